"""The one rule for signals: SIGINT, SIGTERM and SIGHUP mean the same orderly stop.

Wherever a command owns something (a server, an endpoint, a build, pip), it wraps that stretch in
:func:`orderly_stop`, where SIGTERM and SIGHUP raise :class:`Terminated` (a ``KeyboardInterrupt``) so
the cleanup that runs after Ctrl-C runs for them too. A process killed by a signal it did not handle
skips every ``finally``: that is how endpoints were left billing and servers orphaned.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

STOP_SIGNALS: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
T = TypeVar("T")


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived inside :func:`orderly_stop`: unwinds exactly like Ctrl-C."""

    def __init__(self, signum: int):
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


def interrupt_label(exc: BaseException) -> str:
    """How a run's status names its interruption: "interrupted" for Ctrl-C, with the signal otherwise."""
    return f"interrupted ({signal.Signals(exc.signum).name})" if isinstance(exc, Terminated) else "interrupted"


@contextlib.contextmanager
def orderly_stop(*, redeliver: bool = True) -> Iterator[None]:
    """Within the block, the stop signals raise :class:`Terminated` so the cleanup runs; with ``redeliver`` the
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

    handler.raises_terminated = True  # type: ignore[attr-defined]  (what run_to_completion looks for)

    def resend_if_dropped(unraisable: Any) -> None:
        # A signal handled inside a callback (a weakref's, such as an import lock's, or a __del__) raises
        # there, and Python prints and drops that exception: the process would run on with the stop
        # signals ignored (a repack blocked on a hung read would never end). Send it again, from another
        # thread a moment later: sent from here, it would be handled in this hook and dropped again.
        exc = unraisable.exc_value
        if not (isinstance(exc, Terminated) and exc.signum in previous):
            dropped_hook(unraisable)
            return
        signal.signal(exc.signum, handler)
        main = threading.main_thread().ident
        resend = threading.Timer(0.01, signal.pthread_kill, (main, exc.signum))
        resend.daemon = True
        resend.start()

    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:
            previous[sig] = signal.signal(sig, handler)
    dropped_hook = sys.unraisablehook
    if previous:
        sys.unraisablehook = resend_if_dropped
    try:
        yield
    except Terminated as exc:
        if redeliver and exc.signum in previous:
            for sig, old in previous.items():
                signal.signal(sig, old)  # type: ignore[arg-type]
            os.kill(os.getpid(), exc.signum)  # default action: the process ends here
        raise
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)  # type: ignore[arg-type]
        sys.unraisablehook = dropped_hook


def default_in_child() -> None:
    """A fork pool's ``initializer``: the default action for SIGINT and the stop signals in the child,
    and (on Linux) a SIGTERM from the kernel when the parent dies. A parent killed outright (kill -9, or
    a stop signal where nothing handles it) cannot terminate its pool: its workers would finish their
    task, find the result pipe closed and print a BrokenPipeError traceback each."""
    for sig in (signal.SIGINT, *STOP_SIGNALS):
        signal.signal(sig, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        import ctypes  # only a pool worker needs these, not every process that imports this module
        import multiprocessing

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        parent = multiprocessing.parent_process()
        if parent is not None and os.getppid() != parent.pid:  # it died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)


def run_to_completion(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run(make())`` in which a stop signal that :func:`orderly_stop` would turn into
    :class:`Terminated` cancels the run instead, as asyncio does for Ctrl-C, and is raised once the
    loop has unwound. Raised from the handler inside the loop, it would land in whichever task was
    running (aiohttp's request writer, say): that task would keep it and asyncio would print "Task
    exception was never retrieved" with a traceback. Outside the main thread this is asyncio.run; from a
    notebook cell, where Jupyter's loop already runs, it runs in a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(run_to_completion, make).result()
    caught: list[int] = []
    with asyncio.Runner() as runner:
        loop = runner.get_loop()
        task: asyncio.Task | None = None

        async def wrapped() -> T:
            nonlocal task
            task = asyncio.current_task()
            return await make()

        def stop(signum: int) -> None:
            caught.append(signum)
            if task is not None:
                task.cancel()

        taken: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                previous = signal.getsignal(sig)
                if getattr(previous, "raises_terminated", False):  # orderly_stop's: any other handler stays
                    taken[sig] = previous
                    loop.add_signal_handler(sig, stop, sig)
        try:
            result = runner.run(wrapped())
        except asyncio.CancelledError:
            if caught:
                raise Terminated(caught[0]) from None
            raise
        finally:
            for sig, previous in taken.items():
                loop.remove_signal_handler(sig)  # resets the default action: put the right one back
                # after a stop signal, ignore the next as orderly_stop's handler does, until its block restores
                signal.signal(sig, signal.SIG_IGN if caught else previous)
    if caught:  # arrived before the main task could be cancelled
        raise Terminated(caught[0])
    return result
