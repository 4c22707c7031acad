"""Cursor pages, as openai-python's `SyncCursorPage`: a list call answers one page
(`data`, `has_more`, `first_id`, `last_id`), and iterating the page walks every item
of every later page, fetching each as it is reached:

    for batch in client.batches.list(limit=50):   # all batches, 50 a request
        print(batch.id, batch.status)

    page = client.batches.list()
    page.data, page.has_more                      # this page only
    page.get_next_page()                          # the next one (`after=` its cursor)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from batchgen._models import BaseObject

__all__ = ["CursorPage", "BatchErrorPage"]

ItemT = TypeVar("ItemT", bound=BaseObject)


@dataclass(kw_only=True, eq=False, repr=False)
class _Page(BaseObject, Generic[ItemT]):
    """What every page has: `data`, `has_more`, and the walk to the next pages."""

    data: list[Any]
    has_more: bool
    object: str | None = None
    # Fetches the page after a cursor; set by the resource that made this page.
    _fetch: Callable[[Any], Any] | None = None

    @classmethod
    def build(cls, data: dict[str, Any], item: type[ItemT], fetch: Callable[[Any], Any]):
        page = cls.construct(data)
        page.data = [item.construct(v) if isinstance(v, dict) else v for v in page.data or []]
        page._fetch = fetch
        return page

    def next_cursor(self) -> Any:
        raise NotImplementedError

    def has_next_page(self) -> bool:
        return bool(self.has_more and self.data and self._fetch is not None)

    def get_next_page(self):
        if not self.has_next_page():
            raise RuntimeError("no next page: check has_next_page() first")
        return self._fetch(self.next_cursor())

    def iter_pages(self) -> Iterator:
        page = self
        while True:
            yield page
            if not page.has_next_page():
                return
            page = page.get_next_page()

    def __iter__(self) -> Iterator[ItemT]:  # type: ignore[override]
        """Every item from this page on. (`keys()`, `dict(page)` still give the JSON.)"""
        for page in self.iter_pages():
            yield from page.data


@dataclass(kw_only=True, eq=False, repr=False)
class CursorPage(_Page[ItemT]):
    """A page of batches, files, models or webhook endpoints, newest first; the
    cursor is the last item's id."""

    # The same shape as FileList, ModelList and WebhookEndpointList (checked too).
    __component__ = "BatchList"
    first_id: str | None
    last_id: str | None

    def next_cursor(self) -> Any:
        if self.last_id:
            return self.last_id
        return self.data[-1].get("id") if self.data else None


@dataclass(kw_only=True, eq=False, repr=False)
class BatchErrorPage(_Page[ItemT]):
    """A page of a batch's bad input lines: the cursor is the last line's number, and
    `total` counts every bad line the server kept."""

    __component__ = "BatchLineErrorList"
    total: int

    def next_cursor(self) -> Any:
        return self.data[-1].get("line") if self.data else None
