"""The `batchgen` command: submit, watch and fetch batches on a BatchGen server.

Results and summaries go to stdout, progress bars and notices to stderr. Exit codes:
0 success, 1 an error or a batch that did not complete, 2 bad usage, 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any

from batchgen._progress import BatchProgress
from batchgen._version import __version__
from batchgen.batchgen_client import (
    DEFAULT_BASE_URL,
    DEFAULT_ENDPOINT,
    ENDPOINTS,
    FAILED_STATUSES,
    TERMINAL_STATUSES,
    BatchGenHttpClient,
)
from batchgen.errors import BatchFailedError, BatchGenError, WaitTimeoutError

EXIT_OK, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 130
# How many validation errors `status` and `submit` print before summarising the rest.
_SHOWN_ERRORS = 10


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    client = BatchGenHttpClient(args.base_url, args.request_timeout, api_key=args.api_key)
    try:
        with client:
            return args.command(client, args)
    except KeyboardInterrupt:
        _notice("interrupted")
        return EXIT_INTERRUPTED
    except (BatchGenError, OSError) as exc:
        _notice(f"batchgen: error: {exc}")
        return EXIT_ERROR


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="batchgen", description="Submit, watch and fetch batches on a BatchGen server."
    )
    parser.add_argument("--version", action="version", version=f"batchgen {__version__}")
    _connection_options(parser, default=None)
    sub = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")

    def command(name: str, handler, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        # Also accepted after the command; SUPPRESS keeps the top-level value otherwise.
        _connection_options(p, default=argparse.SUPPRESS)
        p.set_defaults(command=handler)
        return p

    _submit_options(command("submit", cmd_submit,
                            "upload a JSONL file, run it as a batch, fetch results"))

    p = command("status", cmd_status, "show a batch")
    p.add_argument("batch_id")
    p.add_argument("--json", action="store_true", help="print the raw batch object")

    p = command("list", cmd_list, "list batches, newest first")
    p.add_argument("--limit", type=_positive_int, default=20)
    p.add_argument("--after", metavar="BATCH_ID", help="start after this batch (next page)")
    p.add_argument("--json", action="store_true", help="print the raw list object")

    p = command("cancel", cmd_cancel, "cancel a batch (finished results are kept)")
    p.add_argument("batch_id")
    p.add_argument("--json", action="store_true", help="print the raw batch object")

    p = command("download", cmd_download, "download a file, or a batch's output file")
    p.add_argument("id", metavar="FILE_ID|BATCH_ID")
    p.add_argument("-o", "--output", required=True, help="destination path")
    p.add_argument("--wait", action="store_true", help="wait for an unfinished batch first")
    _wait_options(p)

    p = command("tail", cmd_tail, "print a batch's result lines as they become available")
    p.add_argument("batch_id")
    _wait_options(p)

    p = command("pool", cmd_pool, "show the server's capacity figures")
    p.add_argument("--json", action="store_true", help="print the raw object")

    command("health", cmd_health, "exit 0 if the server is healthy, 1 otherwise")
    return parser


def _submit_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="input JSONL file")
    p.add_argument("-o", "--output", help="where to write the results (JSONL)")
    # Not argparse choices: the server names what its model serves, and says why
    # when it refuses one (400 unsupported_endpoint).
    p.add_argument("--endpoint", default=DEFAULT_ENDPOINT,
                   help=f"the url of every line: {', '.join(ENDPOINTS)} "
                        f"(default {DEFAULT_ENDPOINT}); /v1/embeddings, /v1/score and "
                        "/v1/rerank need an embedding model (or, the last two, a "
                        "cross-encoder) on the server, the others a chat model")
    p.add_argument("--max-decoding-length", type=_positive_int, metavar="N")
    p.add_argument("--max-context-length", type=_positive_int, metavar="N")
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--metadata", type=_key_value, nargs="+", action="extend", default=[],
                   metavar="KEY=VALUE", help="batch metadata, repeatable")
    p.add_argument("--detach", action="store_true",
                   help="print the batch id and return once the batch is created")
    _wait_options(p)


# -- commands ----------------------------------------------------------------------------


def cmd_submit(client: BatchGenHttpClient, args: argparse.Namespace) -> int:
    file_obj = client.upload_file(args.input, purpose="batch")
    _notice(f"uploaded {args.input} as {file_obj['id']} ({file_obj.get('bytes')} bytes)")
    batch = client.create_batch(
        file_obj["id"],
        endpoint=args.endpoint,
        metadata=dict(args.metadata) or None,
        max_decoding_length=args.max_decoding_length,
        max_context_length=args.max_context_length,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
    )
    batch_id = batch["id"]
    if args.detach:
        print(batch_id)
        return EXIT_OK
    _notice(f"created batch {batch_id}")
    try:
        batch = client.wait_for_batch(
            batch_id, args.poll_interval, args.timeout, progress=not args.no_progress
        )
        if args.output and batch.get("output_file_id"):
            client.download_to(batch["output_file_id"], args.output)
        elif args.output:
            _notice(f"batchgen: error: batch {batch_id} completed without an output file")
            return EXIT_ERROR
    except KeyboardInterrupt:
        _notice(_resume_hint(batch_id, args.output, "interrupted"))
        return EXIT_INTERRUPTED
    except WaitTimeoutError as exc:
        _notice(f"batchgen: error: {exc}")
        _notice(_resume_hint(batch_id, args.output, "gave up waiting"))
        return EXIT_ERROR
    except BatchFailedError as exc:
        _report_unfinished(client, exc.batch, args.output)
        return EXIT_ERROR
    counts = _counts(batch)
    where = f"results in {args.output}" if args.output else (
        f"results: batchgen download {batch_id} -o PATH"
    )
    print(f"batch {batch_id} completed: {counts['completed']} ok, {counts['failed']} failed; "
          f"{where}")
    return EXIT_OK


def cmd_status(client: BatchGenHttpClient, args: argparse.Namespace) -> int:
    batch = client.get_batch(args.batch_id)
    if args.json:
        _print_json(batch)
    else:
        print(format_batch(batch))
    return EXIT_OK


def cmd_list(client: BatchGenHttpClient, args: argparse.Namespace) -> int:
    page = client.list_batches(limit=args.limit, after=args.after)
    if args.json:
        _print_json(page)
        return EXIT_OK
    rows = [("ID", "STATUS", "DONE/TOTAL", "FAILED", "CREATED", "ENDPOINT")]
    for batch in page.get("data", []):
        counts = _counts(batch)
        rows.append((
            batch.get("id", ""),
            batch.get("status", ""),
            f"{counts['completed'] + counts['failed']}/{counts['total']}",
            str(counts["failed"]),
            _when(batch.get("created_at")),
            batch.get("endpoint", ""),
        ))
    if len(rows) == 1:
        print("no batches")
        return EXIT_OK
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print("  ".join(cells).rstrip())
    if page.get("has_more"):
        _notice(f"more: batchgen list --after {page.get('last_id')}")
    return EXIT_OK


def cmd_cancel(client: BatchGenHttpClient, args: argparse.Namespace) -> int:
    batch = client.cancel_batch(args.batch_id)
    if args.json:
        _print_json(batch)
    else:
        print(f"{batch.get('id')}: {batch.get('status')}")
    return EXIT_OK


def cmd_download(client: BatchGenHttpClient, args: argparse.Namespace) -> int:
    file_id = args.id
    if not file_id.startswith("file-"):
        batch = client.get_batch(file_id)
        if batch.get("status") not in TERMINAL_STATUSES:
            if not args.wait:
                _notice(f"batchgen: error: batch {file_id} is still {batch.get('status')}; "
                        f"add --wait to wait for it")
                return EXIT_ERROR
            try:
                batch = client.wait_for_batch(
                    file_id, args.poll_interval, args.timeout, progress=not args.no_progress
                )
            except BatchFailedError as exc:
                batch = exc.batch
        if batch.get("status") in FAILED_STATUSES:
            _notice(f"warning: batch {file_id} ended {batch.get('status')}; "
                    f"its results are partial")
        file_id = batch.get("output_file_id")
        if not file_id:
            _notice(f"batchgen: error: batch {args.id} has no output file")
            return EXIT_ERROR
    path = client.download_to(file_id, args.output)
    print(f"wrote {file_id} to {path} ({path.stat().st_size} bytes)")
    return EXIT_OK


def cmd_tail(client: BatchGenHttpClient, args: argparse.Namespace) -> int:
    with BatchProgress(disable=args.no_progress) as bar:
        try:
            for result in client.follow_results(
                args.batch_id, args.poll_interval, args.timeout, on_poll=bar.update
            ):
                bar.write(json.dumps(result, ensure_ascii=False), file=sys.stdout)
        except BatchFailedError as exc:
            bar.close()
            _notice(f"batchgen: error: {exc}")
            return EXIT_ERROR
    return EXIT_OK


def cmd_pool(client: BatchGenHttpClient, args: argparse.Namespace) -> int:
    pool = client.pool_status()
    if args.json:
        _print_json(pool)
        return EXIT_OK
    intake, intake_cap = pool.get("intake_pool_size", 0), pool.get("intake_pool_capacity", 0)
    active, free = pool.get("scheduling_pool_active", 0), pool.get("scheduling_pool_free", 0)
    slots = pool.get("scheduling_pool_capacity", 0)
    print(f"intake pool      {intake:,} / {intake_cap:,} requests queued "
          f"({_pct(intake, intake_cap)})")
    print(f"scheduling pool  {active:,} active, {free:,} free of {slots:,} slots "
          f"({_pct(active, slots)} busy)")
    print(f"active batches   {pool.get('active_batches', 0):,}")
    return EXIT_OK


def cmd_health(client: BatchGenHttpClient, args: argparse.Namespace) -> int:
    healthy = client.health_check()
    print(f"{client.base_url}: {'healthy' if healthy else 'unhealthy or unreachable'}")
    return EXIT_OK if healthy else EXIT_ERROR


# -- output ------------------------------------------------------------------------------


def format_batch(batch: dict) -> str:
    """A human summary of a batch object."""
    counts = _counts(batch)
    lines = [f"{batch.get('id')}  {batch.get('status')}"]

    def field(label: str, value: Any) -> None:
        if value not in (None, "", {}):
            lines.append(f"  {label:<13}{value}")

    field("endpoint", batch.get("endpoint"))
    field("model", batch.get("model"))
    field("requests", f"{counts['total']} total, {counts['completed']} completed, "
                      f"{counts['failed']} failed")
    usage = batch.get("usage")
    if isinstance(usage, dict) and usage.get("total_tokens"):
        cached = (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0
        reasoning = (usage.get("output_tokens_details") or {}).get("reasoning_tokens") or 0
        field("tokens", f"{usage.get('input_tokens', 0)} in ({cached} cached), "
                        f"{usage.get('output_tokens', 0)} out ({reasoning} reasoning)")
    for stamp in ("created", "in_progress", "finalizing", "completed", "failed",
                  "cancelling", "cancelled", "expires"):
        value = batch.get(f"{stamp}_at")
        if value:
            field(stamp.replace("_", " "), _when(value))
    if batch.get("estimated_completion_at"):
        field("estimated completion", _when(batch["estimated_completion_at"])
              + (" (at risk: past the completion window)" if batch.get("at_risk") else ""))
    field("input file", batch.get("input_file_id"))
    field("output file", batch.get("output_file_id"))
    field("error file", batch.get("error_file_id"))
    error = batch.get("error")
    if isinstance(error, dict):
        field("error", ": ".join(str(v) for v in (error.get("code"), error.get("message")) if v))
    listed = batch.get("errors") or {}
    errors = (listed.get("data") or [])[:_SHOWN_ERRORS]
    for item in errors:
        where = f"line {item.get('line')}: " if item.get("line") is not None else ""
        field("invalid", f"{where}{item.get('code')}: {item.get('message')}")
    more = (listed.get("total") or len(listed.get("data") or [])) - len(errors)
    if more > 0:
        field("", f"... and {more} more (GET /v1/batches/{batch.get('id')}/errors)")
    metadata = batch.get("metadata") or {}
    field("metadata", ", ".join(f"{k}={v}" for k, v in metadata.items()))
    return "\n".join(lines)


def _report_unfinished(client: BatchGenHttpClient, batch: dict, output: str | None) -> None:
    _notice(f"batchgen: error: batch {batch.get('id')} ended {batch.get('status')}")
    _notice(format_batch(batch))
    if output and batch.get("output_file_id"):
        client.download_to(batch["output_file_id"], output)
        _notice(f"partial results written to {output}")


def _resume_hint(batch_id: str, output: str | None, what: str) -> str:
    path = output or "output.jsonl"
    return (
        f"{what}; batch {batch_id} keeps running on the server.\n"
        f"  batchgen status {batch_id}                       # check on it\n"
        f"  batchgen download {batch_id} -o {path} --wait    # fetch the results\n"
        f"  batchgen cancel {batch_id}                       # stop it"
    )


def _counts(batch: dict) -> dict[str, int]:
    counts = batch.get("request_counts") or {}
    return {key: int(counts.get(key) or 0) for key in ("total", "completed", "failed")}


def _when(timestamp: Any) -> str:
    if not isinstance(timestamp, int | float):
        return ""
    return datetime.fromtimestamp(timestamp).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, ensure_ascii=False))


def _notice(text: str) -> None:
    print(text, file=sys.stderr)


# -- argument types ----------------------------------------------------------------------


def _connection_options(parser: argparse.ArgumentParser, *, default: Any) -> None:
    parser.add_argument("--base-url", default=default,
                        help=f"server URL (env BATCHGEN_BASE_URL, default {DEFAULT_BASE_URL})")
    parser.add_argument("--api-key", default=default, help="bearer token (env BATCHGEN_API_KEY)")
    parser.add_argument("--request-timeout", type=float, default=default, metavar="S",
                        help="per-request HTTP timeout in seconds (default: none)")


def _wait_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--poll-interval", type=_non_negative_float, default=5.0, metavar="S",
                        help="seconds between status polls (default 5)")
    parser.add_argument("--timeout", type=_non_negative_float, metavar="S",
                        help="stop waiting after S seconds (the batch keeps running)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


if __name__ == "__main__":
    sys.exit(main())
