"""Per-fleet GPU time: each sampled GPU's busy / idle seconds, attributed to the fleet (actor / rollout /
reward) and phase of the Ray worker call that holds the GPU at that moment, in goodput buckets.

Inputs: the NVML sampler's classified intervals (``gpu/sampler.py``: busy / idle per ~0.2 s period, the last
few minutes per GPU) and the Ray task-event ledger (``discovery/taskevents.py``: every worker call with its
actor, node, pid, start and end). Runs after every sampler poll (``sampler.listeners``), on the exporter
whose sampler sees the GPUs (``--gpu``) and whose task-event source watches the cluster (``--ray-tasks``).

**Which worker holds which GPU** (label ``mapping``; NVML's process list is not relied on: in containers
and VMs it is often empty, issue 24):

- ``nvml_pid``: the GPU's NVML compute-process list holds the actor's pid (the Ray actor table's ``pid``).
  Exact, and used wherever it is visible (``sampler.GpuState.pids``).
- ``placement``: verl's worker group placement. A worker actor is named ``<prefix><Class>_<pg_idx>:<local_rank>``
  and created in bundle ``local_rank`` of its node's placement group, every bundle one GPU
  (``RayResourcePool.get_placement_groups``: ``{"CPU": max_colocate_count, "GPU": 1}`` per process;
  ``_create_worker``: ``placement_group_bundle_idx=local_rank``, ``num_gpus=1/max_colocate_count``;
  docs/verl-source.md R11). Ray hands a bundle the GPU it reserved for it; on a node whose GPUs the pool's
  placement group reserved first (verl creates its pools before any other GPU user), bundle ``i`` holds
  GPU index ``i``. Colocated groups (``max_colocate_count`` > 1, the same bundles) share the GPU: concurrent
  calls split its seconds evenly. Two pools with separate placement groups on one node are not told apart
  this way: there only ``nvml_pid`` is right (docs/who-holds-the-step.md says so).
- ``node``: rollout / reward / teacher server replicas (``vllm_omni_server_*``) ask Ray for no GPU (R12: their
  engines run on the worker group's GPUs in hybrid mode); a replica with requests in flight is charged
  the GPUs of its node that no mapped call holds at that moment.
- ``unmapped``: a GPU no actor was mapped to (its seconds are kept under fleet ``other``, phase ``none``).

Nodes: the sampler's node is the Ray node whose ``node_ip`` or ``node_name`` is the sampler's node label or
one of this host's addresses; on a one-node cluster, that node.

**Buckets** (the productive / overhead / idle vocabulary of goodput accounting, so numbers compare with
NeMo-RL's and Google's): every GPU-second is in exactly one.

- ``productive``: the GPU busy while a compute call holds it (generate, update_actor, compute_log_prob, ...).
- ``overhead``: every second (busy or idle) of a call that moves no sample forward — weight sync
  (``update_weights``), checkpoints, ``init_model``, ``wake_up`` / ``sleep``, profiling — and the GPU busy while no
  worker call holds it (work no Ray call explains).
- ``idle``: the GPU idle inside a compute call, or with no call at all (phase ``none``).

Time is attributed once, in order, up to a horizon the task events are final for (the previous poll minus
Ray's report lag: a call first seen at a poll started after the poll before it, give or take that lag) and
the GPU's sample watermark. Seconds the sampler's ring no longer covers are skipped and counted. Memory is
bounded: counters keyed by fixed label sets, one watermark per GPU.
"""
from __future__ import annotations

import logging
import socket
import threading
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.registry import Collector

from .. import names as n
from ..discovery.phases import PHASES, SERVER_NAME, classify, worker_name
from ..discovery.taskevents import FINAL_WAIT_S
from ..core.phasetable import METHODS, PHASE
from .accounting import overlap_seconds

log = logging.getLogger(__name__)

SOURCE = "gpu_fleet"
FLEETS = ("actor", "rollout", "reward", "other")
BUCKETS = ("productive", "overhead", "idle", "unmeasured")   # unmeasured: a node whose agent was down
MAPPINGS = ("nvml_pid", "placement", "node", "unmapped", "agent_down")
NO_CALL = "none"
# Ray methods (phasetable.METHODS) whose GPU time is overhead; those a colocated actor+rollout worker runs as rollout
OVERHEAD_PHASES = frozenset(m.name for m in METHODS if m.overhead or m.phase and PHASE[m.phase].overhead)
ROLLOUT_PHASES = frozenset(m.name for m in METHODS if m.fleet == "rollout")
SERVER_ROLES = ("rollout_server", "reward_server", "teacher_server")
REPORT_LAG_S = 2.0        # Ray workers report task events every 1 s (RAY_task_events_report_interval_ms)
MAX_CATCHUP_S = 900.0     # at most this much of one GPU's past per pass (the ring holds ~300 s)
RECOVER_WAIT_S = 15.0     # at least this long for the finished-task page of a call only the observer saw
OBS_SLACK_S = 0.25        # an observed call and a Ray call of the same method this close are the same call
DONE_SCAN_SLACK_S = 600.0 # closed calls are scanned back to this long before the attribution window


def fleet_of(role: str, phase: str) -> str:
    """A worker call's fleet. A colocated actor+rollout ``WorkerDict`` is the rollout fleet while it generates
    (or wakes / sleeps the engine) and the actor fleet otherwise."""
    if role in ("rollout_server", "agent_loop", "rollout"):
        return "rollout"
    if role in ("reward_server", "reward_loop", "rm"):
        return "reward"
    if role in ("actor_rollout", "actor_rollout_ref"):
        return "rollout" if phase in ROLLOUT_PHASES else "actor"
    if role in ("actor", "critic", "ref", "fused"):
        return "actor"
    return "other"


def bucket_of(phase: str, busy: bool) -> str:
    if phase in OVERHEAD_PHASES:
        return "overhead"
    if phase == NO_CALL:
        return "overhead" if busy else "idle"
    return "productive" if busy else "idle"


@dataclass(frozen=True)
class Held:
    """One call on one GPU for [start, end)."""
    start: float
    end: float
    fleet: str
    phase: str
    mapping: str


def local_addresses() -> set[str]:
    out = {socket.gethostname()}
    try:
        out |= set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return out


def local_node_ids(node_info: dict[str, dict], sampler_node: str, addresses: set[str]) -> set[str]:
    names = {sampler_node} | addresses
    ids = {nid for nid, i in node_info.items() if i.get("ip") in names or i.get("name") in names}
    if not ids and len(node_info) == 1:
        ids = set(node_info)
    return ids


def gpu_map(ledger, gpus, local_ids: set[str]) -> dict[str, list[tuple[str, str]]]:
    """actor_id -> [(gpu uuid, mapping)] for the actors on this node. NVML pids first: a GPU whose process
    list names an actor's pid is that actor's (and no placement guess lands on it); then placement."""
    by_index = {str(g.index): g.uuid for g in gpus}
    out: dict[str, list[tuple[str, str]]] = {}
    pid_gpu: dict[int, list[str]] = defaultdict(list)
    for g in gpus:
        for pid in getattr(g, "pids", ()) or ():
            pid_gpu[pid].append(g.uuid)
    # a DEAD actor keeps its GPU for the calls it made before it died (a run's last calls are attributed after
    # its job ended); holders() leaves it out of the no-call time
    live = {aid: a for aid, a in ledger.actors.items() if a.node_id in local_ids}
    for aid, a in live.items():
        if a.pid is not None and a.pid in pid_gpu:
            out[aid] = [(u, "nvml_pid") for u in pid_gpu[a.pid]]
    by_pid = {u for pairs in out.values() for u, _ in pairs}
    for aid, a in live.items():
        if aid in out:
            continue
        m = worker_name(a.name)
        uuid = by_index.get(m["local"]) if m else None
        if uuid is not None and uuid not in by_pid:
            out[aid] = [(uuid, "placement")]
    return out


class FleetAccountant:
    """``sampler.listeners`` callback: attributes the sampled GPUs' intervals to the fleets of the worker
    calls holding them (see the module docstring).

    ``poller`` is what the calls come from: the task-event poller (``.ledger``, ``.lock``, ``.recovery``,
    ``.interval``) on the exporter, or an agent's mirror of it (agents/mirror.py) with the same shape.
    ``node_id``: this node's Ray node id when known (an agent is placed on it); otherwise the node whose IP
    or name is the sampler's node label or one of this host's addresses. ``observe``: watch the mapped
    workers' process titles (gpu/callwatch.py) so calls no poll saw are found and recovered."""

    def __init__(self, sampler, poller, run_labels, store=None, addresses: set[str] | None = None,
                 node_id: str | None = None, observe: bool | float = False, observer=None):
        self.sampler, self.poller, self.run_labels, self.store = sampler, poller, run_labels, store
        self.addresses = local_addresses() if addresses is None else addresses
        self.node_id = node_id or None
        self.node = sampler.node
        self.lock = threading.Lock()
        # (project, experiment, node, fleet, phase, bucket, mapping) -> seconds
        self.totals: dict[tuple[str, ...], float] = defaultdict(float)
        self.until: dict[str, float] = {}          # gpu uuid -> attributed up to (unix s)
        self.since: dict[str, float] = {}          # gpu uuid -> attributed from (unix s)
        self.gpus_by: dict[tuple[str, str], int] = {}   # (fleet, mapping) -> GPUs, latest pass
        self.skipped_s = 0.0
        self.observed_s = 0.0      # seconds of calls only the observer saw (Ray's page did not give them)
        self._watch: dict[int, str] = {}            # pid -> actor id of the workers holding this node's GPUs
        self.observer = observer
        if self.observer is None and observe:
            from .callwatch import DEFAULT_INTERVAL_S, CallObserver
            every = DEFAULT_INTERVAL_S if observe is True else float(observe)
            self.observer = CallObserver(lambda: dict(self._watch), every)
        self._observer_started = observer is not None
        self.recorder = None       # gpu/fleettrace.Recorder (a live run recorded as a replay fixture)
        self.trace: list | None = None   # (uuid, a, b, fleet, phase, busy, idle) of every attributed piece, when set
        sampler.listeners.append(self.process)

    def close(self) -> None:
        if self.observer is not None and self._observer_started:
            self.observer.stop()

    def run_key(self) -> tuple[str, str]:
        project, experiment = self.run_labels()
        return project or "", experiment or ""

    def _skip(self, reason: str) -> None:
        if self.store is not None:
            self.store.count_error(SOURCE, reason)

    def _wait_s(self) -> float:
        return max(RECOVER_WAIT_S, 3.0 * float(getattr(self.poller, "interval", 5.0) or 5.0))

    def _horizon(self, led, missed: list) -> float | None:
        """Up to where every call is final: Ray's view is complete up to the last poll minus its report lag; a
        closed call still waiting for its finished row holds the horizon at the last poll that saw it running
        (its end is after that), for at most FINAL_WAIT_S; a call only the observer saw holds it at its start
        while its finished-task page is pending (at most a few poll intervals); the observer's last sample too."""
        last = getattr(led, "last_poll", 0.0) or 0.0
        if not last:
            return None
        hi = last - REPORT_LAG_S
        for t in list(getattr(led, "awaiting", {}).values()):
            if t.end is not None and last - t.end < FINAL_WAIT_S:
                hi = min(hi, (t.seen or t.start) - REPORT_LAG_S)
        wait = self._wait_s()
        early = 2.0 * getattr(self.observer, "interval", 0.0)   # an observed start is up to one sample late
        for o in missed:
            if o.end is not None and last - o.end < wait:
                hi = min(hi, o.start - early)
        if self.observer is not None and self.observer.watermark:
            hi = min(hi, self.observer.watermark)
        created = getattr(led, "created", None)
        if created is not None:   # a call of an actor whose creation end is not known yet may start later
            for t in list(led.running.values()):
                if t.actor_id not in created and last - t.start < FINAL_WAIT_S:
                    hi = min(hi, t.start)
        return hi

    def _calls(self, led, amap, local_ids, lo: float, hi: float, observed: list):
        """Calls overlapping [lo, hi): mapped ones per GPU uuid, node-level server calls, and the observed calls
        on mapped workers that Ray has no call for (``missed``: recovered from a page, else kept as observed)."""
        per_gpu: dict[str, list[Held]] = defaultdict(list)
        node_calls: list[Held] = []
        tasks = list(led.running.values())
        for t in reversed(led.done):   # closed in end order, give or take an exact end or a recovered call
            if t.end is not None and t.end < lo - DONE_SCAN_SLACK_S:
                break
            tasks.append(t)
        by_actor: dict[str, list] = defaultdict(list)
        for t in tasks:
            by_actor[t.actor_id].append(t)
            end = t.end if t.end is not None else hi + MAX_CATCHUP_S
            if end <= lo or t.start >= hi:
                continue
            fleet, phase = fleet_of(t.call.role, t.call.phase), t.call.phase
            for uuid, how in amap.get(t.actor_id, ()):
                per_gpu[uuid].append(Held(t.start, end, fleet, phase, how))
            if t.actor_id not in amap and t.call.role in SERVER_ROLES and t.node_id in local_ids:
                node_calls.append(Held(t.start, end, fleet, phase, "node"))
        missed = []
        for o in observed:
            if o.actor_id not in amap or o.end is None or o.end >= (getattr(led, "last_poll", 0.0) or 0.0):
                continue   # still running, or ended after the last poll: Ray may still show it
            if any(t.name == o.name and t.start - OBS_SLACK_S <= o.end and
                   (t.end if t.end is not None else hi + MAX_CATCHUP_S) + OBS_SLACK_S >= o.start
                   for t in by_actor.get(o.actor_id, ())):
                continue
            missed.append(o)
        return per_gpu, node_calls, missed

    def process(self) -> None:
        marker = None
        try:
            marker = self._process()
        finally:
            if self.recorder is not None:   # gpu/fleettrace.py: what this pass saw, for a replay
                self.recorder.processed(marker)

    def _process(self):
        led = self.poller.ledger
        if not (getattr(led, "last_poll", 0.0) or 0.0):
            return (getattr(led, "polls", 0), 0.0)
        if self.observer is not None and not self._observer_started:
            self.observer.start()
            self._observer_started = True
        run = self.run_key()
        gpus = self.sampler.snapshot()
        # the poller holds its lock through a poll (HTTP calls, up to its timeout when Ray is slow): never stall
        # the sampler's thread on it; this pass is skipped and the next one attributes the same time
        if not self.poller.lock.acquire(timeout=0.1):
            return None
        try:
            local_ids = {self.node_id} if self.node_id else \
                local_node_ids(getattr(led, "node_info", {}), self.sampler.node, self.addresses)
            amap = gpu_map(led, gpus, local_ids)
            self._watch = {led.actors[aid].pid: aid for aid in amap
                           if led.actors[aid].pid and led.actors[aid].state != "DEAD"}
            # pid -> actor for the observer's calls: any actor of this node or not placed yet (a pending actor
            # has a pid before its node is known)
            pid_actor = {a.pid: aid for aid, a in led.actors.items() if a.pid and (a.node_id in local_ids or not a.node_id)}
            holders: dict[str, set[tuple[str, str]]] = defaultdict(set)
            for aid, pairs in amap.items():
                if led.actors[aid].state == "DEAD":
                    continue
                fleet = holder_fleet(led.actors.get(aid))
                for uuid, how in pairs:
                    holders[uuid].add((fleet, how))
            last = getattr(led, "last_poll", 0.0) or 0.0
            lo_all = min((self.until.get(g.uuid, last) for g in gpus), default=last)
            lo_all = max(min(lo_all, last), last - MAX_CATCHUP_S) - 60.0
            observed, obs_t = self.observer.snapshot(lo_all) if self.observer is not None else ([], 0.0)
            marker = (getattr(led, "polls", 0), obs_t)
            observed = [o if o.actor_id else _with_actor(o, pid_actor.get(o.pid, "")) for o in observed]
            per_gpu, node_calls, missed = self._calls(led, amap, local_ids, lo_all, last, observed)
            known_pids = {a.pid for a in led.actors.values() if a.pid}   # another node's workers: not ours
            unknown = [o for o in observed if not o.actor_id and o.pid not in known_pids and o.end is not None
                       and last - o.end < self._wait_s()]
            if unknown and getattr(self.poller, "recovery", None) is not None:
                self.poller.recovery.refresh_actors = True   # a worker the actor table does not name yet
            missed = missed + unknown
            hi_all = self._horizon(led, missed)
            recovery = getattr(self.poller, "recovery", None)
            for o in missed:
                if recovery is not None and o.actor_id and last - o.end < self._wait_s():
                    recovery.want(o.actor_id, o.name, o.start, o.end)
        finally:
            self.poller.lock.release()
        if hi_all is None:
            return marker
        for o in missed:   # what Ray's pages did not give (yet): the observer's boundaries
            call = classify_name(o.name, led, o.actor_id)
            for uuid, how in amap.get(o.actor_id, ()):
                per_gpu[uuid].append(Held(o.start, o.end, fleet_of(call.role, call.phase), call.phase, how))
        with self.sampler.lock, self.lock:
            counts: dict[tuple[str, str], int] = defaultdict(int)
            for g in gpus:
                h_fleet, h_how = _holder(holders.get(g.uuid, set()))
                counts[(h_fleet, h_how)] += 1
                wm = g.watermark
                if wm is None or not g.ring:
                    continue
                hi = min(hi_all, wm)
                lo = self.until.get(g.uuid)
                if lo is None:   # first pass: start where both the task events and the samples are known
                    self.until[g.uuid] = self.since[g.uuid] = max(hi, g.ring[0].start)
                    continue
                if lo < hi - MAX_CATCHUP_S:
                    self.skipped_s += hi - MAX_CATCHUP_S - lo
                    self._skip("fleet_gap")
                    lo = hi - MAX_CATCHUP_S
                if hi <= lo:
                    continue
                if g.ring[0].start > lo + 0.5:
                    self.skipped_s += g.ring[0].start - lo
                    self._skip("fleet_before_samples")
                    lo = g.ring[0].start
                mine = per_gpu.get(g.uuid, [])
                self.observed_s += sum(max(0.0, min(o.end, hi) - max(o.start, lo)) for o in missed
                                       if any(u == g.uuid for u, _ in amap.get(o.actor_id, ())))
                self._attribute(run, g.ring, lo, hi, mine, node_calls, h_fleet, h_how, g.uuid)
                self.until[g.uuid] = hi
            self.gpus_by = dict(counts)
        return marker

    def _attribute(self, run, ring, lo: float, hi: float, mapped: list[Held], node_calls: list[Held],
                   h_fleet: str, h_how: str, uuid: str = "") -> None:
        edges = {lo, hi}
        for c in mapped + node_calls:
            edges.update(x for x in (c.start, c.end) if lo < x < hi)
        pts = sorted(edges)
        for a, b in zip(pts, pts[1:]):
            busy, idle = overlap_seconds(ring, a, b)
            if busy + idle <= 0:
                continue
            holding = [c for c in mapped if c.start <= a and c.end >= b] or \
                      [c for c in node_calls if c.start <= a and c.end >= b]
            if holding:
                share = 1.0 / len(holding)
                for c in holding:
                    self._add(run, c.fleet, c.phase, c.mapping, busy * share, idle * share)
                    if self.trace is not None:
                        self.trace.append((uuid, a, b, c.fleet, c.phase, busy * share, idle * share))
            else:
                self._add(run, h_fleet, NO_CALL, h_how, busy, idle)
                if self.trace is not None:
                    self.trace.append((uuid, a, b, h_fleet, NO_CALL, busy, idle))

    def _add(self, run, fleet, phase, how, busy, idle) -> None:
        phase = phase if phase in _PHASES_OK else "other"
        key = run + (self.node,)
        if busy > 0:
            self.totals[key + (fleet, phase, bucket_of(phase, True), how)] += busy
        if idle > 0:
            self.totals[key + (fleet, phase, bucket_of(phase, False), how)] += idle

    # -- reads ------------------------------------------------------------------------------------
    def series(self) -> tuple[list[tuple[tuple[str, ...], float]], list[tuple[tuple[str, str], int]]]:
        with self.lock:
            return sorted(self.totals.items()), sorted(self.gpus_by.items())


def _with_actor(o, actor_id: str):
    from .callwatch import Observed
    return Observed(actor_id, o.pid, o.name, o.start, o.end) if actor_id else o


def classify_name(name: str, led, actor_id: str):
    a = led.actors.get(actor_id) if hasattr(led, "actors") else None
    return classify(name, a.name if a else "", a.class_name if a else "")


_PHASES_OK = frozenset(PHASES) | {NO_CALL}


def holder_fleet(actor) -> str:
    """The fleet an actor's GPU belongs to while it runs no call: a server replica's fleet, else the worker
    group's (a colocated ``WorkerDict`` is the trainer's pool: ``actor``; a reward-model worker ``reward``)."""
    if actor is None:
        return "other"
    s = SERVER_NAME.match(actor.name or "")
    if s:
        return {"reward_": "reward", "teacher_": "other"}.get(s["kind"] or "", "rollout")
    cls = (actor.class_name or "").rsplit(".", 1)[-1]
    if cls in ("RewardModelWorker", "RewardLoopWorker"):
        return "reward"
    return "actor" if worker_name(actor.name) else "other"


def _holder(hs: set[tuple[str, str]]) -> tuple[str, str]:
    fleets = {f for f, _ in hs}
    fleet = fleets.pop() if len(fleets) == 1 else ("other" if fleets else "other")
    how = min((how for _, how in hs), key=MAPPINGS.index, default="unmapped")
    return fleet, how


class FleetCollector(Collector):
    """The exporter's own GPUs (``accountant``, when it samples any) and every node agent's (``nodes``,
    gpu/fleetnodes.py), each under its ``node``."""
    OWNED = (n.GPU_FLEET_SECONDS_TOTAL, n.GPU_FLEET_GPUS)

    def __init__(self, accountant: FleetAccountant | None, nodes=None):
        self.accountant, self.nodes = accountant, nodes

    def describe(self):
        return n.describe(self.OWNED)

    def collect(self):
        f = {k: n.family(k) for k in self.OWNED}
        own = set()
        if self.accountant is not None:
            totals, gpus = self.accountant.series()
            for labels, secs in totals:
                f[n.GPU_FLEET_SECONDS_TOTAL].add_metric(list(labels), secs)
            run = list(self.accountant.run_key()) + [self.accountant.node]
            own.add(self.accountant.node)
            for (fleet, how), count in gpus:
                f[n.GPU_FLEET_GPUS].add_metric(run + [fleet, how], count)
        if self.nodes is not None:
            totals, gpus = self.nodes.series()
            for labels, secs in totals:
                if labels[2] not in own:   # an agent on the exporter's own node: the exporter's numbers win
                    f[n.GPU_FLEET_SECONDS_TOTAL].add_metric(list(labels), secs)
            for labels, count in gpus:
                if labels[2] not in own:
                    f[n.GPU_FLEET_GPUS].add_metric(list(labels), count)
        yield from f.values()
