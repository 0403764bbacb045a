"""What a command prints: rich tables for people, or JSON for programs (one object
per line, as json_format.MessageToDict renders the message, integral numbers as
integers: `{"attempt":1}`, not `1.0`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from google.protobuf import timestamp_pb2
from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table
from rich.text import Text

from leasehold.client import to_dict

WIDE = 1000


class Output:
    def __init__(self, mode: str) -> None:
        self.json = mode == "json"
        self.console = Console(highlight=False)
        if not self.console.is_terminal:
            # Piped, rich would squeeze tables into 80 columns and cut ids short:
            # as wide as the rows need instead, so every value can be copied whole.
            self.console = Console(highlight=False, width=WIDE)

    def message(self, message: Message) -> None:
        self.line(to_dict(message))

    def line(self, value: dict[str, Any]) -> None:
        print(json.dumps(value, separators=(",", ":"), sort_keys=True), flush=True)

    def table(self, headers: Sequence[str], rows: Iterable[Sequence[str]], title: str | None = None) -> None:
        table = Table(*headers, title=title, title_justify="left", box=None, header_style="bold")
        for row in rows:
            # Cells are data, never rich markup: an error message with
            # brackets is shown as it is.
            table.add_row(*(Text(cell) for cell in row))
        self.console.print(table)

    def fields(self, pairs: Iterable[tuple[str, str]]) -> None:
        """One record, a field a line; empty fields left out."""
        self.table(("FIELD", "VALUE"), ((name, value) for name, value in pairs if value))

    def text(self, text: str) -> None:
        self.console.print(text, markup=False)


def when(message: Message, field: str) -> str:
    """A Timestamp field as RFC 3339 (UTC, seconds), or "" when unset."""
    if not message.HasField(field):
        return ""
    value: timestamp_pb2.Timestamp = getattr(message, field)
    return value.ToJsonString().split(".")[0].removesuffix("Z") + "Z"


def struct_text(message: Message, field: str) -> str:
    """A Struct field as compact JSON, integral numbers shown as integers (a Struct
    holds every number as a double: `attempt: 1`, not `1.0`)."""
    if not message.HasField(field):
        return ""
    return json.dumps(to_dict(getattr(message, field)), separators=(",", ":"))
