"""The process's heap after startup: out of the cyclic garbage collector's way.

A full (generation 2) collection walks every object the collector tracks. By the time
`serve` or `leasehold worker` is up, the modules it imported (grpc, protobuf,
SQLAlchemy, the handlers' own) hold about a hundred thousand such objects that live as
long as the process, and every full collection walked them all again: tens of
milliseconds on a two-core machine, with the event loop, every watch stream and every
running handler stopped meanwhile, several times a minute under load. Those pauses were
the tail of the live-lag figures.

`gc.freeze()` moves what exists now into a permanent generation the collector skips;
what the service allocates afterwards (jobs, calls, streams) is collected as before.

The youngest generation is collected after 10,000 net new container objects rather than
Python's 700. With a thousand streams and jobs alive, the objects of calls and attempts
still in flight survived those frequent young collections, were promoted, and made the
full collections come round again (a trace of `serve` under 1,000 watched jobs showed a
full collection every few seconds and younger ones of several milliseconds many times a
second). At 10,000 most of them are gone by the time a collection looks, and a young
collection still walks no more than about 10,000 objects; 50,000 measured no better.

All of this belongs to the program that owns the process, never to a library class:
`LeaseholdApp` and `Worker` also run inside other programs (tests, embedding
services), whose heaps are theirs to manage.
"""

from __future__ import annotations

import gc

# Net new container objects between young collections (Python's default: 700).
YOUNG_COLLECTION_THRESHOLD = 10_000


def settle_after_startup() -> int:
    """Collect startup's garbage, freeze the survivors and space out the young
    collections; how many objects are frozen.

    The collection first, so that what startup discarded is freed rather than kept
    for ever in the permanent generation.
    """
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, oldest)
    return gc.get_freeze_count()
