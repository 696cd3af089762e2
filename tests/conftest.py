"""Shared test helpers: the recorded fixtures (``tests/fixtures``), free loopback ports, bounded waits,
and the one policy for skipping.

Skips: a test may skip only for optional hardware or a heavy optional dependency, through
:func:`skip_optional`, whose reason names the one command that enables it. Any other skip (a missing
fixture, a missing Prometheus binary) is turned into a failure by ``pytest_runtest_makereport`` below,
so a clean checkout can never pass by skipping.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import re
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with _batch_nice(item), _timeline(item):
        yield


@contextlib.contextmanager
def _timeline(item):
    """OMNIWATCH_TEST_TIMELINE=FILE: one JSON line per test (worker, start, end, CPU seconds) to find a run's critical
    path (``python tests/timeline.py FILE`` prints it). Off by default."""
    path = os.environ.get("OMNIWATCH_TEST_TIMELINE")
    if not path:
        yield
        return
    import resource
    import time

    def cpu(who):
        r = resource.getrusage(who)
        return r.ru_utime + r.ru_stime

    t0, s0, c0 = time.time(), cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
    yield
    # CPU seconds of this worker and of the children it reaped during the test (a live stack's Prometheus,
    # Alertmanager, exporter and CLI runs; not Ray's daemons and workers, which the raylet starts)
    line = {"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "test": item.nodeid, "start": t0,
            "end": time.time(), "cpu": round(cpu(resource.RUSAGE_SELF) - s0, 2),
            "cpu_children": round(cpu(resource.RUSAGE_CHILDREN) - c0, 2)}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


BATCH_NICE = 10


@contextlib.contextmanager
def _batch_nice(item):
    """A test marked ``batch`` (promtool and backtest runs: CPU-bound, no wall-clock expectation) runs at nice 10,
    its module fixtures and the processes it starts included: on 2 cores with four workers the live stacks and Ray
    scenarios beside it (scrape, evaluation and poll intervals, ``for:`` clocks) keep their CPU share and the
    batch work fills the gaps. Linux niceness is per thread: the test's thread and its children change. Only
    where the niceness can be restored afterwards (lowering it needs CAP_SYS_NICE: root, as on CI)."""
    if item.get_closest_marker("batch") is None or os.geteuid() != 0:
        yield
        return
    before = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, max(before, BATCH_NICE))
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)


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


def budget(seconds: float) -> float:
    """A wall-clock budget for a test marked ``timing`` (the one set whose behaviour *is* a time, e.g. "SIGTERM
    exits in under 2 s"): ``seconds`` on an idle machine, scaled by the load (1-minute load average per core,
    at least 1) so a busy CI runner slows the budget, not the verdict. Everywhere else a test asserts an
    order or a count; tests/test_timing_marked.py fails a comparison against elapsed time outside the marker."""
    return seconds * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


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


# --- pytest-xdist: `make test` runs the suite on several workers (`-n 4`). Most slow tests sleep (live stacks
# waiting for scrapes and `for:` windows, Ray scenarios), so more workers than cores overlap them with the
# CPU-bound ones. The scheduler below (pytest_xdist_make_scheduler) decides what runs together:
#
# 1. The tests of a module that defines a module-, class- or package-scoped fixture (a live stack, a Ray
#    scenario, a backtest run once for the module) are one unit of work: one worker runs them all, so the
#    fixture is set up once, as without xdist. Every other test is scheduled on its own.
#    (xdist's own `--dist loadgroup` cannot do this here: with pytest 9 its xdist_group marks do not reach
#    the scheduler.)
# 2. The longest work starts first (longest-processing-time-first): workers take the units in collection
#    order, and pytest_collection_modifyitems sorts the collection by measured seconds, slowest first; a unit
#    weighs the sum of its tests' seconds. A wrong or stale number only changes the order.
# Measured durations (issue 34: no hand table). Every run writes the seconds each test took (setup + call +
# teardown) to .durations.json at the repository root (not tracked; merged over the previous file, so a -k run
# updates what it ran); the scheduler reads it, else tests/durations.json, the copy of a full `make test` run on a
# 2-core machine that ships with the repository (`make durations` refreshes it). A test in neither counts 1 s.
DURATIONS_RUN = REPO / ".durations.json"
DURATIONS_SHIPPED = REPO / "tests" / "durations.json"
DEFAULT_S = 1.0


@functools.cache
def measured() -> dict[str, float]:
    for path in (DURATIONS_RUN, DURATIONS_SHIPPED):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return {k: float(v) for k, v in data.items() if isinstance(v, (int, float))}
    return {}


_took: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """On the controller (xdist sends every worker's reports there) or a plain run: add up each test's phases."""
    _took[report.nodeid] = _took.get(report.nodeid, 0.0) + float(getattr(report, "duration", 0.0) or 0.0)


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput") or not _took:   # a worker: the controller writes
        return
    merged = dict(measured())
    merged.update({k: round(v, 2) for k, v in _took.items()})
    try:
        tmp = DURATIONS_RUN.with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")
        tmp.replace(DURATIONS_RUN)
    except OSError:
        pass


# Modules that share one worker (one after the other) although they share no fixture: the three smaller Ray
# scenarios each start a Ray cluster (CPU-heavy for ~30 s); beside the TransferQueue scenario at most two Ray
# clusters run at a time, so on 2 cores Ray's own startup timeouts and the scenarios' timing bounds hold.
LANES = {"tests/test_raytasks_live.py": "ray-lane", "tests/test_agents_live.py": "ray-lane",
         "tests/test_discovery_live.py": "ray-lane"}


@functools.cache
def _module_text(module: str) -> str:
    try:
        return (REPO / module).read_text()
    except OSError:
        return ""


def _shares_a_fixture(module: str) -> bool:
    return re.search(r"""scope\s*=\s*["'](module|class|package)["']""", _module_text(module)) is not None


# Workers past the first LIVE_WORKERS (make test: -n 6, 4 + 2) are batch workers: they run at nice 19 and take only
# units that start no live stack and no Ray (modules marked ``batch`` -- promtool and backtest runs -- and modules
# with no ``integration``/``slow``/``ray`` mark, the quick tier's tests). While the live stacks and Ray scenarios
# at the head of the queue mostly wait on scrape, evaluation and poll intervals, the batch workers use the CPU
# they leave, and yield it (CFS weight 15 against 1,024) whenever a live one wants it.
LIVE_WORKERS = int(os.environ.get("OMNIWATCH_LIVE_WORKERS", "4"))


def batch_worker(workerid: str) -> bool:
    return workerid.startswith("gw") and workerid[2:].isdigit() and int(workerid[2:]) >= LIVE_WORKERS


def _batch_module(module: str) -> bool:
    text = _module_text(module)
    return bool(text) and ("pytest.mark.batch" in text or re.search(r"mark\.(integration|slow|ray)\b", text) is None)


BATCH_WORKER_NICE = 19   # CFS weight 15 against 1,024: a live stack beside it loses ~1.5 % of a core per batch task


def pytest_configure(config):
    """A batch worker runs everything at nice 19 (its test thread, and so the processes it starts): it fills the CPU
    the live stacks leave idle and takes next to nothing from them (at nice 10, weight 110, two batch workers and
    their promtool children took ~12 % beside three live stacks, and a live test's timing failed in 2 of 4 CI runs)."""
    if batch_worker(getattr(config, "workerinput", {}).get("workerid", "")):
        os.setpriority(os.PRIO_PROCESS, 0, max(os.getpriority(os.PRIO_PROCESS, 0), BATCH_WORKER_NICE))


def batch_unit(unit: str) -> bool:
    """A unit a batch worker may take: no live stack, no Ray (see LIVE_WORKERS)."""
    return unit not in LANES.values() and _batch_module(unit.split("::", 1)[0])


def unit_of_work(nodeid: str) -> str:
    """The scheduling unit of a test: its lane, its module (a shared fixture), or the test itself."""
    module = nodeid.split("::", 1)[0]
    if module in LANES:
        return LANES[module]
    return module if _shares_a_fixture(module) else nodeid


def _weight(nodeid: str) -> float:
    return measured().get(nodeid, DEFAULT_S)


def pytest_collection_modifyitems(session, config, items):
    """Longest unit first: a unit weighs the sum of its tests' measured seconds (one worker runs them in turn)."""
    weight: dict[str, float] = {}
    for item in items:
        unit = unit_of_work(item.nodeid)
        weight[unit] = weight.get(unit, 0.0) + _weight(item.nodeid)
    items.sort(key=lambda i: -weight[unit_of_work(i.nodeid)])


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: without it installed, never called
def pytest_xdist_make_scheduler(config, log):
    """Units of work as :func:`unit_of_work` says, taken in collection order (slowest first)."""
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid)

        def _assign_work_unit(self, node) -> None:
            """A batch worker takes the first (slowest) batch unit left, and stops when there is none."""
            if batch_worker(node.workerinput.get("workerid", "")):
                scope = next((u for u in self.workqueue if batch_unit(u)), None)
                if scope is None:
                    node.shutdown()
                    return
                self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    config.option.loadscopereorder = False  # keep the collection's slowest-first order
    return Units(config, log)


def rule_evaluations(prom_url: str) -> float:
    """How many times this Prometheus has evaluated its slowest rule group so far (its own /metrics:
    iterations scheduled less iterations missed). A wait bounded by evaluations follows the stack's own
    progress: on a loaded machine Prometheus evaluates (and its ``for:`` clocks advance) no faster."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families
    try:
        body = httpx.get(f"{prom_url.rstrip('/')}/metrics", timeout=10, trust_env=False).text
    except httpx.HTTPError:
        return 0.0
    sign = {"prometheus_rule_group_iterations_total": 1.0, "prometheus_rule_group_iterations_missed_total": -1.0}
    done: dict[tuple, float] = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            if s.name in sign:
                key = tuple(sorted(s.labels.items()))
                done[key] = done.get(key, 0.0) + sign[s.name] * s.value
    return min(done.values(), default=0.0)


def wait_evaluations(prom_url: str, fn, evaluations: int, what="condition", every: float = 0.5):
    """Poll ``fn`` until it returns something truthy (returned); fail once Prometheus has evaluated its rules
    ``evaluations`` more times without it (``what``: the failure's text, or a callable that returns it) (pytest-timeout bounds a Prometheus that stopped evaluating)."""
    import time
    start = rule_evaluations(prom_url)
    while True:
        v = fn()
        if v:
            return v
        done = rule_evaluations(prom_url) - start
        if done >= evaluations:
            pytest.fail(f"{what() if callable(what) else what}: not after {done:.0f} rule evaluations of {prom_url}")
        time.sleep(every)
