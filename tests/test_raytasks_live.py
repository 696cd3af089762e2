"""Who holds the step against a real Ray 2.60 cluster (``ray start --head``, token authentication) running
verl's real single controller (RayResourcePool(use_gpu=False), create_colocated_worker_cls, RayWorkerGroup,
@register), the real exporter app with the task-event source on, inside ``unshare -n``. The scenario
(tests/raytasks_scenario.py) runs once and writes what it saw; each test asserts one outcome.

``make test-ray`` installs Ray, TransferQueue and verl (.ci/install-ray-tq.sh) and runs these."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require_ray_tq

ROOT = Path(__file__).resolve().parent.parent
RAY_REPORT_S = 1.0  # RAY_task_events_report_interval_ms default: how late a worker's task events reach the GCS
RAY_MS = 0.001      # Ray's state API floors its stamps to whole ms (ray/util/state/common.py: int(state_ts_ns) // 1e6)
PHASES = ("generate", "infer_actor_batch", "update_actor", "update_weights")  # a step of raytasks_trainer.py, in order
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.ray]
sys.path.insert(0, str(ROOT / "tests"))


def trainer_constants() -> dict:
    """The trainer's top-level constants, read from its source: importing it imports Ray and verl (seconds)."""
    import ast
    out = {}
    for node in ast.parse((ROOT / "tests" / "raytasks_trainer.py").read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            names, value = node.targets[0], node.value
            pairs = zip(names.elts, value.elts) if isinstance(names, ast.Tuple) and isinstance(value, ast.Tuple) \
                else [(names, value)]
            for n, v in pairs:
                if isinstance(n, ast.Name):
                    try:
                        out[n.id] = ast.literal_eval(v)
                    except ValueError:
                        pass
    return out


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    require_ray_tq("ray", "verl", "torch", "tensordict")
    out = tmp_path_factory.mktemp("raytasks") / "observed.json"
    bindir = os.path.dirname(sys.executable)
    cmd = (f"ip link set lo up && PATH={bindir}:$PATH exec {sys.executable} "
           f"{ROOT / 'tests' / 'raytasks_scenario.py'} {out}")
    r = subprocess.run(["unshare", "-n", "sh", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.exists(), f"scenario wrote nothing (rc={r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    obs = json.loads(out.read_text())
    assert "error" not in obs, obs["error"]
    assert not obs.get("timeouts"), obs.get("timeouts")
    return obs


@pytest.mark.timeout(1000)
def test_token_auth_on_and_token_never_logged(seen):
    assert seen["state_api_up"] and seen["without_token_status"] == 401  # the cluster really demands the token
    assert seen["token_in_logs"] is False


def test_lanes_match_the_workers_own_spans(seen):
    """Every worker call that was running in Ray's view during a whole poll is a closed lane in the ledger with
    Ray's own boundaries: its start is Ray's start_time_ms, between the moment the driver could submit the call
    (the previous phase's last call returned: the trainer blocks on each phase) and the worker's first line
    (Ray marks the task RUNNING before it fetches the arguments and, for an async actor, before the event loop
    runs the coroutine: on a loaded 2-core machine that can be seconds); its end is Ray's end_time_ms once
    final, after the worker's last line, else the poll that no longer saw it running: within the slowest poll
    gap the poller kept + Ray's report lag. Ray's state API floors its nanosecond stamps to whole milliseconds
    (ray/util/state/common.py: ``int(state_ts_ns) // 1e6``), so Ray's end may read up to 1 ms before the
    worker's float clock. The poller sees a call only when a poll falls inside it (a call that starts and ends
    between two polls is never seen: taskevents.py), so under load a short call may be missed; the test checks
    the calls some poll saw, and that those cover at least one whole dispatch of every rank."""
    from raytasks_scenario import INTERVAL
    done = seen["ledger_done"]
    polls = seen["poll_times"]  # [start, end] per poll
    gaps = [b[1] - a[1] for a, b in zip(polls, polls[1:])]
    # the interval the poller actually kept under this machine's load, + Ray's own lag: a worker reports its
    # task events to the GCS every RAY_task_events_report_interval_ms (default 1 s)
    slack = max(gaps) + RAY_REPORT_S + 0.1
    last_end: dict = {}   # (step, phase) -> when its last call returned (the worker's clock)
    for span in seen["truth"]:
        k = (span["step"], span["phase"])
        last_end[k] = max(last_end.get(k, 0.0), span["end"])

    def submitted_after(span) -> float:
        i = PHASES.index(span["phase"])
        return last_end[(span["step"], PHASES[i - 1]) if i else (span["step"] - 1, PHASES[-1])]
    matched, unseen, per_dispatch, used = [], 0, {}, set()
    # by end: a replica's 8 concurrent requests are told apart only by their times, so each takes the earliest-ending
    # lane not taken yet that can be its own (one lane per call)
    for span in sorted(seen["truth"], key=lambda x: x["end"]):
        if span["step"] < 2 or span["end"] > polls[-1][1] - slack:
            continue  # the first step may predate the poller; the last spans may not be closed yet
        # was it RUNNING in the GCS for a whole poll? (reported at most RAY_REPORT_S after it began)
        if not any(span["start"] + RAY_REPORT_S <= a and b <= span["end"] for a, b in polls):
            unseen += 1
            continue
        want_role = "rollout_server" if span["phase"] == "generate" else "actor_rollout"
        lo = submitted_after(span) - RAY_MS
        cands = [i for i, t in enumerate(done) if i not in used and t["phase"] == span["phase"]
                 and t["role"] == want_role and (span["rank"] < 0 or t["rank"] == span["rank"])
                 and lo <= t["start"] <= span["start"] + 0.01 and t["end"] >= span["end"] - RAY_MS]
        assert cands, (f"no lane for {span} starting in [{lo:.3f}, {span['start'] + 0.01:.3f}], ending after "
                       f"{span['end'] - RAY_MS:.3f}", [t for t in done if t["phase"] == span["phase"]
                                                       and (t["rank"] == span["rank"] or span["rank"] < 0)])
        i = min(cands, key=lambda i: done[i]["end"])
        used.add(i)
        assert done[i]["end"] - span["end"] <= slack, (span, done[i], slack)
        matched.append(span)
        per_dispatch.setdefault((span["step"], span["phase"]), set()).add(span["rank"])
    whole = [k for k, ranks in per_dispatch.items() if k[1] != "generate" and ranks == {0, 1, 2, 3}]
    assert whole, (f"no dispatch with all 4 ranks seen by a whole poll ({len(matched)} calls matched, {unseen} "
                   f"unseen; slowest poll gap {max(gaps):.2f} s)", per_dispatch)


def test_slow_rank_named_as_straggler(seen):
    s = {(x["role"], x["phase"]): x for x in seen["streaks"]}[("actor_rollout", "update_actor")]
    from omniwatch.config import DEFAULT
    # the slow rank takes (UPDATE_S + SLOW_EXTRA_S) / UPDATE_S = 2.6x the others; ends are known to a poll
    # interval + Ray's report lag, so the measured spread is lower, but above RankStraggler's threshold
    assert s["rank"] == 2 and s["streak"] >= DEFAULT.rank_straggler.dispatches
    assert s["spread_min"] >= DEFAULT.rank_straggler.spread, s
    m = seen["metrics_hang"]
    assert 'omniwatch_ray_straggler_dispatches{experiment="exp1",node="127.0.0.1",phase="update_actor",project="proj",rank="2",role="actor_rollout"}' in m


def test_hang_named_by_ps_json_and_holder_series(seen):
    from raytasks_scenario import INTERVAL
    c = trainer_constants()
    SLOW_EXTRA_S, UPDATE_S = c["SLOW_EXTRA_S"], c["UPDATE_S"]
    g = seen["hang_group"]
    assert (g["role"], g["phase"], g["running"], g["done"]) == ("actor_rollout", "update_actor", 1, 3)
    assert g["slowest"]["rank"] == 1
    # named within two poll intervals of the last healthy rank's end (rank 2 takes UPDATE_S + SLOW_EXTRA_S)
    assert seen["hang_latency_s"] <= 2 * INTERVAL + RAY_REPORT_S, seen["hang_latency_s"]
    (job,) = seen["ps_hang"]["jobs"]
    (pg,) = [x for x in job["groups"] if x["phase"] == "update_actor"]
    for k in ("role", "phase", "running", "done", "age_s", "slowest"):
        assert k in pg
    assert (pg["running"], pg["done"], pg["slowest"]["rank"]) == (1, 3, 1)
    assert set(pg["slowest"]) >= {"rank", "node", "pid", "age_s"} and pg["slowest"]["pid"] > 0
    import re
    m = re.fullmatch(r"update_actor: 3/4 ranks done in (\d+) s, rank 1 on node 127\.0\.0\.1 still running", job["holder"])
    assert m and UPDATE_S + SLOW_EXTRA_S - 0.5 <= int(m[1]) <= UPDATE_S + SLOW_EXTRA_S + 2 * INTERVAL + RAY_REPORT_S, job["holder"]
    assert 'holder="update_actor: 3/4 ranks done in' in seen["metrics_hang"] and "rank 1 on node 127.0.0.1 still running" in seen["metrics_hang"]
    ex = seen["ps_exporter"]["jobs"][0]
    assert (ex["project"], ex["experiment"], ex["phase"]) == ("proj", "exp1", "update_actor")


def test_ps_takes_the_gcs_address_and_finds_the_dashboard_through_it(seen):
    """Issue 35 item 15: ``omniwatch ps --ray-address 127.0.0.1:<gcs port>`` (what ``ray start`` prints, what
    ``serve --ray-address`` takes) failed "did not answer: RemoteProtocolError"; now the dashboard is looked up
    in the GCS as Ray's CLI does and said. Control: the hang the dashboard address showed is the same."""
    ps = seen["ps_gcs"]
    assert ps.get("ray_dashboard", "").startswith("http://") and ps["jobs"], ps
    assert ps["jobs"][0]["job_id"] == seen["ps_hang"]["jobs"][0]["job_id"]


def test_replica_holding_requests_named(seen):
    (r,) = seen["replica_held"]
    assert (r["role"], r["replica"], r["in_flight"]) == ("rollout_server", "0", 6)
    reps = seen["ps_hold"]["jobs"][0]["replicas"]
    assert any(x["replica"] == "0" and x["in_flight"] >= 6 for x in reps)


def test_killed_actor_shows_dead(seen):
    (d,) = seen["dead_seen"]
    assert d["state"] == "DEAD" and d["rank"] == 3
    assert seen["holder_dead"]["text"].startswith("actor DEAD: WorkerDict rank 3 (")
    assert any(x["state"] == "DEAD" and x["rank"] == 3 for x in seen["ps_dead"]["jobs"][0]["dead"])


def test_poll_cost_is_small(seen):
    """3 lists a poll + the finished rows of the calls that ended (by task id, at most the final budget) + the
    actor / node / placement-group tables when they changed (discovery/taskwatch.py)."""
    calls, wall, cpu = seen["poll_cost"]
    assert calls <= 3 + 32 + 2 + 3 and cpu < 0.25, seen["poll_cost"]


def test_fleet_gpu_time_from_real_ray_workers(seen):
    """Per-fleet GPU time (gpu/fleet.py) in the exporter's /metrics with real Ray 2.60 rows and verl's real actor
    names: the exporter replays 4 GPUs as node 127.0.0.1 (the Ray node's IP); WorkerDict ranks 0-3 hold GPUs 0-3 by
    placement (verl-source.md R11), the replica's generate calls are charged by node (R12)."""
    from prometheus_client.parser import text_string_to_metric_families
    fams = {f.name: f for f in text_string_to_metric_families(seen["metrics_normal"])}
    gpus = {(s.labels["fleet"], s.labels["mapping"]): s.value for s in fams["omniwatch_gpu_fleet_gpus"].samples}
    assert gpus == {("actor", "placement"): 4}
    secs: dict = {}
    for s in fams["omniwatch_gpu_fleet_seconds"].samples:
        if s.name.endswith("_total"):
            assert (s.labels["project"], s.labels["experiment"]) == ("proj", "exp1")
            k = (s.labels["fleet"], s.labels["phase"], s.labels["mapping"])
            secs[k] = secs.get(k, 0.0) + s.value
    # the phases the trainer ran on the worker group, on their GPUs; generation on the node's GPUs
    assert secs.get(("actor", "update_actor", "placement"), 0) > 0, secs
    assert secs.get(("actor", "infer_actor_batch", "placement"), 0) > 0, secs
    assert secs.get(("rollout", "generate", "node"), 0) > 0, secs
    # before the worker group's actors were known the GPUs were unmapped (fleet other, no call); nothing else
    assert all(k[2] in ("placement", "node") or k == ("other", "none", "unmapped") for k in secs), secs
