"""How the rig takes Ctrl-C, SIGTERM and SIGHUP: the same way everywhere.

While servers run or requests are in flight, any of them raises KeyboardInterrupt, so the
servers are stopped and a report of the partial results follows. While that report is written
(local work of seconds, every input already in memory), the first interrupt is only noted: the
report is finished, so an interrupted run always leaves a whole report. A second interrupt ends
the process from the signal handler itself: an exception raised at an arbitrary point of
pandas' or matplotlib's C code can be swallowed there, an exit cannot.

SIGINT is handled even where the rig was started with it ignored: a script's background job
(`python -m rig.run ... &`) inherits SIGINT ignored from its shell, and Python then keeps it
ignored, so neither Ctrl-C's group signal nor `kill -INT` would stop the run. SIGHUP ignored at
start (`nohup`) stays ignored: that one the user asked for.

`RIG_HOLD_AT=<phase>` makes a run wait at that phase's start until an interrupt comes: how a
test, or a CI wrapper's own check, sends Ctrl-C at a known point of a run without racing it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import NoReturn

INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
HOLD_VARIABLE = "RIG_HOLD_AT"
# The phases a run goes through, in order; each is a place RIG_HOLD_AT can name.
PHASES = ("preflight", "install-probe", "server-start", "warm-up", "load", "replay", "report")
HOLD_LIMIT_S = 600.0  # a hold nobody interrupts ends, and the run goes on


def raise_interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def interrupts_raise() -> None:
    """SIGTERM and SIGHUP act as Ctrl-C does. SIGINT gets Python's own handler, also where it
    was inherited ignored (asyncio.run replaces that handler with its own, cancelling the
    running task first); SIGHUP inherited ignored stays ignored."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, raise_interrupt)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, raise_interrupt)


def hold_at(phase: str, released: Callable[[], bool] = lambda: False) -> None:
    """Where RIG_HOLD_AT names `phase`, say so and wait until an interrupt raises here (or,
    inside a deferred block, until `released` says one was noted)."""
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}")
    if os.environ.get(HOLD_VARIABLE) != phase:
        return
    print(f"rig: holding at {phase} until interrupted ({HOLD_VARIABLE})", flush=True)
    deadline = time.monotonic() + HOLD_LIMIT_S
    while not released() and time.monotonic() < deadline:
        time.sleep(0.05)


@contextmanager
def _handled_by(handler: Callable[[int, FrameType | None], object]) -> Iterator[None]:
    """Every interrupt goes to `handler` inside the block, to the handlers from before it after."""
    previous = {signum: signal.signal(signum, handler) for signum in INTERRUPTS}
    try:
        yield
    finally:
        for signum, handler_before in previous.items():
            signal.signal(signum, handler_before)


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Interrupts that arrive inside the block are delivered when it ends, to the handlers from
    before it. For what must not be cut in two: a KeyboardInterrupt inside subprocess.Popen,
    after its fork, leaves a child running that its caller never learns of and cannot stop."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers run in the main thread only
        return
    received: list[int] = []
    with _handled_by(lambda signum, _frame: received.append(signum)):
        yield
    for signum in dict.fromkeys(received):
        signal.raise_signal(signum)


class InterruptsDeferred:
    """Inside the block the first interrupt is noted in `received` and `notice` printed; a
    second one calls `stop`, which must end the process."""

    def __init__(self, notice: str, stop: Callable[[], NoReturn]) -> None:
        self.notice = notice
        self.stop = stop
        self.received: int | None = None

    def __enter__(self) -> InterruptsDeferred:
        self._handling = _handled_by(self._note)
        self._handling.__enter__()
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        self._handling.__exit__(_type, _value, _traceback)

    def _note(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is not None:
            self.stop()
        self.received = signum
        print(self.notice, flush=True)
