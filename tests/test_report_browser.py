"""The report pages in a real browser (Debian's headless chromium over the DevTools protocol): each page
loads from disk with no console error and no network request, and every chart draws. A missing
chromium skips, naming ``apt-get install -y chromium``."""
from __future__ import annotations

import pytest

from omniwatch.backtest.runfile import load_run
from omniwatch.report.compare import Comparison
from omniwatch.report.html import compare_page, run_page
from omniwatch.report.index import build_index
from omniwatch.report.gather import facts_of_runs
from omniwatch.report.verdict import verdict
from omniwatch.simulate import RunSpec

from .browser_support import Browser, chromium
from .conftest import fixture_path
from .test_report import pool_pair, write_run

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def browser():
    chromium()
    b = Browser()
    yield b
    b.close()


def assert_clean(check, at_least: int) -> None:
    assert check.console_errors == [], check.console_errors
    assert check.requests == [], check.requests
    assert check.charts_expected >= at_least
    assert check.charts_roots == check.charts_expected
    assert check.charts_drawn == check.charts_expected, check


def test_the_harness_sees_errors_requests_and_blank_charts(browser, tmp_path):
    """Negative control: a page with a console error, an uncaught exception, a request and a blank chart."""
    page = tmp_path / "bad.html"
    page.write_text('<html><head><meta name="omniwatch-charts" content="1"></head><body>'
                    '<div data-root-id="x"><canvas width="50" height="50"></canvas></div>'
                    '<img src="http://127.0.0.1:9/pixel.png"><script>console.error("boom"); '
                    'setTimeout(() => { throw new Error("late") }, 0)</script></body></html>')
    c = browser.check(page, timeout=8)
    assert any("boom" in e for e in c.console_errors) and any("late" in e for e in c.console_errors)
    assert any(u.startswith("http://127.0.0.1:9/") for u in c.requests)
    assert c.charts_roots == 1 and c.charts_drawn == 0


def test_run_report_pages_load_offline_and_draw(browser, tmp_path):
    names = ["flowgrpo_reward_bound", "v1_transfer_idle", "flowgrpo_mfu_above_one"]
    fs = facts_of_runs([load_run(str(fixture_path(n))) for n in names])
    for f in fs:
        page = tmp_path / f"{f.experiment}.html"
        page.write_text(run_page(f, verdict(f)))
        assert page.stat().st_size < 3e6
        # ledger, phases, MFU, alert timeline always; reward-bound where the run logs reward timers
        assert_clean(browser.check(page), 5)


def test_comparison_and_index_pages_load_offline_and_draw(browser, tmp_path):
    root = tmp_path / "verl-logs"
    a, b = pool_pair(root)
    write_run(root / "other" / "healthy.jsonl", RunSpec(seed=13), 30)
    fs = facts_of_runs([load_run(str(p)) for p in (a, b, root / "other" / "healthy.jsonl")])
    cmp_page = tmp_path / "compare.html"
    cmp_page.write_text(compare_page(Comparison(fs[0], fs[1], verdict(fs[0]), verdict(fs[1]))))
    assert_clean(browser.check(cmp_page), 2)
    out = tmp_path / "site" / "index.html"
    rows = build_index(fs, out, str(root), workers=1)
    assert_clean(browser.check(out), 1)
    assert_clean(browser.check(rows[0]["page"]), 5)
