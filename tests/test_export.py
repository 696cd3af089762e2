"""Bring-your-own exports: PrometheusRule and dashboard ConfigMaps generated from alerts/ and
dashboards/ (no copies), committed under deploy/k8s/ without drift, valid for promtool and the
prometheus-operator CRD's required fields; the BYO scrape snippet passes `promtool check config`."""
from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from conftest import REPO, require_binary
from omniwatch import export
from omniwatch.rules import rule_files
from omniwatch.yamlio import load as yaml_load


def _docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def test_prometheusrule_groups_are_the_rule_files_groups_unchanged():
    pr = export.prometheus_rule(namespace="mon", labels={"release": "kps"})
    assert pr["apiVersion"] == "monitoring.coreos.com/v1" and pr["kind"] == "PrometheusRule"
    assert pr["metadata"]["name"] == "omniwatch" and pr["metadata"]["namespace"] == "mon"
    assert pr["metadata"]["labels"]["release"] == "kps"
    want = [g for f in rule_files() for g in yaml_load(f.read_text())["groups"]]
    assert pr["spec"]["groups"] == want


def test_rendered_manifest_round_trips_and_has_crd_required_fields():
    (doc,) = _docs(export.render_rules())
    assert doc["spec"]["groups"] == export.rule_groups()
    for g in doc["spec"]["groups"]:
        assert isinstance(g["name"], str) and g["rules"]
        for r in g["rules"]:
            assert ("alert" in r) != ("record" in r)
            assert isinstance(r["expr"], (str, int)) and str(r["expr"]).strip()


def test_exported_groups_pass_promtool_check_rules(tmp_path):
    promtool = require_binary("promtool")
    (doc,) = _docs(export.render_rules())
    f = tmp_path / "groups.yml"
    f.write_text(yaml.safe_dump({"groups": doc["spec"]["groups"]}, sort_keys=False))
    res = subprocess.run([promtool, "check", "rules", str(f)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    plain = tmp_path / "plain.yml"
    plain.write_text(export.render_rules("rules"))
    res = subprocess.run([promtool, "check", "rules", str(plain)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_dashboard_configmaps_carry_the_sidecar_label_and_parse():
    cms = _docs(export.render_dashboards(namespace="mon"))
    files = export.dashboard_files()
    assert len(cms) == len(files) > 0
    names = set()
    for cm in cms:
        assert cm["apiVersion"] == "v1" and cm["kind"] == "ConfigMap"
        md = cm["metadata"]
        assert md["labels"]["grafana_dashboard"] == "1" and md["namespace"] == "mon"
        assert len(md["name"]) <= 63 and md["name"] not in names
        names.add(md["name"])
        for key, text in cm["data"].items():
            assert key.endswith(".json")
            d = json.loads(text)
            assert d["uid"] and d["panels"]
            assert text == (REPO / "dashboards" / key).read_text(), "ConfigMap must carry the file unchanged"


def test_dashboards_import_through_the_datasource_variable():
    """Plain JSON import works: every panel and target points at ${datasource}, which is a variable."""
    for f in export.dashboard_files():
        d = json.loads(f.read_text())
        assert any(v["name"] == "datasource" and v["type"] == "datasource" for v in d["templating"]["list"]), f.name
        for p in d["panels"]:
            for t in [p] + p.get("targets", []):
                ds = t.get("datasource")
                if isinstance(ds, dict) and "uid" in ds:
                    assert ds["uid"] in ("${datasource}", "-- Grafana --", "grafana"), (f.name, ds)


def test_committed_k8s_manifests_have_no_drift():
    drift = export.write_k8s(check=True)
    assert drift == [], f"deploy/k8s out of date; run `omniwatch export k8s`: {drift}"


@pytest.mark.slow  # make test-quick leaves it to make test
def test_write_k8s_twice_changes_nothing(tmp_path):
    assert len(export.write_k8s(tmp_path)) == 2
    assert export.write_k8s(tmp_path) == []
    assert export.write_k8s(tmp_path, check=True) == []


def test_cli_export(tmp_path, capsys):
    out = tmp_path / "pr.yaml"
    assert cli_main_safe(["export", "rules", "--namespace", "obs", "--label", "release=x", "--out", str(out)]) == 0
    (doc,) = _docs(out.read_text())
    assert doc["metadata"] == {"name": "omniwatch", "namespace": "obs",
                               "labels": {**export.BASE_LABELS, "release": "x"}}
    assert cli_main_safe(["export", "rules", "--label", "novalue"]) == 2
    assert "not key=value" in capsys.readouterr().err
    assert cli_main_safe(["export", "dashboards", "--format", "json", "--out", str(tmp_path / "d")]) == 0
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == [f.name for f in export.dashboard_files()]


def cli_main_safe(argv):
    """The export commands through their own parser (cli.AREAS adds the same ``add_commands`` to the CLI)."""
    import argparse
    p = argparse.ArgumentParser()
    export.add_commands(p.add_subparsers())
    args = p.parse_args(argv)
    return args.func(args)


def test_bad_rules_dir_is_a_clear_error(tmp_path):
    (tmp_path / "x.rules.yml").write_text("not: rules\n")
    with pytest.raises(Exception, match="groups"):
        export.rule_groups(tmp_path)
    (tmp_path / "x.rules.yml").write_text("groups:\n- name: a\n  rules: []\n")
    (tmp_path / "y.rules.yml").write_text("groups:\n- name: a\n  rules: []\n")
    with pytest.raises(Exception, match="both"):
        export.rule_groups(tmp_path)
    with pytest.raises(ValueError):
        export.dashboard_configmaps(dashboards_dir=tmp_path)


def test_byo_scrape_snippet_passes_promtool_check_config(tmp_path):
    promtool = require_binary("promtool")
    snippet = yaml_load((REPO / "deploy" / "byo" / "scrape.yml").read_text())
    jobs = {j["job_name"] for j in snippet["scrape_configs"]}
    assert jobs == {"omniwatch", "omniwatch-discovered", "omniwatch-agent"}
    cfg = {"global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
           "rule_files": [str(p) for p in rule_files()],
           "scrape_configs": snippet["scrape_configs"]}
    f = tmp_path / "prometheus.yml"
    f.write_text(yaml.safe_dump(cfg, sort_keys=False))
    res = subprocess.run([promtool, "check", "config", str(f)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    example = json.loads((REPO / "deploy" / "byo" / "http_sd_example.json").read_text())
    assert all(g["targets"] and isinstance(g["labels"], dict) for g in example)
