"""What every omniwatch web process serves, through client_python's own ASGI app: /metrics in the text
format by default, OpenMetrics when asked, gzip when accepted; /healthz."""
from __future__ import annotations

import gzip

from fastapi.testclient import TestClient

from omniwatch import names
from omniwatch.app import AREAS, create_app
from omniwatch.exposition import make_registry
from omniwatch.model import RunStore
from omniwatch.parse import ParsedStep
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
