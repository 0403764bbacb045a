"""Whether this process's writes reach a writable database.

The writer reports after each batch that tried: a COMMIT reached it, or the
connection could not be made or broke. Only a change is passed on, to whoever
watches (`server.runtime.database_watch`: health, the log, a probe).
"""

from __future__ import annotations

from collections.abc import Callable


class Reachability:
    def __init__(self) -> None:
        self.reachable = True
        self._watchers: list[Callable[[bool], None]] = []

    def watch(self, on_change: Callable[[bool], None]) -> None:
        """Call `on_change` (on the event loop) each time reachability flips."""
        self._watchers.append(on_change)

    def report(self, reachable: bool) -> None:
        if reachable == self.reachable:
            return
        self.reachable = reachable
        for on_change in self._watchers:
            on_change(reachable)
