"""The node agent: the omniwatch package in a mode that runs only node-local sources.

It serves its own ``/metrics`` on a free port (never a fixed one: several agents may share a host,
and Ray picks nothing for us) with the GPU sampler when ``omniwatch.gpu`` is present and NVML
works here, plus ``POST /api/v1/phases`` so trainer workers on the node can send exact phase spans.
It has no file sources, no discovery, no relay. With an exporter URL it registers itself (and keeps
re-registering as a heartbeat) at ``POST /api/v1/agents`` so the exporter's HTTP service discovery
hands it to Prometheus with a ``node`` label.
"""
from __future__ import annotations

import logging
import os
import socket

import httpx
from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from ..core.exposition import make_registry
from ..gpu import api as gpu_api
from ..web import base_app, mount
from ..core.model import RunStore
from ..periodic import Periodic
from ..settings import Settings, read_secret

log = logging.getLogger(__name__)

# Node-local areas an agent mounts (each a module with ``router`` and ``init(app)``, like app.AREAS).
AGENT_AREAS = (gpu_api,)
DEFAULT_HEARTBEAT_S = 10.0


def build_app(settings: Settings, store: RunStore) -> FastAPI:
    """A small FastAPI app: /metrics, /healthz and the node-local routers that are installed."""
    app = base_app(store, make_registry(store), settings, "omniwatch node agent",
                   health={"mode": "agent", "node": settings.extra.get("gpu_node")})

    @app.get("/", response_class=HTMLResponse)
    def index():
        return '<html><body><h1>omniwatch node agent</h1><a href="/metrics">/metrics</a></body></html>'

    mount(app, *AGENT_AREAS)
    return app


class Heartbeat(Periodic):
    """Registers ``node -> address`` at the exporter every ``every_s`` (TTL 3x that), deregisters on stop.
    Failures are logged once per change and retried; the agent keeps serving whatever happens."""

    def __init__(self, exporter_url: str, node: str, address: str, token: str | None,
                 every_s: float = DEFAULT_HEARTBEAT_S, node_id: str = ""):
        self.url = exporter_url.rstrip("/")
        self.node, self.address, self.node_id = node, address, node_id
        self.every_s = max(0.2, float(every_s))
        # start() registers once, then every every_s s (wait_first); a failed beat is handled in beat()
        super().__init__(self.every_s, self.beat, name="omniwatch-agent-heartbeat", what="agent heartbeat",
                         wait_first=True, join_timeout=self.every_s + 5)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.ok = 0
        self.failed = 0
        self.last_error: str | None = None

    def beat(self) -> bool:
        body = {"node": self.node, "address": self.address, "ttl_s": round(3 * self.every_s + 1, 3),
                "node_id": self.node_id}
        try:
            with httpx.Client(timeout=max(1.0, self.every_s), trust_env=False) as c:
                r = c.post(f"{self.url}/api/v1/agents", json=body, headers=self._headers)
            err = None if r.status_code == 200 else f"HTTP {r.status_code}: {r.text[:200]}"
        except httpx.HTTPError as e:
            err = f"{type(e).__name__}: {str(e)[:200]}"
        if err is None:
            self.ok += 1
            if self.last_error:
                log.info("registered with %s again", self.url)
        else:
            self.failed += 1
            if err != self.last_error:
                log.warning("cannot register with exporter %s: %s (retrying every %.0f s)", self.url, err, self.every_s)
        self.last_error = err
        return err is None

    def start(self) -> "Heartbeat":
        """The first registration happens before this returns (an agent is discoverable once started)."""
        self.beat()
        return super().start()

    def stop(self, deregister: bool = True) -> None:
        super().stop()
        if deregister:
            try:
                with httpx.Client(timeout=2.0, trust_env=False) as c:
                    c.delete(f"{self.url}/api/v1/agents/{self.node}", headers=self._headers)
            except httpx.HTTPError:
                pass  # the TTL removes it anyway


class NodeAgent:
    """One node's agent: app + server on ``host:port`` (0 = a free port) + optional heartbeat."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, node: str | None = None, gpu: str = "auto",
                 exporter_url: str | None = None, token: str | None = None, heartbeat_s: float = DEFAULT_HEARTBEAT_S,
                 advertise_host: str | None = None, node_id: str = "", extra: dict | None = None):
        self.node = node or socket.gethostname()
        self.host, self.want_port = host, port
        self.advertise_host = advertise_host or host
        settings = Settings.from_env(host=host, port=port)
        settings.extra.update({"gpu": gpu, "gpu_node": self.node, "discovery": False})
        settings.extra.update(extra or {})
        settings.push_token = token if token is not None else read_secret("OMNIWATCH_PUSH_TOKEN")
        self.settings = settings
        self.store = RunStore()
        self.app = build_app(settings, self.store)
        self.exporter_url, self.heartbeat_s, self.node_id = exporter_url, heartbeat_s, node_id
        self.server = None
        self.heartbeat: Heartbeat | None = None
        self.fleet = None   # agents/fleetagent.AgentFleet: this node's per-fleet GPU time, reported to the exporter

    @property
    def port(self) -> int:
        return self.server.port if self.server else 0

    @property
    def address(self) -> str:
        h = self.advertise_host
        return f"[{h}]:{self.port}" if ":" in h else f"{h}:{self.port}"

    def start(self) -> "NodeAgent":
        from ..httpguard import BackgroundServer
        self.server = BackgroundServer(self.app, self.host, self.want_port).start()
        if self.exporter_url:
            self.heartbeat = Heartbeat(self.exporter_url, self.node, self.address, self.settings.push_token,
                                       self.heartbeat_s, self.node_id).start()
            sampler = getattr(getattr(self.app.state, "gpu", None), "sampler", None)
            if sampler is not None and self.settings.extra.get("fleet", True):
                from .fleetagent import AgentFleet
                self.fleet = AgentFleet(sampler, self.exporter_url, self.settings.push_token, self.node_id,
                                        report_s=min(self.heartbeat_s, 5.0),
                                        observe=self.settings.extra.get("gpu_call_watch", True)).start()
        log.info("omniwatch node agent %s on http://%s/metrics", self.node, self.address)
        return self

    def info(self) -> dict:
        return {"node": self.node, "address": self.address, "port": self.port, "pid": os.getpid(),
                "node_id": self.node_id, "registered": bool(self.heartbeat and self.heartbeat.ok),
                "gpu_sampling": getattr(getattr(self.app.state, "gpu", None), "sampler", None) is not None}

    def stop(self, deregister: bool = True) -> None:
        if self.fleet is not None:
            self.fleet.stop()
        if self.heartbeat:
            self.heartbeat.stop(deregister=deregister)
        if self.server:
            self.server.stop()
