"""Logged tracebacks without exception messages: under --redact-error-messages
for every exception, and always for one a handler marked `private_message`."""

from __future__ import annotations

import json
import traceback

import pytest

from leasehold._server.logs import _Renderer, traceback_without_messages
from leasehold.worker import private_message

SECRET = "card 4242 declined for bob@example.com"


def _lookup(document: dict[str, str]) -> str:
    return document["missing"]


def _chained() -> BaseException:
    """A ValueError raised from a KeyError, during the handling of which a
    RuntimeError was raised: every message quotes SECRET."""
    try:
        try:
            try:
                _lookup({SECRET: SECRET})
            except KeyError as exc:
                raise ValueError(SECRET) from exc
        except ValueError:
            raise RuntimeError(SECRET)  # noqa: B904 (the implicit context is the point)
    except RuntimeError as exc:
        return exc
    raise AssertionError("unreachable")


def test_the_redacted_traceback_keeps_types_frames_and_links_but_no_message() -> None:
    exc = _chained()
    full = "".join(traceback.format_exception(exc))
    assert SECRET in full  # so its absence below means something

    redacted = traceback_without_messages(exc)

    assert SECRET not in redacted
    # The same frames, in the same order, as Python prints them.
    frame_lines = [line for line in full.splitlines() if line.lstrip().startswith("File ")]
    assert [line for line in redacted.splitlines() if line.lstrip().startswith("File ")] == frame_lines
    assert "in _lookup" in redacted
    kinds = [line for line in redacted.splitlines() if line.endswith("(message redacted)")]
    assert kinds == [
        "KeyError (message redacted)",
        "ValueError (message redacted)",
        "RuntimeError (message redacted)",
    ]
    assert redacted.index("direct cause") < redacted.index("During handling")


def test_a_suppressed_context_and_a_cycle_are_followed_as_python_does() -> None:
    try:
        try:
            raise KeyError(SECRET)
        except KeyError:
            raise ValueError(SECRET) from None
    except ValueError as exc:
        suppressed = exc
    assert "KeyError" not in traceback_without_messages(suppressed)

    first, second = ValueError(SECRET), TypeError(SECRET)
    first.__context__, second.__context__ = second, first
    assert traceback_without_messages(first).count("(message redacted)") == 2


def test_an_exception_defined_outside_builtins_is_named_with_its_module() -> None:
    class PaymentDeclined(Exception):
        pass

    text = traceback_without_messages(PaymentDeclined(SECRET))
    assert text == f"{__name__}.{PaymentDeclined.__qualname__} (message redacted)"


def _render(redact: bool, exc: BaseException) -> dict[str, object]:
    line = _Renderer(redact)(None, "error", {"event": "job.failed", "exc_info": exc})
    record = json.loads(line)
    assert isinstance(record, dict)
    return record


@pytest.mark.parametrize("redact", [False, True])
def test_the_renderer_redacts_under_the_flag_and_for_private_messages(redact: bool) -> None:
    plain = _render(redact, _chained())
    assert (SECRET in str(plain["exception"])) is not redact
    assert str(plain["exception"]).startswith("Traceback (most recent call last):")

    marked = _render(redact, private_message(_chained()))
    assert SECRET not in str(marked["exception"])
    assert str(marked["exception"]).endswith("RuntimeError (message redacted)")


def test_private_message_keeps_the_exception_as_it_was() -> None:
    exc = RuntimeError(SECRET)
    assert private_message(exc) is exc
    assert str(exc) == SECRET  # the job's error_message still has it


@pytest.mark.parametrize("command", [["serve"], ["worker", "--server", "h:1", "--handlers", "m"]])
def test_serve_and_worker_take_the_flag_or_the_environment(
    command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from leasehold._server.cli import main, serve, worker

    monkeypatch.setenv("LEASEHOLD_WORKER_TOKEN", "t" * 32)
    monkeypatch.delenv("LEASEHOLD_REDACT_ERROR_MESSAGES", raising=False)

    def redacting(*flags: str) -> bool:
        args = main.parser().parse_args([*command, *flags])
        settings = serve.settings_from(args) if command == ["serve"] else worker.settings_from(args)
        return settings.redact_error_messages

    assert redacting() is False
    assert redacting("--redact-error-messages") is True
    monkeypatch.setenv("LEASEHOLD_REDACT_ERROR_MESSAGES", "1")
    assert redacting() is True
