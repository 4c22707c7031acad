"""Output lines, exactly as the Batch API returns them."""

from __future__ import annotations

import secrets

import orjson

from serving.engines.base import EngineResult


def format_line(custom_id: str, result: EngineResult) -> bytes:
    """One output line (with its newline) for a finished request."""
    random = secrets.token_hex(24)  # one read for both ids
    if result.error is not None:
        item = {
            "id": f"batch_req_{random[:24]}",
            "custom_id": custom_id,
            "response": None,
            "error": {"code": result.error["code"], "message": result.error["message"]},
        }
    else:
        item = {
            "id": f"batch_req_{random[:24]}",
            "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": f"req_{random[24:]}",
                         "body": result.body},
            "error": None,
        }
    return orjson.dumps(item) + b"\n"
