"""The exporter's registry of node agents: who registered, where they listen, when they last said so.

Agents heartbeat (re-register) every few seconds with a TTL. A live agent is served to Prometheus
through HTTP service discovery (``GET /api/v1/agents/sd``) and reported as
``omniwatch_source_up{source="agent", target=<node>} 1``. An agent whose TTL lapses (killed, its
node gone, hung) leaves the SD list at once and stays reported as 0 for ``forget_after_s`` so
``OmniwatchSourceDown`` fires for that node; a clean deregistration (``omniwatch agents stop``)
removes it without an alert. Everything is bounded: at most ``max_agents`` entries.
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field

from ..discovery.targets import normalize_address

SOURCE = "agent"                # omniwatch_source_up{source="agent"}
JOB = "omniwatch-agent"         # Prometheus job label of agent targets
NODE_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
DEFAULT_TTL_S = 30.0
MIN_TTL_S, MAX_TTL_S = 1.0, 600.0
DEFAULT_FORGET_S = 3600.0
DEFAULT_MAX_AGENTS = 4096


class RegistryFull(Exception):
    pass


@dataclass
class AgentEntry:
    node: str
    address: str
    ttl_s: float
    node_id: str = ""
    first_seen: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.time)
    live: bool = True

    def as_dict(self) -> dict:
        return {"node": self.node, "address": self.address, "node_id": self.node_id, "live": self.live,
                "ttl_s": self.ttl_s, "last_seen": self.last_seen, "first_seen": self.first_seen}


def check_registration(node: object, address: object, ttl_s: object) -> tuple[str, str, float]:
    """Validated (node, address, ttl) or ValueError with the reason (never echoing secrets)."""
    if not isinstance(node, str) or not NODE_RE.match(node):
        raise ValueError("node must match [A-Za-z0-9_.:-]{1,128}")
    addr = normalize_address(address)
    if addr is None:
        raise ValueError("address must be host:port (IPv6 in brackets)")
    try:
        ttl = float(DEFAULT_TTL_S if ttl_s is None else ttl_s)
    except (TypeError, ValueError):
        raise ValueError("ttl_s must be a number of seconds") from None
    if not (MIN_TTL_S <= ttl <= MAX_TTL_S):
        raise ValueError(f"ttl_s must be within [{MIN_TTL_S:g}, {MAX_TTL_S:g}]")
    return node, addr, ttl


class AgentRegistry:
    def __init__(self, store=None, *, forget_after_s: float = DEFAULT_FORGET_S,
                 max_agents: int = DEFAULT_MAX_AGENTS, clock=time.time):
        self.store = store
        self.forget_after_s = forget_after_s
        self.max_agents = max_agents
        self.clock = clock
        self.lock = threading.Lock()
        self.agents: dict[str, AgentEntry] = {}

    def register(self, node: str, address: str, ttl_s: float, node_id: str = "") -> AgentEntry:
        now = self.clock()
        with self.lock:
            e = self.agents.get(node)
            if e is None:
                if len(self.agents) >= self.max_agents:
                    raise RegistryFull(f"registry holds {self.max_agents} agents")
                e = self.agents[node] = AgentEntry(node, address, ttl_s, node_id[:64], now, now)
            e.address, e.ttl_s, e.node_id, e.last_seen, e.live = address, ttl_s, node_id[:64], now, True
        self._publish(node, True)
        return e

    def deregister(self, node: str) -> bool:
        with self.lock:
            gone = self.agents.pop(node, None) is not None
        if gone and self.store is not None:
            self.store.remove_source(SOURCE, node)
        return gone

    def sweep(self) -> None:
        """Mark lapsed agents down; forget those down for longer than ``forget_after_s``."""
        now = self.clock()
        down, forgotten = [], []
        with self.lock:
            for node, e in list(self.agents.items()):
                age = now - e.last_seen
                if age > e.ttl_s + self.forget_after_s:
                    del self.agents[node]
                    forgotten.append(node)
                elif age > e.ttl_s and e.live:
                    e.live = False
                    down.append(node)
        for node in down:
            self._publish(node, False)
        if self.store is not None:
            for node in forgotten:
                self.store.remove_source(SOURCE, node)

    def _publish(self, node: str, up: bool) -> None:
        if self.store is not None:
            self.store.set_source_up(SOURCE, node, up)

    def entries(self) -> list[AgentEntry]:
        self.sweep()
        with self.lock:
            return sorted(self.agents.values(), key=lambda e: e.node)

    def http_sd(self) -> list[dict]:
        """Prometheus HTTP-SD body: live agents only, each with its ``node`` label."""
        return [{"targets": [e.address], "labels": {"job": JOB, "node": e.node, "__metrics_path__": "/metrics"}}
                for e in self.entries() if e.live]
