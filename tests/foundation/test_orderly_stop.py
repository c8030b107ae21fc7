"""The orderly stop keeps a stop signal even where Python drops the exception its handler raises."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import weakref

import pytest

from gemma4_t4.foundation import signals


class _Owner:
    pass


def test_a_stop_signal_handled_inside_a_callback_still_stops_the_block():
    # an import lock's weakref callback is where a real repack took its SIGTERM: the handler raised
    # there, Python printed "Exception ignored" and the process blocked on for good
    def callback(_ref: object) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # handled here, at the callback's next instruction

    started = time.monotonic()
    with pytest.raises(signals.Terminated) as stopped, signals.orderly_stop(redeliver=False):
        owner = _Owner()
        ref = weakref.ref(owner, callback)
        del owner
        time.sleep(10)  # the stop must end this sleep, not the sleep end the block
    assert stopped.value.signum == signal.SIGTERM
    assert time.monotonic() - started < 5
    assert ref() is None
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the block gave the signal back


def test_another_dropped_exception_still_reaches_the_previous_hook(monkeypatch):
    seen: list[BaseException] = []
    monkeypatch.setattr("sys.unraisablehook", lambda unraisable: seen.append(unraisable.exc_value))

    def callback(_ref: object) -> None:
        raise ValueError("not a stop")

    with signals.orderly_stop(redeliver=False):
        owner = _Owner()
        ref = weakref.ref(owner, callback)
        del owner
    assert ref() is None and [type(e) for e in seen] == [ValueError]


def test_run_to_completion_runs_a_coroutine_from_plain_python_and_from_inside_a_running_loop():
    async def answer():
        return 42

    assert signals.run_to_completion(answer) == 42

    async def cell():  # a notebook cell: Jupyter's loop already runs, so it goes to a worker thread
        return signals.run_to_completion(answer)

    assert asyncio.run(cell()) == 42
