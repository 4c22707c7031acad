"""What an upload's first bytes say it is.

A batch input file is JSON Lines as plain UTF-8 text. A compressed one would be
stored, then fail validation on its first line with a message about UTF-8 that says
nothing of compression; its magic number tells at once, so the upload is refused
with a message that says what the file is and how to unpack it.
"""

from __future__ import annotations

from core.errors import BatchGenError

# (magic number, format, the command that unpacks it). None of them can open a
# JSON Lines file: all but bzip2's start with a byte JSON never begins with, and
# "BZh" followed by a digit is not JSON either.
_COMPRESSIONS = (
    (b"\x1f\x8b", "gzip", "gunzip"),
    (b"PK\x03\x04", "zip", "unzip"),
    (b"PK\x05\x06", "zip", "unzip"),  # an empty archive
    *((b"BZh%d" % level, "bzip2", "bunzip2") for level in range(1, 10)),
    (b"\xfd7zXZ\x00", "xz", "unxz"),
    (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"),
)
MAGIC_BYTES = max(len(magic) for magic, _, _ in _COMPRESSIONS)


def check_not_compressed(head: bytes) -> None:
    """Refuse an upload whose first bytes (`head`, up to MAGIC_BYTES of them) are a
    compression format's magic number."""
    for magic, kind, unpack in _COMPRESSIONS:
        if head.startswith(magic):
            raise BatchGenError(
                f"The file is {kind}-compressed; batch input files are JSON Lines as plain "
                f"UTF-8 text. Decompress it first (for example with `{unpack}`) and upload "
                "the .jsonl file.", param="file", code="compressed_file")
