"""Alert latency end to end on the real native stack with the DEFAULT intervals (15 s scrape and rule
evaluation, Alertmanager group_wait as alerts/alertmanager.yml ships it): from the moment the condition
becomes true in the trainer's log to the webhook POST stored by the exporter (``receivedAt`` at
``GET /api/v1/alerts``). Target (issue 22 item 10): at most 60 s for every alert, and no notification at
the webhook for these runs besides the expected ones ("extra": e.g. a StepTimeRegression that the cause's
alert must inhibit, reaching the webhook because it was flushed before its inhibitor arrived).

Per trial, five simulated runs are written into the watched directory:

- RewardBoundRollout, InterStageIdleGPU, MFUImpossible, MFUDrop: a healthy prefix (25 steps, so the
  MFU baseline exists), then 3 faulty steps; t0 = the write of the 3rd faulty line (the window of
  k=3 normal steps is then entirely faulty). No later line is written, so the condition holds.
- TrainingStalled: 8 steps written at the simulated pace (4 s), then nothing; t0 = last step's arrival
  + 3 x the exporter's typical step (the rule's threshold).

Trials run one after the other on one stack (new experiment names per trial). Slow by nature: about
1-2 minutes per trial."""
from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import httpx
import orjson

from common import faulty_spec, median
from omniwatch.proc import free_port, wait_for
from omniwatch import names
from omniwatch.simulate import RunSpec, step_dict
from omniwatch.stack import Stack, StackConfig

PREFIX, STALL_PACE = 25, 4.0
TARGET_S = 60.0
SETTLE_S = 45.0  # after the last expected alert, how long extra notifications may still arrive
WINDOW_ALERTS = {"reward": names.ALERT_REWARD_BOUND, "idle": names.ALERT_IDLE,
                 "mfu_impossible": names.ALERT_MFU_IMPOSSIBLE, "mfu_drop": names.ALERT_MFU_DROP}


def _append(path: Path, spec: RunSpec, first: int, last: int, gap: float = 0.0) -> float:
    with open(path, "ab", buffering=0) as f:
        for s in range(first, last + 1):
            f.write(orjson.dumps({"step": s, "data": step_dict(spec, s)}) + b"\n")
            if gap and s < last:
                time.sleep(gap)
    return time.time()


def _metric(exporter: str, name: str, experiment: str) -> float | None:
    for line in httpx.get(exporter + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + "{") and f'experiment="{experiment}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def _trial(stack: Stack, root: Path, trial: int, timeout: float) -> dict[str, float]:
    exp = {k: f"t{trial}-{k}" for k in WINDOW_ALERTS}
    stalled = f"t{trial}-stalled"
    for e in [*exp.values(), stalled]:
        (root / f"{e}.jsonl").touch()
    time.sleep(3)  # the exporter rescans every 2 s: it has opened the files before lines arrive
    t0: dict[str, float] = {}

    def write_stalled():
        last = _append(root / f"{stalled}.jsonl", RunSpec(pace=STALL_PACE, seed=trial), 1, 8, gap=STALL_PACE)
        typical = wait_for(lambda: _metric(stack.cfg.exporter_url, names.TYPICAL_STEP, stalled), 30,
                             what="typical step of the stalled run")
        arrival = _metric(stack.cfg.exporter_url, names.LAST_STEP_TS, stalled) or last
        t0[names.ALERT_STALLED] = arrival + 3 * typical

    th = threading.Thread(target=write_stalled, daemon=True)
    th.start()
    for kind, e in exp.items():
        spec = faulty_spec(kind, start=PREFIX + 1, seed=trial)
        path = root / f"{e}.jsonl"
        _append(path, spec, 1, PREFIX)
        time.sleep(1.0)  # healthy prefix is ingested before the fault
        t0[WINDOW_ALERTS[kind]] = _append(path, spec, PREFIX + 1, PREFIX + 3)
    th.join(60)
    want = {**{WINDOW_ALERTS[k]: e for k, e in exp.items()}, names.ALERT_STALLED: stalled}
    got: dict[str, float] = {}

    def arrived():
        for a in httpx.get(stack.cfg.exporter_url + "/api/v1/alerts", params={"limit": 1000}, timeout=5).json():
            name = a["labels"].get("alertname")
            if a["status"] == "firing" and name in want and want[name] == a["labels"].get("experiment") \
                    and name not in got:
                got[name] = a["receivedAt"]
        return len(got) == len(want)

    try:
        wait_for(arrived, timeout, interval=0.5, what="every core alert at the webhook")
    except TimeoutError:
        pass
    time.sleep(SETTLE_S)
    ours = set(want.values())
    extra = sorted({f"{a['labels'].get('alertname')}{{{a['labels'].get('cause', '')}}}@{a['labels'].get('experiment')}"
                    for a in httpx.get(stack.cfg.exporter_url + "/api/v1/alerts", params={"limit": 1000},
                                       timeout=5).json()
                    if a["status"] == "firing" and a["labels"].get("experiment") in ours
                    and want.get(a["labels"].get("alertname")) != a["labels"].get("experiment")})
    lat = {name: got[name] - t0[name] if name in got and name in t0 else float("nan") for name in want}
    return {"latency": lat, "extra": extra}


def _group_wait() -> str:
    import yaml
    from omniwatch import paths
    return str(yaml.safe_load((paths.alerts_dir() / "alertmanager.yml").read_text())["route"]["group_wait"])


def run(trials: int = 1, timeout: float = 240) -> dict:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "logs" / "bench"
        root.mkdir(parents=True)
        cfg = StackConfig(run_dir=Path(d) / "run", prometheus_port=free_port(), alertmanager_port=free_port(),
                          exporter_port=free_port(), grafana_port=free_port(), profile="default",
                          watch=[str(root.parent)])
        stack = Stack(cfg)
        per_alert: dict[str, list[float]] = {}
        extra: list[str] = []
        try:
            stack.up()
            for t in range(trials):
                res = _trial(stack, root, t, timeout)
                extra += res["extra"]
                for name, lat in res["latency"].items():
                    per_alert.setdefault(name, []).append(lat)
        finally:
            stack.down()
    out = {"trials": trials, "profile": f"default (scrape/eval 15s, group_wait {_group_wait()})", "target_s": TARGET_S,
           "extra_alerts": extra}
    for name, xs in sorted(per_alert.items()):
        ok = [x for x in xs if x == x]
        out[name] = {"median_s": median(ok), "max_s": max(ok) if ok else float("nan"),
                     "missed": len(xs) - len(ok), "samples_s": [round(x, 1) for x in xs]}
    return out
