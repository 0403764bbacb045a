"""Which kinds get a metrics series of their own.

A kind is the caller's to name: under `--remote-kinds 'remote.*'` an owner can
invent as many as they like, and each would be a new series of every
kind-labelled metric, on every scrape, for the life of the process. So a kind
is its own label value only when the operator chose it: a kind an in-process
handler serves (the handler registry), a kind `--remote-kinds` names exactly
(not by a prefix), or a kind `--metrics-kinds` matches. Every other kind is
counted under `OTHER_KIND`, which keeps the totals right and the series few.

`KindLabels.__call__` is the one place a kind becomes a label value; every
instrument and the queue gauges go through it.
"""

from __future__ import annotations

from dataclasses import dataclass

from leasehold._server.jobs.routing import NO_PATTERNS, KindPatterns, LocalKinds

# Not a kind anyone needs to see apart: a real kind named `other` shares it.
OTHER_KIND = "other"


class _NoLocalKinds:
    def __contains__(self, kind: object) -> bool:
        return False

    def kinds(self) -> frozenset[str]:
        return frozenset()


@dataclass(frozen=True)
class KindLabels:
    """`labels(kind)`: the label value a job of `kind` is counted under."""

    local: LocalKinds = _NoLocalKinds()
    chosen: KindPatterns = NO_PATTERNS

    @classmethod
    def of(cls, local: LocalKinds, remote: KindPatterns, metrics: KindPatterns) -> KindLabels:
        """The registry's kinds, the remote kinds named exactly, and whatever
        the `--metrics-kinds` patterns match."""
        chosen = KindPatterns(remote.exact | metrics.exact, metrics.prefixes)
        return cls(local, chosen)

    def __call__(self, kind: str) -> str:
        # The registry is read on every call: it may gain kinds after start.
        if kind in self.local or self.chosen.matches(kind):
            return kind
        return OTHER_KIND
