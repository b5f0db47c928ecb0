"""The background loops' shell (app.loops): when a step runs, what ends a wait, that a
failed step is logged and the loop goes on, and that stop() ends the thread at once. Every
wait is on an event, with bounds far above what a busy machine needs: a loop that waits an
hour between steps must still stop (and wake) within them."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest

from app.loops import Loop, Stop

log = logging.getLogger("tests.loops")
HOUR = 3600.0
PATIENCE = 30.0  # seconds an event may take on a busy machine; a failure is a hang, not luck


def counting(
    times: int, then: float | None = None
) -> tuple[Callable[[], float | None], threading.Event, list[int]]:
    """A step that counts its calls, setting the event at the ``times``-th."""
    calls: list[int] = []
    reached = threading.Event()

    def step() -> float | None:
        calls.append(len(calls) + 1)
        if len(calls) >= times:
            reached.set()
        return then

    return step, reached, calls


def test_the_first_step_runs_at_once_and_stop_ends_the_interval_wait() -> None:
    step, ran, calls = counting(1)
    loop = Loop("t-once", step, interval=HOUR, logger=log, what="step")
    loop.start()
    assert ran.wait(PATIENCE)
    assert loop.stop(timeout=PATIENCE)  # not an hour
    assert calls == [1]


def test_wait_first_waits_the_interval_before_the_first_step() -> None:
    step, _, calls = counting(1)
    loop = Loop("t-first", step, interval=HOUR, logger=log, what="step", wait_first=True)
    loop.start()
    assert loop.stop(timeout=PATIENCE)
    assert calls == []


def test_a_wake_ends_the_wait_and_the_step_runs() -> None:
    step, ran, calls = counting(1)
    loop = Loop("t-wake", step, interval=None, logger=log, what="step", wait_first=True)
    loop.start()
    loop.wake()
    assert ran.wait(PATIENCE)
    assert loop.stop(timeout=PATIENCE)
    assert calls == [1]


def test_the_wait_a_step_returns_replaces_the_interval() -> None:
    step, ran, _ = counting(3, then=0.0)
    loop = Loop("t-returned", step, interval=HOUR, logger=log, what="step")
    loop.start()
    assert ran.wait(PATIENCE)  # three steps, no hour between them
    assert loop.stop(timeout=PATIENCE)


def test_a_wake_during_a_step_is_not_lost() -> None:
    """Work that comes while a step runs (after it looked) is taken by the next one."""
    in_step, go_on, second = threading.Event(), threading.Event(), threading.Event()
    calls: list[int] = []

    def step() -> None:
        calls.append(1)
        if len(calls) == 1:
            in_step.set()
            assert go_on.wait(PATIENCE)
        else:
            second.set()

    loop = Loop("t-during", step, interval=None, logger=log, what="step")
    loop.start()
    assert in_step.wait(PATIENCE)
    loop.wake()
    go_on.set()
    assert second.wait(PATIENCE)  # interval None: only the wake brings it
    assert loop.stop(timeout=PATIENCE)


def test_a_failed_step_is_logged_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    again = threading.Event()
    calls: list[int] = []

    def step() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        again.set()

    loop = Loop("t-failing", step, interval=0.0, logger=log, what="the test step")
    with caplog.at_level(logging.ERROR, logger="tests.loops"):
        loop.start()
        assert again.wait(PATIENCE)
        assert loop.stop(timeout=PATIENCE)
    [record] = [r for r in caplog.records if r.name == "tests.loops"]
    assert record.getMessage() == "the test step"
    assert record.exc_info is not None
    assert "a bug" in str(record.exc_info[1])


def test_the_thread_has_the_loops_name_and_a_restart_runs_again() -> None:
    names: list[str] = []
    ran = threading.Event()

    def step() -> None:
        names.append(threading.current_thread().name)
        ran.set()

    loop = Loop("t-named", step, interval=HOUR, logger=log, what="step")
    for _ in range(2):
        ran.clear()
        loop.start()
        assert ran.wait(PATIENCE)
        assert loop.stop(timeout=PATIENCE)
    assert names == ["t-named", "t-named"]


def test_run_on_a_callers_thread_ends_when_its_stop_is_set() -> None:
    step, ran, _ = counting(1)
    loop = Loop("t-run", step, interval=HOUR, logger=log, what="step")
    stop = Stop()
    thread = threading.Thread(target=loop.run, args=(stop,))
    thread.start()
    assert ran.wait(PATIENCE)
    stop.set()  # no wake() from the loop: the Stop's callback ends the wait
    thread.join(PATIENCE)
    assert not thread.is_alive()


def test_stop_before_start_is_harmless() -> None:
    assert Loop("t-unstarted", lambda: None, interval=1.0, logger=log, what="step").stop()


def test_stop_runs_each_callback_once_and_at_once_when_already_set() -> None:
    stop, called = Stop(), []
    stop.on_set(lambda: called.append("a"))
    unregister = stop.on_set(lambda: called.append("gone"))
    unregister()
    stop.set()
    stop.set()
    assert called == ["a"]
    stop.on_set(lambda: called.append("late"))
    assert called == ["a", "late"]
    assert stop.is_set()
