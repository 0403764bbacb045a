"""The instruments, on a registry of their own per app.

Labels are the job's kind, its final status, and an RPC's method and status
code: small, bounded sets. A kind becomes a label only through `kind_label`
(kind_labels.py: kinds the operator did not choose are `other`), so the
kind-labelled instruments are reached through the methods below, never
directly. Owner ids (unbounded, and private), payloads, results and tokens
never become labels.
"""

from __future__ import annotations

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from leasehold._server.metrics.kind_labels import KindLabels

# Waits run from milliseconds (an idle worker) to hours (a backlog); handlers
# from a few milliseconds to the longest timeout a job may ask for.
WAIT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600)
RUN_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600)


class Metrics:
    """Every instrument Leasehold keeps in process. The registry is this
    object's own, not prometheus-client's global default, so that several apps
    in one process (tests, an embedding program) never add into each other."""

    def __init__(self, kind_label: KindLabels | None = None) -> None:
        """`kind_label`: the label value each kind is counted under (none
        given: every kind is `other`)."""
        self.kind_label = kind_label or KindLabels()
        self.registry = CollectorRegistry()
        registry = self.registry
        self.jobs_enqueued = Counter(
            "leasehold_jobs_enqueued", "Jobs this process created.", ["kind"], registry=registry
        )
        self.jobs_finished = Counter(
            "leasehold_jobs_finished",
            "Jobs this process moved to a final status (succeeded, failed, cancelled).",
            ["kind", "status"],
            registry=registry,
        )
        self.attempts_failed = Counter(
            "leasehold_attempts_failed",
            "Attempts whose handler failed, retried or not.",
            ["kind"],
            registry=registry,
        )
        self.lease_expired = Counter(
            "leasehold_lease_expired",
            "Expired leases this process recovered: a worker stalled or went away.",
            ["kind"],
            registry=registry,
        )
        self.stale_writes_rejected = Counter(
            "leasehold_stale_writes_rejected",
            "Worker writes refused because their lease was lost (fencing at work).",
            registry=registry,
        )
        self.storage_errors = Counter(
            "leasehold_storage_errors",
            "Storage calls that failed: the database was unavailable or full.",
            registry=registry,
        )
        self.job_wait = Histogram(
            "leasehold_job_wait_seconds",
            "From when an attempt was due to when a worker started it.",
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.job_run = Histogram(
            "leasehold_job_run_seconds",
            "From an attempt's start to its end, as its worker reported it.",
            buckets=RUN_BUCKETS,
            registry=registry,
        )
        self.watch_streams = Gauge(
            "leasehold_watch_streams", "WatchEvents streams open now.", registry=registry
        )
        self.grpc_requests = Counter(
            "leasehold_grpc_requests",
            "RPCs answered, by method and final status code.",
            ["method", "code"],
            registry=registry,
        )

    def enqueued(self, kind: str) -> None:
        self.jobs_enqueued.labels(kind=self.kind_label(kind)).inc()

    def finished(self, kind: str, status: str) -> None:
        self.jobs_finished.labels(kind=self.kind_label(kind), status=status).inc()

    def attempt_failed(self, kind: str) -> None:
        self.attempts_failed.labels(kind=self.kind_label(kind)).inc()

    def lease_recovered(self, kind: str) -> None:
        self.lease_expired.labels(kind=self.kind_label(kind)).inc()

    def rpc_finished(self, method: str, code: grpc.StatusCode) -> None:
        """One RPC's final status (method_handlers calls it for every RPC)."""
        self.grpc_requests.labels(method=method, code=code.name).inc()
