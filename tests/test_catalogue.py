"""One set of metric names: everything alerts/ and dashboards/ use exists in the catalogue, the exporter
renders only catalogued omniwatch_* names, and docs/metrics.md is current."""
import re
from pathlib import Path

from prometheus_client import generate_latest

from omniwatch import docsgen, names
from omniwatch.core.exposition import make_registry
from omniwatch.core.model import RunStore
from omniwatch.core.parse import parse_jsonl_line

from .conftest import fixture_path

REPO = Path(__file__).resolve().parents[1]
# omniwatch_ names, not followed by ':' (recording rules are level:metric:ops and may embed a name).
NAME = re.compile(r"(?<![\w:])(omniwatch_[a-z0-9_]+)(?![\w:])")


def used_names(paths):
    found = {}
    for p in paths:
        for m in NAME.finditer(p.read_text()):
            found.setdefault(m.group(1), p.name)
    return found


def test_every_omniwatch_name_in_alerts_and_dashboards_is_catalogued():
    files = list((REPO / "alerts").rglob("*.yml")) + list((REPO / "dashboards").glob("*.json"))
    assert files, "no rule files or dashboards found"
    unknown = {n: f for n, f in used_names(files).items() if n not in names.CATALOGUE}
    assert not unknown, f"names used but not in omniwatch.names.CATALOGUE: {unknown}"


def test_exporter_renders_only_catalogued_names():
    store = RunStore()
    for line in fixture_path("flowgrpo_async_reward_tail").read_bytes().splitlines():
        store.ingest("p", "e", parse_jsonl_line(line), "jsonl")
    text = generate_latest(make_registry(store)).decode()
    rendered = {m.group(1) for m in re.finditer(r"^(omniwatch_[a-z0-9_]+)", text, re.M)}
    assert rendered and rendered <= set(names.CATALOGUE)


def test_docs_metrics_md_is_generated_from_the_catalogue():
    assert (REPO / "docs" / "metrics.md").read_text() == docsgen.render(), "run `make docs`"
    text = (REPO / "docs" / "metrics.md").read_text()
    for name in names.CATALOGUE:
        assert f"`{name}`" in text


def test_counters_end_in_total_and_names_are_prefixed():
    for m in names.CATALOGUE.values():
        assert m.name.startswith(names.PREFIX)
        assert (m.type == "counter") == m.name.endswith("_total"), m.name
