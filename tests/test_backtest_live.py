"""The past looks like the present: backfilled series equal what the live exporter served for the
same file at the same (simulated) times, and replay feeds a running exporter through its file
source and its push endpoint."""
from __future__ import annotations

import threading

import httpx
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from omniwatch.app import create_app
from omniwatch.backtest.backfill import LIVE_ONLY_FAMILIES, backfill, scrape_grid
from omniwatch.backtest.openmetrics import DEFAULT_INSTANCE, DEFAULT_JOB
from omniwatch.backtest.feed import replay_to_file, replay_to_push, target_file
from omniwatch.backtest.runfile import load_run
from omniwatch.backtest.timeline import Timeline
from omniwatch.backtest.tsdb import TempPrometheus
from omniwatch.core.exposition import OWNED, make_registry
from omniwatch.core.model import RunStore
from omniwatch.names import CATALOGUE, SCRAPE_DURATION
from omniwatch.core.planned import owned as planned_owned
from omniwatch.settings import Settings
from omniwatch.sources.files import FileSource

from .conftest import fixture_path, free_port, require_binary, wait_for

START = 1_700_000_000.0
TOKEN = "replay-test-token"
# Families the run and planned-work collectors render (counters under their _total name), minus the
# render timer.
COMPARED = {CATALOGUE[n].name for n in (*OWNED, *planned_owned())} - {SCRAPE_DURATION}


class LiveExporter:
    """create_app + uvicorn on a free loopback port, stopped by ``close``."""

    def __init__(self, store: RunStore, settings: Settings | None = None):
        self.port = free_port()
        app = create_app(store, make_registry(store), settings or Settings())
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.port}"
        wait_for(lambda: httpx.get(self.url + "/healthz", timeout=2).status_code == 200, 20, 0.05, "exporter up")

    def close(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def live():
    made = []

    def make(store, settings=None):
        made.append(LiveExporter(store, settings))
        return made[-1]
    yield make
    for ex in made:
        ex.close()


def _key(name: str, labels: dict) -> tuple:
    # An empty label value is no label in Prometheus (reference_info's reason="" of a reference kept as chosen).
    return name, tuple(sorted((k, v) for k, v in labels.items() if k not in ("job", "instance", "__name__") and v))


def _compared(name: str) -> bool:
    # the time outside the step timer is live-only: a backfill leaves it out (rebuilt arrivals make it 0)
    return (name in COMPARED or name.startswith("verl_")) and name not in LIVE_ONLY_FAMILIES


@pytest.mark.integration
def test_backfilled_series_equal_what_the_live_exporter_served(live, tmp_path):
    require_binary("promtool")
    require_binary("prometheus")
    run = load_run(str(fixture_path("flowgrpo_reward_bound")))
    timeline = Timeline.of(run, START)

    # Live: the same RunStore code, a controlled clock, fed step by step, scraped over HTTP.
    now = [timeline.arrivals[0]]
    store = RunStore(clock=lambda: now[0])
    store.set_source_up(run.kind, run.path, True)
    ex = live(store)
    served: list[dict] = []
    with httpx.Client(base_url=ex.url, timeout=10) as client:
        for i, entry in enumerate(run.entries):
            now[0] = timeline.arrivals[i]
            store.ingest(run.project, run.experiment, entry.parsed, run.kind, arrival=now[0], feed=run.feed)
            text = client.get("/metrics").text
            # The app's other routers (discovery) report their own sources; the run's is the file's.
            served.append({_key(s.name, s.labels): s.value for fam in text_string_to_metric_families(text)
                           for s in fam.samples if _compared(s.name)
                           and s.labels.get("source", run.kind) == run.kind})

    # Backfilled: the TSDB, queried at the first scrape after each step's arrival.
    bf = backfill(run, timeline, str(tmp_path / "data"), om_file=str(tmp_path / "run.om.txt"))
    grid = scrape_grid(timeline, 15.0, 300.0)
    assert [t / 1000 for t in bf.times_ms] == [t / 1000 for t in grid]
    compared = 0
    with TempPrometheus(bf.data_dir) as prom:
        for i, live_values in enumerate(served):
            t = next(ms / 1000 for ms in bf.times_ms if ms / 1000 >= timeline.arrivals[i])
            if i + 1 < len(run.entries) and t >= timeline.arrivals[i + 1]:
                continue  # overtaken before any scrape: never recorded, live or backfilled
            got = {}
            for s in prom.query('{__name__=~"omniwatch_.+|verl_.+"}', t):
                assert s["metric"]["job"] == DEFAULT_JOB and s["metric"]["instance"] == DEFAULT_INSTANCE
                # NaN: the backfill's stand-in for the staleness marker live Prometheus writes when a series goes
                # (openmetrics.stale_points), e.g. reference_info's old origin once the reference moved before a shift
                if _compared(s["metric"]["__name__"]) and s["value"][1] != "NaN":
                    got[_key(s["metric"]["__name__"], s["metric"])] = float(s["value"][1])
            assert got.keys() == live_values.keys(), (i, set(got) ^ set(live_values))
            assert got == live_values, i
            compared += len(got)
        # Between steps the last values are held, as scraping an unchanged exporter records them.
        mid = (timeline.arrivals[10] + timeline.arrivals[11]) / 2
        step = prom.query(f'omniwatch_step{{experiment="{run.experiment}"}}', mid)
        assert float(step[0]["value"][1]) == run.entries[10].step
        assert prom.query("up", mid)[0]["value"][1] == "1"
    assert compared > 40 * 100


@pytest.mark.integration
def test_replay_into_a_watched_file_root(tmp_path):
    run = load_run(str(fixture_path("flowgrpo_healthy")))
    root = tmp_path / "verl_root"
    root.mkdir()
    store = RunStore()
    src = FileSource(store, [str(root)], "jsonl", poll_seconds=0.05).start()
    try:
        total = sum(run.wall_seconds())
        stats = replay_to_file(run, target_file(str(root), run), speed=total / 1.0)  # about one second
        assert stats.sent == len(run.entries)
        assert target_file(str(root), run) == root / "verl" / "flowgrpo_healthy.jsonl"
        got = wait_for(lambda: store.runs.get(("verl", "flowgrpo_healthy")), 10, 0.05, "run in the store")
        wait_for(lambda: got.steps_total == 40, 10, 0.05, "40 steps ingested")
        assert got.restarts_total == 0 and not store.errors
    finally:
        src.stop()


@pytest.mark.integration
def test_replay_through_the_push_endpoint(live):
    run = load_run(str(fixture_path("v1_transfer_idle")))
    store = RunStore()
    ex = live(store, Settings(push_token=TOKEN))
    slept = []
    stats = replay_to_push(run, ex.url, speed=1e9, token=TOKEN, sleep=slept.append)
    assert stats.sent == 40 and not stats.failed
    r = store.runs[("verl", "v1_transfer_idle")]
    assert r.steps_total == 40 and r.last.step == 40
    bad = replay_to_push(run, ex.url, speed=1e9, token="wrong", sleep=slept.append)
    assert bad.sent == 0 and bad.failed == {"http_401": 40}
