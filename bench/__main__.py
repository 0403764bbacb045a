"""`python -m bench`: the benchmark suite, every baseline and every Leasehold figure, on SQLite
and on PostgreSQL.

    python -m bench [--rounds 3] [--only GROUP ...] [--quick] [--out FILE] [--no-postgres]

The PostgreSQL groups (pgqueuer, pg_drain, pg_trickle, pg_cross_replica) run on one durable throwaway
PostgreSQL cluster the bench starts from the installed binaries (initdb, pg_ctl; found on PATH or
in /usr/lib/postgresql/N/bin). Without them those groups crash with an `error` line saying so;
`--no-postgres` (or `--only` without them) leaves them out.

stdout carries JSON lines only:

* `{"kind": "figure", "figure", "round", "value", "unit", "side", "params"}`: one per figure and
  round (`side` is "baseline" or "leasehold");
* `{"kind": "skipped", ...}`: a figure this build cannot measure (e.g. no `--event-loop` flag);
* `{"kind": "error", "group", "round", "error", "traceback"}`: a group that crashed;
* `{"kind": "target", "target", "figure", "goal", "measured", "baseline", "pass", "status",
  "rounds", "figure_values", "baseline_values", ...}`: one per target, after the last round;
  `measured` is the median of the per-round ratios (or values), `rounds` lists them;
* `{"kind": "summary", "wall_seconds", ...}` last.

stderr carries progress lines and, at the end, the targets table. `--out FILE` also writes the
JSON lines to FILE. The exit status is 0 whether targets pass or fail (a benchmark is a
measurement) and 1 if any group crashed. `--quick` runs tiny sizes for one round (the smoke test).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

from bench.common import Emitter
from bench.context import FULL, QUICK
from bench.suite import GROUP_NAMES, GROUPS, run_suite


def _parser() -> argparse.ArgumentParser:
    groups = "\n".join(f"  {group.name:<16} {group.about}" for group in GROUPS)
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        epilog="groups:\n" + groups,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="rounds per group (default 3; 1 with --quick)"
    )
    parser.add_argument(
        "--only", nargs="+", choices=GROUP_NAMES, metavar="GROUP", help="run only these groups"
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 1 round: a smoke run")
    parser.add_argument("--out", help="also write the JSON lines to this file")
    parser.add_argument(
        "--keep", action="store_true", help="keep the work directory (logs, stamps, databases)"
    )
    parser.add_argument("--no-uvloop", action="store_true", help="skip the uvloop figures (h)")
    parser.add_argument(
        "--no-postgres",
        action="store_true",
        help="skip the PostgreSQL groups unless --only names them",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    options = _parser().parse_args(argv)
    rounds = options.rounds if options.rounds is not None else (1 if options.quick else 3)
    if rounds < 1:
        print("--rounds: must be at least 1", file=sys.stderr)
        return 2
    sizes = QUICK if options.quick else FULL
    # SIGTERM (e.g. a CI timeout) unwinds like Ctrl-C, so every child process is stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    out = open(options.out, "w") if options.out else None  # noqa: SIM115 - closed below
    try:
        return run_suite(
            rounds,
            sizes,
            options.only,
            Emitter(out),
            uvloop=not options.no_uvloop,
            keep=options.keep,
            postgres=not options.no_postgres,
        )
    finally:
        if out is not None:
            out.close()


if __name__ == "__main__":
    sys.exit(main())
