"""How the rig takes Ctrl-C, SIGTERM and SIGHUP: the same way everywhere.

While servers run or requests are in flight, any of them raises KeyboardInterrupt, so the
servers are stopped and a report of the partial results follows. While that report is written
(local work of seconds, every input already in memory), the first interrupt is only noted: the
report is finished, so an interrupted run always leaves a whole report. A second interrupt ends
the process from the signal handler itself: an exception raised at an arbitrary point of
pandas' or matplotlib's C code can be swallowed there, an exit cannot.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import NoReturn

INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def raise_interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def interrupts_raise() -> None:
    """SIGTERM and SIGHUP act as Ctrl-C does (SIGINT keeps Python's own handler, which
    asyncio.run replaces with its own, cancelling the running task first)."""
    for signum in INTERRUPTS:
        if signum != signal.SIGINT:
            signal.signal(signum, raise_interrupt)


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
