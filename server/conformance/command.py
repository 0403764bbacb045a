"""`leasehold worker-conformance`: run a worker under the conformance rules.

    leasehold worker-conformance [--kind K] [--rules R...] [--timeout-seconds S] -- COMMAND [ARGS...]

Prints one verdict line per rule and a summary; exit status 0 when no rule
failed (a skipped one does not fail), 1 when one did, 2 for bad usage. Unlike
the other commands, its flags do not come from LEASEHOLD_* variables: the
environment is the worker's, and LEASEHOLD_SERVER, LEASEHOLD_WORKER_TOKEN and
LEASEHOLD_KIND in it are set by this command.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from leasehold._server.conformance.proxy import WorkerServiceProxy
from leasehold._server.conformance.rules import FAIL, PASS, RULES, SKIP, Stage, Verdict
from leasehold._server.conformance.stage import Jobs, Server, WorkerProcess, worker_token

EXIT_CONFIG = 2
DEFAULT_KIND = "conformance.run"
DEFAULT_TIMEOUT_SECONDS = 300.0
DESCRIPTION = f"""Run a worker under test against a real, temporary Leasehold server through a proxy
that plays the server's tricks on it, and print one PASS, FAIL or SKIP line per rule.
COMMAND starts the worker; it gets LEASEHOLD_SERVER, LEASEHOLD_WORKER_TOKEN and LEASEHOLD_KIND
and must run the conformance handler for that kind (docs/protocol.md, Conformance).
Rules, in the order they are played: {", ".join(RULES)}.
Exit status 0 when no rule failed, 1 when one did, 2 for bad usage."""


class UsageError(Exception):
    """A flag or the command is wrong; the message names it."""


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `worker-conformance` subcommand's flags, on the top-level subparsers."""
    parser = commands.add_parser(
        "worker-conformance",
        help="check that a worker in any language follows the worker protocol",
        description=DESCRIPTION,
        usage="leasehold worker-conformance [--kind K] [--rules RULE...] [--timeout-seconds S] "
        "-- COMMAND [ARGS...]",
    )
    parser.add_argument(
        "--kind",
        metavar="K",
        help=f"the kind the worker runs the conformance handler for (default {DEFAULT_KIND})",
    )
    parser.add_argument(
        "--rules", nargs="+", metavar="RULE", help="play only these rules (default: every rule)"
    )
    parser.add_argument(
        "--timeout-seconds",
        metavar="S",
        help="the most the whole run may take; rules not done by then fail "
        f"(default {DEFAULT_TIMEOUT_SECONDS:g})",
    )
    # Not `command`: the top-level parser keeps the subcommand's name there.
    parser.add_argument(
        "worker_command", nargs=argparse.REMAINDER, metavar="COMMAND", help="the worker to run, after --"
    )


def main(args: argparse.Namespace) -> int:
    """Play the rules; the process's exit status."""
    try:
        command, kind, rules, timeout = _usage(args)
    except UsageError as exc:
        print(f"leasehold: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        verdicts = asyncio.run(conform(command, kind, rules, timeout))
    except FileNotFoundError as exc:
        print(f"leasehold: COMMAND: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return EXIT_CONFIG
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("leasehold: stopped before every rule was played", file=sys.stderr)
        return 1
    except RuntimeError as exc:  # the server it plays on did not start
        print(f"leasehold: {exc}", file=sys.stderr)
        return 1
    return 1 if any(verdict.outcome == FAIL for verdict in verdicts) else 0


def _usage(args: argparse.Namespace) -> tuple[list[str], str, list[str], float]:
    command = list(args.worker_command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError(
            "COMMAND: give the worker to run after --, e.g. -- leasehold worker --handlers MODULE"
        )
    unknown = [rule for rule in args.rules or () if rule not in RULES]
    if unknown:
        raise UsageError(f"--rules: no rule named {', '.join(unknown)}; the rules are {', '.join(RULES)}")
    # Played in their own order whatever the order given: drain must come last.
    rules = [rule for rule in RULES if args.rules is None or rule in args.rules]
    try:
        timeout = float(args.timeout_seconds) if args.timeout_seconds is not None else DEFAULT_TIMEOUT_SECONDS
    except ValueError:
        raise UsageError(f"--timeout-seconds: expected a number, got {args.timeout_seconds!r}") from None
    if not timeout > 0:
        raise UsageError("--timeout-seconds: must be more than 0")
    kind = args.kind or DEFAULT_KIND
    return command, kind, rules, timeout


async def conform(command: Sequence[str], kind: str, rules: Sequence[str], timeout: float) -> list[Verdict]:
    """Start the stage, play `rules` in order, print each verdict as it comes."""
    started = time.monotonic()
    deadline = started + timeout
    verdicts: list[Verdict] = []
    # SIGTERM ends the run as Ctrl-C does: the finally below still stops the
    # worker's process group and the server, which would otherwise outlive it.
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    with tempfile.TemporaryDirectory(prefix="leasehold-conformance-") as name:
        directory = Path(name)
        token = worker_token()
        server = Server(directory, kind, token)
        proxy = WorkerServiceProxy(server.address)
        worker = WorkerProcess(command, {}, directory / "worker.log")
        try:
            await server.start()
            port = await proxy.start()
            env = dict(os.environ)
            env.update(
                LEASEHOLD_SERVER=f"127.0.0.1:{port}", LEASEHOLD_WORKER_TOKEN=token, LEASEHOLD_KIND=kind
            )
            worker = WorkerProcess(command, env, directory / "worker.log")
            await worker.start()
            async with Jobs(server.address) as jobs:
                stage = Stage(kind, server, proxy, worker, jobs)
                for rule in rules:
                    verdict = await _play(stage, rule, deadline)
                    verdicts.append(verdict)
                    print(f"{verdict.outcome} {rule}: {verdict.reason}", flush=True)
        finally:
            await worker.stop()
            await proxy.stop()
            await server.stop()
            if any(verdict.outcome == FAIL for verdict in verdicts):
                print(f"--- the worker's last output ---\n{worker.tail()}", file=sys.stderr, flush=True)
    counts = {outcome: sum(v.outcome == outcome for v in verdicts) for outcome in (PASS, FAIL, SKIP)}
    print(
        f"worker conformance: {counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped "
        f"of {len(verdicts)} rules in {time.monotonic() - started:.0f} s",
        flush=True,
    )
    return verdicts


async def _play(stage: Stage, rule: str, deadline: float) -> Verdict:
    left = deadline - time.monotonic()
    if left <= 0:
        return Verdict(rule, FAIL, "not played: --timeout-seconds ran out")
    try:
        async with asyncio.timeout(left):
            await stage.ensure_worker()
            return await RULES[rule](stage)
    except TimeoutError:
        return Verdict(rule, FAIL, "did not finish before --timeout-seconds ran out")
