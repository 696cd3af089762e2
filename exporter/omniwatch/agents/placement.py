"""One agent per alive Ray node, kept that way.

``start()`` creates (or finds) a detached supervisor actor, ``omniwatch-agent-supervisor`` in
namespace ``omniwatch``, which runs the reconcile loop inside the cluster (so it keeps working after
the ``omniwatch agents start`` process exits): every ``reconcile_s`` it lists the alive nodes
(``ray.nodes()``) and makes sure each has exactly one named, detached agent actor
``omniwatch-agent-<node_id[:16]>`` pinned there with ``NodeAffinitySchedulingStrategy(node_id, soft=False)``
and ``num_cpus=0`` (agents take no CPU or GPU slot from the trainer). A node that joins gets one on
the next round; an agent that died is replaced; agents of nodes that left die with them. A second
``start()`` finds the same supervisor and the same agents (names are the lock), so it is idempotent.
``stop()`` deregisters and kills them all.

Ray is imported lazily: the exporter never imports Ray (see discovery/probe.py for why).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass

log = logging.getLogger(__name__)

NAMESPACE = "omniwatch"
SUPERVISOR = "omniwatch-agents-supervisor"
AGENT_PREFIX = "omniwatch-agent-"
RAY_CALL_TIMEOUT_S = 30.0


@dataclass
class AgentsConfig:
    exporter_url: str | None = None
    heartbeat_s: float = 10.0
    reconcile_s: float = 30.0
    gpu: str = "auto"                 # auto | on | off (the agent's GPU sampler)
    namespace: str = NAMESPACE


def agent_name(node_id: str) -> str:
    return AGENT_PREFIX + node_id[:16]


def node_labels(nodes: list[dict]) -> dict[str, str]:
    """node_id -> the ``node`` label: the host name, or ``host-<id8>`` where several Ray nodes share
    a host (one-host test clusters, several raylets per machine)."""
    hosts = Counter(n.get("NodeManagerHostname") or n.get("NodeManagerAddress") or "node" for n in nodes)
    out = {}
    for n in nodes:
        h = n.get("NodeManagerHostname") or n.get("NodeManagerAddress") or "node"
        out[n["NodeID"]] = h if hosts[h] == 1 else f"{h}-{n['NodeID'][:8]}"
    return out


def head_node_id(nodes: list[dict]) -> str | None:
    for n in nodes:
        if n.get("Alive") and any(k.startswith("node:__internal_head__") for k in (n.get("Resources") or {})):
            return n["NodeID"]
    return None


def _actor_classes():
    """The two Ray actor classes, built on first use so importing this module needs no Ray."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0, max_restarts=0)
    class AgentActor:
        def __init__(self, node: str, node_id: str, cfg: dict, token: str | None):
            from .node import NodeAgent
            ip = ray.util.get_node_ip_address()
            self.agent = NodeAgent(ip, 0, node=node, gpu=cfg["gpu"], exporter_url=cfg["exporter_url"],
                                   token=token, heartbeat_s=cfg["heartbeat_s"], node_id=node_id).start()

        def info(self) -> dict:
            return dict(self.agent.info(), ray_node_id=ray.get_runtime_context().get_node_id())

        def shutdown(self) -> None:
            self.agent.stop(deregister=True)

    @ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
    class Supervisor:
        def __init__(self, cfg: dict, token: str | None):
            self.cfg, self.token = cfg, token
            self.stop_ev = threading.Event()
            self.lock = threading.Lock()
            self.rounds = 0
            self.placed = 0
            self.last: dict = {}
            self.events: deque = deque(maxlen=100)  # (time, node_id, what happened)
            self.thread = threading.Thread(target=self._loop, daemon=True)
            self.thread.start()

        def _loop(self):
            while not self.stop_ev.is_set():
                try:
                    self.reconcile()
                except Exception:  # the loop must survive a bad round (GCS hiccup, node flapping)
                    log.exception("agent reconcile round failed")
                self.stop_ev.wait(self.cfg["reconcile_s"])

        def _find(self, name: str):
            try:
                return ray.get_actor(name, namespace=self.cfg["namespace"])
            except ValueError:
                return None

        def reconcile(self) -> dict:
            with self.lock:
                nodes = [n for n in ray.nodes() if n.get("Alive")]
                labels = node_labels(nodes)
                status = {}
                for n in nodes:
                    nid = n["NodeID"]
                    name = agent_name(nid)
                    handle = self._find(name)
                    info = None
                    if handle is not None:
                        try:
                            info = ray.get(handle.info.remote(), timeout=RAY_CALL_TIMEOUT_S)
                        except Exception as e:  # dead or wedged: replace it
                            why = f"{type(e).__name__}: {str(e)[:160]}"
                            log.warning("agent %s on node %s is not answering (%s); replacing it", name, nid[:8], why)
                            self.events.append((time.time(), nid, "replaced: " + why))
                            try:
                                ray.kill(handle, no_restart=True)
                            except Exception:
                                pass
                            handle = None
                    if handle is None:
                        try:
                            handle = AgentActor.options(
                                name=name, namespace=self.cfg["namespace"], lifetime="detached",
                                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=nid, soft=False),
                            ).remote(labels[nid], nid, self.cfg, self.token)
                            self.placed += 1
                            self.events.append((time.time(), nid, "placed"))
                            info = ray.get(handle.info.remote(), timeout=RAY_CALL_TIMEOUT_S)
                        except Exception as e:  # name still held by the dead one, node leaving: next round
                            info = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                    status[nid] = dict(info or {}, name=name, node_id=nid)
                self.rounds += 1
                self.last = status
                return status

        def status(self) -> dict:
            return {"rounds": self.rounds, "placed": self.placed, "agents": self.last, "config": self.cfg,
                    "events": list(self.events)}

        def shutdown(self) -> int:
            self.stop_ev.set()
            with self.lock:
                n = 0
                for name in _agent_names(self.cfg["namespace"]):
                    h = self._find(name)
                    if h is None:
                        continue
                    try:
                        ray.get(h.shutdown.remote(), timeout=10)
                    except Exception:
                        pass
                    ray.kill(h, no_restart=True)
                    n += 1
                return n

    return AgentActor, Supervisor


def _agent_names(namespace: str) -> list[str]:
    import ray
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a.get("namespace") == namespace and a["name"].startswith(AGENT_PREFIX) and a["name"] != SUPERVISOR]


def _connect(ray_address: str | None, namespace: str) -> bool:
    """ray.init when this process is not attached yet; True when we attached (and should detach)."""
    import ray
    if ray.is_initialized():
        return False
    ray.init(address=ray_address or "auto", namespace=namespace, log_to_driver=False,
             logging_level=logging.WARNING)
    return True


def start(ray_address: str | None = None, exporter_url: str | None = None, *, heartbeat_s: float = 10.0,
          reconcile_s: float = 30.0, gpu: str = "auto", namespace: str = NAMESPACE, token: str | None = None,
          wait: bool = True) -> dict:
    """Place one agent per alive node (idempotent) and leave a supervisor that keeps it so.

    ``token`` defaults to ``$OMNIWATCH_PUSH_TOKEN`` (or ``_FILE``): the agents register with it.
    Returns the supervisor's status after one reconcile round (``wait=True``)."""
    import ray
    from ..settings import read_secret
    cfg = AgentsConfig(exporter_url, heartbeat_s, reconcile_s, gpu, namespace)
    token = token if token is not None else read_secret("OMNIWATCH_PUSH_TOKEN")
    _connect(ray_address, namespace)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    _, Supervisor = _actor_classes()
    opts = dict(name=SUPERVISOR, namespace=namespace, lifetime="detached", get_if_exists=True)
    head = head_node_id(ray.nodes())
    if head:  # the head outlives every worker node; soft: any node will do if it cannot host it
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=head, soft=True)
    sup = Supervisor.options(**opts).remote(asdict(cfg), token)
    if not wait:
        return {}
    ray.get(sup.reconcile.remote(), timeout=reconcile_bound_s(sum(1 for n in ray.nodes() if n.get("Alive"))))
    return ray.get(sup.status.remote(), timeout=RAY_CALL_TIMEOUT_S)


def reconcile_bound_s(nodes: int) -> float:
    """How long one reconcile round may take: per node at most two bounded calls (the old agent's ``info``, then
    the new agent's), one after the other, plus one call of slack. A fixed bound (it was 150 s) failed a healthy
    round on a busy 3-node machine and any round of a cluster over 5 nodes whose agents all needed placing."""
    return RAY_CALL_TIMEOUT_S * (2 * max(1, nodes) + 1)


def status(ray_address: str | None = None, namespace: str = NAMESPACE) -> dict | None:
    import ray
    _connect(ray_address, namespace)
    try:
        sup = ray.get_actor(SUPERVISOR, namespace=namespace)
    except ValueError:
        return None
    return ray.get(sup.status.remote(), timeout=RAY_CALL_TIMEOUT_S)


def stop(ray_address: str | None = None, namespace: str = NAMESPACE) -> int:
    """Stop the supervisor and every agent in ``namespace`` (each deregisters first); returns how many agents."""
    import ray
    _connect(ray_address, namespace)
    n = 0
    try:
        sup = ray.get_actor(SUPERVISOR, namespace=namespace)
    except ValueError:
        sup = None
    if sup is not None:
        try:
            n = ray.get(sup.shutdown.remote(), timeout=5 * RAY_CALL_TIMEOUT_S)
        except Exception as e:
            log.warning("supervisor did not shut down cleanly (%s); killing agents directly", type(e).__name__)
        ray.kill(sup, no_restart=True)
    for name in _agent_names(namespace):  # stragglers (supervisor gone or wedged)
        try:
            ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
            n += 1
        except ValueError:
            pass
    return n


