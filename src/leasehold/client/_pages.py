"""Walking a paged List call to its end, written once for every paged method."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Protocol, TypeVar

Item = TypeVar("Item")


class Page(Protocol):
    @property
    def next_page_token(self) -> str: ...


PageT = TypeVar("PageT", bound=Page)


async def every_item(
    fetch_page: Callable[[str], Awaitable[PageT]], items_of: Callable[[PageT], Iterable[Item]]
) -> AsyncIterator[Item]:
    """Each item of each page, fetching the next page only when the caller has taken
    this one's: a caller that stops early never pays for the pages it did not read."""
    token = ""
    while True:
        page = await fetch_page(token)
        for item in items_of(page):
            yield item
        token = page.next_page_token
        if not token:
            return
