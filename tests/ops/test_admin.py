"""The admin: batches (list, search, filters, detail, cancel), chunks, files,
workers and the pool dashboard; read-only where a hand edit would break invariants."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils import timezone

from batches.admin import batch_progress, incremental_tail
from batches.models import Batch, Chunk
from files import storage
from files.incremental import append_lines
from files.models import File
from tests.ops.conftest import chunks_of, result_line

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/batches/batch/"


def url(name: str, object_id: str) -> str:
    """An admin page's address as the admin itself links it (ids quoted)."""
    return reverse(f"admin:{name}", args=[quote(object_id)])


def detail_url(batch_id: str) -> str:
    return url("batches_batch_change", batch_id)


def bar_value(html: str, batch_id: str) -> int:
    pattern = r'role="progressbar"[^>]*aria-valuenow="(\d+)" data-batch="' + re.escape(batch_id)
    match = re.search(pattern + '"', html)
    assert match, f"no progress bar for {batch_id}"
    return int(match.group(1))


# --- batches: list ---------------------------------------------------------------------


def test_batch_list_shows_status_endpoint_progress_throughput_and_eta(admin_client, make_batch,
                                                                      run_chunk):
    batch = make_batch(5)
    Batch.objects.filter(id=batch.id).update(in_progress_at=timezone.now() - timedelta(seconds=4))
    run_chunk(chunks_of(batch)[0])
    Batch.objects.filter(id=batch.id).update(
        estimated_completion_at=timezone.now() + timedelta(seconds=90))

    page = admin_client.get(CHANGELIST).content.decode()

    assert bar_value(page, batch.id) == 2
    assert 'data-status="in_progress"' in page
    assert "/v1/chat/completions" in page
    assert "2 ✓ 0 ✗ / 5" in page
    assert re.search(r'data-field="throughput">0\.\d req/s<', page)  # 2 requests in ~4 s
    assert re.search(r'data-field="eta">1m (29|30)s<', page)  # the ETA model's
    assert "Cancel selected batches" in page


def test_progress_figures_measure_from_start_to_end():
    started = timezone.now() - timedelta(seconds=100)
    running = Batch(id="batch_a", status="in_progress", total=1000, completed=150, failed=50,
                    in_progress_at=started,
                    estimated_completion_at=started + timedelta(seconds=500))
    finished = Batch(id="batch_b", status="completed", total=100, completed=100,
                     in_progress_at=started, completed_at=started + timedelta(seconds=50))

    progress = batch_progress(running, now=started + timedelta(seconds=100))
    assert progress.throughput == pytest.approx(2.0)
    assert progress.eta_seconds == pytest.approx(400.0)  # the ETA model's, from now
    assert progress.percent(progress.completed) == 15.0
    done = batch_progress(finished, now=started + timedelta(seconds=500))
    assert done.throughput == pytest.approx(2.0)
    assert done.eta_seconds is None


def test_batch_search_by_id_metadata_and_input_file(admin_client, make_batch):
    tagged = make_batch(2, metadata={"experiment": "exp-42"})
    other = make_batch(2, metadata={"experiment": "baseline"})

    def found(query: str) -> set[str]:
        page = admin_client.get(CHANGELIST, {"q": query}).content.decode()
        return {b for b in (tagged.id, other.id) if f'data-batch="{b}"' in page}

    assert found(tagged.id) == {tagged.id}
    assert found("exp-42") == {tagged.id}
    assert found(other.input_file_id) == {other.id}


def test_batch_filters_by_status_and_date(admin_client, make_batch):
    running = make_batch(2)
    validating = make_batch(2, validate=False)

    in_progress = admin_client.get(CHANGELIST, {"status__exact": "in_progress"}).content.decode()
    midnight = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    today = admin_client.get(CHANGELIST, {  # the filter's "Today" link
        "created_at__gte": midnight.isoformat(),
        "created_at__lt": (midnight + timedelta(days=1)).isoformat()}).content.decode()
    long_ago = admin_client.get(CHANGELIST, {
        "created_at__lt": "2000-01-01T00:00:00+00:00"}).content.decode()

    assert f'data-batch="{running.id}"' in in_progress
    assert f'data-batch="{validating.id}"' not in in_progress
    assert f'data-batch="{running.id}"' in today and f'data-batch="{validating.id}"' in today
    assert f'data-batch="{running.id}"' not in long_ago


# --- batches: detail ----------------------------------------------------------------------


def test_batch_detail_shows_timestamps_parameters_files_errors_and_output_tail(
        admin_client, make_batch, run_chunk):
    batch = make_batch(4, temperature=0.7, top_k=5, metadata={"team": "search"})
    for chunk in chunks_of(batch):
        run_chunk(chunk)
    batch.refresh_from_db()
    assert batch.status == "completed"

    page = admin_client.get(detail_url(batch.id)).content.decode()

    assert url("files_file_content", batch.input_file_id) in page
    assert url("files_file_content", batch.output_file_id) in page
    assert "0.7" in page and "search" in page
    for label in ("Created at", "In progress at", "Finalizing at", "Completed at", "Expires at"):
        assert label in page
    assert "2 done" in page and "view chunks" in page
    assert batch.usage_input_tokens == 4 * 5  # four result lines of 5 prompt tokens
    assert "Usage input tokens" in page and ">20<" in page
    assert "req-3" in page  # the incremental file's last lines
    assert "Cancel batch" not in page  # finished: nothing to cancel


def test_batch_detail_lists_line_errors(admin_client, upload, published):
    from batches import services

    file = upload(b'{"custom_id": "a"}\nnot json\n')
    batch = services.batch_create(input_file_id=file["id"], endpoint="/v1/chat/completions",
                                  model="m")
    batch = services.batch_validate(batch_id=batch.id)

    page = admin_client.get(detail_url(batch.id)).content.decode()

    assert batch.status == "failed"
    assert "invalid_input" in page and "invalid_json" in page


def test_incremental_tail_reads_a_bounded_window_of_whole_lines(make_batch):
    batch = make_batch(2)
    path = storage.absolute(storage.incremental_name(batch.id))
    append_lines(path, [result_line(f"req-{i}") for i in range(5000)])
    with path.open("ab") as fh:
        fh.write(b'{"custom_id": "torn')  # a line still being written

    lines = incremental_tail(batch.id, lines=3, max_bytes=4096)

    assert [line.split('"custom_id":"')[1].split('"')[0] for line in lines] == [
        "req-4997", "req-4998", "req-4999"]
    assert incremental_tail("batch_missing") == []


def test_incremental_tail_on_a_bucket_reads_the_segments_then_the_composed_output(
        make_batch, s3_storage):
    """On object storage the running output is counted segments (files/segments.py),
    and after finalization one composed object: the admin shows the last lines of
    either, reading a bounded window."""
    from files import backends, segments
    from files.models import OutputSegment
    from files.services import file_register_output

    batch = make_batch(2)
    store = backends.current()
    offset = 0
    for chunk in range(3):
        data = b"".join(result_line(f"req-{chunk}-{i}") for i in range(400))
        name = segments.segment_name(batch.id, chunk, 1, 0)
        store.put_bytes(name, data)
        OutputSegment.objects.create(batch_id=batch.id, chunk_id=chunk, name=name,
                                     size=len(data), start_offset=offset)
        offset += len(data)

    def ids(lines: list[str]) -> list[str]:
        return [line.split('"custom_id":"')[1].split('"')[0] for line in lines]

    assert ids(incremental_tail(batch.id, lines=3, max_bytes=4096)) == [
        "req-2-397", "req-2-398", "req-2-399"]
    counted = [segments.Segment(row.name, row.size) for row in OutputSegment.objects.all()]
    composed = segments.compose(store, counted, storage.incremental_name(batch.id))
    OutputSegment.objects.all().delete()
    output = file_register_output(batch_id=batch.id, owner=batch.owner, size=composed.size,
                                  digest="0" * 64)
    Batch.objects.filter(id=batch.id).update(output_file=output)
    assert ids(incremental_tail(batch.id, lines=2, max_bytes=4096)) == [
        "req-2-398", "req-2-399"]
    assert len(incremental_tail(batch.id, lines=10_000)) < 1200  # within TAIL_BYTES
    assert incremental_tail("batch_missing") == []


# --- batches: cancel --------------------------------------------------------------------


def test_cancel_action_cancels_through_the_service(admin_client, make_batch, run_chunk):
    running = make_batch(4)
    run_chunk(chunks_of(running)[0], close=False)  # one chunk inside a worker
    waiting = make_batch(4)

    response = admin_client.post(CHANGELIST, {"action": "cancel_selected",
                                              "_selected_action": [running.id, waiting.id]},
                                 follow=True)

    running.refresh_from_db()
    waiting.refresh_from_db()
    assert running.status == "cancelling"  # its worker stops the running chunk
    assert waiting.status == "cancelled"
    assert waiting.output_file_id is not None
    assert "Cancelled 2 batch(es)" in response.content.decode()


def test_cancel_action_reports_batches_that_cannot_be_cancelled(admin_client, make_batch,
                                                                 run_chunk):
    finished = make_batch(2)
    run_chunk(chunks_of(finished)[0])

    response = admin_client.post(CHANGELIST, {"action": "cancel_selected",
                                              "_selected_action": [finished.id]}, follow=True)

    finished.refresh_from_db()
    assert finished.status == "completed"
    assert "can no longer be cancelled" in response.content.decode()


def test_cancel_button_on_the_detail_page(admin_client, make_batch):
    batch = make_batch(4)
    detail = detail_url(batch.id)
    page = admin_client.get(detail).content.decode()
    assert 'id="bg-cancel-batch"' in page
    cancel = re.search(r'<form method="post" action="([^"]+)"', page).group(1)
    assert cancel == url("batches_batch_cancel", batch.id)

    assert admin_client.get(cancel).status_code == 405
    response = admin_client.post(cancel)

    assert response.status_code == 302 and response["Location"] == detail
    batch.refresh_from_db()
    assert batch.status == "cancelled"
    again = admin_client.post(cancel, follow=True)
    assert "can no longer be cancelled" in again.content.decode()


def test_cancel_needs_the_change_permission(client, django_user_model, make_batch):
    from django.contrib.auth.models import Permission

    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_batch"))
    client.force_login(viewer)
    batch = make_batch(2)

    assert client.post(url("batches_batch_cancel", batch.id)).status_code == 403
    page = client.get(CHANGELIST).content.decode()

    batch.refresh_from_db()
    assert batch.status == "in_progress"
    assert "Cancel selected batches" not in page


def test_progress_feed_answers_for_the_batches_asked(admin_client, make_batch, run_chunk):
    batch = make_batch(5)
    run_chunk(chunks_of(batch)[0])

    data = admin_client.get(f"{CHANGELIST}progress/", {"id": [batch.id, "batch_nope"]}).json()

    assert len(data["batches"]) == 1
    figures = data["batches"][0]
    assert (figures["id"], figures["done"], figures["total"]) == (batch.id, 2, 5)
    assert figures["completed_pct"] == 40.0
    assert figures["display"]["status"] == "in_progress"


def test_progress_feed_and_pages_need_a_staff_login(client, make_batch):
    batch = make_batch(2)
    for page in (CHANGELIST, f"{CHANGELIST}progress/?id={batch.id}", "/admin/pool/"):
        response = client.get(page)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert client.post(url("batches_batch_cancel", batch.id)).status_code == 302
    batch.refresh_from_db()
    assert batch.status == "in_progress"


# --- read-only -------------------------------------------------------------------------


def test_batches_and_chunks_cannot_be_added_edited_or_deleted(admin_client, make_batch):
    batch = make_batch(2)
    chunk = chunks_of(batch)[0]

    assert admin_client.get(f"{CHANGELIST}add/").status_code == 403
    edit = admin_client.post(detail_url(batch.id),
                             {"status": "completed", "completed": "2"})
    assert edit.status_code == 403
    assert admin_client.post(url("batches_batch_delete", batch.id)).status_code == 403
    assert admin_client.post(f"/admin/batches/chunk/{chunk.id}/change/",
                             {"status": "done"}).status_code == 403
    page = admin_client.get(detail_url(batch.id)).content.decode()

    batch.refresh_from_db()
    chunk.refresh_from_db()
    assert (batch.status, batch.completed) == ("in_progress", 0)
    assert chunk.status != "done"
    assert 'name="_save"' not in page


def test_chunk_list_filtered_by_batch(admin_client, make_batch, run_chunk):
    batch = make_batch(5)
    other = make_batch(2)
    run_chunk(chunks_of(batch)[0], worker="host-z:7:1")

    page = admin_client.get("/admin/batches/chunk/", {"batch__id__exact": batch.id})

    html = page.content.decode()
    assert page.status_code == 200
    assert f"{batch.id}#0" in html and f"{batch.id}#2" in html
    assert f"{other.id}#0" not in html
    assert "host-z:7:1" in html


def test_a_chunk_s_page_says_when_it_was_claimed_and_when_it_finished(
        admin_client, make_batch):
    chunk = chunks_of(make_batch(2))[0]
    Chunk.objects.filter(id=chunk.id).update(
        claimed_at=datetime(2026, 12, 5, 9, 0, tzinfo=UTC),
        finished_at=datetime(2026, 12, 5, 9, 1, tzinfo=UTC))

    page = admin_client.get(f"/admin/batches/chunk/{chunk.id}/change/")

    html = page.content.decode()
    assert page.status_code == 200
    assert "Claimed at" in html and "Finished at" in html
    assert "9 a.m." in html and "9:01 a.m." in html


# --- files, workers, dashboard --------------------------------------------------------


def test_file_list_shows_purpose_size_checksum_batch_and_download(admin_client, make_batch):
    batch = make_batch(3)
    file = File.objects.get(id=batch.input_file_id)

    page = admin_client.get("/admin/files/file/").content.decode()

    assert file.checksum in page and "batch" in page
    assert url("files_file_content", file.id) in page
    assert detail_url(batch.id) in page
    detail = admin_client.get(url("files_file_change", file.id)).content.decode()
    assert f"{batch.id}</a> (in_progress)" in detail


def test_file_download_streams_the_bytes_to_staff_even_when_the_api_wants_keys(
        admin_client, client, upload, api):
    from core.auth import apikey_create

    content = b'{"custom_id": "a"}\n' * 1000
    file_id = upload(content, filename="prompts.jsonl")["id"]
    apikey_create(name="team-a")  # from now on the API needs a key
    assert api.get(f"/v1/files/{file_id}/content").status_code == 401

    response = admin_client.get(url("files_file_content", file_id))

    assert response.status_code == 200
    assert b"".join(response.streaming_content) == content
    assert 'filename="prompts.jsonl"' in response["Content-Disposition"]
    anonymous = client.get(url("files_file_content", file_id))
    assert anonymous.status_code == 302 and "/admin/login/" in anonymous["Location"]


def test_file_download_of_missing_bytes_is_a_404(admin_client, upload):
    file = File.objects.get(id=upload(b'{"x": 1}\n')["id"])
    storage.absolute(file.storage_name).unlink()

    assert admin_client.get(url("files_file_content", file.id)).status_code == 404


def test_batches_and_files_show_their_api_key(admin_client, make_batch):
    from core.auth import apikey_create

    batch = make_batch(2)
    key, _ = apikey_create(name="team-a")
    Batch.objects.filter(id=batch.id).update(owner=key)
    File.objects.filter(id=batch.input_file_id).update(owner=key)

    batches = admin_client.get(CHANGELIST, {"owner__id__exact": key.id}).content.decode()
    files = admin_client.get("/admin/files/file/").content.decode()

    assert f'data-batch="{batch.id}"' in batches and str(key) in batches
    assert str(key) in files


def test_file_delete_goes_through_the_service(admin_client, make_batch, upload,
                                              django_capture_on_commit_callbacks):
    in_use = File.objects.get(id=make_batch(2).input_file_id)
    unused = File.objects.get(id=upload(b'{"x": 1}\n')["id"])
    unused_path = storage.absolute(unused.storage_name)
    assert unused_path.exists()

    refused = admin_client.post(url("files_file_delete", in_use.id), {"post": "yes"})
    with django_capture_on_commit_callbacks(execute=True):
        deleted = admin_client.post(url("files_file_delete", unused.id), {"post": "yes"})

    assert refused.status_code == 403
    assert File.objects.filter(id=in_use.id).exists()
    assert deleted.status_code == 302
    assert not File.objects.filter(id=unused.id).exists()
    assert not unused_path.exists()


def test_bulk_file_delete_refuses_a_selection_with_files_in_use(admin_client, make_batch,
                                                                 upload):
    in_use = make_batch(2).input_file_id
    unused = [upload(b'{"x": 1}\n')["id"] for _ in range(2)]

    def delete(ids):
        return admin_client.post("/admin/files/file/", {
            "action": "delete_selected", "_selected_action": ids, "post": "yes"})

    assert delete([in_use, unused[0]]).status_code == 403
    assert File.objects.filter(id__in=[in_use, *unused]).count() == 3
    assert delete(unused).status_code == 302
    assert list(File.objects.values_list("id", flat=True)) == [in_use]


def test_file_delete_refused_by_the_service_keeps_the_file(admin_client, make_batch,
                                                           monkeypatch):
    # A batch started on the file after the confirmation page was shown.
    file_id = make_batch(2).input_file_id
    monkeypatch.setattr("batches.files_admin.file_in_active_use", lambda file_id: False)

    response = admin_client.post(url("files_file_delete", file_id), {"post": "yes"},
                                 follow=True)

    assert "used by an active batch" in response.content.decode()
    assert File.objects.filter(id=file_id).exists()


def test_worker_list_shows_liveness_slots_and_counts(admin_client, worker_row):
    worker_row("host-a:1:1", slots_active=3, requests_completed=42, tokens_generated=999)
    worker_row("host-b:2:1", hostname="host-b", age=3600)

    page = admin_client.get("/admin/fleet/worker/").content.decode()
    alive = admin_client.get("/admin/fleet/worker/", {"alive": "yes"}).content.decode()

    assert "3 / 64" in page and "42" in page and "999" in page
    assert "host-a:1:1" in alive and "host-b:2:1" not in alive
    assert admin_client.get("/admin/fleet/worker/add/").status_code == 403


def test_the_workers_page_from_before_the_move_to_fleet_leads_to_it(admin_client, worker_row):
    worker_row("host-a:1:1")

    listing = admin_client.get("/admin/inference/worker/?alive=yes", follow=True)

    assert listing.redirect_chain == [("/admin/fleet/worker/?alive=yes", 301)]
    assert "host-a:1:1" in listing.content.decode()


def test_pool_dashboard_shows_pool_figures_workers_and_active_batches(admin_client, make_batch,
                                                                      worker_row, run_chunk):
    from batches.selectors import pool_status

    worker_row("host-a:1:1", slots_active=7, slots_capacity=32, tokens_active=300,
               token_budget=1200)
    batch = make_batch(5)
    run_chunk(chunks_of(batch)[0])
    pool = pool_status()

    page = admin_client.get("/admin/pool/").content.decode()

    assert '<meta http-equiv="refresh"' in page
    assert f'data-figure="intake_pool_size">{pool["intake_pool_size"]}<' in page
    assert 'data-figure="scheduling_pool_active">7<' in page
    assert 'data-figure="active_batches">1<' in page
    assert 'data-figure="live_workers">1<' in page
    assert 'data-figure="scheduling_pool_tokens_active">300<' in page
    assert "of a 1200-token budget (25.0%)" in page
    assert "host-a:1:1" in page and "7 / 32" in page
    assert bar_value(page, batch.id) == 2


def test_admin_index_links_the_dashboard_and_admin_static_files_are_served(admin_client):
    page = admin_client.get("/admin/").content.decode()

    assert "/admin/pool/" in page and "BatchGen" in page
    css = admin_client.get("/static/admin/css/base.css")
    assert css.status_code == 200
