"""The HTTP plumbing under `BatchGenHttpClient`, as openai-python's `_base_client`:
the connection (base URL, key, timeouts), one exchange under the retry policy, JSON and
streamed answers, and transport failures and HTTP errors turned into
`batchgen.errors`. The client class on top holds only the API's calls."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Self

import httpx

from batchgen import _retry
from batchgen._version import __version__
from batchgen.errors import APIConnectionError, APITimeoutError, BatchGenError, error_from_response

DEFAULT_BASE_URL = "http://localhost:10900"
# Without timeout_s a request may take as long as it needs (multi-GB uploads and
# downloads), but an unreachable host should not hang the caller.
_CONNECT_TIMEOUT_S = 10.0


class BaseClient:
    def __init__(
        self,
        base_url: str | None = None,
        timeout_s: float | None = None,
        *,
        api_key: str | None = None,
    ):
        base_url = (base_url or os.environ.get("BATCHGEN_BASE_URL") or DEFAULT_BASE_URL)
        base_url = base_url.rstrip("/")
        base_url = base_url.removesuffix("/v1")
        self.base_url = base_url
        api_key = api_key if api_key is not None else os.environ.get("BATCHGEN_API_KEY")
        headers = {"User-Agent": f"batchgen-client/{__version__}"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        if timeout_s is None:
            timeout = httpx.Timeout(None, connect=_CONNECT_TIMEOUT_S)
        else:
            timeout = httpx.Timeout(timeout_s)
        self._http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- plumbing ----------------------------------------------------------------------

    def _json(self, method: str, path: str, **kwargs: Any) -> dict:
        return json_of(self._send(lambda: self._http.request(method, path, **kwargs)))

    def _send(self, attempt: Callable[[], httpx.Response]) -> httpx.Response:
        """Run one HTTP exchange under the retry policy (429, and 503 with Retry-After)."""
        return _retry.rate_limit_retrying()(_checked, attempt)

    @contextmanager
    def _stream(self, method: str, path: str, **kwargs: Any) -> Iterator[httpx.Response]:
        """A response whose body is read as it arrives; closed on exit."""

        def attempt() -> httpx.Response:
            return self._http.send(self._http.build_request(method, path, **kwargs), stream=True)

        response = self._send(attempt)
        try:
            yield response
        except httpx.TimeoutException as exc:
            raise APITimeoutError(f"timed out reading {method} {path}: {exc}") from exc
        except httpx.HTTPError as exc:  # the connection broke mid-body
            raise APIConnectionError(f"reading {method} {path} failed: {exc}") from exc
        finally:
            response.close()


def _checked(attempt: Callable[[], httpx.Response]) -> httpx.Response:
    """Make one request; turn transport failures and HTTP errors into BatchGenErrors
    (a 429 becomes a RateLimitError and a 503 a ServiceUnavailableError, which the
    retry policy decides on)."""
    try:
        response = attempt()
        if response.is_error:
            try:
                response.read()
            finally:
                response.close()
    except httpx.TimeoutException as exc:
        raise APITimeoutError(f"{_target(exc)} timed out: {exc}") from exc
    except httpx.HTTPError as exc:
        raise APIConnectionError(f"cannot reach {_target(exc)}: {exc}") from exc
    if response.is_error:
        retry_after = None
        if response.status_code in (429, 503):
            retry_after = _retry.parse_retry_after(response.headers.get("Retry-After"))
        raise error_from_response(response, retry_after=retry_after)
    return response


def _target(exc: httpx.HTTPError) -> str:
    try:
        request = exc.request
    except RuntimeError:  # httpx raises when the error carries no request
        return "the BatchGen server"
    return f"{request.method} {request.url}"


def json_of(response: httpx.Response) -> dict:
    try:
        return response.json()
    except ValueError as exc:
        raise BatchGenError(
            f"expected JSON from {response.request.method} {response.request.url}, "
            f"got {response.headers.get('content-type', 'no content type')}"
        ) from exc


def without_none(**fields: Any) -> dict[str, Any]:
    return {key: value for key, value in fields.items() if value is not None}
