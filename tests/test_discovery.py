"""Discovery without a Ray cluster: file parsing, flags, the HTTP-SD endpoint and collector,
Ray absent, and ``omniwatch discover`` against stand-in servers on 127.0.0.1."""
from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from conftest import require_tool
from omniwatch import names as n
from omniwatch.app import create_app
from omniwatch.discovery import DiscoveryConfig, add_commands, scrape_configs
from omniwatch.discovery.config import from_args, parse_max_num_seqs
from omniwatch.discovery.service import Discovery
from omniwatch.discovery.targets import (
    Target, dedupe, http_sd, normalize_address, parse_address_list, read_ray_sd_file, read_rollout_prometheus_file,
)
from omniwatch.core.exposition import make_registry
from omniwatch.core.model import RunStore
from omniwatch.settings import Settings

STANDIN = Path(__file__).parent / "standins" / "vllm_omni_server.py"


@pytest.mark.parametrize("raw,want", [
    ("127.0.0.1:8000", "127.0.0.1:8000"), ("http://10.0.0.1:9/metrics", "10.0.0.1:9"), ("[::1]:80", "[::1]:80"),
    ("host-a:1", "host-a:1"), ("a:0", None), ("a:70000", None), ("a", None), ("[zz]:1", None), (":1", None),
    (None, None), (42, None), ("a b:1", None),
])
def test_normalize_address(raw, want):
    assert normalize_address(raw) == want


def test_address_list_keeps_bad_entries_aside():
    assert parse_address_list(["a:1,b:2", " ,nope", "c:3"]) == (["a:1", "b:2", "c:3"], ["nope"])


def test_rollout_file_as_verl_writes_it(tmp_path):
    f = tmp_path / "prometheus.yml"
    f.write_text("global: {scrape_interval: 10s}\nscrape_configs:\n"
                 "- job_name: ray\n  file_sd_configs: [{files: [/tmp/ray/prom_metrics_service_discovery.json]}]\n"
                 "- job_name: rollout\n  static_configs: [{targets: ['10.0.0.5:4000', '10.0.0.6:4001', bad, '10.0.0.5:4000']}]\n")
    addrs, why = read_rollout_prometheus_file(str(f))
    assert addrs == ["10.0.0.5:4000", "10.0.0.6:4001"] and "2 target" in why


@pytest.mark.parametrize("body,expect", [
    ("scrape_configs: [{job_name: ray}]\n", []), (": : :\n  - [", None), ("[1, 2]\n", []), ("", []),
    ("scrape_configs: [{job_name: rollout, static_configs: [7, {targets: 5}]}]", []),
])
def test_rollout_file_bad_inputs_never_raise(tmp_path, body, expect):
    f = tmp_path / "p.yml"
    f.write_text(body)
    assert read_rollout_prometheus_file(str(f))[0] == expect
    assert read_rollout_prometheus_file(str(tmp_path / "missing.yml"))[0] is None


def test_ray_sd_file_fresh_stale_and_bad(tmp_path):
    f = tmp_path / "sd.json"
    f.write_text(json.dumps([{"labels": {"job": "ray"}, "targets": ["127.0.0.1:5000", "127.0.0.1:44217", "junk"]}]))
    assert read_ray_sd_file(str(f))[0] == ["127.0.0.1:5000", "127.0.0.1:44217"]
    assert read_ray_sd_file(str(f), now=time.time() + 3600)[0] is None  # its cluster stopped rewriting it
    f.write_text("{not json")
    assert read_ray_sd_file(str(f))[0] is None


def test_http_sd_labels_and_filter():
    ts = [Target("rollout", "a:1", "flag", role="rollout", replica="0"), Target("tq", "b:2", "tq-controller", role="controller"),
          Target("rollout", "a:1", "rollout-file", role="rollout", replica="3")]
    body = http_sd(dedupe(ts), "p", "e")
    assert body == [{"targets": ["a:1"], "labels": {"job": "rollout", "__metrics_path__": "/metrics", "project": "p",
                                                   "experiment": "e", "role": "rollout", "replica": "0"}},
                    {"targets": ["b:2"], "labels": {"job": "transfer_queue", "__metrics_path__": "/metrics", "project": "p",
                                                   "experiment": "e", "role": "controller"}}]
    assert [g["targets"] for g in http_sd(ts, None, None, "tq")] == [["b:2"]]


def test_storage_unit_targets_carry_the_id_the_controller_labels_them_with():
    """The controller exports tq_storage_*{storage_unit_id} for each unit, the unit's own endpoint has no
    such label: discovery reads the id (get_zmq_server_info().id) and sets it as a target label."""
    from types import SimpleNamespace

    from omniwatch.discovery.probe import probe_storage

    class Remote:
        def __init__(self, value):
            self.value = value

        def remote(self, **_):
            return self.value

    class FakeRay:
        def __init__(self, ids):
            self.ids = ids

        def get_actor(self, name, namespace):
            unit = name.split("#")[1]
            ident = self.ids[unit]
            return SimpleNamespace(start_metrics=Remote(f"127.0.0.1:90{unit}"),
                                   get_zmq_server_info=Remote(ident if isinstance(ident, Exception) else
                                                              SimpleNamespace(id=ident)))

        def get(self, value, timeout=None):
            if isinstance(value, Exception):
                raise value
            return value

    named = [{"name": f"TransferQueueStorageUnit#{i}", "namespace": "ns"} for i in range(3)] + \
        [{"name": "TransferQueueController", "namespace": "transfer_queue"}]
    got = probe_storage(FakeRay({"0": "TQ_STORAGE_UNIT_1729eee7", "1": TimeoutError("slow"), "2": "bad id with spaces"}),
                        named, 1.0)
    assert got[0] == {"unit": "0", "endpoint": "127.0.0.1:900", "storage_unit_id": "TQ_STORAGE_UNIT_1729eee7"}
    assert got[1]["endpoint"] == "127.0.0.1:901" and "storage_unit_id" not in got[1] and "TimeoutError" in got[1]["id_error"]
    assert got[2] == {"unit": "2", "endpoint": "127.0.0.1:902"}
    t = Target("tq", "127.0.0.1:900", "tq-storage", role="storage", replica="0", storage_unit_id="TQ_STORAGE_UNIT_1729eee7")
    assert t.labels("p", "e")["storage_unit_id"] == "TQ_STORAGE_UNIT_1729eee7"
    assert "storage_unit_id" not in Target("tq", "b:2", "tq-controller", role="controller").labels("p", "e")


def test_max_num_seqs_flag():
    assert parse_max_num_seqs("16") == {"rollout": 16, "reward": 16}
    assert parse_max_num_seqs("rollout=8, reward=4") == {"rollout": 8, "reward": 4}
    for bad in ("0", "x", "critic=3", "rollout=-1"):
        with pytest.raises(ValueError):
            parse_max_num_seqs(bad)


def _parser():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    add_commands(sub)
    return p


def test_flags_build_config():
    a = _parser().parse_args(["discover", "--ray-address", "off", "--rollout", "h:1,h:2", "--reward", "bad",
                              "--ray-sd-file", "none", "--max-num-seqs", "rollout=8"])
    cfg = from_args(a)
    assert cfg.ray_address is None and cfg.ray_sd_file is None
    assert cfg.rollout == ["h:1", "h:2"] and cfg.reward == [] and cfg.rejected == ["bad"]


def test_scrape_configs_one_job_per_kind():
    jobs = scrape_configs("127.0.0.1:19095", refresh_interval="5s")
    assert [j["job_name"] for j in jobs] == ["transfer_queue", "rollout", "reward", "ray"]
    assert jobs[0]["http_sd_configs"] == [{"url": "http://127.0.0.1:19095/api/v1/sd?kind=tq", "refresh_interval": "5s"}]


def _app(cfg: DiscoveryConfig, store: RunStore | None = None):
    store = store or RunStore()
    settings = Settings(extra={"discovery": cfg})
    return create_app(store, make_registry(store), settings), store


def _wait(fn, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.2)
    return fn()


def test_sd_endpoint_and_collector_without_ray(tmp_path):
    cfg = DiscoveryConfig(ray_address=None, interval=0.2, rollout=["127.0.0.1:7001", "127.0.0.1:7002"],
                          reward=["127.0.0.1:7003"], max_num_seqs={"rollout": 8}, ray_sd_file=None,
                          rollout_prometheus_file=str(tmp_path / "absent.yml"))
    app, store = _app(cfg)
    store.ingest("proj", "exp", __import__("omniwatch.core.parse", fromlist=["ParsedStep"]).ParsedStep(1, {}), "test")
    with TestClient(app) as c:
        body = _wait(lambda: c.get("/api/v1/sd").json())
        assert {g["targets"][0]: (g["labels"]["role"], g["labels"]["replica"]) for g in body} == {
            "127.0.0.1:7001": ("rollout", "0"), "127.0.0.1:7002": ("rollout", "1"), "127.0.0.1:7003": ("reward", "0")}
        assert all(g["labels"]["project"] == "proj" and g["labels"]["experiment"] == "exp" for g in body)  # the only run
        assert [g["targets"] for g in c.get("/api/v1/sd?kind=reward").json()] == [["127.0.0.1:7003"]]
        assert c.get("/api/v1/sd?kind=../etc").status_code == 400
        text = c.get("/metrics").text
        assert f'{n.SD_TARGETS}{{kind="rollout"}} 2.0' in text and f'{n.SD_TARGETS}{{kind="tq"}} 0.0' in text
        assert f'{n.ROLLOUT_MAX_NUM_SEQS}{{experiment="exp",project="proj",replica="1",role="rollout"}} 8.0' in text
        assert 'source="ray"' not in text  # switched off by the user: nothing to report
        assert c.get("/api/v1/discovery").json()["counts"]["reward"] == 1


def test_ray_absent_with_auto_is_off_not_down_and_app_serves(tmp_path, monkeypatch, caplog):
    """No cluster answering ``auto`` (a host without Ray, a legacy run without TransferQueue) is "off",
    said once in the log; it must not be ``omniwatch_source_up 0``, or OmniwatchSourceDown would fire
    forever on every such setup."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # no ray_current_cluster here: "auto" finds nothing
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    caplog.set_level(logging.INFO, logger="omniwatch.discovery")
    cfg = DiscoveryConfig(ray_address="auto", interval=0.5, ray_sd_file=None, rollout=["127.0.0.1:7001"],
                          rollout_prometheus_file=str(tmp_path / "absent.yml"))
    app, _ = _app(cfg)
    with TestClient(app) as c:
        _wait(lambda: "Ray discovery is off" in caplog.text or None, 60)
        text = c.get("/metrics").text
        assert 'omniwatch_source_up{source="ray"' not in text
        assert 'omniwatch_source_up{source="transferqueue"' not in text
        assert [g["targets"] for g in c.get("/api/v1/sd").json()] == [["127.0.0.1:7001"]]
        assert c.get("/healthz").status_code == 200
    lines = [r.getMessage() for r in caplog.records if "Ray discovery is off" in r.getMessage()]
    assert len(lines) == 1, lines  # one clear line, not one per round


def test_a_source_that_was_up_and_went_away_is_down():
    from omniwatch.discovery.service import Snapshot
    store = RunStore()
    d = Discovery(DiscoveryConfig(ray_address="auto", ray_sd_file=None), store=store)
    up = {"ray": {"up": True, "why": "attached"}, "transferqueue": {"up": True, "why": "found"}}
    down = {"ray": {"up": False, "why": "lost"}, "transferqueue": {"up": False, "why": "lost"}}
    d._publish(Snapshot((), up, None, None, 0.0))
    assert store.sources[("ray", "auto")] == 1 and store.sources[("transferqueue", "controller")] == 1
    d._publish(Snapshot((), down, None, None, 1.0))
    assert store.sources[("ray", "auto")] == 0 and store.sources[("transferqueue", "controller")] == 0


def test_discovery_round_is_bounded_when_files_are_huge(tmp_path):
    big = tmp_path / "prometheus.yml"
    big.write_bytes(b"#" * (2 << 20))
    d = Discovery(DiscoveryConfig(ray_address=None, rollout_prometheus_file=str(big), ray_sd_file=str(big)))
    snap = d.round()
    assert snap.targets == () and "over 1 MiB" in snap.status["rollout"]["why"]


@pytest.fixture
def standins():
    procs, addrs = [], {}
    try:
        for mode in ("ok", "nostats"):
            p = subprocess.Popen([sys.executable, str(STANDIN), "--mode", mode], stdout=subprocess.PIPE, text=True)
            procs.append(p)
            addrs[mode] = f"127.0.0.1:{json.loads(p.stdout.readline())['port']}"
        yield addrs
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def test_discover_command_json(standins, capsys):
    a = _parser().parse_args(["discover", "--json", "--ray-address", "off", "--ray-sd-file", "off",
                              "--rollout-prometheus-file", "/nonexistent/prometheus.yml",
                              "--rollout", f"{standins['ok']},{standins['nostats']}"])
    assert a.func(a) == 0
    out = json.loads(capsys.readouterr().out)
    states = {t["address"]: t["state"] for t in out["targets"]}
    assert states == {standins["ok"]: "ok", standins["nostats"]: "no_stats"}
    nostats = next(t for t in out["targets"] if t["state"] == "no_stats")
    assert "actor_rollout_ref.rollout.disable_log_stats=False" in nostats["detail"]
    assert "transfer_queue.metrics.enabled=true" in out["missing"]["tq"]
    assert "reward.reward_model.rollout.disable_log_stats=False" in out["missing"]["reward"]


def test_discover_command_table(standins, capsys):
    a = _parser().parse_args(["discover", "--ray-address", "off", "--ray-sd-file", "off", "--no-fetch",
                              "--rollout-prometheus-file", "/nonexistent/prometheus.yml", "--rollout", standins["ok"]])
    assert a.func(a) == 0
    text = capsys.readouterr().out
    assert standins["ok"] in text and "transfer_queue.metrics.enabled=true" in text


def test_promtool_rules_and_tests():
    root = Path(__file__).resolve().parent.parent
    promtool = require_tool("promtool")
    r = subprocess.run([promtool, "check", "rules", "alerts/endpoints.rules.yml"], cwd=root, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([promtool, "test", "rules", "alerts/tests/endpoints.test.yml"], cwd=root, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("name,role,replica", [
    ("vllm_server_2_0", "rollout", "2"), ("vllm_server_reward_1_0", "reward", "1"),
    ("vllm_omni_server_3_0", "rollout", "3"),            # VeRL-Omni's prefix (verl-source.md R8)
    ("vllm_omni_server_reward_0_0", "reward", "0"), ("sglang_server_0_0_model", "rollout", "0")])
def test_server_actor_names_of_verl_and_verl_omni_are_recognised(name, role, replica):
    from omniwatch.discovery.probe import SERVER_NAME
    m = SERVER_NAME.match(name)
    assert m and m["node"] == "0" and m["replica"] == replica and ("reward" if m["reward"] else "rollout") == role


def test_names_that_are_not_server_replicas_are_not_recognised():
    from omniwatch.discovery.probe import SERVER_NAME
    for name in ("vllm_omni_server_x_0", "TaskRunner", "vllm_omniserver_0_0", "myvllm_server_0_0"):
        assert not SERVER_NAME.match(name), name


def _fake_proc(root, procs: dict, netns_of: dict):
    """A /proc with ``self/ns/net`` and, per pid, its cmdline (NUL-separated) and network namespace file."""
    import os as _os
    (root / "self" / "ns").mkdir(parents=True)
    (root / "self" / "ns" / "net").write_text("mine")
    others = root / "other-netns"
    others.write_text("other")
    for pid, argv in procs.items():
        (root / pid / "ns").mkdir(parents=True)
        (root / pid / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        _os.link(root / "self" / "ns" / "net" if netns_of[pid] == "mine" else others, root / pid / "ns" / "net")


def test_auto_probes_only_where_ray_could_find_a_cluster(tmp_path):
    """Ray resolves "auto" from RAY_ADDRESS, its temp dir's ray_current_cluster file, or any raylet's --gcs-address
    (ray/_private/services.py); without any of them no probe process is spawned (each one imports ray). A raylet on
    loopback in another network namespace (a test's `unshare -n` cluster) cannot be reached from here."""
    from omniwatch.discovery.service import local_cluster_hint
    raylet = ".venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet"
    worker_cmd = "--python_worker_command=python default_worker.py --gcs-address=127.0.0.1:6379 --temp-dir=/tmp/ray"
    proc = tmp_path / "proc"
    _fake_proc(proc, {"10": ["python", "-m", "pytest"], "11": [raylet, "--raylet_socket_name=x", worker_cmd],
                      "12": ["/usr/bin/prometheus", "--gcs-address=127.0.0.1:1"]},
               {"10": "mine", "11": "other", "12": "mine"})
    env = {"TMPDIR": str(tmp_path)}
    assert local_cluster_hint("auto", env, str(proc)) is None
    assert local_cluster_hint("10.0.0.5:6379", env, str(proc)) == "address 10.0.0.5:6379"
    assert local_cluster_hint("auto", {**env, "RAY_ADDRESS": "10.0.0.5:6379"}, str(proc)) == "RAY_ADDRESS"
    # the same raylet in this namespace, or with a routable GCS address elsewhere, is a cluster Ray would find
    same = tmp_path / "proc-same"
    _fake_proc(same, {"11": [raylet, worker_cmd]}, {"11": "mine"})
    assert local_cluster_hint("auto", env, str(same)) == "raylet 11"
    routable = tmp_path / "proc-routable"
    _fake_proc(routable, {"11": [raylet, "--gcs-address=10.0.0.5:6379"]}, {"11": "other"})
    assert local_cluster_hint("auto", env, str(routable)) == "raylet 11"
    # the last `ray start` of this machine's temp dir ($RAY_TMPDIR first)
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.1:6379")
    assert local_cluster_hint("auto", env, str(proc)) == str(tmp_path / "ray" / "ray_current_cluster")
    assert local_cluster_hint("auto", {"RAY_TMPDIR": str(tmp_path / "elsewhere"), **env}, str(proc)) is None


def test_no_probe_process_is_started_while_no_cluster_can_be_found(tmp_path, monkeypatch):
    from omniwatch.discovery import service
    spawned = []
    hint = {"now": None}
    monkeypatch.setattr(service, "local_cluster_hint", lambda address: hint["now"])
    probe = service.RayProbe(DiscoveryConfig(ray_address="auto", ray_sd_file=None))
    monkeypatch.setattr(probe, "_spawn", lambda: spawned.append(1))
    probe.tick()
    up, why, _, _ = probe.state()
    assert not spawned and up is False and "no Ray cluster on this machine" in why
    probe.tick()   # looked at again only after HINT_RECHECK_S
    assert not spawned
    hint["now"] = "raylet 11"
    probe.next_start = 0.0
    probe.tick()
    assert spawned == [1]
