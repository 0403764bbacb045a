"""The seams between the operations and the engines, held by tests that fail
when one is crossed: the in-memory engine needs no SQL library, and the job
columns the domain knows are the schema's."""

from __future__ import annotations

import subprocess
import sys

from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.sql.tables import jobs
from tests.system.helpers import child_env


def test_the_in_memory_engine_and_the_operations_import_no_sqlalchemy() -> None:
    # A fresh interpreter: this one has SQLAlchemy loaded by other tests.
    probe = (
        "import sys, leasehold._server.jobs.memory, leasehold._server.jobs.operations.repository;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sqlalchemy'"
        " or m.startswith('leasehold._server.jobs.sql')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], env=child_env(), capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]", out


def test_the_domain_knows_every_column_of_the_schema_in_its_order() -> None:
    assert sm.JOB_COLUMNS == tuple(jobs.c.keys())
