"""The spine end to end on loopback: real Prometheus + Alertmanager + the exporter started by
``omniwatch up`` (fast profile), fed verl-written fixture files and simulated runs; asserts the contract
series in Prometheus with the values the files imply, every core alert at the exporter's webhook
history, none for the healthy run, and ``omniwatch down`` stopping exactly what it started."""
from __future__ import annotations

import os
import shutil
import statistics
import threading
import time
from pathlib import Path

import httpx
import orjson
import pytest

from omniwatch import names
from omniwatch.config import DEFAULT
from omniwatch.core.analytics import phase_of
from omniwatch.simulate import Fault, RunSpec, step_dict
from omniwatch.stack import Stack, StackConfig

from .conftest import fixture_path, free_port, require_binary, wait_for

pytestmark = pytest.mark.integration
FIXTURES = ["flowgrpo_healthy", "flowgrpo_reward_bound", "flowgrpo_async_reward_tail", "v1_transfer_idle",
            "flowgrpo_mfu_above_one"]
EXPECTED = {
    ("verl", "flowgrpo_reward_bound"): names.ALERT_REWARD_BOUND,
    ("verl", "flowgrpo_async_reward_tail"): names.ALERT_REWARD_BOUND,
    ("verl", "v1_transfer_idle"): names.ALERT_IDLE,
    ("verl", "flowgrpo_mfu_above_one"): names.ALERT_MFU_IMPOSSIBLE,
    ("sim", "mfu-drop"): names.ALERT_MFU_DROP,
    ("sim", "stalled"): names.ALERT_STALLED,
}


LAST_WRITE: dict[str, float] = {}  # sim experiment -> when its last line was written
RUN_EXPIRY = 60.0  # --run-expiry of this stack's exporter (the ended run must reach critical before it: for: on a loaded machine)


def write_sim(path: Path, spec: RunSpec, steps: int, pace: float, stop: threading.Event,
              hold_open: float | None = 0.0) -> None:
    """Write like verl's FileLogger; after the last line keep the file open ``hold_open`` seconds (None:
    until the test ends — a trainer process that hangs) before closing it (the process exits)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb", buffering=0) as f:
        for s in range(1, steps + 1):
            if stop.is_set():
                return
            f.write(orjson.dumps({"step": s, "data": step_dict(spec, s)}) + b"\n")
            LAST_WRITE[path.stem] = time.time()
            stop.wait(pace)
        stop.wait(hold_open)


def rows(name):
    return [orjson.loads(line) for line in fixture_path(name).read_bytes().splitlines()]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    require_binary("prometheus")
    require_binary("alertmanager", "prometheus-alertmanager")
    tmp = tmp_path_factory.mktemp("stack")
    root = tmp / "logs"
    (root / "verl").mkdir(parents=True)
    for name in FIXTURES:
        shutil.copy(fixture_path(name), root / "verl" / f"{name}.jsonl")
    cfg = StackConfig(run_dir=tmp / "run", prometheus_port=free_port(), alertmanager_port=free_port(),
                      exporter_port=free_port(), grafana_port=free_port(), profile="fast", watch=[str(root)],
                      exporter_args=["--poll-interval", "0.2", "--run-expiry", f"{RUN_EXPIRY:g}"])
    st = Stack(cfg)
    stop = threading.Event()
    # MFUDrop compares against the median of the previous 20 normal steps: with 17 healthy baseline
    # steps the drop stays visible for ~17 steps: 34 s at 2 s per step, twice `for: 15s` (margin for a loaded CI).
    sims = [threading.Thread(target=write_sim, daemon=True, args=(
                root / "sim" / "mfu-drop.jsonl", RunSpec(pace=2.0, seed=11, faults=[Fault("actor_slow", 20, factor=2.0)]),
                60, 2.0, stop)),
            # a hung trainer: its process keeps the log open (this test process, not the exporter)
            threading.Thread(target=write_sim, daemon=True, args=(
                root / "sim" / "stalled.jsonl", RunSpec(pace=0.5, seed=12), 8, 0.5, stop, None)),
            # a trainer that stopped and exited (seen holding its log, then gone): finished or crashed
            threading.Thread(target=write_sim, daemon=True, args=(
                root / "sim" / "ended.jsonl", RunSpec(pace=0.5, seed=13), 8, 0.5, stop, 15.0)),
            # a run that finished: its last step (8) carries the forced checkpoint, off its cadence of 3
            threading.Thread(target=write_sim, daemon=True, args=(
                root / "sim" / "finished.jsonl", RunSpec(pace=0.5, seed=14, checkpoint_every=3, total_steps=8),
                8, 0.5, stop))]
    try:
        st.up()
        for t in sims:
            t.start()
        yield st
    finally:
        stop.set()
        st.down()


def prom(stack, query):
    r = httpx.get(f"{stack.cfg.prometheus_url}/api/v1/query", params={"query": query}, timeout=5)
    r.raise_for_status()
    return {(s["metric"].get("project"), s["metric"].get("experiment"), s["metric"].get("phase"),
             s["metric"].get("role")): float(s["value"][1]) for s in r.json()["data"]["result"]}


def webhook_alerts(stack):
    r = httpx.get(f"{stack.cfg.exporter_url}/api/v1/alerts", params={"limit": 1000}, timeout=5)
    r.raise_for_status()
    return r.json()


def test_contract_series_carry_the_values_the_fixture_files_imply(stack):
    def loaded():
        v = prom(stack, names.STEPS_TOTAL + '{project="verl"}')
        return len(v) == len(FIXTURES) and all(x == (30 if k[1] == "flowgrpo_mfu_above_one" else 40)
                                              for k, x in v.items())
    wait_for(loaded, 60, what="all fixture steps in Prometheus")

    rb = rows("flowgrpo_reward_bound")
    last = rb[-1]["data"]
    key = ("verl", "flowgrpo_reward_bound", None, None)
    assert prom(stack, names.STEP)[key] == 40
    assert prom(stack, names.STEP_DURATION)[key] == pytest.approx(last["timing_s/step"])
    assert prom(stack, names.REWARD_BOUND_RATIO)[key] == pytest.approx(
        last["timing_s/reward"] / (last["timing_s/gen"] + last["timing_s/reward"]))
    assert prom(stack, names.THROUGHPUT)[key] == pytest.approx(last["perf/throughput"])
    assert prom(stack, names.MFU)[("verl", "flowgrpo_reward_bound", None, "actor")] == pytest.approx(last["perf/mfu/actor"])
    totals = prom(stack, names.STAGE_SECONDS_TOTAL + '{experiment="flowgrpo_reward_bound"}')
    assert totals[("verl", "flowgrpo_reward_bound", "reward", None)] == pytest.approx(
        sum(r["data"]["timing_s/reward"] for r in rb))
    untracked = sum(r["data"]["timing_s/step"] - sum(v for k, v in r["data"].items() if phase_of(k)) for r in rb)
    assert totals[("verl", "flowgrpo_reward_bound", "untracked", None)] == pytest.approx(untracked)
    # typical step: median of the last 20 normal steps (steps 3..40 are normal)
    assert prom(stack, names.TYPICAL_STEP)[key] == pytest.approx(
        statistics.median(r["data"]["timing_s/step"] for r in rb[-20:]))
    win = prom(stack, names.REWARD_BOUND_WINDOW + '{stat="min"}')[key]
    assert win == pytest.approx(min(r["data"]["timing_s/reward"] / (r["data"]["timing_s/gen"] + r["data"]["timing_s/reward"])
                                    for r in rb[-3:]))

    v1 = rows("v1_transfer_idle")[-1]["data"]
    timed = sum(v for k, v in v1.items() if phase_of(k))
    assert prom(stack, names.INTER_STAGE_IDLE_RATIO)[("verl", "v1_transfer_idle", None, None)] == pytest.approx(
        (v1["timing_s/step"] - timed) / v1["timing_s/step"])
    # verl passthrough keeps the original key as a label
    zs = prom(stack, 'verl_critic_rewards_zero_std_ratio{key="critic/rewards/zero_std_ratio"}')
    assert zs[key] == pytest.approx(last["critic/rewards/zero_std_ratio"])
    up = prom(stack, names.SOURCE_UP + '{source="jsonl"}')
    assert up and all(v == 1 for v in up.values())


def test_every_core_alert_reaches_the_webhook_and_the_healthy_run_stays_silent(stack):
    state = {}

    def fired():
        got = {(a["labels"].get("project"), a["labels"].get("experiment"), a["labels"]["alertname"])
               for a in webhook_alerts(stack) if a["status"] == "firing"}
        state["missing"] = [(p, e, a) for (p, e), a in EXPECTED.items() if (p, e, a) not in got]
        return not state["missing"]
    try:
        wait_for(fired, 150, interval=1.0, what="every core alert at /api/v1/alerts")
    except TimeoutError:
        raise AssertionError(f"alerts never reached the webhook: {state.get('missing')}") from None
    alerts = webhook_alerts(stack)
    healthy = [a for a in alerts if a["labels"].get("experiment") == "flowgrpo_healthy"]
    assert healthy == []
    one = next(a for a in alerts if a["labels"]["alertname"] == names.ALERT_REWARD_BOUND)
    assert one["labels"]["severity"] in ("warning", "critical")
    assert one["annotations"]["summary"] and one["annotations"]["description"]
    rw = stack._runbooks()  # the rule files link this exporter's own runbooks (issue 35 item 14)
    want = DEFAULT.runbook_url(names.ALERT_REWARD_BOUND)
    assert one["annotations"]["runbook_url"] == (want.replace(*rw) if rw else want)
    assert one["startsAt"] and one["endsAt"] is None


def test_a_hung_run_alerts_past_run_expiry_an_ended_or_finished_one_does_not(stack):
    """--run-expiry (60 s here) is for runs that ended. sim/stalled: a live process still holds its log open
    (a hung trainer): TrainingStalled escalates to critical and still fires past the expiry after its
    last step. sim/ended: its writer was seen and closed the log (the process exited): it stalls, then
    expires and resolves. sim/finished: its last step carried the forced final checkpoint (off its
    cadence): it never stalls."""
    def stalled(experiment: str, status: str, severity: str | None = None) -> list:
        return [a for a in webhook_alerts(stack) if a["labels"].get("experiment") == experiment
                and a["labels"]["alertname"] == names.ALERT_STALLED and a["status"] == status
                and severity in (None, a["labels"]["severity"])]
    wait_for(lambda: "stalled" in LAST_WRITE and time.time() - LAST_WRITE["stalled"] > RUN_EXPIRY + 15, 150,
             interval=1.0, what="the hung run idle past --run-expiry")
    # firing at all three severities past the expiry (an expired run would never fire again). Looked at for a few
    # evaluations, not at one instant: at the fast profile's 1 s scrape timeout a loaded machine can miss a scrape,
    # and Prometheus then restarts the alert's for: (production scrapes every 15 s with a 10 s timeout)
    seen: dict = {}

    def all_three() -> bool:
        seen["severities"] = {a["metric"]["severity"] for a in httpx.get(
            f"{stack.cfg.prometheus_url}/api/v1/query", timeout=5,
            params={"query": 'ALERTS{alertname="TrainingStalled",experiment="stalled",alertstate="firing"}'}
        ).json()["data"]["result"]}
        return seen["severities"] == {"info", "warning", "critical"}
    try:
        wait_for(all_three, 60, interval=1.0, what="the hung run's stall at every severity")
    except TimeoutError:
        raise AssertionError(f"the hung run stopped alerting: firing {seen.get('severities')}") from None
    assert prom(stack, names.RUN_LOG_OPEN + '{experiment="stalled"}') == {("sim", "stalled", None, None): 1.0}
    assert stalled("stalled", "firing", "critical")
    try:
        wait_for(lambda: stalled("ended", "resolved"), 180, interval=1.0, what="the ended run's stall resolved by expiry")
    except TimeoutError:
        on_metrics = prom(stack, names.STEP + '{experiment="ended"}')
        raise AssertionError(f"the ended run's stall never resolved at the webhook: fired {stalled('ended', 'firing')}; "
                             f"on /metrics {on_metrics}") from None
    assert stalled("ended", "firing", "critical"), "a run whose process exited is a stall until it expires"
    assert not prom(stack, names.STEP + '{experiment="ended"}')  # left /metrics
    # the finished run said so while it was on /metrics (it may have expired since: --run-expiry)
    assert prom(stack, f'max_over_time({names.RUN_FINISHED}{{experiment="finished"}}[30m])') == \
        {("sim", "finished", None, None): 1.0}
    assert not stalled("finished", "firing"), "a finished run stalled"


def test_status_and_down_stop_exactly_what_up_started(stack):
    rows_ = stack.status()
    assert {r["component"] for r in rows_} >= {"exporter", "prometheus", "alertmanager"}
    assert all(r["running"] for r in rows_)
    pids = [r["pid"] for r in rows_]
    # a pid file naming a process that is not ours (pid reuse) is never signalled
    fake = stack.p("pids", "grafana.json")
    fake.write_text(orjson.dumps({"pid": os.getpid(), "argv": ["/usr/sbin/grafana-server"], "started": 0}).decode())
    assert not stack._alive(stack._read_pid("grafana"))
    stack.down()
    for pid in pids:
        wait_for(lambda: not Path(f"/proc/{pid}").exists() or
                 Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", 20, what=f"pid {pid} to exit")
    assert stack.status() == []
