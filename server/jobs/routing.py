"""Which jobs a claimer may take, by kind: the remote-kind patterns a server is
started with (`serve --remote-kinds`), and the filter each claim carries.

A pattern is an exact kind (`media.transcode`) or a prefix ending in `.*`
(`media.*`, every kind beginning `media.`). The in-process runtime claims every
kind no pattern matches, including kinds no handler serves any more, which then
fail through the normal path (DESIGN §3); a remote worker claims only the kinds
it names, each of which a pattern must match.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from leasehold._server.jobs import limits

WILDCARD = ".*"


@dataclass(frozen=True)
class KindPatterns:
    """Remote-kind patterns, checked: build with `KindPatterns.parse`."""

    exact: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()  # each ends in "."

    @classmethod
    def parse(cls, patterns: Iterable[str], field: str = "remote_kinds") -> KindPatterns:
        """Raises ValueError naming `field` for a pattern that is neither a kind
        nor a kind prefix followed by `.*`."""
        exact: set[str] = set()
        prefixes: set[str] = set()
        for pattern in patterns:
            if pattern.endswith(WILDCARD) and limits.is_valid_kind(pattern[: -len(WILDCARD)]):
                prefixes.add(pattern[:-1])
            elif limits.is_valid_kind(pattern):
                exact.add(pattern)
            else:
                raise ValueError(
                    f"{field}: {pattern!r} is neither a kind (1-128 characters of [a-z0-9._-]) "
                    "nor a prefix such as 'media.*'"
                )
        return cls(frozenset(exact), tuple(sorted(prefixes)))

    def __bool__(self) -> bool:
        return bool(self.exact or self.prefixes)

    def matches(self, kind: str) -> bool:
        return kind in self.exact or kind.startswith(self.prefixes)

    def describe(self) -> list[str]:
        return sorted(self.exact) + [prefix + "*" for prefix in self.prefixes]


NO_PATTERNS = KindPatterns()


@dataclass(frozen=True)
class KindFilter:
    """The kinds one claim may take: only those named (a remote worker's), or
    every kind the patterns do not match (the in-process runtime's)."""

    only: frozenset[str] | None = None
    excluding: KindPatterns = NO_PATTERNS

    def admits(self, kind: str) -> bool:
        if self.only is not None and kind not in self.only:
            return False
        return not self.excluding.matches(kind)

    @property
    def shape(self) -> KindFilter:
        """What a claim statement depends on: the names in `only` travel as a
        parameter, so every remote claim shares one statement."""
        return KindFilter(only=None if self.only is None else frozenset(), excluding=self.excluding)


ANY_KIND = KindFilter()


class LocalKinds(Protocol):
    """The kinds in-process handlers serve (the handler registry), read on
    every call: a registry may gain kinds after the server is built."""

    def __contains__(self, kind: object) -> bool: ...

    def kinds(self) -> frozenset[str]: ...


# How many served kinds a refusal names: enough to spot a typo, bounded however
# many handlers a server has.
NAMED_KINDS = 10


@dataclass(frozen=True)
class ServedKinds:
    """What this server accepts jobs of: every kind a local handler serves,
    and every kind a remote-kind pattern matches. `served(kind)` says whether
    one is; `named()` lists some, for a refusal to show."""

    local: LocalKinds
    remote: KindPatterns = NO_PATTERNS

    def __call__(self, kind: str) -> bool:
        return kind in self.local or self.remote.matches(kind)

    def named(self) -> str:
        """Up to NAMED_KINDS of them, local kinds then remote patterns, sorted."""
        every = sorted(self.local.kinds()) + self.remote.describe()
        if not every:
            return "this server serves no kind (start it with --handlers or --remote-kinds)"
        shown = ", ".join(every[:NAMED_KINDS])
        more = len(every) - NAMED_KINDS
        return f"this server serves {shown}" + (f" and {more} more" if more > 0 else "")

    def refusal(self, kind: str) -> str:
        """Why a job of `kind` is refused here."""
        return f"no handler is registered for kind {kind!r}; {self.named()}"
