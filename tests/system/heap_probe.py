"""A kind that reports its process's heap: `test.heap` returns
`{"frozen": gc.get_freeze_count(), "young_threshold": gc.get_threshold()[0]}`: how
many objects sit in the permanent generation the cyclic collector skips, and after how
many new objects it collects the youngest generation (server/gc_tuning.py). Loaded by `serve` and by
`leasehold worker` in tests/system/test_heap.py."""

from __future__ import annotations

import gc

from leasehold.worker import HandlerRegistry, JobContext


async def heap(ctx: JobContext) -> dict[str, object]:
    return {"frozen": gc.get_freeze_count(), "young_threshold": gc.get_threshold()[0]}


def register(registry: HandlerRegistry) -> None:
    registry.register("test.heap", heap)
