"""Many rows into one table in one statement, the cheapest way each engine has.

SQLite's executemany runs in C and costs a few microseconds a row. psycopg's
executemany (which SQLAlchemy uses for PostgreSQL) adapts every parameter of
every row in Python, 25-33 µs a row: for a drain that writes two events a job,
the largest single cost of the writer thread. On PostgreSQL the rows therefore
travel as one JSON array, which the server unpacks with
`json_to_recordset` into the table's own column types: one parameter
however many rows, 6-7 µs a row.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import JSON, Table, insert
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection

from leasehold._server.jobs.sql.tables import UtcTimestamp


class BulkInsert:
    """`insert(conn, rows)`: rows are dicts of column values, as for `insert(table)`;
    every row names the same columns (`columns`).

    A JSON column's value travels as its serialized text and is cast back to
    JSON by the server: unpacked as a nested JSON value instead, a string
    holding U+0000 (which JSON may carry, and a payload may hold) would be
    refused as text PostgreSQL cannot store."""

    def __init__(self, table: Table, columns: Sequence[str]) -> None:
        self._statement = insert(table)
        self._columns = tuple(columns)
        dialect = postgresql.dialect()
        # Values JSON cannot carry as the column expects, turned into what it can.
        self._encoders: dict[str, Callable[[Any], Any]] = {}
        definitions, selected = [], []
        for name in self._columns:
            column_type = table.c[name].type
            if isinstance(column_type, UtcTimestamp):
                self._encoders[name] = _timestamp_encoder(column_type)
            if isinstance(column_type, JSON):
                self._encoders[name] = _json_text
                definitions.append(f"{name} text")
                selected.append(f"{name}::json")
            else:
                definitions.append(f"{name} {column_type.compile(dialect=dialect)}")
                selected.append(name)
        self._postgres = (
            f"INSERT INTO {table.name} ({', '.join(self._columns)}) SELECT {', '.join(selected)} "
            f"FROM json_to_recordset(%s::json) AS incoming({', '.join(definitions)})"
        )

    def __call__(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        if conn.dialect.name != "postgresql":
            conn.execute(self._statement, rows)
            return
        encoders = self._encoders
        encoded = [
            {name: (encoders[name](row[name]) if name in encoders else row[name]) for name in self._columns}
            for row in rows
        ]
        conn.exec_driver_sql(self._postgres, (json.dumps(encoded, separators=(",", ":")),))


def _json_text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _timestamp_encoder(column_type: UtcTimestamp) -> Callable[[Any], Any]:
    def encode(value: Any) -> Any:
        return column_type.process_bind_param(value, None)  # type: ignore[arg-type]

    return encode
