"""The sampler loop's alarm (gpuwatch/collect/alarm.py): a real timerfd, moved by one thread
while another waits on it."""

from __future__ import annotations

import threading
import time

import pytest

from gpuwatch.collect import alarm as alarm_mod
from gpuwatch.collect.alarm import make_alarm


@pytest.fixture
def alarm():
    a = make_alarm()
    if a is None:
        pytest.skip("no timerfd on this system")
    yield a
    a.close()


def _waiter(a) -> threading.Event:
    done = threading.Event()

    def run() -> None:
        a.wait()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done


def test_a_waiter_sleeps_while_the_time_is_moved_ahead_and_wakes_once_it_passes(alarm) -> None:
    alarm.set_at(time.monotonic() + 0.2)
    done = _waiter(alarm)
    moved_until = time.monotonic() + 0.6
    while time.monotonic() < moved_until:  # moved before it fires, again and again
        alarm.set_at(time.monotonic() + 0.2)
        assert not done.wait(0.05)
    assert not done.is_set()
    assert done.wait(5.0)  # no longer moved: it fires


def test_fire_now_wakes_a_waiter_at_once(alarm) -> None:
    alarm.set_at(time.monotonic() + 3600)
    done = _waiter(alarm)
    assert not done.wait(0.1)
    alarm.fire_now()
    assert done.wait(5.0)


def test_a_time_already_past_returns_at_once_and_is_used_up(alarm) -> None:
    alarm.set_at(time.monotonic() - 1.0)
    alarm.wait()  # the expiry is kept until read
    alarm.set_at(time.monotonic() + 3600)
    done = _waiter(alarm)
    assert not done.wait(0.1)  # the old expiry does not wake the next wait
    alarm.fire_now()
    assert done.wait(5.0)


def test_no_timerfd_gives_none_and_closes_what_it_opened(monkeypatch) -> None:
    def refuse(self, when: float) -> None:
        raise OSError(22, "timerfd_settime: Invalid argument")

    made: list[tuple[alarm_mod.Alarm, int]] = []
    real_init = alarm_mod.Alarm.__init__

    def init(self) -> None:
        real_init(self)
        made.append((self, self.fd))

    monkeypatch.setattr(alarm_mod.Alarm, "__init__", init)
    monkeypatch.setattr(alarm_mod.Alarm, "set_at", refuse)
    assert make_alarm() is None
    (obj, fd), = made
    assert fd >= 0 and obj.fd == -1  # it had a descriptor, and closed it
