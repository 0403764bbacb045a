"""The public Python API: what `leasehold.worker` offers handler authors, and
that a job context never shows its payload or lease token."""

from __future__ import annotations

import importlib

import leasehold
import leasehold.worker
from leasehold._server.jobs.records import Lease
from leasehold.worker import JobContext

HANDLER_API = {"Handler", "HandlerRegistry", "JobCancelled", "JobContext", "LeaseLost", "PermanentError"}


def test_the_handler_api_is_exactly_what_leasehold_worker_exports() -> None:
    assert set(leasehold.worker.__all__) >= HANDLER_API
    for name in leasehold.worker.__all__:
        assert getattr(leasehold.worker, name) is not None


def test_the_built_in_examples_use_only_the_public_package() -> None:
    source = importlib.import_module("leasehold.examples").__loader__.get_source("leasehold.examples")  # type: ignore[union-attr]

    assert source is not None and "_server" not in source


def test_the_version_is_the_installed_distributions() -> None:
    from importlib.metadata import version

    assert leasehold.__version__ == version("leasehold")


def test_a_job_context_shows_no_payload_and_no_lease_token() -> None:
    context = JobContext(
        job_id="job_1",
        owner_id="alice",
        kind="example.echo",
        payload={"card": "4111-SECRET"},
        attempt=2,
        _lease=Lease(job_id="job_1", token="lease-token-SECRET", attempt=2),
        _repository=None,  # type: ignore[arg-type]  # repr never touches it
        _lease_seconds=30,
    )

    shown = repr(context)

    assert "SECRET" not in shown
    assert "job_1" in shown and "attempt=2" in shown
