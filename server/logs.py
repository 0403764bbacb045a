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

The exception's own message is the handler author's words and is logged with
it, unless `--redact-error-messages` is on or the handler marked it
`private_message`: then the traceback names each exception's type only.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import traceback
from types import TracebackType
from typing import Any

import structlog

from leasehold._server.defaults import env_true
from leasehold._server.jobs.errors import has_private_message

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

    def __init__(self, redact_error_messages: bool) -> None:
        self._timestamps = _Timestamps()
        self._redact = redact_error_messages

    def __call__(self, logger: Any, method_name: str, event_dict: Any) -> str:
        if "exc_info" in event_dict:
            exc = _exception(event_dict["exc_info"])
            if exc is not None and (self._redact or has_private_message(exc)):
                del event_dict["exc_info"]
                event_dict["exception"] = traceback_without_messages(exc)
            else:
                event_dict = structlog.processors.format_exc_info(logger, method_name, event_dict)
        event_dict["level"] = _LEVEL_NAMES.get(method_name, method_name)
        event_dict["timestamp"] = self._timestamps.now()
        return json.dumps(event_dict, default=_fallback)


def _exception(exc_info: object) -> BaseException | None:
    """The exception an `exc_info` value names: the exception itself, an
    exc_info tuple, or True for the one being handled."""
    if isinstance(exc_info, BaseException):
        return exc_info
    if isinstance(exc_info, tuple) and len(exc_info) == 3 and isinstance(exc_info[1], BaseException):
        return exc_info[1]
    if exc_info is True:
        return sys.exception()
    return None


_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def traceback_without_messages(exc: BaseException) -> str:
    """Python's traceback of `exc` and the exceptions it was raised from, each
    ending with its type alone: the frames (file, line, code) say where it
    failed, while the messages, which may quote what a caller sent, are left
    out. Notes and the members of exception groups are left out likewise."""
    # Newest first, each with the line that says how it follows the older one.
    chain: list[tuple[BaseException, str]] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if current.__cause__ is not None:
            chain.append((current, _CAUSE))
            current = current.__cause__
        elif current.__context__ is not None and not current.__suppress_context__:
            chain.append((current, _CONTEXT))
            current = current.__context__
        else:
            chain.append((current, ""))
            current = None
    parts: list[str] = []
    for one, link in reversed(chain):  # oldest first, as Python prints them
        parts.append(link)
        parts.append(_one_without_message(one, one.__traceback__))
    return "".join(parts).rstrip("\n")


def _one_without_message(exc: BaseException, tb: TracebackType | None) -> str:
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    frames = "".join(traceback.format_tb(tb)) if tb is not None else ""
    head = "Traceback (most recent call last):\n" if frames else ""
    return f"{head}{frames}{name} (message redacted)\n"


def redact_flag(parser: argparse.ArgumentParser) -> None:
    """`--redact-error-messages`, for `serve` and `worker` alike."""
    parser.add_argument(
        "--redact-error-messages",
        action="store_true",
        default=None,
        help="log failed attempts' tracebacks without exception messages (the job keeps them)",
    )


def redact_requested(args: argparse.Namespace) -> bool:
    """The flag, or LEASEHOLD_REDACT_ERROR_MESSAGES=1."""
    return bool(args.redact_error_messages) or env_true("REDACT_ERROR_MESSAGES")


def configure_logging(level: str = "info", *, redact_error_messages: bool = False) -> None:
    """JSON records on stderr from `level` up. `redact_error_messages` leaves
    every exception's message out of the tracebacks logged (DESIGN's log
    promise: the job's `error_message` still has it, for its owner)."""
    threshold = logging.getLevelName(level.upper())
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, _Renderer(redact_error_messages)],
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
