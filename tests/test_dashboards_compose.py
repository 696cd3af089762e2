"""The compose stack runs the native stack's configs: deploy/compose/*.yml are rendered by
omniwatch.compose from omniwatch.stack's code (drift-checked here), address compose services, mount
the rule files and the generated tokens; the tokens are created, never defaulted, never printed."""
from __future__ import annotations

import argparse
import os
import stat
import subprocess

import pytest
import yaml

from omniwatch import compose, rules
from omniwatch.stack import Stack, StackConfig

from .conftest import REPO, require_binary
from omniwatch.yamlio import load as yaml_load

COMPOSE_FILE = REPO / "docker-compose.yml"
OUT = REPO / "deploy" / "compose"


def _cli(*argv):
    p = argparse.ArgumentParser()
    compose.add_commands(p.add_subparsers())
    args = p.parse_args(["compose", *argv])
    return args.func(args)


def _load(name: str) -> dict:
    return yaml_load((OUT / name).read_text())


def test_committed_files_are_what_the_code_renders(tmp_path, capsys):
    assert compose.check(OUT) == [], "run `omniwatch compose render`"
    assert _cli("check") == 0
    assert _cli("render", "--out", str(tmp_path)) == 0
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == compose.rendered()
    assert compose.render(tmp_path) == []                     # a second render writes nothing
    (tmp_path / "prometheus.yml").write_text("# edited by hand\n")
    (tmp_path / "alertmanager.yml").unlink()
    assert _cli("check", "--out", str(tmp_path)) == 1
    err = capsys.readouterr().err
    assert "prometheus.yml: differs" in err and "alertmanager.yml: missing" in err


def test_same_jobs_rules_and_routing_as_the_native_stack(tmp_path):
    native = Stack(StackConfig(run_dir=tmp_path))
    nprom, nam = native.prometheus_config(), native.alertmanager_config()
    cprom, cam = _load("prometheus.yml"), _load("alertmanager.yml")
    assert [j["job_name"] for j in cprom["scrape_configs"]] == [j["job_name"] for j in nprom["scrape_configs"]]
    assert cprom["global"] == nprom["global"] and cprom.keys() == nprom.keys()
    # the glob inside the container names exactly the rule files the native stack loads
    assert cprom["rule_files"] == [compose.RULES_GLOB]
    mount = next(v for v in yaml_load(COMPOSE_FILE.read_text())["services"]["prometheus"]["volumes"]
                 if v.split(":")[1] == compose.RULES_GLOB.rsplit("/", 1)[0])
    assert sorted(p.name for p in (REPO / mount.split(":")[0]).glob("*.rules.yml")) == \
        [p.name for p in rules.rule_files()]
    assert {k: v for k, v in cam.items() if k != "receivers"} == {k: v for k, v in nam.items() if k != "receivers"}


def test_every_address_is_a_compose_service_and_tokens_are_mounted_secrets():
    spec = yaml_load(COMPOSE_FILE.read_text())
    svc = spec["services"]
    prom, am = _load("prometheus.yml"), _load("alertmanager.yml")
    text = (OUT / "prometheus.yml").read_text() + (OUT / "alertmanager.yml").read_text()
    assert "127.0.0.1" not in text and "localhost" not in text and "placeholder" not in text
    targets = [t for j in prom["scrape_configs"] for sc in j.get("static_configs", []) for t in sc["targets"]]
    targets += [t for a in prom["alerting"]["alertmanagers"] for sc in a["static_configs"] for t in sc["targets"]]
    for t in targets:
        host, port = t.split(":")
        assert host in svc and int(port) == compose.SERVICES[host], t
    sd = [c["url"] for j in prom["scrape_configs"] for c in j.get("http_sd_configs", [])]
    assert all(u.startswith(("http://exporter:19095/api/v1/sd", "http://exporter:19095/api/v1/agents/sd"))
               for u in sd), sd   # discovery and node agents via the exporter
    wh = am["receivers"][0]["webhook_configs"][0]
    assert wh["url"] == "http://exporter:19095/api/v1/alertmanager"
    token_file = wh["http_config"]["authorization"]["credentials_file"]
    secret = compose.SECRETS["webhook"]
    assert token_file == f"/run/secrets/{secret}"
    assert secret in svc["alertmanager"]["secrets"] and secret in svc["exporter"]["secrets"]
    env = svc["exporter"]["environment"]
    assert env["OMNIWATCH_WEBHOOK_TOKEN_FILE"] == token_file
    assert env["OMNIWATCH_PUSH_TOKEN_FILE"] == f"/run/secrets/{compose.SECRETS['push']}"
    assert not any(k.endswith("_TOKEN") for k in env)          # no token value, no empty default
    mounts = {v.split(":")[1]: v.split(":")[0] for v in svc["alertmanager"]["volumes"]}
    assert mounts["/etc/alertmanager/alertmanager.yml"] == "./deploy/compose/alertmanager.yml"
    for name, sec in compose.SECRETS.items():       # the files `compose secrets` creates, git-ignored
        f = spec["secrets"][sec]["file"]
        assert f == f"./.omniwatch/{compose.SECRETS_SUBDIR}/{name}.token"
    ignored = subprocess.run(["git", "check-ignore", "-q", ".omniwatch/compose-secrets/webhook.token"], cwd=REPO)
    assert ignored.returncode == 0


def test_rendered_configs_pass_promtool_and_amtool(tmp_path):
    promtool, amtool = require_binary("promtool"), require_binary("amtool")
    cfg = _load("prometheus.yml")
    cfg["rule_files"] = [str(p) for p in rules.rule_files()]   # the container glob, resolved here
    (tmp_path / "p.yml").write_text(yaml.safe_dump(cfg))
    for argv in ([promtool, "check", "config", str(tmp_path / "p.yml")],
                 [amtool, "check-config", str(OUT / "alertmanager.yml")]):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr


def test_secrets_are_random_private_stable_and_never_printed(tmp_path, capsys):
    assert _cli("secrets", "--run-dir", str(tmp_path)) == 0
    out = capsys.readouterr().out
    d = tmp_path / compose.SECRETS_SUBDIR
    tokens = {p.name: p.read_text() for p in d.iterdir()}
    assert set(tokens) == {"webhook.token", "push.token"}
    assert len(set(tokens.values())) == 2 and all(len(t) >= 32 for t in tokens.values())
    assert not any(t in out for t in tokens.values())
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert all(stat.S_IMODE((d / n).stat().st_mode) == 0o644 for n in tokens)
    assert _cli("secrets", "--run-dir", str(tmp_path)) == 0     # again: the running stack's tokens stay
    assert {p.name: p.read_text() for p in d.iterdir()} == tokens


def test_bad_inputs_are_clear_errors(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert _cli("secrets", "--run-dir", str(blocker)) == 1      # run dir is a file
    assert _cli("render", "--out", str(blocker)) == 1
    assert "omniwatch compose" in capsys.readouterr().err
    with pytest.raises(ValueError, match="still points at 127.0.0.1"):
        compose._relocate({"x": ["http://127.0.0.1:1234/"]}, {"127.0.0.1:9090": "prometheus:9090"})
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        try:
            assert _cli("secrets", "--run-dir", str(ro)) == 1
        finally:
            ro.chmod(0o700)
