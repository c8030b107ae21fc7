"""The one rule for signals: SIGINT, SIGTERM and SIGHUP mean the same orderly stop.

Wherever a command owns something (a server, an endpoint, a build, pip), it wraps that stretch in
:func:`orderly_stop`, where SIGTERM and SIGHUP raise :class:`Terminated` (a ``KeyboardInterrupt``) so
the cleanup that runs after Ctrl-C runs for them too. A process killed by a signal it did not handle
skips every ``finally``: that is how endpoints were left billing and servers orphaned.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

STOP_SIGNALS: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived inside :func:`orderly_stop`: unwinds exactly like Ctrl-C."""

    def __init__(self, signum: int):
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name


def interrupt_label(exc: BaseException) -> str:
    """How a run's status names its interruption: "interrupted" for Ctrl-C, with the signal otherwise."""
    return f"interrupted ({exc.signal_name})" if isinstance(exc, Terminated) else "interrupted"


@contextlib.contextmanager
def orderly_stop(signals: tuple[int, ...] = STOP_SIGNALS, *, redeliver: bool = True) -> Iterator[None]:
    """Within the block, ``signals`` raise :class:`Terminated` so the cleanup runs; with ``redeliver`` the
    signal is sent again with its default action once it has unwound (exit status 128 + signal), else
    ``Terminated`` propagates. Only signals at their default action are taken over (a caller's handler
    wins; nesting is harmless), only in the main thread; a second signal during cleanup is ignored. A
    child forked inside the block gets the default action (it inherits none of the cleanup)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, object] = {}
    installed_by = os.getpid()

    def handler(signum: int, _frame: object) -> None:
        if os.getpid() != installed_by:  # a forked child: die of the signal, as if never handled
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        raise Terminated(signum)

    for sig in signals:
        if signal.getsignal(sig) is signal.SIG_DFL:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    except Terminated as exc:
        for sig, old in previous.items():
            signal.signal(sig, old)  # type: ignore[arg-type]
        owned = exc.signum in previous
        previous.clear()
        if redeliver and owned:
            os.kill(os.getpid(), exc.signum)  # default action: the process ends here
        raise
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)  # type: ignore[arg-type]


def default_in_child() -> None:
    """A fork pool's ``initializer``: the default action for SIGINT and the stop signals in the child."""
    for sig in (signal.SIGINT, *STOP_SIGNALS):
        signal.signal(sig, signal.SIG_DFL)
