"""The Ray task-event source without a cluster: the phase mapper (verl / VeRL-Omni names), the ledger's
incremental and loss logic, holder text, stragglers and lanes — fed the state API's real answers recorded
from Ray 2.60 running verl's single controller (tests/fixtures/raytasks, README row for provenance)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from omniwatch.discovery import phases, taskevents as te
from omniwatch.discovery.rayapi import RayAPIError, parse_page
from omniwatch.discovery.taskmetrics import PHASE_CODE, TaskCollector, lanes, straggler_streaks
from omniwatch.discovery.taskwatch import TaskPoller, TaskSnapshot

FIX = Path(__file__).parent / "fixtures" / "raytasks"


def page(name: str):
    return parse_page(json.loads((FIX / f"ray_2.60_{name}.json").read_text()))


POLL_TIME = json.loads((FIX / "ray_2.60_recorded_at.json").read_text())["poll_time"]


# --- phase mapping ----------------------------------------------------------------------------------
@pytest.mark.parametrize("task,actor,want", [
    ("WorkerDict.actor_rollout_update_actor", "abcWorkerDict_0:1", ("actor_rollout", "update_actor")),
    ("WorkerDict.actor_rollout_ref_infer_ref_batch", "abcWorkerDict_0:0", ("actor_rollout_ref", "infer_ref_batch")),
    ("WorkerDict.actor_rollout_ref_update_actor", "", ("actor_rollout_ref", "update_actor")),  # longest prefix wins
    ("WorkerDict.ref_infer_ref_batch", "", ("ref", "infer_ref_batch")),
    ("WorkerDict.generate_sequences", "", ("rollout", "generate_sequences")),  # DIRECT_ROLLOUT_METHOD, no prefix
    ("WorkerDict.actor_rollout_my_custom_thing", "", ("actor_rollout", "other")),
    ("FusedWorker_actor_critic._fuw_execute", "xFusedWorker_actor_critic_0:0", ("fused", "other")),
    ("vLLMOmniHttpServer.generate", "vllm_omni_server_5_0", ("rollout_server", "generate")),
    ("vLLMHttpServer.generate", "vllm_server_reward_1_0", ("reward_server", "generate")),
    ("vLLMHttpServer.wake_up", "vllm_server_2_0", ("rollout_server", "wake_up")),
    ("DiffusionAgentLoopWorkerTQ.generate_sequences", "", ("agent_loop", "generate_sequences")),
    ("RewardLoopWorker.compute_score_batch", "", ("reward_loop", "compute_score_batch")),
    ("ActorRolloutRefWorker.update_actor", "", ("actor_rollout_ref", "update_actor")),
    ("SomethingElse.frobnicate", "", ("other", "other")),
    ("", "", ("other", "other")),
])
def test_phase_mapping(task, actor, want):
    c = phases.classify(task, actor)
    assert (c.role, c.phase) == want
    assert c.role in phases.ALL_ROLES and c.phase in phases.PHASES  # bounded label values


def test_server_replica_and_rank_order():
    assert phases.classify("vLLMOmniHttpServer.generate", "vllm_omni_server_5_1").replica == "5"
    # verl creates a group's workers in (pg_idx, local_rank) order: rank counts across placement groups
    names = ["pWorkerDict_1:0", "pWorkerDict_0:1", "pWorkerDict_0:0", "pWorkerDict_1:1", "qWorkerDict_0:0"]
    assert phases.ranks(names) == {"pWorkerDict_0:0": 0, "pWorkerDict_0:1": 1, "pWorkerDict_1:0": 2,
                                   "pWorkerDict_1:1": 3, "qWorkerDict_0:0": 0}


# --- the recorded hang ------------------------------------------------------------------------------
def hang_ledger() -> te.TaskLedger:
    led = te.TaskLedger(dispatch_gap_s=2.0)
    led.apply_actors(page("actors").rows)
    led.apply_nodes(page("nodes").rows)
    run = page("tasks_running_hang")
    led.apply(run.rows, page("tasks_failed").rows, POLL_TIME, dropped=run.dropped, truncated=run.truncated)
    return led


def test_page_counts_from_real_answer():
    p = page("tasks_finished_update_actor")
    assert len(p.rows) == 19 and p.dropped == 0 and not p.truncated
    with pytest.raises(RayAPIError):
        parse_page({"result": False, "msg": "boom", "data": {}}, 500)


def test_hung_rank_named_from_recorded_payloads():
    led = hang_ledger()
    assert len(led.running) == 1
    assert led.add_finished(page("tasks_finished_update_actor").rows) == 3  # only this dispatch's ranks
    (g,) = te.groups(led, POLL_TIME)
    assert (g["role"], g["phase"], g["running"], g["done"]) == ("actor_rollout", "update_actor", 1, 3)
    assert g["slowest"]["rank"] == 1 and g["slowest"]["node"] == "127.0.0.1" and g["slowest"]["pid"] == 16516
    assert g["done_within_s"] == pytest.approx(5.0, abs=0.1)  # rank 2, the slow one, took 5 s
    h = te.holder(led, POLL_TIME)
    assert h["text"] == "update_actor: 3/4 ranks done in 5 s, rank 1 on node 127.0.0.1 still running"
    assert h["age_s"] == pytest.approx(g["age_s"])


def test_incremental_close_estimated_and_failed_exact():
    led = hang_ledger()
    (key,) = led.running
    # the next poll no longer sees it and Ray lost nothing: it ended between the polls
    assert led.apply([], [], POLL_TIME + 0.5) == {"opened": 0, "closed": 1, "lossy": False}
    (t,) = led.done
    assert t.end == POLL_TIME + 0.5 and t.end_estimated
    led2 = hang_ledger()
    row = dict(page("tasks_running_hang").rows[0], state="FAILED", end_time_ms=int((POLL_TIME + 0.2) * 1000))
    led2.apply([], [row], POLL_TIME + 0.5)
    (t2,) = led2.done
    assert t2.failed and not t2.end_estimated and t2.end == pytest.approx(POLL_TIME + 0.2)


def test_dropped_events_and_cut_pages_close_nothing():
    led = hang_ledger()
    r = led.apply([], [], POLL_TIME + 0.5, dropped=7)  # Ray's GCS dropped events since the last poll
    assert r["lossy"] and r["closed"] == 0 and len(led.running) == 1
    assert led.dropped_seen == 7 and led.drop_increases == 1
    r = led.apply([], [], POLL_TIME + 1.0, dropped=7, truncated=True)  # our page size cut the answer
    assert r["lossy"] and r["closed"] == 0 and led.truncated_polls == 1
    r = led.apply([], [], POLL_TIME + 1.5, dropped=7)  # complete again: now it is known to have ended
    assert not r["lossy"] and r["closed"] == 1


def test_bad_rows_are_counted_not_fatal():
    led = te.TaskLedger()
    led.apply([{"task_id": "x"}, {"name": "WorkerDict.actor_update_actor"}, {"type": "NORMAL_TASK", "task_id": "n"}],
              [], 1.0)
    assert led.bad_rows == 2 and not led.running


def test_straggler_streak_from_recorded_steps():
    led = te.TaskLedger(dispatch_gap_s=2.0)
    led.apply_actors(page("actors").rows)
    led.apply_nodes(page("nodes").rows)
    rows = page("tasks_finished_update_actor").rows
    for r in sorted(rows, key=lambda r: r["start_time_ms"]):  # feed them as a poller would see them
        led.apply([dict(r, state="RUNNING")], [], r["start_time_ms"] / 1000)
    # close all (exact ends from the FINISHED rows, as ps does) -- rebuild from the rows instead:
    for d in led.dispatches:
        for t in d.tasks:
            t.end = next(r["end_time_ms"] for r in rows if r["task_id"] == t.key[0]) / 1000
    led.running.clear()
    s = {(x["role"], x["phase"]): x for x in straggler_streaks(led)}["actor_rollout", "update_actor"]
    assert s["rank"] == 2 and s["node"] == "127.0.0.1" and s["streak"] >= 4
    assert 1.9 < s["spread_min"] < 2.1   # 5 s against 2.5 s


def test_tied_ends_name_no_straggler():
    """Ranks that finish between the same two polls get the same estimated end: none of them is 'last'."""
    led = synthetic(8)
    led.apply([], [], 1010.0)  # all 8 close on the same poll
    assert straggler_streaks(led) == []


def synthetic(n: int, phase: str = "update_actor") -> te.TaskLedger:
    led = te.TaskLedger()
    led.apply_actors([{"actor_id": f"a{i}", "name": f"pWorkerDict_{i // 8}:{i % 8}", "class_name": "WorkerDict",
                       "state": "ALIVE", "node_id": f"n{i // 8}", "pid": 1000 + i, "job_id": "01"} for i in range(n)])
    led.apply([{"task_id": f"t{i}", "attempt_number": 0, "name": f"WorkerDict.actor_rollout_{phase}", "actor_id": f"a{i}",
                "node_id": f"n{i // 8}", "worker_pid": 1000 + i, "job_id": "01", "type": "ACTOR_TASK",
                "start_time_ms": 1000_000 + i} for i in range(n)], [], 1001.0)
    return led


def test_lanes_one_per_rank_then_collapse_at_512():
    lane, collapsed = lanes(synthetic(8), collapse_above=64)
    assert sorted(r for _, r, _ in lane) == list(range(8)) and not collapsed
    assert {code for *_, code in lane} == {PHASE_CODE["update_actor"]}
    lane, collapsed = lanes(synthetic(512), collapse_above=64)
    assert lane == [] and collapsed == [("actor_rollout", "update_actor", 512)]


def test_collector_renders_bounded_series_at_512_workers():
    poller = TaskPoller("http://127.0.0.1:9", interval=1.0, ledger=synthetic(512))
    led = poller.ledger
    poller.job_id = "01"
    poller.publish(1001.0)
    reg = CollectorRegistry()
    reg.register(TaskCollector(poller, lambda: ("proj", "exp1"), collapse_above=64))
    body = generate_latest(reg).decode()
    series = [ln for ln in body.splitlines() if ln and not ln.startswith("#")]
    assert not any(ln.startswith("omniwatch_ray_worker_phase{") for ln in series)
    assert 'omniwatch_ray_workers_running{experiment="exp1",phase="update_actor",project="proj",role="actor_rollout"} 512.0' in series
    assert len(series) < 20
    holder = [ln for ln in series if ln.startswith("omniwatch_step_holder_info{")]
    assert holder and "512 actor_rollout worker(s) running, slowest rank 0" in holder[0]
    poller.api.close()


def test_holder_texts_for_replica_idle_and_dead():
    led = te.TaskLedger()
    led.apply_actors([{"actor_id": "s5", "name": "vllm_omni_server_5_0", "class_name": "vLLMOmniHttpServer",
                       "state": "ALIVE", "node_id": "n1", "pid": 7, "job_id": "01"}])
    assert te.holder(led, 10.0)["text"] == "no Ray task running: the driver is outside any worker call"
    led.apply([{"task_id": f"g{i}", "name": "vLLMOmniHttpServer.generate", "actor_id": "s5", "node_id": "n1",
                "job_id": "01", "type": "ACTOR_TASK", "start_time_ms": 1000 + i} for i in range(16)], [], 10.0)
    h = te.holder(led, 10.0)
    assert h["text"] == "generation: replica 5 holds 16 requests, other replicas idle" and h["phase"] == "generate"
    led.apply_actors([{"actor_id": "w", "name": "pWorkerDict_0:7", "class_name": "x.WorkerDict", "state": "DEAD",
                       "node_id": "n3", "pid": 9, "job_id": "01"}])
    led.apply_nodes([{"node_id": "n3", "node_ip": "10.0.0.3"}])
    assert te.holder(led, 10.0)["text"] == "actor DEAD: WorkerDict rank 0 (pWorkerDict_0:7) on node 10.0.0.3"


# --- report lanes (report/gantt.py) ---------------------------------------------------------------------
def test_report_lanes_segments_and_chart():
    from omniwatch.report import gantt as rl
    up, ref = PHASE_CODE["update_actor"], PHASE_CODE["infer_ref_batch"]
    series = {"actor_rollout rank 000": {0.0: ref, 15.0: ref, 30.0: 0, 45.0: up, 60.0: up, 75.0: up, 90.0: 0},
              "actor_rollout rank 001": {45.0: up, 60.0: up, 105.0: up}}  # a scrape gap (75, 90 missing) splits a bar
    bars = rl.segments(series, 15.0)
    assert [(b.lane[-1], b.phase, b.start, b.end) for b in bars] == [
        ("0", "infer_ref_batch", 0.0, 30.0), ("0", "update_actor", 45.0, 90.0),
        ("1", "update_actor", 45.0, 75.0), ("1", "update_actor", 105.0, 120.0)]
    fig = rl.chart(bars)
    assert fig is not None and list(fig.y_range.factors) == ["actor_rollout rank 001", "actor_rollout rank 000"]
    assert rl.chart([]) is None


def test_report_lanes_have_every_fleet_in_the_dashboards_colours():
    """Issue 32 item 6: the report's lanes, like the dashboard's, show the generate (agent-loop), reward (reward-loop)
    and actor fleets, each phase in the one colour every panel kind gives it (palette.PHASE_COLORS)."""
    from omniwatch import palette
    from omniwatch.dashboards.lanes import PHASE_MAPPINGS
    from omniwatch.report import gantt as rl
    lanes = {"agent_loop rank 000": "generate_sequences", "reward_loop rank 000": "compute_score",
             "actor_rollout rank 000": "update_actor", "actor_rollout rank 001": "train_batch"}
    series = {lane: {0.0: PHASE_CODE[ph], 15.0: PHASE_CODE[ph], 30.0: 0} for lane, ph in lanes.items()}
    bars = rl.segments(series, 15.0)
    assert {(b.lane, b.phase) for b in bars} == set(lanes.items())
    fig = rl.chart(bars)
    data = fig.renderers[0].data_source.data
    colour = dict(zip(data["phase"], data["color"]))
    dashboard = {text: c for code, text, c in PHASE_MAPPINGS}
    for ph in lanes.values():
        assert colour[ph] == palette.color(ph, "?") == dashboard[ph], ph
    assert colour["train_batch"] == colour["update_actor"] != colour["compute_score"] != colour["generate_sequences"]


def test_report_slowest_steps_windows():
    """The slowest steps' Gantt: the K longest step times, each from the previous step's arrival to its own."""
    from omniwatch.report import gantt as rl
    marks = [(100.0, 1), (130.0, 2), (200.0, 3), (220.0, 4), (300.0, 5)]
    durs = {1: 25.0, 2: 28.0, 3: 66.0, 4: 19.0, 5: 75.0}
    assert rl.slowest(marks, durs, 2) == [(3, 130.0, 200.0), (5, 220.0, 300.0)]
    assert rl.slowest(marks[:1], durs, 2) == []   # the first step has no window

    class Prom:  # query_range answers as Prometheus does: one series per (role, rank)
        def query_range(self, q, a, b, res):
            return [{"metric": {"role": "actor_rollout", "rank": "1"},
                     "values": [[a + 15.0, str(PHASE_CODE["update_actor"])], [a + 30.0, "0"]]}]
    bars = rl.query_steps(Prom(), 'project="p"', [(3, 130.0, 200.0)], 15.0)
    assert [(b.lane, b.phase, b.start, b.end) for b in bars] == [("step 3 · actor_rollout rank 001", "update_actor", 15.0, 30.0)]
    assert rl.chart(bars, title="slowest") is not None


@pytest.mark.integration
def test_report_lanes_read_back_from_a_real_prometheus(tmp_path):
    """The lanes series as scraped (written as OpenMetrics, made blocks by promtool, served by a real
    Prometheus) come back as the report's bars: rank 1 in update_actor for 4 scrapes, rank 0 for 1."""
    from omniwatch.backtest.tsdb import TempPrometheus, create_blocks_from_openmetrics
    from omniwatch.report import gantt as rl
    up = PHASE_CODE["update_actor"]
    t0 = 1_800_000_000
    lines = ["# TYPE omniwatch_ray_worker_phase gauge"]
    for rank, codes in (("0", [up, 0, 0, 0, 0]), ("1", [up, up, up, up, 0])):
        for k, c in enumerate(codes):
            lines.append(f'omniwatch_ray_worker_phase{{project="p",experiment="e",role="actor_rollout",rank="{rank}"}} '
                         f"{c} {t0 + 15 * k}")
    om = tmp_path / "lanes.om"
    om.write_text("\n".join(lines) + "\n# EOF\n")
    create_blocks_from_openmetrics(str(om), str(tmp_path / "data"))
    with TempPrometheus(str(tmp_path / "data")) as prom:
        bars = rl.query(prom, 'project="p",experiment="e"', t0, t0 + 60, 15.0)
    assert [(b.lane, b.phase, b.end - b.start) for b in bars] == [
        ("actor_rollout rank 000", "update_actor", 15.0), ("actor_rollout rank 001", "update_actor", 60.0)]


def test_holder_label_is_redacted():
    """Actor names are the trainer's: a credential-shaped one never becomes a label value."""
    led = te.TaskLedger()
    led.apply_actors([{"actor_id": "w", "name": "hf_abcdefghijklmnopqrstuvwxyzABCDEF", "class_name": "WorkerDict",
                       "state": "DEAD", "node_id": "n3", "pid": 9, "job_id": "01"}])
    poller = TaskPoller("http://127.0.0.1:9", interval=1.0, ledger=led)
    poller.job_id = "01"
    poller.publish(10.0)
    reg = CollectorRegistry()
    reg.register(TaskCollector(poller, lambda: ("p", "e")))
    body = generate_latest(reg).decode()
    assert "omniwatch_step_holder_info{" in body and "hf_abcdefghijklmnopqrstuvwxyzABCDEF" not in body
    poller.api.close()


def test_pending_actor_seen_first_is_refreshed_once_it_runs():
    """An actor first seen PENDING_CREATION (the non-ALIVE query) has no pid / node yet: a call running on it
    makes it stale, so the poller fetches the actor and node tables (regression: nodes shown as ids)."""
    led = te.TaskLedger()
    actors = page("actors").rows
    led.apply_actors([dict(a, state="PENDING_CREATION", pid=None, node_id="") for a in actors])
    run = page("tasks_running_hang").rows
    # every actor last seen pending is stale (issue 33 item 2: mapped at its first call, even one no poll saw)
    assert led.stale_actor_ids(run) == {a["actor_id"] for a in actors} and run[0]["actor_id"] in led.stale_actor_ids(run)
    led.apply_actors(actors)
    assert led.stale_actor_ids(run) == set()


def test_a_second_call_on_a_worker_opens_the_next_dispatch():
    """verl sends each rank one call per dispatch (execute_all_async): steps shorter than the dispatch gap, seen by polls
    as far apart as that gap, stay separate dispatches -- never "4/5 ranks done" of a 4-rank group; a server replica's
    concurrent requests on one actor stay one group."""
    led = synthetic(4)   # step 1's update_actor on ranks 0-3, started at 1000.000-1000.003, gap 5 s
    led.apply([], [], 1002.0)   # all four ended between polls
    row = {"attempt_number": 0, "name": "WorkerDict.actor_rollout_update_actor", "node_id": "n0", "job_id": "01",
           "type": "ACTOR_TASK"}
    # step 2's: rank 1 (hung) and rank 0 (its 1 s call seen by this poll), 2.5 s after step 1's
    led.apply([dict(row, task_id="s2r1", actor_id="a1", worker_pid=1001, start_time_ms=1002_500),
               dict(row, task_id="s2r0", actor_id="a0", worker_pid=1000, start_time_ms=1002_501)], [], 1003.0)
    led.apply([dict(row, task_id="s2r1", actor_id="a1", worker_pid=1001, start_time_ms=1002_500)], [], 1004.0)
    assert len(led.dispatches) == 2
    assert te.holder(led, 1004.0)["text"] == "update_actor: 1/2 ranks done in 2 s, rank 1 on node n0 still running"
    # ps adds the finished rows of the open dispatch: a worker's call of the step before is not one of its ranks
    fin = [dict(row, task_id=f"s{s}r{r}", actor_id=f"a{r}", state="FINISHED", start_time_ms=start,
                end_time_ms=start + 1000) for s, start in ((1, 1000_002), (2, 1002_502)) for r in (2, 3)]
    assert led.add_finished(fin) == 2
    (g,) = te.groups(led, 1004.0)
    assert (g["running"], g["done"]) == (1, 3)
    # a replica's concurrent requests on one actor are one group (not verl workers)
    srv = te.TaskLedger(dispatch_gap_s=5.0)
    srv.apply_actors([{"actor_id": "s", "name": "vllm_omni_server_0_0", "class_name": "vLLMOmniHttpServer",
                       "state": "ALIVE", "node_id": "n0", "pid": 7, "job_id": "01"}])
    srv.apply([dict(row, name="vLLMOmniHttpServer.generate", task_id=f"g{i}", actor_id="s", worker_pid=7,
                    start_time_ms=1000_000 + i) for i in range(6)], [], 1001.0)
    assert len(srv.dispatches) == 1 and len(srv.dispatches[0].tasks) == 6


def test_the_change_log_gives_the_keys_changed_since_a_seq_newest_first_each_once():
    led = te.TaskLedger(max_done=2)   # a change log of 8 keys
    for k in ["a", "b", "a", "c", "d", "e", "f", "g", "h", "c"]:
        led.touch((k, 0))
    assert led.seq == 10 and led.oldest_change() == 3 and len(led.changes) == 8
    assert [k for k, _ in led.changed_since(7)] == ["c", "h", "g"]
    assert [k for k, _ in led.changed_since(2)] == ["c", "h", "g", "f", "e", "d", "a"]
    assert led.changed_since(10) == [] and led.changed_since(11) == []
