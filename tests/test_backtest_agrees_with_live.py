"""The past looks like the present: a backtest of a fixture and a live replay of the same fixture agree
on which alerts fire at which steps.

A live replay is accelerated (``replay --pace 2``: one verl line every 2 s) while the rules' ``for:``
and the evaluation interval stay what they are, so live alerts fire more steps after the fault than
in a backtest on the file's own 250 s steps. ``backtest --pace 2`` with the fast profile's 1 s scrape
and evaluation intervals runs on the replay's clock; this test replays two fault fixtures at once into
the real native stack (Prometheus + Alertmanager + exporter, ``profile="fast"``), records when each
alert fired in Prometheus (``activeAt + for``, seen by polling ``/api/v1/alerts`` every 0.5 s) and
at the exporter's webhook (``receivedAt``), maps those times to the latest step written, and asserts
the backtest of the very lines that were written names the same alerts, each within one step, with the
annotations Alertmanager delivered to the webhook: equal where Prometheus fired at the backtest's step
(same window values), equal but for the numbers where it fired a step later.
"""
from __future__ import annotations

import bisect
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import httpx
import pytest

from omniwatch import names
from omniwatch.backtest.backtest import backtest_many
from omniwatch.backtest.feed import replay_to_file, target_file
from omniwatch.backtest.ruleset import load
from omniwatch.backtest.runfile import load_run
from omniwatch.backtest.timeline import parse_duration
from omniwatch.stack import Stack, StackConfig

from .conftest import fixture_path, free_port, require_binary, rule_evaluations

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

PACE = 2.0          # seconds per replayed step
INTERVAL = "1s"     # the fast profile's scrape and evaluation interval
POLL = 0.5          # Prometheus /api/v1/alerts polling period
AFTER_FIRING = 3    # steps replayed after the run's fault alert fired
WATCH_BOUND = 60.0  # seconds the live side may trail the last line (a loaded machine) before the test judges anyway
REPLAY_LIMIT = 95.0  # seconds; 40 steps at 2 s are 80 s, the restart case writes 46 lines (92 s)
# Runs replayed at once: the two fault fixtures, and configuration-matrix runs (tests/test_matrix.py):
# a reward pool that cannot keep up (the streamed-reward remedy), a V1 separate_async transfer gap
# (its remedy), and a wrong device peak fixed through a restart in the same file (the steps go back:
# live and backtest must both start new baselines, so no MFUDrop follows). name -> the alert whose firing
# ends that run's replay (None: replay every line).
# Issue 22: a slowdown that lasts (generation 1.6x from step 12) is still firing live at the last line, as in
# the backtest (anchored reference), and a creep (generation +2 %/step from step 10) fires StepTimeRegression
# (one alert, its creep condition) at the same step live and in the backtest.
RUNS = {"flowgrpo_reward_bound": names.ALERT_REWARD_BOUND, "v1_transfer_idle": names.ALERT_IDLE,
        "legacy-pool--reward_slow": names.ALERT_REWARD_BOUND, "v1-separate-async--idle_gap": names.ALERT_IDLE,
        "legacy-colocated--mfu_peak_fix": None, "legacy-colocated--gen_slow": None, "legacy-pool--gen_creep": None}
LASTING = {"legacy-colocated--gen_slow": names.ALERT_STEP_REGRESSION}  # run -> alert firing at its last line
FIRES = {"legacy-colocated--mfu_peak_fix": names.ALERT_MFU_IMPOSSIBLE, "legacy-colocated--gen_slow": names.ALERT_STEP_REGRESSION,
         "legacy-pool--gen_creep": names.ALERT_STEP_REGRESSION}  # the alert a run replayed whole must fire


def run_file(name: str, tmp_path) -> str:
    """A fixture, or a matrix case written as verl would (under a "verl" project dir, like the fixtures)."""
    if "--" not in name:
        return str(fixture_path(name))
    from .test_matrix import CASES, write
    case = next(c for c in CASES if f"{c.layout}--{c.scenario}" == name)
    src = write(tmp_path / "cases", case)
    dest = tmp_path / "cases" / "verl" / f"{name}.jsonl"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(open(src, "rb").read())
    return str(dest)
STEP_TOLERANCE = 1   # Prometheus firing step vs backtest first_step
WEBHOOK_LAG = 2      # steps the webhook may trail Prometheus (group_wait 1 s, group_interval 2 s)


class Writes:
    """``replay_to_file`` progress hooks: the wall-clock time each line was written."""

    def __init__(self, run):
        self.run, self.times = run, []

    def phase(self, name, total=None):
        pass

    def advance(self, n=1):
        self.times.append(time.time())

    def step_at(self, t: float) -> int | None:
        """The latest step written at ``t`` (None before the first line)."""
        i = bisect.bisect_right(self.times, t) - 1
        return self.run.entries[i].step if i >= 0 else None


def _unix(rfc3339: str) -> float:
    """Prometheus' nanosecond RFC 3339 timestamps (``...12.123456789Z``) as unix seconds."""
    t = re.sub(r"(\.\d{6})\d+", r"\1", rfc3339).replace("Z", "+00:00")
    return datetime.fromisoformat(t).timestamp()


def _key(labels: dict) -> tuple:
    """(experiment, alertname, the other labels) — the identity of one alert of one run."""
    rest = tuple(sorted((k, v) for k, v in labels.items() if k not in ("alertname", "alertstate")))
    return labels.get("experiment"), labels["alertname"], rest


def _ours(labels: dict) -> bool:
    return labels.get("project") == "verl" and labels.get("experiment") in RUNS


@pytest.fixture
def stack(tmp_path):
    require_binary("prometheus")
    require_binary("promtool")
    require_binary("alertmanager", "prometheus-alertmanager")
    root = tmp_path / "logs"
    root.mkdir()
    cfg = StackConfig(run_dir=tmp_path / "run", prometheus_port=free_port(), alertmanager_port=free_port(),
                      exporter_port=free_port(), grafana_port=free_port(), profile="fast", watch=[str(root)],
                      exporter_args=["--poll-interval", "0.2"])
    st = Stack(cfg)
    try:
        st.up()
        yield st, root
    finally:
        st.down()


def _prometheus_firing(client: httpx.Client, url: str) -> list[dict]:
    r = client.get(f"{url}/api/v1/alerts", timeout=5)
    r.raise_for_status()
    return [a for a in r.json()["data"]["alerts"] if a["state"] == "firing" and _ours(a["labels"])]


def _backtest(paths: dict[str, str]) -> dict[str, dict]:
    """``omniwatch backtest --pace 2 --scrape-interval 1s --eval-interval 1s --json`` of every file, in one
    pass of the engine: name -> the JSON document the command prints."""
    runs = [load_run(p) for p in paths.values()]
    seconds = parse_duration(INTERVAL)
    out = backtest_many(runs, pace=PACE, scrape_interval=seconds, eval_interval=seconds)
    return {name: json.loads(json.dumps(res.as_json())) for name, res in zip(paths, out)}


def test_backtest_on_the_replay_clock_fires_the_live_alerts_at_the_same_steps(stack, tmp_path):
    st, root = stack
    hold = {r.name: r.hold for r in load().evaluated()}
    # After the last step the held values change no more: only a step-based alert that became true on
    # the last steps can still fire, once it sat out its for: (as the backtest's tail lets it).
    tail = max(r.hold for r in load().evaluated() if r.labels.get("persistence") == "steps") + 3 + 1
    runs = {name: load_run(run_file(name, tmp_path)) for name in RUNS}
    dests = {name: target_file(str(root) + "/", run) for name, run in runs.items()}
    writes = {name: Writes(run) for name, run in runs.items()}
    stops = {name: threading.Event() for name in RUNS}
    errors: list[BaseException] = []

    def replay(name):
        try:
            replay_to_file(runs[name], dests[name], progress=writes[name], pace=PACE, stop=stops[name])
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            errors.append(e)

    threads = [threading.Thread(target=replay, args=(n,), daemon=True) for n in RUNS]
    prom: dict[tuple, dict] = {}  # alert -> {"fired": activeAt + for, "seen": first poll that saw it firing}
    pool = ThreadPoolExecutor(1)
    client = httpx.Client(trust_env=False)
    try:
        for t in threads:
            t.start()
        started = time.monotonic()

        def poll():
            now = time.time()
            for a in _prometheus_firing(client, st.cfg.prometheus_url):
                k = _key(a["labels"])
                if k not in prom:
                    prom[k] = {"fired": _unix(a["activeAt"]) + hold[a["labels"]["alertname"]], "seen": now}
                prom[k]["last"] = now

        # Replay until each run's fault alert fired in Prometheus and AFTER_FIRING more steps were written.
        while any(t.is_alive() for t in threads) and time.monotonic() - started < REPLAY_LIMIT:
            poll()
            for name, alert in RUNS.items():
                if alert is None:
                    continue
                fired = [v["seen"] for (x, a, _), v in prom.items() if x == name and a == alert]
                w = writes[name]
                if fired and len(w.times) >= bisect.bisect_right(w.times, fired[0]) + AFTER_FIRING:
                    stops[name].set()
            time.sleep(POLL)
        for name in RUNS:
            stops[name].set()
        for t in threads:
            t.join(timeout=10)
        assert not errors, errors
        # Backtest the lines that were written, on the replay's clock, all runs in one pass (started only
        # now: on a 2-core machine it would slow the live exporter while it still follows a replay).
        backtest = pool.submit(_backtest, {name: str(dests[name]) for name in RUNS})
        # Keep watching as long as the backtest keeps scraping the finished run (alerts that became
        # true on the last steps sit out their for: there too).
        # On a loaded machine the live side may trail the last line: watch until Prometheus has scraped every run's
        # last step and then evaluated its rules `tail` more times (at the fast profile's 1 s), at least until
        # watch_until (bounded: WATCH_BOUND s past it)
        watch_until = max(w.times[-1] for w in writes.values()) + tail + 1.0
        last_step = {name: w.run.entries[len(w.times) - 1].step for name, w in writes.items() if w.times}

        def caught_up() -> bool:
            r = client.get(f"{st.cfg.prometheus_url}/api/v1/query", params={"query": 'omniwatch_step{project="verl"}'},
                           timeout=10)
            got = {x["metric"].get("experiment"): float(x["value"][1]) for x in r.json()["data"]["result"]}
            return all(got.get(name) == step for name, step in last_step.items())
        evaluated_from = None
        while time.time() < watch_until + WATCH_BOUND:
            poll()
            if evaluated_from is None and caught_up():
                evaluated_from = rule_evaluations(st.cfg.prometheus_url)
            if evaluated_from is not None and time.time() >= watch_until \
                    and rule_evaluations(st.cfg.prometheus_url) - evaluated_from >= tail:
                break
            time.sleep(POLL)
        r = client.get(f"{st.cfg.exporter_url}/api/v1/alerts", params={"limit": 1000}, timeout=5)
        r.raise_for_status()
        webhook: dict[tuple, float] = {}
        webhook_ann: dict[tuple, dict] = {}  # annotations of each alert's first notification
        for a in r.json():
            if a["status"] == "firing" and _ours(a["labels"]):
                k = _key(a["labels"])
                if k not in webhook or a["receivedAt"] < webhook[k]:
                    webhook[k], webhook_ann[k] = a["receivedAt"], a["annotations"]
        results = backtest.result(timeout=180)
    finally:
        for ev in stops.values():
            ev.set()
        pool.shutdown(wait=True)
        client.close()

    # A replay that stopped is a stalled run, live; the backtest judges stalls only up to the last line.
    for d in (prom, webhook):
        for k in [k for k in d if k[1] == names.ALERT_STALLED
                  and (d[k]["fired"] if d is prom else d[k]) >= writes[k[0]].times[-1]]:
            del d[k]
    webhook_ann = {k: v for k, v in webhook_ann.items() if k in webhook}
    expected, expected_ann = {}, {}
    for name, res in results.items():
        w = writes[name]  # distinct steps among the lines written (a restart writes some steps again)
        assert res["steps"] == len({w.run.entries[i].step for i in range(len(w.times))})
        for a in res["alerts"]:
            labels = {**a["labels"], "alertname": a["alertname"]}
            expected[_key(labels)] = a["first_step"]
            ann = dict(a["annotations"])
            rw = st._runbooks()  # the stack's rule files link this exporter's own runbooks (issue 35 item 14)
            if rw and "runbook_url" in ann:
                ann["runbook_url"] = ann["runbook_url"].replace(*rw)
            expected_ann[_key(labels)] = ann
    live = {k: (writes[k[0]].step_at(v["fired"]), writes[k[0]].step_at(v["seen"])) for k, v in prom.items()}
    hooks = {k: writes[k[0]].step_at(t) for k, t in webhook.items()}
    report = "\n".join(f"{k[0]:<24} {k[1]:<20} backtest {expected.get(k)!s:>4}  prometheus {live.get(k, (None,))[0]!s:>4} "
                       f"(poll {live.get(k, (None, None))[1]!s:>4})  webhook {hooks.get(k)!s:>4}"
                       for k in sorted(set(expected) | set(live), key=str))
    print("\nalert first steps at pace", PACE, "s/step\n" + report)

    for name, alert in RUNS.items():  # the faults were seen at all, live and in the backtest
        alert = alert or FIRES[name]
        assert any(k[0] == name and k[1] == alert for k in live), f"{alert} never fired live for {name}\n{report}"
    # the fix through a restart sets nothing off, live as in the backtest
    assert not any(k[0] == "legacy-colocated--mfu_peak_fix" and k[1] in (names.ALERT_MFU_DROP, names.ALERT_STEP_REGRESSION)
                   for k in live), report
    assert set(live) == set(expected), f"live and backtest fire different alerts\n{report}"
    for k, first_step in expected.items():
        assert abs(live[k][0] - first_step) <= STEP_TOLERANCE, f"{k[:2]} fired at different steps\n{report}"
    # The webhook sees what Alertmanager let through (inhibited alerts, e.g. StepTimeRegression under
    # RewardBoundRollout, never arrive), after Prometheus, within group_wait / group_interval.
    assert {(k[0], k[1]) for k in webhook} >= {(n, a or FIRES[n]) for n, a in RUNS.items()}, report
    # a slowdown that lasts is still firing in Prometheus when the last line is written, live as in the backtest
    for name, alert in LASTING.items():
        last_line = writes[name].run.entries[len(writes[name].times) - 1].step
        held = [k for k in prom if k[0] == name and k[1] == alert]
        assert held and any(writes[name].step_at(prom[k]["last"]) == last_line for k in held), report
        assert any(a["alertname"] == alert and a["last_step"] == last_line for a in results[name]["alerts"]), report
    for k, step in hooks.items():
        assert k in live, f"{k[:2]} at the webhook but never firing in Prometheus\n{report}"
        assert live[k][0] <= step <= live[k][0] + WEBHOOK_LAG, f"{k[:2]} webhook step {step}\n{report}"
    # Annotations: Prometheus rendered them when the alert first fired and Alertmanager delivered them.
    numbers = re.compile(r"\d+(?:\.\d+)?")
    for k, got in webhook_ann.items():
        want = expected_ann.get(k)
        assert want and set(got) == set(want), (k[:2], got, want)
        # rendered at the same step: the same values. Prometheus renders the annotations at the evaluation that
        # fires the alert; under load that evaluation can run a step after activeAt + for: (its `step` says which)
        if (got.get("step") == want.get("step")) if "step" in want else live[k][0] == expected[k]:
            assert got == want, (k[:2], got, want)
        else:
            assert {f: numbers.sub("#", v) for f, v in got.items()} == \
                {f: numbers.sub("#", v) for f, v in want.items()}, (k[:2], got, want)
    print("annotations compared:", {k[:2]: "equal" if webhook_ann[k] == expected_ann.get(k) else "equal but numbers"
                                    for k in webhook_ann})
