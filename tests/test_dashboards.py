"""Dashboards as code, offline: structure of the generated JSON, drift, provisioning and compose files."""
from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from grafana_foundation_sdk.cog import plugins
from grafana_foundation_sdk.models import dashboard as dmodel

from omniwatch import demo_endpoints, names
from omniwatch.dashboards import bottlenecks, external, factory, generate, spec
from omniwatch.dashboards.catalog import DASHBOARDS
from omniwatch.dashboards.verify import substitute

REPO = Path(__file__).resolve().parents[1]
DASH_DIR = REPO / "dashboards"


def load(d) -> dict:
    return json.loads((DASH_DIR / f"{d.uid}.json").read_text())


def panels(doc):
    return [p for p in doc["panels"] if p["type"] != "row"]


def test_generate_check_is_clean_and_regenerating_is_stable(tmp_path):
    assert generate.check(DASH_DIR) == [], "run `omniwatch dashboards generate`"
    generate.generate(tmp_path)
    first = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert generate.generate(tmp_path) == []          # second run writes nothing
    assert first == generate.rendered()
    (tmp_path / "omniwatch-gpus.json").write_text("{}")
    (tmp_path / "omniwatch-stale.json").write_text("{}")
    problems = generate.check(tmp_path)
    assert any("omniwatch-gpus.json: differs" in p for p in problems)
    assert any("omniwatch-stale.json" in p for p in problems)


def test_cli_check_fails_on_drift(tmp_path, capsys):
    from omniwatch.cli import build_parser
    import argparse
    from omniwatch import dashboards
    p = argparse.ArgumentParser()
    dashboards.add_commands(p.add_subparsers())
    args = p.parse_args(["dashboards", "generate", "--out", str(tmp_path)])
    assert args.func(args) == 0
    args = p.parse_args(["dashboards", "check", "--out", str(tmp_path)])
    assert args.func(args) == 0
    (tmp_path / "omniwatch-rollout.json").write_text("edited by hand")
    assert args.func(args) == 1
    assert "differs" in capsys.readouterr().err
    assert build_parser  # the shared CLI builds whether or not the lead has listed us yet


@pytest.mark.parametrize("d", DASHBOARDS, ids=lambda d: d.uid)
def test_ids_refids_datasources_units_descriptions(d):
    doc = load(d)
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) and i > 0 for i in ids)
    for p in panels(doc):
        refs = [t["refId"] for t in p["targets"]]
        assert refs == [chr(ord("A") + i) for i in range(len(refs))], p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": spec.DATASOURCE_UID}
        assert all(t["datasource"] == p["datasource"] for t in p["targets"])
        assert p["description"] and p["fieldConfig"]["defaults"]["unit"], p["title"]
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
    assert doc["uid"] == d.uid and doc["schemaVersion"] >= 39
    tvars = {v["name"]: v for v in doc["templating"]["list"]}
    assert tvars["datasource"]["type"] == "datasource" and tvars["datasource"]["query"] == "prometheus"
    for v in ("project", "experiment"):
        assert tvars[v]["multi"] and tvars[v]["includeAll"] and tvars[v]["datasource"]["uid"] == spec.DATASOURCE_UID
    ann = doc["annotations"]["list"]
    assert any("ALERTS" in a.get("expr", "") and 'alertstate="firing"' in a["expr"] for a in ann)


@pytest.mark.parametrize("d", DASHBOARDS, ids=lambda d: d.uid)
def test_json_parses_back_through_the_sdk(d):
    plugins.register_default_plugins()
    text = (DASH_DIR / f"{d.uid}.json").read_text()
    model = dmodel.Dashboard.from_json(json.loads(text))
    assert model.uid == d.uid
    assert len(model.panels) == len(load(d)["panels"])


RUNLESS = {names.GPU_UTILIZATION, names.GPU_MEMORY_USED, names.GPU_MEMORY_TOTAL, names.GPU_POWER,
           names.GPU_SM_CLOCK, names.GPU_BUSY_SECONDS_TOTAL, names.GPU_IDLE_SECONDS_TOTAL}
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}")


def all_targets():
    for d in DASHBOARDS:
        for p in d.panels():
            for t in p.targets:
                yield d, p, t


def test_every_query_filters_by_the_dashboard_variables():
    for d, p, t in all_targets():
        sels = SELECTOR.findall(t.expr)
        assert sels, (p.title, t.expr)
        for metric, matchers in sels:
            if metric in RUNLESS:  # per-device NVML gauges: filtered by the run-scoped node/gpu variables
                assert spec.GPU_MATCHERS in matchers, (p.title, t.expr)
            else:
                assert spec.RUN_MATCHERS in matchers, (p.title, t.expr)
        for fn in re.finditer(r"\b(rate|irate|increase)\(", t.expr):
            window = re.search(r"\[([^\]]+)\]", t.expr[fn.end():])
            assert window and window.group(1) == spec.RATE_INTERVAL, (p.title, t.expr)
        substitute(t.expr)  # no variable Grafana would not know


def test_names_come_from_the_catalogue_and_tq_total_gauges_are_never_rated():
    known_external = {v for k, v in vars(external).items() if k.isupper() and isinstance(v, str)}
    for d, p, t in all_targets():
        for metric, _ in SELECTOR.findall(t.expr):
            base = re.sub(r"_(bucket|sum|count)$", "", metric)
            ok = (metric in names.CATALOGUE or metric.startswith(names.PASSTHROUGH_PREFIX) or metric == "ALERTS"
                  or metric in known_external or base in known_external)
            assert ok, (p.title, metric)
        for g in external.TQ_GAUGES_NAMED_TOTAL:
            assert not re.search(r"(rate|increase)\(" + re.escape(g), t.expr), (p.title, t.expr)


def test_gpu_dashboard_has_run_scoped_node_and_gpu_variables():
    doc = load(next(d for d in DASHBOARDS if d.gpu_variables))
    tvars = {v["name"]: v for v in doc["templating"]["list"]}
    for v in ("node", "gpu"):
        assert spec.RUN_MATCHERS in tvars[v]["query"] and "allValue" not in tvars[v]


def test_alert_thresholds_match_the_rule_files():
    rules = list((REPO / "alerts").glob("*.rules.yml"))
    assert rules, "alerts/*.rules.yml missing"
    exprs = {r["alert"]: str(r["expr"]) for f in rules for g in yaml.safe_load(f.read_text())["groups"]
             for r in g["rules"] if "alert" in r}
    assert re.search(rf"> {bottlenecks.REWARD_BOUND_THRESHOLD}\b", exprs[names.ALERT_REWARD_BOUND])
    assert re.search(r"> 0?\.10?\b", exprs[names.ALERT_IDLE])
    assert re.search(r"> 1(\.0)?\b", exprs[names.ALERT_MFU_IMPOSSIBLE])
    assert re.search(rf"< {bottlenecks.MFU_DROP_FACTOR}\b", exprs[names.ALERT_MFU_DROP])


def test_provisioning_points_at_existing_files():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    env = compose["services"]["grafana"]["environment"]
    ds = yaml.safe_load((DASH_DIR / "provisioning/datasources/omniwatch.yml").read_text())
    assert ds["datasources"][0]["uid"] == spec.PROVISIONED_UID and ds["datasources"][0]["type"] == "prometheus"
    assert ds["datasources"][0]["url"] == "$OMNIWATCH_PROMETHEUS_URL"  # compose and the native stack set it
    assert env["OMNIWATCH_PROMETHEUS_URL"] == "http://prometheus:9090"
    prov = yaml.safe_load((DASH_DIR / "provisioning/dashboards/omniwatch.yml").read_text())
    path = prov["providers"][0]["options"]["path"]
    assert path == "$OMNIWATCH_DASHBOARDS_DIR"
    mounts = compose["services"]["grafana"]["volumes"]
    host = next(m.split(":")[0] for m in mounts if m.split(":")[1] == env["OMNIWATCH_DASHBOARDS_DIR"])
    assert sorted(p.name for p in (REPO / host).glob("omniwatch-*.json")) == sorted(f"{d.uid}.json" for d in DASHBOARDS)
    # $__rate_interval in Grafana is derived from timeInterval: it must be the compose scrape interval
    prom = yaml.safe_load((REPO / "deploy/compose/prometheus.yml").read_text())
    assert ds["datasources"][0]["jsonData"]["timeInterval"] == prom["global"]["scrape_interval"]


def test_compose_validates_and_references_existing_files_and_pinned_images():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    schema = json.loads((REPO / "tests/data/compose-spec.json").read_text())
    jsonschema.Draft7Validator(schema).validate(compose)  # the vendored schema says draft 2019-09, uses draft-7 keywords
    named = set(compose["volumes"])
    for name, svc in compose["services"].items():
        if "image" in svc:
            img, _, tag = svc["image"].rpartition(":")
            assert img and tag and tag != "latest" and re.match(r"v?\d+\.\d+", tag), svc["image"]
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith(("./", "/")):
                assert (REPO / src).exists(), (name, src)
            elif not src.startswith("$"):
                assert src in named, (name, src)
        if "build" in svc:
            assert (REPO / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file()
    assert compose["services"]["grafana"]["image"].startswith("grafana/grafana:11.6.")
    env = compose["services"]["grafana"]["environment"]
    assert env["GF_SECURITY_ADMIN_PASSWORD"].startswith("${OMNIWATCH_GRAFANA_ADMIN_PASSWORD:?")
    prom = yaml.safe_load((REPO / "deploy/compose/prometheus.yml").read_text())
    assert prom["rule_files"] == ["/etc/prometheus/alerts/*.rules.yml"]
    assert any(j["job_name"] == "omniwatch" for j in prom["scrape_configs"])


def test_compose_prometheus_config_passes_promtool(tmp_path):
    from .conftest import require_binary
    promtool = require_binary("promtool")
    import subprocess
    cfg = yaml.safe_load((REPO / "deploy/compose/prometheus.yml").read_text())
    cfg["rule_files"] = [str(p) for p in (REPO / "alerts").glob("*.rules.yml")]
    (tmp_path / "p.yml").write_text(yaml.safe_dump(cfg))
    r = subprocess.run([promtool, "check", "config", str(tmp_path / "p.yml")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_substitute_and_bad_inputs():
    e = substitute('rate(x{project=~"$project", node=~"$node"}[$__rate_interval])', "a|b", ".*", "2m")
    assert e == 'rate(x{project=~"a|b", node=~".*"}[2m])'
    with pytest.raises(ValueError):
        substitute("x{a=~\"$nosuch\"}")
    with pytest.raises(ValueError):
        spec.Panel("t", "d", (), kind="timeseries")
    with pytest.raises(ValueError):
        spec.Panel("t", "d", (spec.Target("x"),), kind="piechart")
    with pytest.raises(KeyError):
        from omniwatch.dashboards.catalog import by_uid
        by_uid("nope")


def test_demo_scrape_configs_are_valid_prometheus_jobs():
    jobs = demo_endpoints.scrape_configs("127.0.0.1", 9999, "p", "e")
    assert len({j["job_name"] for j in jobs}) == len(jobs)
    for j in jobs:
        for sc in j["static_configs"]:
            assert sc["labels"]["project"] == "p" and sc["labels"]["experiment"] == "e"
            assert sc["labels"]["__metrics_path__"].endswith("/metrics") and sc["labels"]["role"]
    assert factory.layout(DASHBOARDS[0])[0].row is not None
