"""API keys: `Authorization: Bearer <key>`, as the openai SDK sends it.

While no key exists (and BATCHGEN_REQUIRE_AUTH is off) the API is open, for local
use. Once any key exists every /v1/ endpoint needs one, and each key sees only its
own files and batches (another key's are answered 404, as if they did not exist)."""

from __future__ import annotations

import hashlib
import secrets
import time
from datetime import timedelta

from django.conf import settings
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions

from core.models import ApiKey

KEY_PREFIX = "bg-"


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


# Whether any key exists, as this process last saw it: (monotonic time, answer).
# A key is never deleted by the API (revoked keys stay), so once seen the answer
# stays yes; until then it is asked again at most every KEYS_RECHECK_SECONDS, so a
# key made by `manage.py createapikey` closes a running server within that time,
# and a poll costs no query for it (an open server, one a second per process).
KEYS_RECHECK_SECONDS = 1.0
_keys_seen: tuple[float, bool] = (float("-inf"), False)


def apikey_create(*, name: str, max_intake_requests: int | None = None,
                  tokens_per_day: int | None = None, weight: int = 1) -> tuple[ApiKey, str]:
    """Create a key; the raw key is returned once and never stored."""
    global _keys_seen
    raw = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(name=name, prefix=raw[:10], hashed_key=hash_key(raw),
                 max_intake_requests=max_intake_requests, tokens_per_day=tokens_per_day,
                 weight=weight)
    key.full_clean(exclude=["hashed_key"])
    key.save()
    _keys_seen = (time.monotonic(), True)  # this process closes at once
    return key, raw


_UNSET = object()


def apikey_set_quotas(*, prefix: str, max_intake_requests=_UNSET, tokens_per_day=_UNSET,
                      weight=_UNSET) -> ApiKey:
    """Change a key's quotas or weight (None: no limit); what is not given stays. They
    apply to the next create, admission and dispatch (batches.quotas)."""
    key = ApiKey.objects.get(prefix=prefix)  # ApiKey.DoesNotExist when there is none
    changes = {name: value for name, value in [
        ("max_intake_requests", max_intake_requests), ("tokens_per_day", tokens_per_day),
        ("weight", weight)] if value is not _UNSET}
    for name, value in changes.items():
        setattr(key, name, value)
    key.full_clean(exclude=["hashed_key"])
    key.save(update_fields=list(changes))
    return key


def apikey_revoke(*, prefix: str) -> int:
    return ApiKey.objects.filter(prefix=prefix, revoked_at__isnull=True).update(
        revoked_at=timezone.now())


def auth_required() -> bool:
    """Keys are required once any key was ever created (revoking them all must not
    reopen the server) or when BATCHGEN_REQUIRE_AUTH is set."""
    global _keys_seen
    if settings.BATCHGEN_REQUIRE_AUTH:
        return True
    checked_at, exists = _keys_seen
    now = time.monotonic()
    if not exists and now - checked_at >= KEYS_RECHECK_SECONDS:
        exists = ApiKey.objects.exists()
        _keys_seen = (now, exists)
    return exists


def forget_keys_seen() -> None:
    """Ask the database again on the next request (a test rolled its keys back)."""
    global _keys_seen
    _keys_seen = (float("-inf"), False)


class ApiKeyAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != b"bearer":
            return None
        try:
            if len(header) != 2:
                raise exceptions.AuthenticationFailed("Malformed Authorization header.")
            try:
                raw = header[1].decode()
            except UnicodeDecodeError:
                raise exceptions.AuthenticationFailed("Malformed API key.") from None
        except exceptions.AuthenticationFailed:
            if not auth_required():
                return None  # an open server ignores whatever a client sends
            raise
        key = ApiKey.objects.filter(hashed_key=hash_key(raw), revoked_at__isnull=True).first()
        if key is None:
            if not auth_required():
                return None  # open server: a placeholder key (the SDK insists) is fine
            raise exceptions.AuthenticationFailed("Incorrect API key provided.")
        now = timezone.now()
        if key.last_used_at is None or now - key.last_used_at > timedelta(minutes=1):
            ApiKey.objects.filter(id=key.id).update(last_used_at=now)
        return key, key

    def authenticate_header(self, request):
        return 'Bearer realm="batchgen"'


class ApiKeyRequired(permissions.BasePermission):
    message = "You must provide an API key (Authorization: Bearer <key>)."

    def has_permission(self, request, view):
        return isinstance(request.auth, ApiKey) or not auth_required()


def request_owner(request) -> ApiKey | None:
    """Whose objects a request may see: its key, or None (all) on an open server."""
    return request.auth if isinstance(request.auth, ApiKey) else None


class ApiKeyScheme(OpenApiAuthenticationExtension):
    """Tells drf-spectacular that the API takes `Authorization: Bearer <key>`."""

    target_class = "core.auth.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer"}
