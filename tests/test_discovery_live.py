"""Discovery against a real Ray cluster, a real TransferQueue, the real exporter app and a real
Prometheus, all inside a private network namespace (loopback only). The scenario runs once
(tests/discovery_scenario.py) and writes what it saw; each test asserts one outcome of it.

Skips when ray/transferqueue are not installed or ``unshare -n`` is not permitted here, saying that
``make test-ray`` installs them and runs these tests (where they are required, OMNIWATCH_REQUIRE_RAY=1,
a missing piece fails).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require_binary, require_ray_tq

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.ray]


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    require_ray_tq("ray", "transfer_queue", "torch", "tensordict")
    require_binary("prometheus")
    out = tmp_path_factory.mktemp("disc") / "observed.json"
    bindir = os.path.dirname(sys.executable)
    cmd = (f"ip link set lo up && PATH={bindir}:$PATH exec {sys.executable} "
           f"{ROOT / 'tests' / 'discovery_scenario.py'} {out}")
    r = subprocess.run(["unshare", "-n", "sh", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert out.exists(), f"scenario wrote nothing (rc={r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    obs = json.loads(out.read_text())
    assert "error" not in obs, obs["error"]
    return obs


def _labels(results):
    return [r["metric"] for r in results or []]


@pytest.mark.timeout(600)
def test_ray_attached_while_transferqueue_absent(seen):
    assert seen["A_ray_up"] == 1
    # not there yet (a legacy run never has one) is "off", not down: no omniwatch_source_up series
    assert seen["A_tq_up"] is None
    assert "TransferQueueController" in seen["A_status"]["transferqueue"]["why"]
    assert seen["A_sd_tq"] == []


def test_transferqueue_scraped_with_run_labels(seen):
    assert seen["tq_roundtrip"] is True
    (m,) = _labels(seen["B_tq"])
    assert (m["project"], m["experiment"], m["job"], m["role"]) == ("proj", "exp1", "transfer_queue", "controller")
    assert m["instance"] == seen["tq_endpoint"]
    ops = {r["metric"]["op_type"]: float(r["value"][1]) for r in seen["B_tq_samples"]}
    assert ops == {"NOTIFY_DATA_UPDATE": 8.0, "CLEAR_META": 4.0}  # 8 put, 4 cleared
    assert float(seen["B_tq_live"][0]["value"][1]) == 4.0   # live samples (recording rule, evaluated by Prometheus)
    assert seen["B_tq_keys"], "run:tq_storage_active_keys:sum never reached 4"


def test_transferqueue_storage_units_discovered(seen):
    ups = seen["B_tq_storage_targets"]
    assert len(ups) == 2 and all(r["value"][1] == "1" for r in ups)
    # each carries the id the controller's per-unit series are labelled with (the join key)
    ids = {r["metric"].get("storage_unit_id", "") for r in ups}
    assert len(ids) == 2 and all(i.startswith("TQ_STORAGE_UNIT_") for i in ids), ids


def test_ray_node_metrics_scraped(seen):
    (m,) = _labels(seen["B_ray"])
    assert m["job"] == "ray" and m["ip"] == "127.0.0.1" and m["IsHeadNode"] == "true" and m["project"] == "proj"


def test_rollout_saturation_rule_and_alert_in_prometheus(seen):
    assert seen["pushed_steps"] == 200  # the run's step timers: the alert needs the step to wait on the servers
    roles = {(m["role"], m["replica"]) for m in _labels(seen["B_saturated"])}
    assert ("rollout", "0") in roles           # vLLM-Omni stand-in from verl's rollout prometheus.yml
    assert ("reward", "0") in roles            # vLLM stand-in found as Ray actor vllm_server_reward_0_0
    alerts = {(m["role"], m["alertstate"]) for m in _labels(seen["B_alert"])}
    assert {r for r, _ in alerts} >= {"rollout", "reward"}
    names = {(m["__name__"], m["role"]) for m in _labels(seen["B_vllm_both"])}
    assert {("vllm_omni:num_requests_running", "rollout"), ("vllm:num_requests_running", "rollout"),
            ("vllm:num_requests_running", "reward")} <= names
    seqs = {(m["role"], m["replica"]): float(r["value"][1]) for r in seen["B_max_num_seqs"] for m in [r["metric"]]}
    assert seqs[("rollout", "0")] == 8 and seqs[("reward", "0")] == 4


def test_hung_and_garbage_endpoints_down_exporter_unaffected(seen):
    ups = {r["metric"]["instance"]: r["value"][1] for r in seen["B_rollout_up"]}
    a = seen["rollout_addresses"]
    assert ups == {a["ok"]: "1", a["hang"]: "0", a["garbage"]: "0"}
    assert seen["B_exporter_up"][0]["value"][1] == "1"
    assert seen["B_exporter_scrape_max_s"] < 5  # a bound (hang detection), not a speed claim


def test_reward_server_found_through_ray_actor(seen):
    (r,) = seen["B_reward_up"]
    assert r["metric"]["instance"] == seen["reward_address"] and r["value"][1] == "1"


def test_targets_that_go_away_leave_sd_and_prometheus(seen):
    assert seen["C_sd_rollout"] == [seen["rollout_addresses"]["ok"]]
    assert seen["C_sd_reward"] == ["none"]
    assert seen["C_prom_rollout_targets"] == [seen["rollout_addresses"]["ok"]]


def test_cluster_gone_source_down_and_targets_dropped(seen):
    assert seen["D_ray_up"] == 0
    assert seen["D_sd_tq"] == [] and seen["D_sd_ray"] == []
    assert seen["D_exporter_status"] == 200
    log = seen["exporter_log"]
    assert "Ray discovery is off" in log and "every other source keeps working" in log
    assert "auth_token" not in log and "RAY_AUTH_TOKEN=" not in log
