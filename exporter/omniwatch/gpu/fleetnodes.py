"""Per-fleet GPU time of every node, summed at the exporter (issue 33 item 3).

Each node agent attributes its own GPUs' seconds (gpu/fleet.py over its mirror of the cluster's task ledger,
discovery/taskshare.py) and reports its cumulative totals with ``POST /api/v1/agents/fleet`` every heartbeat:
``{"node", "node_id", "gpus", "since", "until", "totals": [[project, experiment, fleet, phase, bucket, mapping,
seconds]], "gpus_by": [[fleet, mapping, count]]}`` (``since`` / ``until``: the time its attribution covers).
The exporter exports every node's series under ``node`` (the exporter's own GPUs too), so a cluster total is
``sum without (node)``.

**A node whose agent is down is counted as such, not as idle.** While the agent registry has an agent down
(its TTL lapsed), its node's GPUs go on being counted -- GPUs x the time since its attribution stopped -- in
bucket ``unmeasured`` (fleet ``other``, phase ``none``, mapping ``agent_down``). When the agent reports again,
the part of its new seconds that falls in time already counted unmeasured is left out (its delta is scaled to
the part after), and a restarted agent's gap (its new ``since`` after the last ``until``) is unmeasured too; so
each node's buckets sum to its GPUs x the time since its first report.

Bounded: at most ``MAX_NODES`` nodes and ``MAX_ROWS`` label sets per node; every row is validated on its own
(labels from the fixed fleet / phase / bucket / mapping sets; a bad row is a counted skip).
"""
from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

from ..discovery.phases import PHASES

MAX_NODES = 4096
MAX_ROWS = 4096
DOWN_LAG_S = 30.0      # unmeasured time is counted up to this long before now (an agent's attribution trails)
SOURCE = "gpu_fleet"


@dataclass
class NodeFleet:
    node: str
    node_id: str = ""
    gpus: int = 0
    run: tuple[str, str] = ("", "")
    first: float = 0.0          # the first attributed second of this node
    counted_until: float = 0.0  # every GPU-second of this node up to here is in some bucket
    last: dict = field(default_factory=dict)      # the agent's last cumulative totals (label set -> seconds)
    totals: dict = field(default_factory=lambda: defaultdict(float))   # ours: label set -> seconds
    gpus_by: dict = field(default_factory=dict)   # (fleet, mapping) -> GPUs
    reported_until: float = 0.0  # the ``until`` of the agent's last report
    down: bool = False


def _label(v, allowed=None, n: int = 128) -> str:
    if not isinstance(v, str) or len(v) > n or (allowed is not None and v not in allowed):
        raise ValueError("bad label")
    return v


class NodeTotals:
    """The agents' per-fleet GPU time (and the unmeasured time of the down ones)."""

    def __init__(self, store=None, clock=time.time, down_lag_s: float = DOWN_LAG_S):
        from .fleet import BUCKETS, FLEETS, MAPPINGS, NO_CALL
        self._fleets, self._buckets, self._maps = set(FLEETS), set(BUCKETS), set(MAPPINGS)
        self._phases = set(PHASES) | {NO_CALL}
        self.store, self.clock, self.down_lag_s = store, clock, down_lag_s
        self.lock = threading.Lock()
        self.nodes: dict[str, NodeFleet] = {}

    def _count(self, reason: str, n: int = 1) -> None:
        if self.store is not None and n:
            self.store.count_error(SOURCE, reason, n)

    def report(self, body: dict) -> int:
        """One agent report; returns the label sets taken. ValueError for a report that is not one."""
        if not isinstance(body, dict):
            raise ValueError("body must be a JSON object")
        node = _label(body.get("node"))
        node_id = body.get("node_id") if isinstance(body.get("node_id"), str) else ""
        gpus = body.get("gpus")
        if isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 <= gpus <= 1024:
            raise ValueError("gpus must be an integer 0-1024")
        since, until = body.get("since"), body.get("until")
        for v in (since, until):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError("since / until must be unix seconds")
        rows = body.get("totals") or []
        if not isinstance(rows, list) or len(rows) > MAX_ROWS:
            raise ValueError(f"totals must be a list of at most {MAX_ROWS} rows")
        new: dict[tuple, float] = {}
        run = ("", "")
        bad = 0
        for r in rows:
            try:
                p, e, fleet, phase, bucket, how, secs = r
                key = (_label(p), _label(e), _label(fleet, self._fleets), _label(phase, self._phases),
                       _label(bucket, self._buckets), _label(how, self._maps))
                if isinstance(secs, bool) or not isinstance(secs, (int, float)) or not math.isfinite(secs) or secs < 0:
                    raise ValueError("seconds")
                new[key] = float(secs)
                run = (key[0], key[1])
            except (ValueError, TypeError):
                bad += 1
        self._count("bad_fleet_row", bad)
        by = {}
        for r in body.get("gpus_by") or []:
            try:
                f, how, n = r
                if isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= 1024:
                    by[(_label(f, self._fleets), _label(how, self._maps))] = n
            except (ValueError, TypeError):
                self._count("bad_fleet_row")
        with self.lock:
            nf = self.nodes.get(node)
            if nf is None:
                if len(self.nodes) >= MAX_NODES:
                    raise ValueError(f"more than {MAX_NODES} nodes")
                nf = self.nodes[node] = NodeFleet(node, node_id, gpus, run, first=float(since),
                                                  counted_until=float(since), reported_until=float(since))
            restarted = any(v < nf.last.get(k, 0.0) - 1e-6 for k, v in new.items()) or \
                (nf.last and float(since) > nf.counted_until + 1.0)
            if restarted and float(since) > nf.counted_until:   # the gap the agent never saw
                self._unmeasured(nf, float(since) - nf.counted_until)
                nf.counted_until = float(since)
            prev_until = nf.reported_until
            if restarted:
                prev_until, nf.last = float(since), {}
            span = float(until) - prev_until
            keep = 1.0 if span <= 0 or nf.counted_until <= prev_until else \
                max(0.0, min(1.0, (float(until) - nf.counted_until) / span))
            for k, v in new.items():
                d = v - nf.last.get(k, 0.0)
                if d > 0 and len(nf.totals) < MAX_ROWS:
                    nf.totals[k] += d * keep
            nf.last = new
            nf.reported_until = float(until)
            nf.counted_until = max(nf.counted_until, float(until))
            nf.node_id, nf.gpus, nf.gpus_by, nf.down = node_id[:128], gpus, by, False
            if run != ("", ""):
                nf.run = run
        return len(new)

    def _unmeasured(self, nf: NodeFleet, seconds: float) -> None:
        from .fleet import NO_CALL
        if seconds > 0 and nf.gpus:
            nf.totals[nf.run + ("other", NO_CALL, "unmeasured", "agent_down")] += seconds * nf.gpus

    def sweep(self, live: dict[str, bool]) -> None:
        """``live``: node -> the agent registry's verdict. A down agent's node accrues unmeasured time."""
        now = self.clock()
        with self.lock:
            for node, nf in self.nodes.items():
                down = live.get(node) is False
                nf.down = down
                if down and now - self.down_lag_s > nf.counted_until:
                    self._unmeasured(nf, now - self.down_lag_s - nf.counted_until)
                    nf.counted_until = now - self.down_lag_s

    def forget(self, node: str) -> None:
        with self.lock:
            self.nodes.pop(node, None)

    def series(self):
        """([(labels without node... with node), seconds]), [(run + node, fleet, mapping), GPUs])."""
        out, gpus = [], []
        with self.lock:
            for node, nf in self.nodes.items():
                for (p, e, fleet, phase, bucket, how), s in nf.totals.items():
                    out.append(((p, e, node, fleet, phase, bucket, how), s))
                if nf.down:
                    gpus.append((nf.run + (node, "other", "agent_down"), nf.gpus))
                else:
                    for (fleet, how), n in nf.gpus_by.items():
                        gpus.append((nf.run + (node, fleet, how), n))
        return out, gpus


def report_body(accountant) -> dict:
    """An agent's report (see the module docstring) from its FleetAccountant."""
    with accountant.lock:
        totals = [[p, e, fleet, phase, bucket, how, round(s, 6)]
                  for (p, e, _node, fleet, phase, bucket, how), s in accountant.totals.items()]
        since = min(accountant.since.values(), default=0.0)
        until = min(accountant.until.values(), default=0.0)
        by = [[f, how, n] for (f, how), n in accountant.gpus_by.items()]
        gpus = len(accountant.until)
    return {"node": accountant.node, "node_id": accountant.node_id or "", "gpus": gpus, "since": since,
            "until": until, "totals": totals, "gpus_by": by}
