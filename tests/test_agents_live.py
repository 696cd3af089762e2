"""Node agents on a real multi-node Ray cluster (tests/agents_scenario.py inside ``unshare -n``):
one agent per node, discovered and scraped by a real Prometheus, idempotent start, a joining node
gets one, a killed agent or a removed node leaves SD and fires OmniwatchSourceDown, stop removes all."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require_binary, require_ray_tq

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.ray]


@pytest.fixture(scope="module")
def obs(tmp_path_factory):
    require_binary("prometheus")
    require_ray_tq("ray")
    out = tmp_path_factory.mktemp("agents") / "out.json"
    cmd = f"ip link set lo up && exec {sys.executable} {ROOT / 'tests' / 'agents_scenario.py'} {out}"
    res = subprocess.run(["unshare", "-n", "sh", "-c", cmd], capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert out.exists(), res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert not data.get("error"), data["error"]
    return data


def test_one_agent_per_node_discovered_and_scraped(obs):
    agents = obs["start1"]["agents"]
    assert sorted(agents) == sorted(obs["nodes"])
    for nid, a in agents.items():
        assert a["ray_node_id"] == nid, "agent not on the node it was pinned to"
        assert a["registered"]
    assert len(obs["sd1"]) == 3 and len(set(obs["sd1"].values())) == 3
    assert sorted(obs["sd1"]) == obs["prom_nodes1"], "Prometheus scrapes each agent with its node label"


def test_start_is_idempotent(obs):
    a1, a2 = obs["start1"], obs["start2"]
    assert a2["placed"] == a1["placed"] == 3
    assert {k: v["pid"] for k, v in a1["agents"].items()} == {k: v["pid"] for k, v in a2["agents"].items()}


def test_joining_node_gets_an_agent(obs):
    assert obs["sd_join"] and len(obs["sd_join"]) == 4


def test_killed_agent_alerts_then_is_replaced(obs):
    v = obs["victim"]
    assert obs["kill_sd_dropped"] and obs["kill_source_up"] == 0.0
    assert obs["kill_alert"], "OmniwatchSourceDown{source=agent} did not fire for the killed agent"
    assert obs["replaced_address"] and obs["replaced_address"] != v["address"]
    assert obs["replaced_pid"] and obs["replaced_pid"] != v["pid"]
    assert obs["replaced_source_up"]


def test_removed_node_leaves_sd_and_alerts(obs):
    assert obs["remove_sd_dropped"] and obs["remove_alert"]
    final = obs["final"]
    assert sorted(final) == obs["alive_nodes"]
    assert all(a.get("ray_node_id") == nid for nid, a in final.items())


def test_stop_removes_every_agent(obs):
    assert obs["stopped"] == 3
    assert obs["sd_after_stop"] == {} and obs["actors_after_stop"] == []


def test_agent_cpu_cost_is_small(obs):
    # Recorded for docs/scaling.md; a loose sanity bound, not a speed assertion.
    assert 0 <= obs["agent_cpu_fraction_each"] < 0.5
