from __future__ import annotations

from django.db import models


class ApiKey(models.Model):
    """A client's API key. Only its sha256 is stored: keys are long random tokens, so
    a fast hash is safe, and lookup is one indexed equality."""

    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16)  # shown to operators to tell keys apart
    hashed_key = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_authenticated(self) -> bool:  # lets DRF treat the key as the request's user
        return True
