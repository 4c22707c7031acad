"""The client's version, read from the installed distribution when there is one."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("batchgen")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.1.0"
