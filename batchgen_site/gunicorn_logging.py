"""gunicorn's access log without the polls (`manage.py serve --access-log except-polls`,
the default).

A batch service is polled: hundreds of clients asking for a batch or the pool status
every few seconds would bury the requests worth reading (uploads, creates, cancels,
downloads, every error) and cost the web a tenth of its CPU at a thousand polls a
second. Successful GETs of the polled paths are left out; they are counted by
`/metrics` instead. Every other request, and any poll that fails, is logged as usual.
"""

from __future__ import annotations

import re

from gunicorn.glogging import Logger

POLLED = re.compile(r"/(?:health|metrics|v1/pool/status|v1/batches/[^/]+)")


def is_poll(method: str, path: str, status: int | None) -> bool:
    return (method in ("GET", "HEAD") and status is not None and status < 400
            and POLLED.fullmatch(path) is not None)


class ExceptPollsLogger(Logger):
    def access(self, resp, req, environ, request_time):
        # gunicorn's answers to malformed requests (handle_error) have no status_code:
        # reading it raised, and the client got no answer at all.
        if is_poll(req.method, req.path, getattr(resp, "status_code", None)):
            return
        super().access(resp, req, environ, request_time)
