"""Issue 35's first hour beside a real run, items 11, 13 and 14 (items 12 and 16: test_up_keeps.py, test_newcomer.py,
test_extras.py): a watched root created after `up` is followed, not failed as a file; `make up WATCH='<glob>'`
hands omniwatch the glob whole; the rule files Prometheus is given link runbooks on the exporter's own port."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import orjson
import pytest
import yaml

from omniwatch.core.model import RunStore
from omniwatch.rules import rule_files
from omniwatch.sources.files import FileSource
from omniwatch.stack import Stack, StackConfig

from .conftest import REPO, require_binary


def test_a_watched_root_created_after_start_is_followed_and_its_source_stays_up(tmp_path):
    """Before: `make up WATCH=<root>` before the trainer made <root> (the README's order): the tail opened on the
    missing path failed "not a regular file" once it appeared, omniwatch_source_up{source="jsonl"} stayed 0 for good
    and OmniwatchSourceDown paged. Control: a root that exists at start."""
    root = tmp_path / "verl-logs"                       # not there yet
    store = RunStore(clock=time.time)
    src = FileSource(store, [str(root)], "jsonl")
    src.poll_once()
    (root / "p").mkdir(parents=True)                    # the trainer starts: the root, then its run log
    with open(root / "p" / "e.jsonl", "wb") as f:
        for n in (1, 2, 3):
            f.write(orjson.dumps({"step": n, "data": {"timing_s/step": 1.0}}) + b"\n")
    for _ in range(6):
        src._last_scan = 0.0
        src.poll_once()
    assert store.sources[("jsonl", str(root))] == 1, store.sources
    assert ("p", "e") in store.runs and store.runs[("p", "e")].last.step == 3
    assert not [k for k in store.errors if k[1] == "not_regular_file"], store.errors
    # control: a root that exists at start
    store2 = RunStore(clock=time.time)
    FileSource(store2, [str(root)], "jsonl").poll_once()
    assert store2.sources[("jsonl", str(root))] == 1 and ("p", "e") in store2.runs


def test_make_up_hands_a_watch_glob_to_omniwatch_whole(tmp_path):
    """Before: the Makefile passed `--watch $(w)` unquoted: the shell expanded the glob to the files of now (or
    failed). `make up` is run with a stand-in omniwatch (OW) that records its argv and a venv dir whose install
    stamp is fresh (nothing is installed); two files match the glob now, so an expansion would show."""
    make = require_binary("make")
    require_binary("prometheus")          # `deps` only checks, never installs, when these are on PATH
    require_binary("promtool")
    require_binary("alertmanager", "prometheus-alertmanager")
    if shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        pytest.skip("a Docker engine answers here: `make up` runs docker-compose.yml instead")
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed").touch()
    stamp = max((REPO / "pyproject.toml").stat().st_mtime, (REPO / "constraints.txt").stat().st_mtime) + 60
    os.utime(venv / ".installed", (stamp, stamp))
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (logs / name).touch()
    argv_out = tmp_path / "argv"
    ow = tmp_path / "ow"
    ow.write_text(f"#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > {argv_out}\n")
    ow.chmod(ow.stat().st_mode | stat.S_IXUSR)
    glob = f"{logs}/*.jsonl"
    r = subprocess.run([make, "-s", "up", f"VENV={venv}", f"OW={ow}", f"WATCH={glob}", f"TRAINER_CONFIG={logs}/*.yaml"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    argv = argv_out.read_text().splitlines()
    assert argv == ["up", "--watch", glob, "--trainer-config", f"{logs}/*.yaml"], argv


def test_the_rules_prometheus_loads_link_runbooks_on_the_exporters_port(tmp_path):
    """Before: with OMNIWATCH_EXPORTER_PORT set, every runbook_url Prometheus served (and Alertmanager, Grafana and
    `omniwatch alerts` showed) was http://127.0.0.1:19095/...; only the relay rewrote its own messages.
    Control: on the default port Prometheus loads alerts/ itself."""
    stack = Stack(StackConfig(run_dir=tmp_path / "rd", exporter_port=29123))
    stack.write_configs()
    prom = yaml.safe_load((tmp_path / "rd" / "config" / "prometheus.yml").read_text())
    loaded = [Path(p) for p in prom["rule_files"]]
    assert loaded and all(p.parent == tmp_path / "rd" / "config" / "rules" for p in loaded), loaded
    urls = [r["annotations"]["runbook_url"] for p in loaded for g in yaml.safe_load(p.read_text())["groups"]
            for r in g["rules"] if "runbook_url" in r.get("annotations", {})]
    assert urls and all(u.startswith("http://127.0.0.1:29123/runbooks#") for u in urls), urls[:3]
    assert len(urls) == sum(p.read_text().count("runbook_url:") for p in rule_files())  # none left out
    promtool = shutil.which("promtool")
    if promtool:
        check = subprocess.run([promtool, "check", "rules", *map(str, loaded)], capture_output=True, text=True,
                               timeout=120)
        assert check.returncode == 0, check.stdout + check.stderr
    # control: the default port loads the repository's rule files as they are
    default = Stack(StackConfig(run_dir=tmp_path / "rd2"))
    default.write_configs()
    prom = yaml.safe_load((tmp_path / "rd2" / "config" / "prometheus.yml").read_text())
    assert [Path(p) for p in prom["rule_files"]] == rule_files()
