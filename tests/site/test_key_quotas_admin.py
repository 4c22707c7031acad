"""Setting a key's quotas and weight: `manage.py createapikey` options and the admin."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from batches import quotas
from batches.usage import Usage
from core.auth import apikey_create
from core.models import ApiKey

pytestmark = pytest.mark.django_db


def command(*args: str) -> str:
    out = StringIO()
    call_command("createapikey", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_createapikey_sets_quotas_and_weight():
    raw = command("team-a", "--max-intake-requests", "5000", "--tokens-per-day", "2000000",
                  "--weight", "3").strip()

    key = ApiKey.objects.get()
    assert raw.startswith("bg-") and key.prefix == raw[:10]
    assert (key.max_intake_requests, key.tokens_per_day, key.weight) == (5000, 2000000, 3)


def test_createapikey_without_options_makes_a_key_without_limits():
    command("team-a")

    key = ApiKey.objects.get()
    assert (key.max_intake_requests, key.tokens_per_day, key.weight) == (None, None, 1)


def test_update_changes_only_what_is_given_and_none_lifts_a_limit():
    key, _ = apikey_create(name="team-a", max_intake_requests=10, tokens_per_day=99, weight=2)

    said = command("--update", key.prefix, "--tokens-per-day", "none")

    key.refresh_from_db()
    assert (key.max_intake_requests, key.tokens_per_day, key.weight) == (10, None, 2)
    assert "tokens_per_day=-" in said


def test_list_shows_quotas_but_never_the_key():
    key, raw = apikey_create(name="team-a", max_intake_requests=7)

    listing = command("--list")

    assert "team-a" in listing and key.prefix in listing and " 7 " in listing
    assert raw not in listing


@pytest.mark.parametrize("args", [
    ["team-a", "--weight", "0"],
    ["team-a", "--weight", "1001"],
    ["team-a", "--max-intake-requests", "-1"],
    ["team-a", "--tokens-per-day", "lots"],
    ["--update", "bg-nothere", "--weight", "2"],
    ["--update", "bg-nothere"],
])
def test_bad_quota_options_are_refused(args):
    with pytest.raises(CommandError):
        command(*args)
    assert not ApiKey.objects.exists()


def test_the_admin_edits_a_keys_quotas_and_shows_what_it_holds_and_used(admin_client):
    key, _ = apikey_create(name="team-a")
    quotas.key_usage_add({(key.pk, quotas.utc_today()): quotas.KeyDayUsage(
        requests_completed=1, tokens=Usage(input_tokens=30, output_tokens=12))})
    url = f"/admin/core/apikey/{key.pk}/change/"

    response = admin_client.post(url, {"name": "team-a", "max_intake_requests": "100",
                                       "tokens_per_day": "", "weight": "4"})

    assert response.status_code == 302, response.content.decode()[:2000]
    key.refresh_from_db()
    assert (key.max_intake_requests, key.tokens_per_day, key.weight) == (100, None, 4)
    listing = admin_client.get("/admin/core/apikey/").content.decode()
    assert "team-a" in listing and ">42<" in listing
    usage = admin_client.get("/admin/core/keyusage/").content.decode()
    assert "team-a" in usage and "42 tokens" in usage


def test_the_admins_key_pages_from_before_the_move_to_core_lead_to_them(admin_client):
    key, _ = apikey_create(name="team-a")

    change = admin_client.get(f"/admin/batchgen_site/apikey/{key.pk}/change/")
    listing = admin_client.get("/admin/batchgen_site/apikey/?revoked_at__isempty=1",
                               follow=True)

    assert (change.status_code, change["Location"]) == (
        301, f"/admin/core/apikey/{key.pk}/change/")
    assert listing.redirect_chain == [("/admin/core/apikey/?revoked_at__isempty=1", 301)]
    assert "team-a" in listing.content.decode()


def test_the_admin_refuses_a_weight_out_of_bounds(admin_client):
    key, _ = apikey_create(name="team-a")

    response = admin_client.post(f"/admin/core/apikey/{key.pk}/change/",
                                 {"name": "team-a", "weight": "0"})

    assert response.status_code == 200  # the form again, with the error
    key.refresh_from_db()
    assert key.weight == 1
