"""Structured JSON logs with stable keys, one object per line on stderr.

Log records name jobs by id and kind and errors by class; payloads and handler
output never reach the log. The service's own records take structlog's direct
path (a few microseconds each; the runtime writes two per job). Libraries that
log through the standard `logging` module (alembic, grpc) are rendered as the
same JSON, with a `logger` key naming them.

A record with `exc_info` (a failed attempt's `job.failed`) gets its traceback as
an `exception` string from structlog's `format_exc_info`: Python's plain
rendering, files, lines and code only. Keep it so: renderers that show local
variables (`dict_tracebacks`, rich tracebacks) would put handlers' payloads in
the log (tests/system/test_structured_logs.py holds one in a local to check).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

import structlog

_SHARED: list[structlog.typing.Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.processors.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


# structlog's add_log_level, for the method names the service calls.
_LEVEL_NAMES = {"warn": "warning", "exception": "error"}


class _Timestamps:
    """ISO 8601 UTC stamps, as structlog's TimeStamper(fmt="iso", utc=True)
    writes them, with the date and time of day formatted once a second."""

    def __init__(self) -> None:
        self._second: tuple[int, str] = (-1, "")

    def now(self) -> str:
        now = time.time()
        whole = int(now)
        second = self._second  # one read: the writer thread logs too
        if second[0] != whole:
            second = (whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)))
            self._second = second
        return f"{second[1]}.{int((now - whole) * 1_000_000):06d}Z"


def _fallback(value: object) -> Any:
    """What JSONRenderer does with what json cannot encode."""
    structlog_form = getattr(value, "__structlog__", None)
    return structlog_form() if structlog_form is not None else repr(value)


class _Renderer:
    """add_log_level, the timestamp, format_exc_info and JSONRenderer in one
    processor: the runtime writes two records per job, and each processor
    structlog runs is a call and a lookup or two more."""

    def __init__(self) -> None:
        self._timestamps = _Timestamps()

    def __call__(self, logger: Any, method_name: str, event_dict: Any) -> str:
        if "exc_info" in event_dict:
            event_dict = structlog.processors.format_exc_info(logger, method_name, event_dict)
        event_dict["level"] = _LEVEL_NAMES.get(method_name, method_name)
        event_dict["timestamp"] = self._timestamps.now()
        return json.dumps(event_dict, default=_fallback)


def configure_logging(level: str = "info") -> None:
    threshold = logging.getLevelName(level.upper())
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, _Renderer()],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*_SHARED, structlog.stdlib.add_logger_name],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(threshold)
