"""Output lines, exactly as the Batch API returns them."""

from __future__ import annotations

import secrets

import orjson

from inference.engines.base import EngineResult


def _suffix() -> str:
    return secrets.token_hex(12)


def format_line(custom_id: str, result: EngineResult) -> bytes:
    """One output line (with its newline) for a finished request."""
    if result.error is not None:
        item = {
            "id": f"batch_req_{_suffix()}",
            "custom_id": custom_id,
            "response": None,
            "error": {"code": result.error["code"], "message": result.error["message"]},
        }
    else:
        item = {
            "id": f"batch_req_{_suffix()}",
            "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": f"req_{_suffix()}",
                         "body": result.body},
            "error": None,
        }
    return orjson.dumps(item) + b"\n"
