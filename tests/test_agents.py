"""Node agents without Ray: the exporter's agent registry (TTL, down, forget, bounds), its HTTP API
(auth, bad input -> 4xx, SD body), a real NodeAgent registering with a real exporter app, the
``omniwatch agent`` command on a free port, and the pure placement helpers."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest

from conftest import wait_for
from omniwatch.agents import placement
from omniwatch.agents.node import NodeAgent
from omniwatch.agents.registry import SOURCE, AgentRegistry, RegistryFull, check_registration
from omniwatch.core.model import RunStore
from omniwatch.httpguard import BackgroundServer
from omniwatch.server import Exporter
from omniwatch.settings import Settings

TOKEN = "test-agent-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_registry_ttl_down_then_forgotten():
    store, clock = RunStore(), Clock()
    reg = AgentRegistry(store, forget_after_s=100, clock=clock)
    reg.register("n1", "10.0.0.1:4000", ttl_s=5)
    reg.register("n2", "10.0.0.2:4000", ttl_s=5)
    assert [g["labels"]["node"] for g in reg.http_sd()] == ["n1", "n2"]
    assert store.sources[(SOURCE, "n1")] == 1
    clock.t += 4
    reg.register("n2", "10.0.0.2:4001", ttl_s=5)  # heartbeat, new port
    clock.t += 2
    sd = reg.http_sd()
    assert [(g["labels"]["node"], g["targets"]) for g in sd] == [("n2", ["10.0.0.2:4001"])]
    assert store.sources[(SOURCE, "n1")] == 0, "a lapsed agent must be reported down (alert), not vanish"
    reg.register("n1", "10.0.0.1:4000", ttl_s=5)  # it came back
    assert store.sources[(SOURCE, "n1")] == 1
    clock.t += 200
    reg.sweep()
    assert reg.entries() == [] and (SOURCE, "n1") not in store.sources


def test_registry_clean_deregistration_raises_nothing():
    store = RunStore()
    reg = AgentRegistry(store)
    reg.register("n1", "h:1", 5)
    assert reg.deregister("n1") and not reg.deregister("n1")
    assert (SOURCE, "n1") not in store.sources and reg.http_sd() == []


def test_registry_is_bounded():
    reg = AgentRegistry(max_agents=2)
    reg.register("a", "h:1", 5)
    reg.register("b", "h:2", 5)
    reg.register("a", "h:3", 5)  # re-registration is not a new entry
    with pytest.raises(RegistryFull):
        reg.register("c", "h:4", 5)


@pytest.mark.parametrize("node,address,ttl,why", [
    ("", "h:1", 5, "node"), ("a b", "h:1", 5, "node"), ("x" * 200, "h:1", 5, "node"), (None, "h:1", 5, "node"),
    ("n", "nohost", 5, "address"), ("n", "h:0", 5, "address"), ("n", "h:99999", 5, "address"), ("n", 7, 5, "address"),
    ("n", "h:1", 0.1, "ttl"), ("n", "h:1", 1e9, "ttl"), ("n", "h:1", "soon", "ttl"),
])
def test_bad_registrations_are_rejected(node, address, ttl, why):
    with pytest.raises(ValueError, match=why):
        check_registration(node, address, ttl)


def test_registration_accepts_urls_and_ipv6():
    assert check_registration("n", "http://10.0.0.1:9/metrics", None)[1] == "10.0.0.1:9"
    assert check_registration("n", "[::1]:9", 3)[1:] == ("[::1]:9", 3.0)


@pytest.fixture
def exporter(monkeypatch):
    monkeypatch.setenv("OMNIWATCH_PUSH_TOKEN", TOKEN)
    settings = Settings.from_env(port=0)
    settings.extra.update(discovery=False, gpu="off")
    ex = Exporter.build(settings)
    srv = BackgroundServer(ex.app).start()
    try:
        yield srv
    finally:
        srv.stop()


def _source_up(url: str, node: str):
    for ln in httpx.get(f"{url}/metrics").text.splitlines():
        if ln.startswith(f'omniwatch_source_up{{source="agent",target="{node}"}}'):
            return float(ln.rsplit(" ", 1)[1])
    return None


def test_api_auth_and_bad_input(exporter):
    u = exporter.url + "/api/v1/agents"
    good = {"node": "n1", "address": "127.0.0.1:5"}
    assert httpx.post(u, json=good).status_code == 401
    assert httpx.post(u, json=good, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.post(u, content=b"{nope", headers=AUTH).status_code == 400
    assert httpx.post(u, json=[1, 2], headers=AUTH).status_code == 400
    r = httpx.post(u, json={"node": "n 1", "address": "127.0.0.1:5"}, headers=AUTH)
    assert r.status_code == 422 and TOKEN not in r.text
    assert httpx.post(u, content=b"x" * (2 << 20), headers=AUTH).status_code == 413
    assert httpx.delete(u + "/n1").status_code == 401
    r = httpx.post(u, json=good, headers=AUTH)
    assert r.status_code == 200 and r.json()["registered"]
    listing = httpx.get(u).json()
    assert [a["node"] for a in listing] == ["n1"] and TOKEN not in json.dumps(listing)
    assert httpx.get(u + "/sd").json() == [{"targets": ["127.0.0.1:5"],
                                           "labels": {"job": "omniwatch-agent", "node": "n1", "__metrics_path__": "/metrics"}}]
    assert 'omniwatch_ingest_errors_total{reason="bad_registration",source="agents"}' in httpx.get(exporter.url + "/metrics").text
    assert httpx.delete(u + "/n1", headers=AUTH).json() == {"removed": True}
    assert httpx.get(u + "/sd").json() == []


def test_disabled_without_push_token(monkeypatch):
    monkeypatch.delenv("OMNIWATCH_PUSH_TOKEN", raising=False)
    monkeypatch.delenv("OMNIWATCH_PUSH_TOKEN_FILE", raising=False)
    settings = Settings.from_env(port=0)
    settings.extra.update(discovery=False, gpu="off")
    ex = Exporter.build(settings)
    srv = BackgroundServer(ex.app).start()
    try:
        r = httpx.post(srv.url + "/api/v1/agents", json={"node": "n", "address": "h:1"}, headers=AUTH)
        assert r.status_code == 403
    finally:
        srv.stop()


def test_node_agent_registers_heartbeats_and_goes_down_when_silent(exporter):
    agent = NodeAgent(node="gpu-node-1", gpu="off", exporter_url=exporter.url, token=TOKEN, heartbeat_s=0.3).start()
    try:
        assert agent.info()["registered"], "the first registration happens inside start()"
        assert agent.port > 0
        body = httpx.get(f"http://{agent.address}/metrics").text
        assert "omniwatch_build_info" in body
        assert httpx.get(f"http://{agent.address}/healthz").json()["mode"] == "agent"
        sd = httpx.get(exporter.url + "/api/v1/agents/sd").json()
        assert sd[0]["targets"] == [agent.address] and sd[0]["labels"]["node"] == "gpu-node-1"
        assert _source_up(exporter.url, "gpu-node-1") == 1.0
        agent.stop(deregister=False)  # like a SIGKILL: heartbeats stop, nobody says goodbye
        assert wait_for(lambda: httpx.get(exporter.url + "/api/v1/agents/sd").json() == [], 10, what="SD drop")
        assert wait_for(lambda: _source_up(exporter.url, "gpu-node-1") == 0.0, 5, what="source down")
    finally:
        agent.stop()


def test_node_agent_keeps_serving_when_the_exporter_is_unreachable():
    agent = NodeAgent(node="n", gpu="off", exporter_url="http://127.0.0.1:9", token="t", heartbeat_s=0.2).start()
    try:
        assert not agent.info()["registered"] and agent.heartbeat.failed >= 1
        assert httpx.get(f"http://{agent.address}/metrics").status_code == 200
    finally:
        agent.stop()


def test_agent_command_binds_a_free_port_and_registers(exporter):
    env = dict(os.environ, OMNIWATCH_PUSH_TOKEN=TOKEN)
    p = subprocess.Popen([sys.executable, "-c", "from omniwatch.agents.commands import add_commands; import argparse, sys;"
                          "ap = argparse.ArgumentParser(); add_commands(ap.add_subparsers()); a = ap.parse_args(sys.argv[1:]);"
                          "sys.exit(a.func(a))", "agent", "--node", "cli-node", "--gpu-mode", "off",
                          "--exporter", exporter.url, "--heartbeat", "0.5"],
                         stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        first = json.loads(p.stdout.readline())
        assert first["port"] > 0 and first["node"] == "cli-node"
        assert httpx.get(f"http://{first['address']}/metrics").status_code == 200
        assert wait_for(lambda: any(g["labels"]["node"] == "cli-node"
                                    for g in httpx.get(exporter.url + "/api/v1/agents/sd").json()), 10)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 0
        # clean exit deregisters: gone from SD without a down report
        assert _source_up(exporter.url, "cli-node") is None
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)


def test_node_labels_disambiguate_shared_hosts():
    nodes = [{"NodeID": "aaaa" * 14, "NodeManagerHostname": "h1"},
             {"NodeID": "bbbb" * 14, "NodeManagerHostname": "h2"},
             {"NodeID": "cccc" * 14, "NodeManagerHostname": "h2"}]
    assert placement.node_labels(nodes) == {"aaaa" * 14: "h1", "bbbb" * 14: "h2-bbbbbbbb", "cccc" * 14: "h2-cccccccc"}
    assert placement.agent_name("abcdef" * 10) == "omniwatch-agent-" + ("abcdef" * 10)[:16]
    assert not placement.agent_name("x").startswith(placement.SUPERVISOR)


def test_head_node_id():
    nodes = [{"NodeID": "w", "Alive": True, "Resources": {"CPU": 1}},
             {"NodeID": "h", "Alive": True, "Resources": {"node:__internal_head__": 1.0}}]
    assert placement.head_node_id(nodes) == "h"
    assert placement.head_node_id(nodes[:1]) is None


def test_importing_agents_does_not_import_ray():
    code = "import sys, omniwatch.agents, omniwatch.agents.placement; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_the_first_reconcile_is_waited_for_as_long_as_its_own_calls_may_take():
    # a round makes at most two bounded calls per node, one after the other: start() waits that long, so a
    # 64-node cluster placing every agent is not cut off after a fixed 150 s
    assert placement.reconcile_bound_s(3) == 7 * placement.RAY_CALL_TIMEOUT_S
    assert placement.reconcile_bound_s(64) >= 2 * 64 * placement.RAY_CALL_TIMEOUT_S
    assert placement.reconcile_bound_s(0) == placement.reconcile_bound_s(1) > 2 * placement.RAY_CALL_TIMEOUT_S
