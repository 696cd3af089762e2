"""Per-fleet GPU time (issue 24 item 6, gpu/fleet.py): the sampled GPUs' busy / idle seconds by the fleet and
phase of the Ray worker call holding each GPU, in productive / overhead / idle buckets, with the mapping each
number used. Ray's side is the state-API stand-in (rows shaped as recorded from Ray 2.60: the colocated
WorkerDict ranks 0-3 and the vllm_omni_server_0_0 replica on one node); the GPUs are the real sampler over
scripted NVML samples. The truth each number is checked against is the stand-in's own schedule, sampled every
10 ms, independent of the ledger the exporter builds from its polls."""
from __future__ import annotations

import json
import math
import threading
from urllib.parse import urlencode
from collections import defaultdict, deque

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from omniwatch.demo import raytasks as dr
from omniwatch import names as n
from omniwatch.discovery import taskevents as te
from omniwatch.discovery.phases import classify
from omniwatch.discovery.rayapi import parse_page
from omniwatch.discovery.taskfinal import Recovery, settle
from omniwatch.gpu import fleet as fl
from omniwatch.gpu.callwatch import CallObserver
from omniwatch.gpu.devices import TraceBackend, TraceDevice
from omniwatch.gpu.sampler import GpuSampler
from omniwatch.core.model import RunStore

POLL_S, SAMPLE_S = 0.5, 0.2
# a normal (not held) step starts here: k % HANG_EVERY == 1
T0 = 1_800_000_000.0 - 1_800_000_000.0 % (dr.CYCLE_S * dr.HANG_EVERY) + dr.CYCLE_S


def util(gpu: int, t: float) -> int:
    """GPU 0 computes from 3 s to 8 s of every step (the worker phases), GPU 1 all the time."""
    return 100 if gpu == 1 or 3.0 <= (t - T0) % dr.CYCLE_S < 8.0 else 0


class Poller:  # what FleetAccountant reads of the task-event source: the ledger, its lock, the recovery queue
    def __init__(self):
        self.ledger = te.TaskLedger(dispatch_gap_s=2.0)
        self.lock = threading.Lock()
        self.recovery = Recovery()
        self.interval = POLL_S


class StandInAPI:
    """rayapi.StateAPI's ``list`` over the stand-in's own answers (its filters, its limit), at a given time."""

    def __init__(self, stand: dr.StateStandIn):
        self.stand, self.now, self.calls = stand, 0.0, 0

    def list(self, kind, filters=(), limit=None, detail=False):
        q = [("limit", str(limit or 2000))] + [x for k, p, v in filters
                                               for x in (("filter_keys", k), ("filter_predicates", p), ("filter_values", v))]
        status, body = self.stand.answer(f"/api/v0/{kind}?" + urlencode(q), now=self.now)
        self.calls += 1
        return parse_page(json.loads(body), status)


def truth_at(stand: dr.StateStandIn, gpu: int, t: float) -> tuple[str, str, str] | None:
    """(fleet, phase, mapping) of the call holding GPU ``gpu`` at ``t`` by the stand-in's own schedule."""
    rows = stand.running(t)
    rank_actor = stand.ranks[gpu]["actor_id"]
    mine = [r for r in rows if r["actor_id"] == rank_actor]
    if mine:
        c = classify(mine[0]["name"])
        return fl.fleet_of(c.role, c.phase), c.phase, "placement"
    if any(r["actor_id"] == stand.servers[0]["actor_id"] for r in rows):
        return "rollout", "generate", "node"
    return None


def simulate(steps: int = 3, pids: dict[int, frozenset] | None = None, store=None, finals: bool = True,
             poll_s: float = POLL_S, drain_s: float = POLL_S, observe: bool = False):
    """The stand-in's schedule through the real sampler (scripted NVML samples), ledger, finals and accountant,
    on a 50 ms clock: a poll every ``poll_s``, a sampler drain every ``drain_s``; with ``observe`` a call
    observer reads the ranks' process titles from the schedule (gpu/callwatch.py) every tick."""
    stand = dr.StateStandIn()
    devs = [TraceDevice(i, f"GPU-{i}", "NVIDIA H200", deque(), memory_total=1 << 30,
                        visible_pids=(pids or {}).get(i, frozenset())) for i in range(2)]
    sampler = GpuSampler(TraceBackend(devs), store, node="127.0.0.1")
    poller = Poller()
    poller.interval = poll_s
    clock = {"t": 0.0}
    by_pid = {r["pid"]: r["actor_id"] for r in stand.ranks}

    def title(pid: int) -> bytes:
        if pid not in by_pid:
            raise FileNotFoundError(pid)
        names = [r["name"] for r in stand.running(clock["t"]) if r["actor_id"] == by_pid[pid]]
        return ("ray::" + names[0] if names else "ray::WorkerDict").encode() + b"\x00"
    observer = CallObserver(lambda: {}, read=title, scan=lambda: list(by_pid)) if observe else None
    acct = fl.FleetAccountant(sampler, poller, lambda: ("flowgrpo", "fleet"), store, addresses=set(),
                              observer=observer)
    poller.ledger.apply_actors(stand.actors)
    poller.ledger.apply_nodes(stand.nodes)
    api = StandInAPI(stand)
    t = last_sample = T0 - 2.0
    next_poll = next_drain = t
    while t < T0 + steps * dr.CYCLE_S:
        t = round(t + 0.05, 6)
        clock["t"] = t
        if observer is not None:
            observer.sample(t)
        if t >= next_poll - 1e-9:
            next_poll += poll_s
            api.now = t
            poller.ledger.apply(stand.running(t), now=t)
            if finals:   # Ray's recorded ends of the calls that left the RUNNING set (discovery/taskfinal.py)
                settle(api, poller.ledger, [], poller.recovery)
        if t >= next_drain - 1e-9:
            next_drain += drain_s
            for i, d in enumerate(devs):
                d.chunks.append([(int(round(x * 1e6)), util(i, x))
                                 for x in (last_sample + SAMPLE_S * k for k in range(1, int(drain_s / SAMPLE_S) + 2))
                                 if last_sample < x <= t + 1e-9])
            last_sample = max(x for x in (last_sample + SAMPLE_S * k for k in range(0, 40)) if x <= t + 1e-9)
            sampler.poll_once()
    return stand, sampler, acct


def truth(stand, sampler, acct):
    """The stand-in's own schedule, every 20 ms, over the accountant's window: (fleet, phase, bucket, mapping)
    -> seconds, and how many calls each (fleet, phase, mapping) had."""
    firsts = {acct.since[g.uuid] for g in sampler.snapshot()}
    ends = {acct.until[g.uuid] for g in sampler.snapshot()}
    assert len(ends) == 1 and len(firsts) == 1
    first, end = firsts.pop(), ends.pop()
    out, calls, prev, dt = defaultdict(float), defaultdict(int), {}, 0.02
    for gpu in (0, 1):
        x = first + dt / 2
        while x < end:
            # the NVML sample stamped s describes the period (s - 0.2, s]
            busy = util(gpu, T0 + math.ceil(round((x - T0) / SAMPLE_S, 6)) * SAMPLE_S) > 50
            h = truth_at(stand, gpu, x)
            fleet, phase, how = h if h else ("actor", fl.NO_CALL, "placement")
            out[(fleet, phase, fl.bucket_of(phase, busy), how)] += dt
            if h and h != prev.get(gpu):
                calls[(fleet, phase, how)] += 1
            prev[gpu] = h
            x += dt
    return out, calls, first, end


def _got(acct) -> dict:
    got = defaultdict(float)
    for (p, e, _node, fleet, phase, bucket, how), s in acct.series()[0]:
        assert (p, e) == ("flowgrpo", "fleet") and bucket in fl.BUCKETS and how in fl.MAPPINGS
        got[(fleet, phase, bucket, how)] += s
    return got


def _exact(got, want, calls, per_call: float = 0.03, mappings=fl.MAPPINGS):
    """Every named phase within the truth's own 20 ms grid per call."""
    for key in [k for k in want if k[1] != fl.NO_CALL and k[3] in mappings]:
        tol = per_call * max(1, calls[(key[0], key[1], key[3])]) + 0.05
        assert got.get(key, 0.0) == pytest.approx(want[key], abs=tol), (key, got.get(key), want[key])


def test_every_attributed_gpu_second_is_in_one_bucket_and_matches_the_schedule_exactly():
    stand, sampler, acct = simulate(steps=3)
    got = _got(acct)
    want, calls, first, end = truth(stand, sampler, acct)
    assert end > T0 + 2 * dr.CYCLE_S   # the horizon trails the last poll by Ray's report lag
    # every second the GPUs were sampled in the attributed window is in exactly one bucket
    assert sum(got.values()) == pytest.approx(sum(want.values()), abs=0.3)
    # the named phases: starts and ends are Ray's recorded times (the finished rows looked up by task id), not
    # the poll that stopped seeing a call
    _exact(got, want, calls)
    # what the numbers say, in words: GPU 0 computes in compute_log_prob / update_actor (actor fleet,
    # productive), sits idle while the replica generates (rollout fleet, by node), and weight sync is overhead
    assert got[("actor", "update_actor", "productive", "placement")] > 2 * 1.4 * 2 - 1.5
    assert got[("rollout", "generate", "idle", "node")] > 0       # GPU 0 idle during generation
    assert got[("rollout", "generate", "productive", "node")] > 0  # GPU 1 busy during generation
    assert got[("actor", "update_weights", "overhead", "placement")] > 0
    assert ("actor", "update_weights", "productive", "placement") not in got
    assert got[("actor", fl.NO_CALL, "idle", "placement")] > 0 and got[("actor", fl.NO_CALL, "overhead", "placement")] > 0
    assert acct.poller.ledger.finals_exact > 0 and acct.poller.ledger.finals_estimated == 0


def test_calls_between_slow_polls_are_found_by_the_observer_and_recovered_exactly():
    """At a 5 s poll most of the stand-in's calls (0.6-2.5 s) start and end between two polls: no RUNNING
    answer has them. The observer (process titles, 50 ms) sees each one; its finished-task page gives Ray's
    exact times, so every phase is as exact as at 0.5 s polls. Without the observer they are lost."""
    stand, sampler, acct = simulate(steps=3, poll_s=5.0, drain_s=1.0, observe=True)
    got = _got(acct)
    want, calls, _, _ = truth(stand, sampler, acct)
    # the worker calls (placement); a replica's requests (async, by node) are not observed: see the docs
    _exact(got, want, calls, mappings=("placement",))
    led = acct.poller.ledger
    assert led.recovered >= 6 and acct.poller.recovery.pages >= 6 and acct.observed_s == 0.0
    assert got[("actor", "update_weights", "overhead", "placement")] == pytest.approx(
        want[("actor", "update_weights", "overhead", "placement")], abs=0.1)
    stand, sampler, acct = simulate(steps=3, poll_s=5.0, drain_s=1.0, observe=False)   # the control
    got = _got(acct)
    want, calls, _, _ = truth(stand, sampler, acct)
    missing = want[("actor", "update_weights", "overhead", "placement")] - got.get(("actor", "update_weights", "overhead", "placement"), 0)
    assert missing > 1.0


def test_an_observed_call_whose_page_is_cut_keeps_the_observed_boundaries():
    """A recovery page that comes back cut at its size bound (the actor's history of that method is longer):
    no more pages for that (actor, method); the observer's boundaries (+-25 ms) stand and are counted."""
    import omniwatch.discovery.taskfinal as tf
    page, tf.RECOVER_PAGE = tf.RECOVER_PAGE, 1
    try:
        stand, sampler, acct = simulate(steps=3, poll_s=5.0, drain_s=1.0, observe=True)
    finally:
        tf.RECOVER_PAGE = page
    got = _got(acct)
    want, calls, _, _ = truth(stand, sampler, acct)
    assert acct.poller.recovery.given_up and acct.observed_s > 1.0
    _exact(got, want, calls, per_call=0.08, mappings=("placement",))


def test_nvml_pids_win_where_visible_and_the_collector_renders_the_mapping():
    stand = dr.StateStandIn()
    rank3 = stand.ranks[3]
    _, sampler, acct = simulate(steps=2, pids={1: frozenset({rank3["pid"]})})
    reg = CollectorRegistry()
    reg.register(fl.FleetCollector(acct))
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    secs = fams[n.GPU_FLEET_SECONDS_TOTAL.removesuffix("_total")].samples
    by_how = defaultdict(float)
    for s in secs:
        if s.name.endswith("_total"):
            by_how[s.labels["mapping"]] += s.value
    assert by_how["nvml_pid"] > 0 and by_how["placement"] > 0
    gpus = {(s.labels["fleet"], s.labels["mapping"]): s.value for s in fams[n.GPU_FLEET_GPUS].samples}
    assert gpus == {("actor", "nvml_pid"): 1, ("actor", "placement"): 1}
    # rank 3 is the straggler (1.8x in compute_log_prob): GPU 1 (its pid) carries its longer calls
    clp = sum(s.value for s in secs if s.name.endswith("_total") and s.labels["phase"] == "compute_log_prob"
              and s.labels["mapping"] == "nvml_pid")
    assert clp > 1.3 * 1.8 * 0.9


def test_no_gpu_mapping_without_the_node_and_bad_rows_are_kept_out():
    stand = dr.StateStandIn()
    led = te.TaskLedger()
    led.apply_actors(stand.actors)
    led.apply_nodes(stand.nodes + [dict(stand.nodes[0], node_id="f" * 56, node_ip="10.0.0.9", node_name="10.0.0.9")])
    # two nodes: the sampler's is the one whose IP or name it carries; none -> nothing is mapped
    assert fl.local_node_ids(led.node_info, "127.0.0.1", set()) == {stand.nodes[0]["node_id"]}
    assert fl.local_node_ids(led.node_info, "gpu-host-7", set()) == set()
    gpus = [type("G", (), {"index": 0, "uuid": "GPU-0", "pids": frozenset()})()]
    assert fl.gpu_map(led, gpus, set()) == {}
    m = fl.gpu_map(led, gpus, {stand.nodes[0]["node_id"]})
    assert m == {stand.ranks[0]["actor_id"]: [("GPU-0", "placement")]}
    # fleets and buckets from the fixed sets
    assert fl.fleet_of("actor_rollout", "generate_sequences") == "rollout"
    assert fl.fleet_of("actor_rollout", "update_actor") == "actor"
    assert fl.fleet_of("reward_server", "generate") == "reward"
    assert fl.bucket_of("save_checkpoint", False) == "overhead" and fl.bucket_of("update_actor", False) == "idle"


def test_a_gap_longer_than_the_ring_is_a_counted_skip():
    store = RunStore()
    _, sampler, acct = simulate(steps=1, store=store)
    g = sampler.snapshot()[0]
    acct.until[g.uuid] = g.ring[0].start - 5.0   # as if the sampler had been away
    acct.poller.ledger.prev_poll = acct.poller.ledger.last_poll
    acct.process()
    assert acct.skipped_s >= 5.0
    assert store.errors[(fl.SOURCE, "fleet_before_samples")] == 1


# -- cluster-wide: the agents' mirror of the one poller's ledger, and the exporter's per-node sums (issue 33 item 3)
def test_an_agent_mirroring_the_ledger_attributes_its_gpus_as_the_exporter_does():
    """An agent's accountant over a mirror fed the exporter's ledger changes (``share`` since its last look, as
    ``GET /api/v1/raytasks/calls`` answers) charges every second as an accountant over the ledger itself."""
    from types import SimpleNamespace
    from omniwatch.discovery.taskshare import TaskMirror, share
    stand = dr.StateStandIn()
    devs = [TraceDevice(0, "GPU-0", "NVIDIA H200", deque(), memory_total=1 << 30)]
    sampler = GpuSampler(TraceBackend(devs), None, node="127.0.0.1")
    poller = Poller()
    poller.snapshot, poller.run_labels = SimpleNamespace(job_id=dr.JOB_ID), lambda: ("flowgrpo", "fleet")
    mirror = TaskMirror("http://127.0.0.1:9")
    here = fl.FleetAccountant(sampler, poller, poller.run_labels, None, addresses=set())
    there = fl.FleetAccountant(sampler, mirror, mirror.run_labels, None, node_id=stand.nodes[0]["node_id"])
    poller.ledger.apply_actors(stand.actors)
    poller.ledger.apply_nodes(stand.nodes)
    api = StandInAPI(stand)
    t = last = T0 - 2.0
    sizes = []
    while t < T0 + 2 * dr.CYCLE_S:
        t = round(t + POLL_S, 6)
        api.now = t
        poller.ledger.apply(stand.running(t), now=t)
        settle(api, poller.ledger, [], poller.recovery)
        doc = json.loads(json.dumps(share(poller, mirror.seq)))
        sizes.append(len(doc["calls"]))
        mirror.apply(doc)
        devs[0].chunks.append([(int(round(x * 1e6)), util(0, x)) for x in (last + SAMPLE_S * k for k in (1, 2, 3))
                               if last < x <= t + 1e-9])
        last = max(x for x in (last + SAMPLE_S * k for k in range(4)) if x <= t + 1e-9)
        sampler.poll_once()
    a, b = dict(_got(here)), dict(_got(there))
    assert a.keys() == b.keys() and all(b[k] == pytest.approx(v, abs=1e-6) for k, v in a.items()) and sum(a.values()) > 10
    assert max(sizes[1:]) < 20   # after the first answer only the calls that changed travel
    assert mirror.bad_rows == 0 and mirror.run == ("flowgrpo", "fleet")
    doc = share(poller, 0)   # a bad row is a counted skip, the rest is taken
    doc["calls"][0][3] = "no_such_role"
    doc["calls"][1] = ["x"]
    fresh = TaskMirror("http://127.0.0.1:9")
    assert fresh.apply(json.loads(json.dumps(doc))) == len(doc["calls"]) - 2 and fresh.bad_rows == 2
    with pytest.raises(ValueError):
        fresh.apply({"v": 99})


def test_the_exporter_sums_nodes_and_counts_a_down_agents_gpus_as_unmeasured():
    from omniwatch.gpu.fleetnodes import DOWN_LAG_S, NodeTotals
    now = {"t": 1000.0}
    store = RunStore()
    nodes = NodeTotals(store, clock=lambda: now["t"])
    row = lambda secs, bucket="productive": ["p", "e", "actor", "update_actor", bucket, "placement", secs]  # noqa: E731

    def rep(node, since, until, secs, idle=0.0, gpus=2):
        return nodes.report({"node": node, "node_id": node * 4, "gpus": gpus, "since": since, "until": until,
                             "totals": [row(secs), row(idle, "idle")], "gpus_by": [["actor", "placement", gpus]]})

    def sums(node):
        return sum(s for labels, s in nodes.series()[0] if labels[2] == node)
    rep("a", 900.0, 950.0, 80.0, 20.0)             # 2 GPUs x 50 s
    rep("b", 900.0, 950.0, 100.0)
    assert sums("a") == pytest.approx(100.0) and sums("b") == pytest.approx(100.0)
    # agent a goes down at 950; the exporter counts its 2 GPUs unmeasured up to now - DOWN_LAG_S
    now["t"] = 1100.0
    nodes.sweep({"a": False, "b": True})
    assert sums("a") == pytest.approx(2 * (1100.0 - DOWN_LAG_S - 900.0))
    series, gpus = nodes.series()
    assert ("p", "e", "a", "other", "agent_down") in {g[0] for g in gpus}
    assert any(labels[5] == "unmeasured" and labels[6] == "agent_down" for labels, _ in series)
    # it comes back (same process): of its seconds since 950 only the part after the counted time is taken
    rep("a", 900.0, 1100.0, 80.0 + 300.0, 20.0)
    assert sums("a") == pytest.approx(2 * (1100.0 - 900.0))   # every GPU-second of a in exactly one bucket
    # a restarted agent (totals start over, since after the last until): the gap between is unmeasured
    now["t"] = 1200.0
    rep("a", 1150.0, 1190.0, 80.0)
    assert sums("a") == pytest.approx(2 * (1190.0 - 900.0))
    # bad rows are counted skips; a report that is not one is a ValueError
    nodes.report({"node": "b", "gpus": 2, "since": 900.0, "until": 960.0,
                  "totals": [row(110.0), ["p", "e", "spaceship", "x", "productive", "placement", 1.0], "junk"]})
    assert store.errors[("gpu_fleet", "bad_fleet_row")] == 2 and sums("b") == pytest.approx(110.0)
    for bad in ({"node": "b"}, {"node": "b", "gpus": -1, "since": 0, "until": 1}, [], {"node": "b" * 300}):
        with pytest.raises(ValueError):
            nodes.report(bad)


def test_recovery_wants_from_agents_are_validated():
    from omniwatch.discovery.taskshare import check_wants
    wants, refresh = check_wants({"wants": [["a" * 32, "WorkerDict.actor_rollout_update_weights", 1.0, 2.0]],
                                  "refresh_actors": True})
    assert wants == [("a" * 32, "WorkerDict.actor_rollout_update_weights", 1.0, 2.0)] and refresh
    for bad in ([], {"wants": "x"}, {"wants": [["a", "b", "c", 1.0]]}, {"wants": [["a", "b", float("nan"), 1.0]]},
                {"wants": [["a", "b", 1.0, 2.0]] * 300}):
        with pytest.raises(ValueError):
            check_wants(bad)
