"""`manage.py storage_move s3://bucket/prefix`: move an existing deployment's files
from the storage path to a bucket (files.services.files_move_to_store), and say what
was moved."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.template.defaultfilters import filesizeformat

from files.backends import StorageUnavailable
from files.services import files_move_to_store


class Command(BaseCommand):
    help = ("Move every file's bytes (uploads, output files) from the storage path to an "
            "S3-compatible bucket under the same names, then start the server with "
            "BATCHGEN_STORAGE_URL set to the same URL. Stop the server first. Safe to run "
            "again: files already in the bucket are skipped.")

    def add_arguments(self, parser):
        parser.add_argument("url", help="s3://bucket/prefix")
        parser.add_argument("--dry-run", action="store_true",
                            help="say what would be moved, move nothing")

    def handle(self, *args, url: str, dry_run: bool, **options):
        if not url.startswith("s3://"):
            raise CommandError(f"{url!r} is not an s3://bucket/prefix URL")
        try:
            report = files_move_to_store(url=url, dry_run=dry_run)
        except StorageUnavailable as exc:
            raise CommandError(f"the object store did not answer: {exc}") from None
        verb = "would move" if dry_run else "moved"
        self.stdout.write(f"{verb} {report.moved} file(s), "
                          f"{filesizeformat(report.moved_bytes)}, to {url}")
        if report.already_there:
            self.stdout.write(f"{report.already_there} file(s) were in the bucket already")
        if report.missing:
            self.stdout.write(f"{len(report.missing)} file(s) have no bytes on the path or in "
                              f"the bucket: {', '.join(report.missing[:20])}")
