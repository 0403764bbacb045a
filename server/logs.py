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

import logging
import sys

import structlog

_SHARED: list[structlog.typing.Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.processors.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def configure_logging(level: str = "info") -> None:
    threshold = logging.getLevelName(level.upper())
    structlog.configure(
        processors=[*_SHARED, structlog.processors.format_exc_info, structlog.processors.JSONRenderer()],
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
