"""What every omniwatch web process serves, through client_python's own ASGI app: /metrics in the text
format by default, OpenMetrics when asked, gzip when accepted; /healthz."""
from __future__ import annotations

import gzip

import pytest

from fastapi.testclient import TestClient

from omniwatch import names
from omniwatch.app import AREAS, create_app
from omniwatch.core.exposition import make_registry
from omniwatch.core.model import RunStore
from omniwatch.core.parse import ParsedStep
from omniwatch.settings import Settings


def client() -> TestClient:
    store = RunStore()
    store.ingest("p", "e", ParsedStep(1, {"timing_s/step": 10.0, "timing_s/gen": 4.0}), "push")
    return TestClient(create_app(store, make_registry(store), Settings()))


def test_metrics_negotiates_openmetrics_and_gzip():
    c = client()
    plain = c.get("/metrics")
    assert plain.status_code == 200 and plain.headers["content-type"].startswith("text/plain")
    assert f'{names.STEP}{{experiment="e",project="p"}} 1.0' in plain.text
    om = c.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert om.headers["content-type"].startswith("application/openmetrics-text") and om.text.rstrip().endswith("# EOF")
    z = c.get("/metrics", headers={"Accept-Encoding": "gzip"})
    assert z.headers.get("content-encoding") == "gzip"
    raw = c.get("/metrics", headers={"Accept-Encoding": "gzip"}).content  # TestClient decodes; check it was gzip
    assert names.STEP in (raw.decode() if not raw[:2] == b"\x1f\x8b" else gzip.decompress(raw).decode())
    assert c.head("/metrics").status_code == 200


def test_every_area_is_listed_and_mounted():
    app = client().app
    paths = set(app.openapi()["paths"])
    for area in AREAS:
        for route in area.router.routes:
            if getattr(route, "include_in_schema", True):
                assert route.path in paths, (area.__name__, route.path)


def test_each_collector_describes_what_it_collects_and_a_second_owner_is_refused(tmp_path):
    """Every collector's ``describe()`` names the families it renders (names.describe), so the private
    registry refuses a second collector that would render one of them, as client_python intends."""
    from prometheus_client import CollectorRegistry

    from omniwatch.core.exposition import RunCollector
    from omniwatch.gpu.collector import GpuCollector
    from omniwatch.httpguard import GuardCollector, GuardStats
    from omniwatch.core.planned import PlannedCollector
    from omniwatch.sources.files import FilesCollector
    from omniwatch.core.parse import parse_record
    from omniwatch.simulate import RunSpec, step_dict

    store = RunStore()
    for i in range(1, 30):
        store.ingest("p", "e", parse_record({"step": i, "data": step_dict(RunSpec(), i)}), "jsonl")
    makers = [lambda: RunCollector(store), lambda: PlannedCollector(store), lambda: GpuCollector(None),
              lambda: GuardCollector(GuardStats()), lambda: FilesCollector([])]
    reg = CollectorRegistry(auto_describe=False)
    for make in makers:
        c = make()
        described = {f.name for f in c.describe()}
        assert described, type(c).__name__
        collected = {f.name for f in c.collect() if not f.name.startswith(names.PASSTHROUGH_PREFIX)}
        assert collected <= described, (type(c).__name__, collected - described)
        reg.register(c)
    for make in makers:
        with pytest.raises(ValueError, match="Duplicated timeseries"):
            reg.register(make())
