"""The alert config reaches the ledger and the report as a parameter (issue 23 item 4): `rules generate --config`
tunes the rules, and the exporter (`RunStore(alert_config=...)`) and `omniwatch report --config` then book and
draw by the same thresholds instead of the defaults."""
import os
import subprocess
import sys

import pytest

from omniwatch import names
from omniwatch import config
from omniwatch.core.model import RunStore
from omniwatch.core.parse import parse_jsonl_line

from .conftest import fixture_path


def _ledger(cfg=None) -> dict[str, float]:
    """12 steps of ~250 s arriving 757 s apart: beyond the default tolerance (2 typical steps of outside time)."""
    lines = fixture_path("flowgrpo_healthy").read_bytes().splitlines()[:12]
    now = [1000.0]
    st = RunStore(clock=lambda: now[0], **({"alert_config": cfg} if cfg is not None else {}))
    for i, line in enumerate(lines):
        now[0] += 0.0 if i == 0 else 757.0
        st.ingest("p", "e", parse_jsonl_line(line), "jsonl", feed="jsonl:f")
    return dict(st.runs[("p", "e")].gpu_seconds)


def test_the_ledger_books_stalled_time_by_the_alert_config_it_is_given(tmp_path):
    default = _ledger()
    assert default["stalled"] > 0  # control: the default tolerance books the pauses' excess as stalled
    y = tmp_path / "thresholds.yml"
    y.write_text("stall:\n  notice_steps: 5\n")  # a tolerance of 4 typical steps (~1,000 s): no pause exceeds it
    tuned = _ledger(config.load(y))
    assert "stalled" not in tuned
    assert sum(tuned.values()) == pytest.approx(sum(default.values()))  # the same seconds, in other buckets
    assert tuned["outside_step_timer"] == pytest.approx(default["outside_step_timer"] + default["stalled"])


def test_report_config_draws_the_thresholds_the_rules_were_made_with(tmp_path):
    run = tmp_path / "proj" / "exp.jsonl"
    run.parent.mkdir()
    run.write_bytes(fixture_path("flowgrpo_healthy").read_bytes())
    y = tmp_path / "thresholds.yml"
    y.write_text("mfu:\n  impossible: 3.5\n")
    pages = {}
    for name, extra in (("default", []), ("tuned", ["--config", str(y)])):
        out = tmp_path / f"{name}.html"
        r = subprocess.run([sys.executable, "-m", "omniwatch", "report", str(run), "--no-alerts", "--quiet",
                            "-o", str(out), *extra], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        pages[name] = out.read_text()
    assert f"{names.ALERT_MFU_IMPOSSIBLE}: &gt; 3.5" in pages["tuned"] or f"{names.ALERT_MFU_IMPOSSIBLE}: > 3.5" in pages["tuned"]
    assert "3.5" not in pages["default"].split(names.ALERT_MFU_IMPOSSIBLE, 1)[1][:20]


def test_the_exporter_takes_the_alert_config_from_its_settings(tmp_path, monkeypatch):
    """`OMNIWATCH_ALERT_CONFIG` (or `alert_config:` in the settings file) names the YAML the rules were generated
    with; the exporter's ledger books by it."""
    from omniwatch.server import Exporter
    from omniwatch.settings import Settings
    y = tmp_path / "thresholds.yml"
    y.write_text("stall:\n  notice_steps: 5\n")
    monkeypatch.chdir(tmp_path)
    assert Exporter._build(Settings.load(), None).store.stall_tolerance_steps == 2  # control: the default
    monkeypatch.setenv("OMNIWATCH_ALERT_CONFIG", str(y))
    assert Exporter._build(Settings.load(), None).store.stall_tolerance_steps == 4


@pytest.mark.parametrize("content", [None, "stall: [1\n", "- a list\n"])
def test_an_alert_config_the_exporter_cannot_use_is_one_line_and_exit_2(tmp_path, content):
    """A missing, non-YAML or non-mapping OMNIWATCH_ALERT_CONFIG stops `serve` with one line naming the file,
    never a traceback (and before anything listens)."""
    cfg = tmp_path / "alerts.yml"
    if content is not None:
        cfg.write_text(content)
    env = dict(os.environ, OMNIWATCH_ALERT_CONFIG=str(cfg))
    r = subprocess.run([sys.executable, "-m", "omniwatch", "serve", "--listen", "127.0.0.1:9",
                        "--state-dir", str(tmp_path / "state")], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert f"alert config {cfg}" in r.stderr.strip().splitlines()[-1]
