"""`python -m bench.child SPEC.json`: run one bench function in a process of its own.

The spec names `module:function`, its keyword arguments, the event loop for an async function
(asyncio or uvloop) and a file for the JSON result. Load generators, watchers, seeders and the
in-process runtime all run this way, so none of them shares a CPU-bound interpreter with the bench
process or with each other, and each can be killed on a deadline.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if name == "asyncio":
        return asyncio.new_event_loop
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    raise ValueError(f"unknown event loop {name!r}")


def run(spec: dict[str, Any]) -> Any:
    module_name, _, function_name = str(spec["call"]).partition(":")
    function = getattr(importlib.import_module(module_name), function_name)
    kwargs = spec.get("kwargs", {})
    if inspect.iscoroutinefunction(function):
        with asyncio.Runner(loop_factory=loop_factory(spec.get("event_loop", "asyncio"))) as runner:
            return runner.run(function(**kwargs))
    return function(**kwargs)


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    result = run(spec)
    Path(spec["result"]).write_text(json.dumps({"result": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
