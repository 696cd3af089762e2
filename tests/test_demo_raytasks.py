"""The demo's stand-in of Ray's state API (omniwatch.demo.raytasks, served by the demo endpoints): rows shaped
exactly as recorded from Ray 2.60, Ray's filters and limit, and a step that the real task-event source reads
as phases moving, one straggling rank and a held step."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from omniwatch.demo import standins as demo_endpoints
from omniwatch.demo import raytasks as dr
from omniwatch.discovery import taskevents as te
from omniwatch.discovery.rayapi import parse_page
from omniwatch.discovery.taskmetrics import PHASE_CODE, lanes, straggler_streaks
from omniwatch.discovery.taskwatch import TaskPoller

FIX = Path(__file__).parent / "fixtures" / "raytasks"


@pytest.mark.parametrize("name", ["tasks_running_hang", "actors", "nodes"])
def test_the_packaged_rows_are_the_recorded_fixtures(name):
    f = f"ray_2.60_{name}.json"
    assert (dr.ROWS / f).read_bytes() == (FIX / f).read_bytes()


def test_running_rows_keep_the_recorded_shape_and_ray_filters_apply():
    rec = json.loads((FIX / "ray_2.60_tasks_running_hang.json").read_text())
    s = dr.StateStandIn()
    t0 = 1_800_000_000.0 - 1_800_000_000.0 % dr.CYCLE_S + dr.CYCLE_S  # a step start: t0 + 6 s is in update_actor
    code, body = s.answer("/api/v0/tasks?limit=100&filter_keys=state&filter_predicates=%3D&filter_values=RUNNING",
                          now=t0 + 6.0)
    out = json.loads(body)
    assert code == 200 and out.keys() == rec.keys() and out["data"]["result"].keys() == rec["data"]["result"].keys()
    rows = out["data"]["result"]["result"]
    assert rows and all(r.keys() == rec["data"]["result"]["result"][0].keys() for r in rows)
    assert {r["name"] for r in rows} == {"WorkerDict.actor_rollout_update_actor"} and len(rows) == 4
    # limit cuts as Ray does: num_filtered says how many matched
    page = parse_page(json.loads(s.answer("/api/v0/tasks?limit=2&filter_keys=state&filter_predicates=%3D"
                                          "&filter_values=RUNNING", now=t0 + 6.0)[1]))
    assert len(page.rows) == 2 and page.truncated
    # FAILED and another job: nothing; actors not ALIVE: none; the actor and node tables: the recorded ones
    assert not parse_page(json.loads(s.answer("/api/v0/tasks?filter_keys=state&filter_predicates=%3D"
                                              "&filter_values=FAILED")[1])).rows
    assert not parse_page(json.loads(s.answer("/api/v0/tasks?filter_keys=state&filter_predicates=%3D&filter_values="
                                              "RUNNING&filter_keys=job_id&filter_predicates=%3D&filter_values=02000000",
                                              now=t0 + 6.0)[1])).rows
    assert not parse_page(json.loads(s.answer("/api/v0/actors?filter_keys=state&filter_predicates=!%3D"
                                              "&filter_values=ALIVE")[1])).rows
    assert len(parse_page(json.loads(s.answer("/api/v0/actors")[1])).rows) == 5 + 2 * dr.LOOP_WORKERS
    assert s.answer("/api/v0/jobs")[0] == 404


def test_the_ledger_sees_phases_a_straggling_rank_and_a_held_step():
    s = dr.StateStandIn()
    led = te.TaskLedger(dispatch_gap_s=2.0)
    led.apply_actors(s.actors)
    led.apply_nodes(s.nodes)
    base = 1_800_000_000.0 - 1_800_000_000.0 % (dr.CYCLE_S * dr.HANG_EVERY) + dr.CYCLE_S  # a normal step
    seen_phases, holders = set(), []
    now = base
    while now < base + 3 * dr.CYCLE_S:
        led.apply(s.running(now), [], now)
        seen_phases |= {t.call.phase for t in led.running.values()}
        holders.append(te.holder(led, now))
        now += 0.5
    assert {"generate", "compute_log_prob", "update_actor", "update_weights"} <= seen_phases
    assert any("replica" in h["text"] for h in holders)
    streaks = {(x["role"], x["phase"]): x for x in straggler_streaks(led)}
    st = streaks[("actor_rollout", "update_actor")]
    assert st["rank"] == dr.SLOW_RANK and st["streak"] >= 2 and st["spread_last"] > 1.5
    # the held step (the third): one rank holds update_actor for seconds after the others finished
    held = [h for h in holders if h["phase"] == "update_actor" and "3/4 ranks done" in h["text"]]
    assert held and max(h["age_s"] for h in held) > 3.0
    lane, _ = lanes(led, 64)
    assert sorted(r for role, r, _ in lane if role == "actor_rollout") == [0, 1, 2, 3]
    # issue 32 item 6: every fleet of the step has its lanes: the agent loops generate, the reward loops score
    led.apply(s.running(now + 2.0), [], now + 2.0)
    lane, _ = lanes(led, 64)
    by_role = {}
    for role, r, code in lane:
        by_role.setdefault(role, {})[r] = code
    assert sorted(by_role["agent_loop"]) == sorted(by_role["reward_loop"]) == list(range(dr.LOOP_WORKERS))
    assert all(c == PHASE_CODE["generate_sequences"] for c in by_role["agent_loop"].values())
    assert all(c == PHASE_CODE["compute_score"] for c in by_role["reward_loop"].values())


def test_the_real_poller_reads_the_demo_endpoints_state_api():
    server, port = demo_endpoints.start()
    try:
        p = TaskPoller(f"http://127.0.0.1:{port}", interval=0.5, timeout=5, job_id=dr.JOB_ID)
        # the demo's step (CYCLE_S of wall time) has short gaps between its phases where nothing runs, and the
        # poller reads the actor table only when a running task names an unknown actor: poll until one runs
        for _ in range(round(dr.CYCLE_S / 0.25)):
            snap = p.poll()
            if p.ledger.running:
                break
            time.sleep(0.25)
        p.api.close()
        assert snap.up and len(p.ledger.actors) == 5 + 2 * dr.LOOP_WORKERS and snap.holder["text"]
        assert not snap.lossy and snap.dropped == 0
    finally:
        demo_endpoints.stop(server)


def test_the_demo_passes_the_stand_in_to_the_exporter_with_its_run():
    args = demo_endpoints.ray_tasks_args("127.0.0.1", 9999, "demo", "exp")
    assert args[args.index("--ray-tasks") + 1] == "http://127.0.0.1:9999"
    assert args[args.index("--ray-job") + 1] == dr.JOB_ID
    assert args[args.index("--discovery-experiment") + 1] == "exp"
