"""Telling the planners which index a question means.

A claim asks, per priority, for the first and last owner with a due job, in
owner order: a seek at each end of `ix_jobs_claim_order` (status, priority,
owner_id, ...). SQLite, offered `available_at <= :now` as well, prefers the
range of `ix_jobs_status_available_at` (status, available_at) instead, with or
without ANALYZE's statistics, and then reads every due job of the queue and
sorts them to answer a question about one row: a claim's cost grew with the
backlog. SQLAlchemy's SQLite dialect renders no `INDEXED BY`, so the comparison
is written the way SQLite's documentation gives for keeping a term out of index
selection, a unary `+` on the column; the term still filters the rows the seek
walks. PostgreSQL plans these statements well as they are and gets the column
unchanged.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.functions import FunctionElement


class not_an_index_bound(FunctionElement[Any]):  # noqa: N801 - named like SQL's own functions
    """`column`, which SQLite must not choose an index by."""

    inherit_cache = True
    name = "not_an_index_bound"

    def __init__(self, column: ColumnElement[Any]) -> None:
        super().__init__(column)
        self.type = column.type


@compiles(not_an_index_bound)
def _as_is(element: not_an_index_bound, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.clauses, **kw)


@compiles(not_an_index_bound, "sqlite")
def _unary_plus(element: not_an_index_bound, compiler: SQLCompiler, **kw: Any) -> str:
    return f"+{compiler.process(element.clauses, **kw)}"


class seek_by_key_only(FunctionElement[Any]):  # noqa: N801 - named like SQL's own functions
    """`column` (a text column), which neither database may choose an index
    by: a statement that names rows by key (jobs by id, edges by parent) and
    also filters on a column as unselective as `status` or `owner_id`.

    Without statistics SQLite walks an index on the filter column (every queued
    or succeeded job) instead of seeking the few keys; PostgreSQL may do the
    same in a generic plan it cached for a prepared statement while the table
    was small, and keep it as the table grows. Out of index selection, the
    filter still applies to the rows the key seeks find."""

    inherit_cache = True
    name = "seek_by_key_only"

    def __init__(self, column: ColumnElement[Any]) -> None:
        super().__init__(column)
        self.type = column.type


@compiles(seek_by_key_only, "sqlite")
def _sqlite_unary_plus(element: seek_by_key_only, compiler: SQLCompiler, **kw: Any) -> str:
    return f"+{compiler.process(element.clauses, **kw)}"


@compiles(seek_by_key_only)
def _concatenated(element: seek_by_key_only, compiler: SQLCompiler, **kw: Any) -> str:
    # An expression over the column: no index on the column serves it.
    return f"({compiler.process(element.clauses, **kw)} || '')"
