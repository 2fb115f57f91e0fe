"""A stand-in for ps.service_calls.CallerGone, the caller_gone that waits in the engine are given."""

from __future__ import annotations

from collections.abc import Callable


class StandInCaller:
    """Called: whether the caller left. watch(wake) has wake() called as it leaves (leave()), or returns False where
    it left already (as CallerGone.watch does for an RPC that ended)."""

    def __init__(self, gone: bool = False):
        self.gone, self.wakes = gone, []

    def __call__(self) -> bool:
        return self.gone

    def watch(self, wake: Callable[[], None]) -> bool:
        if self.gone:
            return False
        self.wakes.append(wake)
        return True

    def leave(self) -> None:
        self.gone = True
        for wake in self.wakes:
            wake()
