"""The process's heap after startup: out of the cyclic garbage collector's way.

A full (generation 2) collection walks every object the collector tracks. By the time
`serve` or `leasehold worker` is up, the modules it imported (grpc, protobuf,
SQLAlchemy, the handlers' own) hold about a hundred thousand such objects that live as
long as the process, and every full collection walked them all again: tens of
milliseconds on a two-core machine, with the event loop, every watch stream and every
running handler stopped meanwhile, a few times a minute under load. Those pauses were
the tail of the live-lag figures.

`gc.freeze()` moves what exists now into a permanent generation the collector skips;
what the service allocates afterwards (jobs, calls, streams) is collected as before.
It belongs to the program that owns the process, never to a library class:
`LeaseholdApp` and `Worker` also run inside other programs (tests, embedding
services), whose heaps are theirs to manage.
"""

from __future__ import annotations

import gc


def settle_after_startup() -> int:
    """Collect startup's garbage, then freeze the survivors; how many are frozen.

    The collection first, so that what startup discarded is freed rather than kept
    for ever in the permanent generation.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
