"""Shared test helpers: the shared fixtures (``../shared/fixtures``), free loopback ports, bounded waits."""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("OMNIWATCH_SHARED", REPO.parent / "shared"))
VERL_FIXTURES = SHARED / "fixtures" / "verl"
SCENARIOS = ["flowgrpo_healthy", "flowgrpo_reward_bound", "flowgrpo_async_reward_tail", "v1_transfer_idle",
             "flowgrpo_mfu_above_one", "flowgrpo_stalled"]


def fixture_path(name: str, suffix: str = ".jsonl") -> Path:
    p = VERL_FIXTURES / f"{name}{suffix}"
    if not p.exists():
        if os.environ.get("CI"):
            pytest.fail(f"shared fixture {p} missing: CI runs with ../shared beside the clone")
        pytest.skip(f"shared fixture {p} not present")
    return p


def truth(name: str) -> dict:
    return json.loads(fixture_path(name, ".truth.json").read_text())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(fn, timeout: float = 30.0, interval: float = 0.2, what: str = "condition"):
    """Poll ``fn`` until it returns a truthy value; bounded by ``timeout``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except Exception as e:  # noqa: BLE001 - keep polling, report the last error
            last = e
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def require_binary(name: str, *alts: str) -> str:
    import shutil
    for n in (name, *alts):
        p = shutil.which(n)
        if p:
            return p
    if os.environ.get("CI"):
        pytest.fail(f"{name} missing on PATH in CI: .ci/run must install it")
    pytest.skip(f"{name} not installed")


def require_tool(*candidates: str) -> str:
    """A Prometheus/Alertmanager tool found the way ``omniwatch rules`` finds it, or skip -- except in
    CI (env CI set), where a missing tool is a failure."""
    from omniwatch import rules
    try:
        return rules.find_tool(*candidates)
    except rules.RulesError as e:
        if os.environ.get("CI"):
            pytest.fail(str(e))
        pytest.skip(str(e))
