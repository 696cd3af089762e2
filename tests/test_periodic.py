"""The one periodic-thread helper (omniwatch/periodic.py) every plain background loop uses."""
from __future__ import annotations

import threading
import time

from omniwatch.periodic import Periodic
from omniwatch.proc import wait_for


def test_scans_every_interval_survives_a_failure_and_stops():
    calls, failed = [], []

    class Boom(Periodic):
        what = "boom scan"

        def scan_once(self):
            calls.append(time.monotonic())
            if len(calls) == 2:
                raise RuntimeError("one bad scan")

        def scan_failed(self):
            failed.append(len(calls))
            super().scan_failed()

    p = Boom(0.02, name="omniwatch-test-periodic").start()
    assert any(t.name == "omniwatch-test-periodic" for t in threading.enumerate())
    wait_for(lambda: len(calls) >= 4, timeout=10, what="four scans")
    p.stop()
    n = len(calls)
    time.sleep(0.1)
    assert len(calls) == n and failed == [2]          # the failure was handled, the next scans ran, none after stop
    assert not p._thread.is_alive()


def test_wait_first_and_a_function_and_restart_after_stop():
    calls = []
    p = Periodic(0.3, lambda: calls.append(1), wait_first=True, join_timeout=2.0)
    p.start()
    time.sleep(0.1)
    assert calls == []                                 # the first scan is one interval after start()
    wait_for(lambda: calls, timeout=10, what="the first scan")
    p.stop()
    assert not p._thread.is_alive()
    p.start()                                          # the agents' sweep restarts with its app's lifespan
    wait_for(lambda: len(calls) >= 2, timeout=10, what="a scan after the restart")
    p.stop()


def test_stop_before_the_first_wait_ends_returns_at_once():
    p = Periodic(60.0, lambda: None, wait_first=True).start()
    p.stop()  # joins for join_timeout (5 s), far less than the 60 s wait: the thread ended, so the wait was cut short
    assert p.join_timeout < 60 and not p._thread.is_alive()
