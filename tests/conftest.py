"""Shared test helpers: the recorded fixtures (``tests/fixtures``), free loopback ports, bounded waits,
and the one policy for skipping.

Skips: a test may skip only for optional hardware or a heavy optional dependency, through
:func:`skip_optional`, whose reason names the one command that enables it. Any other skip (a missing
fixture, a missing Prometheus binary) is turned into a failure by ``pytest_runtest_makereport`` below,
so a clean checkout can never pass by skipping.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from omniwatch.proc import free_port, stop as stop_process, wait_for

# The one free_port / wait_for / stop_process (omniwatch.proc), re-exported for the tests.
__all__ = ["free_port", "stop_process", "wait_for"]

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
VERL_FIXTURES = FIXTURES / "verl"
SCENARIOS = ["flowgrpo_healthy", "flowgrpo_reward_bound", "flowgrpo_async_reward_tail", "v1_transfer_idle",
             "flowgrpo_mfu_above_one", "flowgrpo_stalled"]
OPTIONAL_MARK = " -- enable with: "
# `make test-ray` and .ci/run set this: there, Ray/TransferQueue/unshare missing is a failure.
REQUIRE_RAY = os.environ.get("OMNIWATCH_REQUIRE_RAY") == "1"


def fixture(relpath: str) -> Path:
    """A recorded input under tests/fixtures (see its README); missing is a failure, everywhere."""
    p = FIXTURES / relpath
    if not p.is_file():
        pytest.fail(f"fixture {p} is missing: it is part of the repository (tests/fixtures/README.md)")
    return p


def fixture_path(name: str, suffix: str = ".jsonl") -> Path:
    return fixture(f"verl/{name}{suffix}")


def truth(name: str) -> dict:
    return json.loads(fixture_path(name, ".truth.json").read_text())


def skip_optional(why: str, enable: str):
    """Skip for optional hardware or a heavy optional dependency; ``enable`` is the command that makes
    the test run (``make test-ray``, ...)."""
    pytest.skip(f"{why}{OPTIONAL_MARK}{enable}")


def require_ray_tq(*modules: str) -> None:
    """Ray / TransferQueue (and torch) are heavy optional dependencies: skip with the command that
    installs them, or fail where they are required (make test-ray, CI)."""
    import importlib.util
    import shutil
    import subprocess
    missing = [m for m in modules or ("ray",) if importlib.util.find_spec(m) is None]
    why = f"not installed: {', '.join(missing)}" if missing else None
    if why is None:
        if not shutil.which("unshare"):
            why = "no `unshare` here (util-linux)"
        else:
            try:
                r = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up"], capture_output=True, timeout=20)
                ok = r.returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
            if not ok:
                why = "`unshare -n` is not permitted here (needs root or user namespaces)"
    if why is None:
        return
    if REQUIRE_RAY:
        pytest.fail(f"{why} (OMNIWATCH_REQUIRE_RAY=1: .ci/install-ray-tq.sh should have installed them)")
    skip_optional(why, "make test-ray")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Only :func:`skip_optional` may skip; any other skip fails the test with its reason."""
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and not hasattr(rep, "wasxfail"):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        if OPTIONAL_MARK not in reason:
            rep.outcome = "failed"
            rep.longrepr = (f"skipped without an enabling command (only skip_optional may skip): {reason}")


@pytest.fixture(autouse=True)
def _no_settings_from_the_developers_environment(monkeypatch):
    """Settings read OMNIWATCH_* variables: a developer's exported token or port must not change what a
    test sees (tests set what they need through monkeypatch or arguments)."""
    from omniwatch.settings import CONFIG_ENV, PREFIX, Settings
    names = {CONFIG_ENV} | {PREFIX + f.upper() for f in Settings.model_fields} | \
        {PREFIX + f.upper() + "_FILE" for f in Settings.model_fields} | {PREFIX + "EXPORTER_PORT"}
    for name in names:
        monkeypatch.delenv(name, raising=False)


def _no_shared_reads(event: str, args) -> None:
    """Nothing in the repository may read the team's ``../shared`` folder: a clone elsewhere lacks it."""
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if _SHARED_PREFIX in os.path.abspath(path) + os.sep:
            raise PermissionError(f"tests must not read outside the repository: {path}")


_SHARED_PREFIX = str(REPO.parent / "shared") + os.sep
sys.addaudithook(_no_shared_reads)


def require_binary(name: str, *alts: str) -> str:
    """A binary ``make deps`` installs (prometheus, promtool, alertmanager): missing is a failure."""
    import shutil
    for n in (name, *alts):
        p = shutil.which(n)
        if p:
            return p
    pytest.fail(f"{name} is not on PATH: `make deps` installs it (apt-get install -y prometheus prometheus-alertmanager)")


def require_tool(*candidates: str) -> str:
    """A Prometheus/Alertmanager tool found the way ``omniwatch rules`` finds it; missing is a failure."""
    from omniwatch import rules
    try:
        return rules.find_tool(*candidates)
    except rules.RulesError as e:
        pytest.fail(f"{e}; `make deps` installs it")
