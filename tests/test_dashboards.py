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

from omniwatch.alerting import records
from omniwatch import names
from omniwatch.demo import standins as demo_endpoints
from omniwatch import config
from omniwatch import external
from omniwatch.dashboards import factory, overview
from omniwatch.dashboards import jsonfiles as generate
from omniwatch.dashboards import panels as spec
from omniwatch.dashboards.catalog import DASHBOARDS
from omniwatch.dashboards.verify import substitute

from .conftest import require_binary
from omniwatch.yamlio import load as yaml_load

REPO = Path(__file__).resolve().parents[1]
DASH_DIR = REPO / "dashboards"


def load(d) -> dict:
    return json.loads((DASH_DIR / f"{d.uid}.json").read_text())


def panels(doc):
    """Every panel, those inside collapsed rows included."""
    out = []
    for p in doc["panels"]:
        if p["type"] == "row":
            out += p.get("panels", [])
        else:
            out.append(p)
    return out


def by_title(doc) -> dict:
    return {p["title"]: p for p in panels(doc)}


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
    # the same command through the shared `omniwatch` parser (cli.AREAS lists the dashboards area)
    args = build_parser().parse_args(["dashboards", "check", "--out", str(tmp_path)])
    assert args.func(args) == 1


@pytest.mark.parametrize("d", DASHBOARDS, ids=lambda d: d.uid)
def test_ids_refids_datasources_units_descriptions(d):
    doc = load(d)
    ids = [p["id"] for p in doc["panels"]] + [q["id"] for p in doc["panels"] if p["type"] == "row"
                                              for q in p.get("panels", [])]
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
    ann = {a["name"]: a for a in doc["annotations"]["list"]}
    alerts = ann["omniwatch alerts"]
    assert 'alertstate="firing"' in alerts["target"]["expr"] and alerts["target"]["expr"] == alerts["expr"]
    assert alerts["titleFormat"] == "{{alertname}}"
    assert set(alerts["tagKeys"].split(",")) == {"project", "experiment", "severity"}
    assert "flag" in ann["validation / checkpoint steps"]["tagKeys"]
    assert names.TRAINER_RESTARTS_TOTAL in ann["trainer restarts"]["target"]["expr"]


@pytest.mark.parametrize("d", DASHBOARDS, ids=lambda d: d.uid)
def test_json_parses_back_through_the_sdk(d):
    plugins.register_default_plugins()
    text = (DASH_DIR / f"{d.uid}.json").read_text()
    model = dmodel.Dashboard.from_json(json.loads(text))
    assert model.uid == d.uid
    assert len(model.panels) == len(load(d)["panels"])


RUNLESS = {names.GPU_UTILIZATION, names.GPU_MEMORY_USED, names.GPU_MEMORY_TOTAL, names.GPU_POWER,
           names.GPU_SM_CLOCK, names.GPU_BUSY_SECONDS_TOTAL, names.GPU_IDLE_SECONDS_TOTAL, records.REC_GPU_MEMORY}
SELECTOR = re.compile(r"(?<![$\w:])([a-zA-Z_:][a-zA-Z0-9_:]*)?\{([^}]*)\}")
AGGREGATION = re.compile(r"\b(sum|max|min|avg|count|topk|bottomk|quantile|stddev|stdvar|group|count_values)\s*"
                         r"(?:(by|without)\s*\(([^)]*)\))?\s*\(")
MATCHING = re.compile(r"\b(on|ignoring)\s*\(([^)]*)\)")


def all_targets():
    for d in DASHBOARDS:
        for p in d.panels():
            for t in p.targets:
                yield d, p, t


def all_steps():
    for d in DASHBOARDS:
        for p in d.panels():
            for st in p.all_steps:
                yield d, p, st


def rule_docs():
    files = sorted((REPO / "alerts").glob("*.rules.yml"))
    assert files, "alerts/*.rules.yml missing"
    return [r for f in files for g in yaml_load(f.read_text())["groups"] for r in g["rules"]]


def test_every_query_filters_by_the_dashboard_variables():
    for d, p, t in all_targets():
        sels = SELECTOR.findall(t.expr)
        if p.scope == "global":  # the exporter and its sources belong to no run
            continue
        assert sels, (p.title, t.expr)
        for metric, matchers in sels:
            if metric in RUNLESS:  # per-device NVML gauges: filtered by the run-scoped node/gpu variables
                assert spec.GPU_MATCHERS in matchers, (p.title, t.expr)
            else:
                assert spec.RUN_MATCHERS in matchers, (p.title, t.expr)
        substitute(t.expr)  # no variable Grafana would not know


def test_counters_per_step_are_read_over_window_and_the_rest_over_rate_interval():
    """No panel reads a per-step counter over $__rate_interval (0 for most of a long step, then many times the
    truth); continuous counters are read over $__rate_interval."""
    per_step_read = 0
    for d, p, t in all_targets():
        for fn in re.finditer(r"\b(rate|irate|increase)\(([\w:]+)\{[^}]*\}\[([^\]]+)\]", t.expr):
            metric, window = fn.group(2), fn.group(3)
            assert metric not in spec.PER_STEP_COUNTERS, (d.uid, p.title, t.expr)
            assert window == spec.RATE_INTERVAL, (d.uid, p.title, t.expr)
        # a per-step counter is read only through spec.increase_w: each run over its own window (every rung)
        rungs: dict[str, set[int]] = {}
        rest, pos = [], 0
        for m in re.finditer(r"clamp_min\(([\w:]+\{[^}]*\}) - \(", t.expr):
            sel_ = m.group(1)
            tail = re.match(r"offset (\d+)s or ", t.expr[m.end() + len(sel_) + 1:])
            whole = f"clamp_min({sel_} - ({sel_} offset {tail.group(1)}s or {sel_} * 0), 0)" if tail else ""
            assert whole and t.expr.startswith(whole, m.start()), (p.title, t.expr[m.start():m.start() + 300])
            rungs.setdefault(sel_, set()).add(int(tail.group(1)))
            rest.append(t.expr[pos:m.start()])
            pos = m.start() + len(whole)
        rest.append(t.expr[pos:])
        assert all(r == set(spec.WINDOW_LADDER) for r in rungs.values()), (p.title, rungs)
        rest = "".join(rest)  # elsewhere a per-step counter is read as its value (a total), never over a range
        assert not any(re.search(rf"\b{c}\{{[^}}]*\}}\[", rest) for c in spec.PER_STEP_COUNTERS), (d.uid, p.title, rest)
        per_step_read += bool(rungs)
        assert len(re.findall(r"\b(rate|irate|increase)\(", t.expr)) == len(
            re.findall(r"\b(rate|irate|increase)\([\w:]+\{[^}]*\}\[", t.expr)), (p.title, t.expr)
    assert per_step_read >= 5


def test_every_run_scoped_series_keeps_its_run():
    """Run-scoped panels: every aggregation keeps project and experiment (no bare sum()/max()), every
    vector match is on the run, and every legend names the run; stacked run panels repeat per run."""
    for d, p, t in all_targets():
        if p.scope != "run":
            continue
        # the remedy texts are keyed by their variant, not by run, by design (remedy_info.py)
        expr = re.sub(r"\* on \(variant\) group_left \([^)]*\) max by \(variant, [^)]*\) \(omniwatch_remedy_info\)",
                      "", t.expr)
        for agg in AGGREGATION.finditer(expr):
            kind, labels = agg.group(2), agg.group(3) or ""
            assert kind == "by" and {"project", "experiment"} <= {x.strip() for x in labels.split(",")}, \
                (d.uid, p.title, agg.group(0), t.expr)
        for m in MATCHING.finditer(expr):
            assert m.group(1) == "on" and {"project", "experiment"} <= {x.strip() for x in m.group(2).split(",")}, \
                (d.uid, p.title, m.group(0))
        if p.kind not in ("table", "xychart") or t is not p.targets[0]:
            if p.kind != "table":
                assert "{{experiment}}" in t.legend, (d.uid, p.title, t.legend)
    for d in DASHBOARDS:
        for p in d.panels():
            if p.stack and p.scope == "run":
                assert p.repeat, (d.uid, p.title, "a stack of all runs mixes runs")
            if p.repeat:
                assert "$experiment" in p.title and p.w == 24, (d.uid, p.title)


def test_repeated_panels_repeat_on_the_experiment_variable():
    for d in DASHBOARDS:
        doc = by_title(load(d))
        for p in d.panels():
            j = doc[p.title]
            assert (j.get("repeat") == spec.V_EXPERIMENT) == p.repeat, (d.uid, p.title)
            if p.repeat:
                assert j["repeatDirection"] == "h" and j["maxPerRow"] >= 1


def test_names_come_from_the_catalogue_and_tq_total_gauges_are_never_rated():
    known_external = {v for k, v in vars(external).items() if k.isupper() and isinstance(v, str)}
    records = {r["record"] for r in rule_docs() if "record" in r}
    for d, p, t in all_targets():
        for metric, matchers in SELECTOR.findall(t.expr):
            if not metric:  # {__name__=~"verl_val_.*", ...}: passed-through verl keys
                assert f'__name__=~"{names.PASSTHROUGH_PREFIX}' in matchers, (p.title, t.expr)
                continue
            base = re.sub(r"_(bucket|sum|count)$", "", metric)
            ok = (metric in names.CATALOGUE or metric.startswith(names.PASSTHROUGH_PREFIX) or metric == "ALERTS"
                  or metric in known_external or base in known_external or metric in records or metric == "up")
            assert ok, (p.title, metric)
        for g in external.TQ_GAUGES_NAMED_TOTAL:
            assert not re.search(r"(rate|increase)\(" + re.escape(g), t.expr), (p.title, t.expr)


def test_recording_rules_and_alerts_the_panels_name_exist():
    rules = rule_docs()
    records = {r["record"] for r in rules if "record" in r}
    alerts = {r["alert"] for r in rules if "alert" in r}
    assert set(spec.RECORDS) <= records, set(spec.RECORDS) - records
    for d in DASHBOARDS:
        for p in d.panels():
            assert set(p.alerts) <= alerts, (d.uid, p.title, set(p.alerts) - alerts)
    assert {spec.ALERT_ROLLOUT_SATURATED, spec.ALERT_TQ_BACKLOG, spec.ALERT_GPU_MEMORY, spec.ALERT_WATCHDOG} <= alerts


def test_watchdog_is_left_out_everywhere():
    exprs = [t.expr for _, _, t in all_targets()] + [a.expr for a in factory.annotations()]
    for e in exprs:
        for m in re.finditer(r"ALERTS\{([^}]*)\}", e):
            name = re.search(r'alertname(=|!=|=~|!~)"([^"]*)"', m.group(1))
            # every ALERTS selector leaves Watchdog out: by name, by a regex of others, or by naming another alert
            assert name and (name.group(1) == "!=" and name.group(2) == spec.ALERT_WATCHDOG
                             or name.group(1) == "!~" and spec.ALERT_WATCHDOG in name.group(2).split("|")
                             or name.group(1) == "=" and name.group(2) != spec.ALERT_WATCHDOG), e


def test_gpu_dashboard_has_run_scoped_node_and_gpu_variables():
    doc = load(next(d for d in DASHBOARDS if d.gpu_variables))
    tvars = {v["name"]: v for v in doc["templating"]["list"]}
    for v in ("node", "gpu"):
        assert spec.RUN_MATCHERS in tvars[v]["query"] and "allValue" not in tvars[v]


def _threshold_in_rule(expr: str, value: float) -> bool:
    """The rule compares with the value (``> 0.4``), or scales its threshold by it (``3 * typical``)."""
    v = re.escape(f"{value:g}")
    return bool(re.search(rf"(>|<|>=|<=)\s*{v}(?![0-9.])|(?<![\w.]){v}\s*\*", expr))


def test_every_panel_threshold_comes_from_the_config_and_matches_its_rule():
    """Every threshold step is either an alert threshold read from omniwatch.config.DEFAULT (and then the
    rule of that alert compares with exactly that number, and the panel links that alert's runbook), or a
    display band that says why it is not one."""
    records = {r["record"]: str(r["expr"]) for r in rule_docs() if "record" in r}
    exprs: dict[str, list[str]] = {}
    for r in rule_docs():
        if "alert" in r:
            # the alert's expression and the recording rules it reads (thresholds may live there)
            todo, seen = [str(r["expr"])], set()
            while todo:
                e = todo.pop()
                exprs.setdefault(r["alert"], []).append(e)
                for name in re.findall(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", e):
                    if name in records and name not in seen:
                        seen.add(name)
                        todo.append(records[name])
    drawn = set()
    for d, p, st in all_steps():
        if st.value is None:
            continue
        if not st.config:
            assert st.note, (d.uid, p.title, st)
            continue
        # a negated step (TimersExceedStep: `< -timer_overlap.tolerance`) sits at minus the configured number
        assert st.value == (-1 if st.negate else 1) * spec.cfg_value(st.config, config.DEFAULT), (d.uid, p.title, st)
        alert = spec.THRESHOLD_ALERT[st.config]
        assert any(_threshold_in_rule(e, st.value) for e in exprs[alert]), (d.uid, p.title, alert, st.value)
        assert alert in p.alerts, (d.uid, p.title, f"draws {alert}'s threshold but links {p.alerts}")
        drawn.add(st.config)
    assert drawn == set(spec.THRESHOLD_ALERT), set(spec.THRESHOLD_ALERT) - drawn
    assert any(st.negate for _, _, st in all_steps()), "TimersExceedStep's negative line is drawn"


def test_per_run_thresholds_are_plotted_from_the_rule_that_holds_them():
    """TrainingStalled's warning and critical stages add each run's planned work and typical steps: no fixed line
    can draw them. Each configured number they scale by is used by its recording rule, and a panel that links the
    alert plots that rule (the Runs table, the age-vs-thresholds chart, the stage gauge and timeline)."""
    records = {r["record"]: str(r["expr"]) for r in rule_docs() if "record" in r}
    for path, (alert, record) in spec.RULE_THRESHOLDS.items():
        assert _threshold_in_rule(records[record], spec.cfg_value(path, config.DEFAULT)), (path, record, records[record])
        users = [(d.uid, p.title) for d, p, t in all_targets() if record in t.expr and alert in p.alerts]
        assert users, (path, record, "no panel linking the alert plots the rule")


def test_step_negation_follows_the_config():
    st = spec.cfg_step(config.DEFAULT, "timer_overlap.tolerance", "green", negate=True)
    assert st.value == -config.DEFAULT.timer_overlap.tolerance == st.value_in(config.DEFAULT)
    tuned = config.DEFAULT.model_copy(update={"timer_overlap": config.DEFAULT.timer_overlap.model_copy(
        update={"tolerance": 0.037})})
    assert st.value_in(tuned) == -0.037
    with pytest.raises(ValueError):
        spec.Step(-0.01, "green", note="a band", negate=True)  # only a configured threshold is negated


def test_threshold_lines_follow_the_config(monkeypatch):
    """A tuned config moves the panel's line: Step values are read from the config, not copied."""
    with pytest.raises(ValueError):
        spec.Step(0.41, "red")  # neither a config path nor a note
    assert spec.cfg_step(config.DEFAULT, "reward_bound.ratio", "red").value == config.DEFAULT.reward_bound.ratio


def test_runbook_links_on_every_panel_tied_to_an_alert():
    for d in DASHBOARDS:
        doc = by_title(load(d))
        for p in d.panels():
            urls = [link["url"] for link in doc[p.title].get("links", [])]
            assert urls == [config.DEFAULT.runbook_url(a) for a in p.alerts], (d.uid, p.title)
            for a in p.alerts:
                assert config.DEFAULT.runbook_url(a) in doc[p.title]["description"]


def test_dashboard_links_and_run_data_links():
    uids = {d.uid for d in DASHBOARDS}
    for d in DASHBOARDS:
        doc = load(d)
        assert spec.TAG in doc["tags"]
        [link] = doc["links"]
        assert link["type"] == "dashboards" and link["tags"] == [spec.TAG] and link["keepTime"] and link["includeVars"]
        j = by_title(doc)
        for p in d.panels():
            links = j[p.title]["fieldConfig"]["defaults"].get("links", [])
            if p.scope != "run":
                assert not links, (d.uid, p.title)
                continue
            assert len(links) - len(p.row_links) == len(uids) - 1, (d.uid, p.title)
            links = [x for x in links if x["url"].startswith("/d/")]  # besides the rows' own (a runbook section)
            targets = {re.match(r"/d/([^/?]+)", x["url"]).group(1) for x in links}
            assert targets == uids - {d.uid}, (d.uid, p.title)
            field = "__data.fields" if p.kind == "table" else "__field.labels"
            for x in links:
                assert f"var-project=${{{field}.project}}" in x["url"] and "${__url_time_range}" in x["url"]


def test_xy_charts_plot_against_step_with_the_grafana_11_recipe():
    found = 0
    for d in DASHBOARDS:
        j = by_title(load(d))
        for p in d.panels():
            if p.kind != "xychart":
                continue
            found += 1
            x = j[p.title]
            assert names.STEP in x["targets"][0]["expr"]
            assert all(t["format"] == "table" and t["range"] and not t["instant"] for t in x["targets"])
            assert x["interval"] == factory.XY_INTERVAL and x["maxDataPoints"] == factory.XY_MAX_DATA_POINTS
            assert [t["id"] for t in x["transformations"]] == ["merge", "groupBy", "sortBy", "partitionByValues"]
            group = x["transformations"][1]["options"]["fields"]
            assert group["project"]["operation"] == group["experiment"]["operation"] == "groupby"
            assert group["Value #A"]["operation"] == "groupby"
            assert x["transformations"][3]["options"]["fields"] == ["project", "experiment", *p.xy_labels]
            assert x["options"]["mapping"] == "auto"
            assert x["options"]["series"][0]["x"]["matcher"] == {"id": "byName", "options": "Value #A"}
    assert found >= 8  # reward mean/std, zero-std, validation, clip, KL, grad norm, ratio, phases


def test_window_variable_where_per_step_counters_are_read():
    for d in DASHBOARDS:
        tvars = {v["name"]: v for v in load(d)["templating"]["list"]}
        assert (spec.V_WINDOW in tvars) == d.uses_window, d.uid
        if d.uses_window:
            w = tvars[spec.V_WINDOW]
            # typical steps per run (each run's seconds come from its own typical step inside the queries)
            steps = spec.window_steps(config.DEFAULT)
            assert w["type"] == "custom" and w["query"] == ",".join(map(str, steps))
            assert w["current"]["value"] == str(steps[0]) == str(config.DEFAULT.window.k)
            assert not w.get("multi") and not w.get("includeAll")


def test_collapsed_rows_hold_their_panels():
    for d in DASHBOARDS:
        doc = load(d)
        for row in (p for p in doc["panels"] if p["type"] == "row"):
            spec_row = next(r for r in d.rows if r.title == row["title"])
            assert row["collapsed"] == spec_row.collapsed
            assert len(row.get("panels", [])) == (len(spec_row.panels) if spec_row.collapsed else 0)
    assert any(r.collapsed for d in DASHBOARDS for r in d.rows)


def test_provisioning_points_at_existing_files():
    compose = yaml_load((REPO / "docker-compose.yml").read_text())
    env = compose["services"]["grafana"]["environment"]
    ds = yaml_load((DASH_DIR / "provisioning/datasources/omniwatch.yml").read_text())
    assert ds["datasources"][0]["uid"] == spec.PROVISIONED_UID and ds["datasources"][0]["type"] == "prometheus"
    assert ds["datasources"][0]["url"] == "$OMNIWATCH_PROMETHEUS_URL"  # compose and the native stack set it
    assert env["OMNIWATCH_PROMETHEUS_URL"] == "http://prometheus:9090"
    prov = yaml_load((DASH_DIR / "provisioning/dashboards/omniwatch.yml").read_text())
    path = prov["providers"][0]["options"]["path"]
    assert path == "$OMNIWATCH_DASHBOARDS_DIR"
    mounts = compose["services"]["grafana"]["volumes"]
    host = next(m.split(":")[0] for m in mounts if m.split(":")[1] == env["OMNIWATCH_DASHBOARDS_DIR"])
    assert sorted(p.name for p in (REPO / host).glob("omniwatch-*.json")) == sorted(f"{d.uid}.json" for d in DASHBOARDS)
    # $__rate_interval in Grafana is derived from timeInterval: it must be the compose scrape interval
    prom = yaml_load((REPO / "deploy/compose/prometheus.yml").read_text())
    assert ds["datasources"][0]["jsonData"]["timeInterval"] == prom["global"]["scrape_interval"]


def test_compose_validates_and_references_existing_files_and_pinned_images():
    compose = yaml_load((REPO / "docker-compose.yml").read_text())
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
    prom = yaml_load((REPO / "deploy/compose/prometheus.yml").read_text())
    assert prom["rule_files"] == ["/etc/prometheus/alerts/*.rules.yml"]
    assert any(j["job_name"] == "omniwatch" for j in prom["scrape_configs"])


def test_compose_prometheus_config_passes_promtool(tmp_path):
    promtool = require_binary("promtool")
    import subprocess
    cfg = yaml_load((REPO / "deploy/compose/prometheus.yml").read_text())
    cfg["rule_files"] = [str(p) for p in (REPO / "alerts").glob("*.rules.yml")]
    (tmp_path / "p.yml").write_text(yaml.safe_dump(cfg))
    r = subprocess.run([promtool, "check", "config", str(tmp_path / "p.yml")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_substitute_and_bad_inputs():
    e = substitute('rate(x{project=~"$project", node=~"$node"}[$__rate_interval])', "a|b", ".*", "2m")
    assert e == 'rate(x{project=~"a|b", node=~".*"}[2m])'
    assert substitute("x * ${window}", window="10") == "x * 10"
    with pytest.raises(ValueError):
        substitute("x{a=~\"$nosuch\"}")
    with pytest.raises(ValueError):
        spec.Panel("t", "d", (), kind="timeseries")
    with pytest.raises(ValueError):
        spec.Panel("t", "d", (spec.Target("x"),), kind="piechart")
    with pytest.raises(KeyError):
        from omniwatch.dashboards.catalog import by_uid
        by_uid("nope", config.DEFAULT)


def test_demo_scrape_configs_are_valid_prometheus_jobs():
    jobs = demo_endpoints.scrape_configs("127.0.0.1", 9999, "p", "e")
    assert len({j["job_name"] for j in jobs}) == len(jobs)
    for j in jobs:
        for sc in j["static_configs"]:
            assert sc["labels"]["project"] == "p" and sc["labels"]["experiment"] == "e"
            assert sc["labels"]["__metrics_path__"].endswith("/metrics") and sc["labels"]["role"]
    assert factory.layout(DASHBOARDS[0])[0].row is not None


def test_demo_endpoints_attach_to_two_runs_each_with_its_own_endpoints():
    jobs = demo_endpoints.scrape_configs("127.0.0.1", 9999, "p", "e", also=[("q", "f")])
    by_run: dict[tuple, set] = {}
    for j in jobs:
        for sc in j["static_configs"]:
            lab = sc["labels"]
            by_run.setdefault((lab["project"], lab["experiment"]), set()).add(lab["__metrics_path__"])
    assert set(by_run) == {("p", "e"), ("q", "f")}
    assert not by_run[("p", "e")] & by_run[("q", "f")]  # separate endpoint sets: separate values
    served = set(demo_endpoints.build_endpoints(demo_endpoints.DemoSources()))
    assert by_run[("p", "e")] | by_run[("q", "f")] <= served
    with pytest.raises(ValueError):
        demo_endpoints.scrape_configs("127.0.0.1", 9999, "p", "e", also=[("q", "f"), ("r", "g")])
    # the second set speaks the older vLLM-Omni prefix, so the panels' name forms are exercised
    text = demo_endpoints.build_endpoints(demo_endpoints.DemoSources())["/run/1/rollout/0/metrics"].render().decode()
    assert external.OMNI_V0_RUNNING in text and external.OMNI_RUNNING not in text


def test_the_stacked_phases_are_the_exporters_phase_list_in_step_order():
    """One phase list: the stacked step-time chart and the per-step XY columns take analytics.PHASE_ORDER (+ the
    untimed rest), so a phase the exporter times (teacher, rollout_corr, save_checkpoint, ...) is never left out."""
    from omniwatch.core.analytics import PHASE_ORDER
    from omniwatch.dashboards import overview
    assert spec.PHASES == (*PHASE_ORDER, names.UNTRACKED_PHASE)
    assert {"teacher", "rollout_corr"} <= set(spec.PHASES)
    stacked = by_title(load(DASHBOARDS[0]))["Step time by phase: $experiment"]["targets"][0]["expr"]
    assert f'phase=~"{"|".join(spec.PHASES)}"' in stacked
    for i, ph in enumerate(spec.PHASES):  # each phase sorted into its place in the stack
        assert f'"{spec.ORDER_LABEL}", "{i:02d}", "phase", "{ph}")' in stacked, ph
    xy = [g.split("|") for g in overview.XY_PHASES]
    assert [ph for g in xy for ph in g] == sorted(spec.PHASES, key=lambda ph: next(
        i for i, g in enumerate(xy) if ph in g)), "XY columns group the phases without reordering or dropping any"
    assert sorted(ph for g in xy for ph in g) == sorted(spec.PHASES)


def test_ledger_buckets_sort_in_ledger_order():
    """The ledger panels label each bucket so that Prometheus' sorted range result (and so Grafana's stack) is
    ledger.ordered(): phases in step order, any other timed phase alphabetically, then the non-phase buckets."""
    from omniwatch.core import ledger
    buckets = [*ledger.NON_PHASE, *ledger.PHASE_BUCKETS, "sleep_replicas", "aaa_custom_timer"]
    key = lambda b: spec.order_key(b, spec.LEDGER_HEAD, spec.LEDGER_TAIL)  # noqa: E731
    assert sorted(buckets, key=key) == ledger.ordered(buckets)
    assert spec.ORDER_LABEL < names.L_BUCKET < names.L_EXPERIMENT  # the label Prometheus compares first
    assert names.GPU_SECONDS_TOTAL in spec.PER_STEP_COUNTERS  # read over $window (test above)
    uses = [(d.uid, p.title) for d, p, t in all_targets() if names.GPU_SECONDS_TOTAL in t.expr and spec.WINDOW in t.expr]
    assert {u for u, _ in uses} == {"omniwatch-run-overview", "omniwatch-bottlenecks"}, uses


def _promtool_eval(tmp_path, series: dict[str, float], cases: list[tuple[str, list[tuple[dict, float]]]],
                   minutes: int = 1):
    """Each series constant for ``minutes`` (a sample a minute); each case's expected samples at the last minute."""
    promtool = require_binary("promtool")
    import subprocess
    tests = [{"expr": substitute(expr), "eval_time": f"{minutes}m",
              "exp_samples": [{"labels": "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(lab.items())) + "}",
                               "value": val} for lab, val in want]} for expr, want in cases]
    doc = {"rule_files": [], "evaluation_interval": "1m",
           "tests": [{"interval": "1m", "input_series": [{"series": k, "values": f"{v:g}x{minutes + 1}"} for k, v in series.items()],
                      "promql_expr_test": tests}]}
    (tmp_path / "t.yml").write_text(yaml.safe_dump(doc, sort_keys=False, width=10_000))
    r = subprocess.run([promtool, "test", "rules", str(tmp_path / "t.yml")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]


def test_stall_stage_and_staged_alert_names_evaluate_as_the_rules_stage(tmp_path):
    """promtool: each run's stage from its age against the rules' info/warning/critical thresholds (finished wins;
    a run without a typical step yet is running), the gauge's stage label, and TrainingStalled's severity in the
    alert timeline's row name."""
    runs = {"running": (10, 0), "info": (40, 0), "warning": (80, 0), "critical": (150, 0), "finished": (150, 1)}
    series = {}
    for exp, (age, fin) in runs.items():
        r = f'project="p", experiment="{exp}"'
        series.update({f"{records.REC_AGE}{{{r}}}": age, f"{records.REC_STALL_INFO}{{{r}}}": 30,
                       f"{records.REC_STALL_WARNING}{{{r}}}": 70, f"{records.REC_STALL_CRITICAL}{{{r}}}": 100,
                       f"{names.TYPICAL_STEP}{{{r}}}": 10, f"{names.RUN_FINISHED}{{{r}}}": fin,
                       f"{names.STEP}{{{r}}}": 5})
    series[f'{names.STEP}{{project="p", experiment="new"}}'] = 1  # no typical step yet
    a = 'project="p", experiment="critical"'
    series[f'ALERTS{{alertname="{names.ALERT_STALLED}", alertstate="firing", severity="warning", {a}}}'] = 1
    series[f'ALERTS{{alertname="{names.ALERT_STALLED}", alertstate="pending", severity="critical", {a}}}'] = 1
    series[f'ALERTS{{alertname="{names.ALERT_REWARD_BOUND}", alertstate="firing", severity="warning", {a}}}'] = 1
    code = {t: v for v, t, _ in spec.STALL_STAGE_MAPPINGS}
    run = lambda e: {"project": "p", "experiment": e}  # noqa: E731
    _promtool_eval(tmp_path, series, [
        (spec.stall_stage(), [(run(e), code[e]) for e in runs] + [(run("new"), code["running"])]),
        (spec.age_steps_by_stage(), [({**run(e), "stage": e}, runs[e][0] / 10) for e in runs]),
        (f'{spec.alert_states_by_run()}', [
            ({**run("critical"), "alertname": f"{names.ALERT_STALLED} (warning)"}, 2),
            ({**run("critical"), "alertname": f"{names.ALERT_STALLED} (critical)"}, 1),
            ({**run("critical"), "alertname": names.ALERT_REWARD_BOUND}, 2),
            *[({**run(e), "alertname": "none"}, 0) for e in ("running", "info", "warning", "finished", "new")]]),
    ])
    # the gauge colours each stage by the same colour as the table column and the timeline
    doc = by_title(load(DASHBOARDS[0]))["Time since last step (typical steps)"]
    colours = {o["matcher"]["options"]: o["properties"][0]["value"]["fixedColor"] for o in doc["fieldConfig"]["overrides"]}
    assert colours == {f".* {t}": c for v, t, c in spec.STALL_STAGE_MAPPINGS if v != spec.STAGE_RUNNING}


def test_the_sdk_lays_out_the_panels_and_the_renderer_reads_its_positions():
    """One representation (issue 23 item 3): the specs give widths and heights, the SDK places the panels; the
    renderer's positions are the generated JSON's."""
    for d in DASHBOARDS:
        doc = load(d)
        pos = {p["id"]: p["gridPos"] for p in doc["panels"]}
        pos.update({q["id"]: q["gridPos"] for p in doc["panels"] for q in p.get("panels", [])})
        placed = factory.layout(d)
        assert len(placed) == len(pos)
        for pl in placed:
            g = pos[pl.id]
            assert (pl.x, pl.y, pl.w, pl.h) == (g["x"], g["y"], g["w"], g["h"]), (d.uid, pl.id)
            if pl.panel is not None:
                assert (pl.w, pl.h) == (pl.panel.w, pl.panel.h)
                assert pl.x + pl.w <= 24


def test_no_dashboard_module_reads_a_module_level_config():
    """Issue 32 item 5: every dashboard is dashboard(cfg); no module that builds panels imports a config object (a
    query or legend bound to the default at import time kept job="omniwatch" under `generate --config`)."""
    import ast
    from omniwatch.dashboards import catalog
    pkg = REPO / "exporter" / "omniwatch" / "dashboards"
    builders = {m.__module__.rsplit(".", 1)[-1] for m in catalog.BUILDERS} | {"panels", "factory", "catalog"}
    for name in sorted(builders):
        tree = ast.parse((pkg / f"{name}.py").read_text())
        for node in tree.body:  # module level only (catalog's lazy DASHBOARDS imports inside a function)
            if isinstance(node, ast.ImportFrom) and node.module and (node.module == "config" or node.module.endswith("omniwatch.config")):
                assert {a.name for a in node.names} <= {"Config"}, (name, [a.name for a in node.names])
    for build in catalog.BUILDERS:
        assert build.__name__ == "dashboard"


def test_a_table_column_is_named_in_words_not_a_legend_template():
    """A table's value column shows its target's legend as its name: a `{{label}}` template there was shown as it is
    (issue 32: `{{holder}}` as a column header)."""
    for d in DASHBOARDS:
        for p in d.panels():
            if p.kind == "table":
                for t in p.targets:
                    assert "{{" not in t.legend, (d.uid, p.title, t.legend)
