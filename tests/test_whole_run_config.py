"""Issue 22 items 4-6 through ``omniwatch backtest`` (a real Prometheus evaluating alerts/) and the report:
the whole-run cases (tests/fixtures/whole_run/, CASES.md) judged with and without the trainer's config
(tests/fixtures/trainer_config/). ``silence``: TrainingStalled judged as if the log stayed silent after its
last line — what the live exporter does at the end of a file. Every run is backtested in one pass of the
engine (``backtest_many``, a module fixture); each test reads its run's result."""
from __future__ import annotations

import json

import pytest

from omniwatch import names as n, trainer_config as tc
from omniwatch.backtest.backtest import backtest_many
from omniwatch.backtest.runfile import load_run
from omniwatch.report.gather import facts_of_runs

from .conftest import fixture, require_binary

pytestmark = [pytest.mark.integration, pytest.mark.batch]
SILENCE = 4 * 3600.0


def run_of(name: str, config: str | None = None, path: str | None = None):
    """The whole-run case ``name`` (or its lines copied to ``path``), with the trainer config given."""
    run = load_run(path or str(fixture(f"whole_run/{name}.jsonl")))
    if config is not None:
        assert not tc.attach([run], [str(fixture(f"trainer_config/{config}"))])
        assert run.trainer_config is not None
    return run


# key -> (case, lines, trainer config, silence after the last line)
BACKTESTS = {
    "hang_in_step2": ("hang_in_step3", 1, None, SILENCE),
    "hang_in_step3": ("hang_in_step3", 2, None, SILENCE),
    "hang_in_step3_config": ("finished_on_cadence", 2, "finished_on_cadence.pprint.log", SILENCE),
    "finish": ("finished_on_cadence", None, None, SILENCE),
    "finish_pprint": ("finished_on_cadence", None, "finished_on_cadence.pprint.log", SILENCE),
    "finish_hydra": ("finished_on_cadence", None, "finished_on_cadence.hydra/config.yaml", SILENCE),
    "finished_off_cadence": ("finished_off_cadence", None, None, SILENCE),
    "no_validation_bare": ("no_validation_15min", 25, None, SILENCE),
    "no_validation_config": ("no_validation_15min", 25, "no_validation_15min.pprint.log", SILENCE),
    "mfu_sp4": ("mfu_sp4", None, None, 0.0),
    "mfu_sp4_config": ("mfu_sp4", None, "mfu_sp4.pprint.log", 0.0),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every run of BACKTESTS in one backtest pass (each its own experiment label): key -> result."""
    require_binary("prometheus")
    require_binary("promtool")
    root = tmp_path_factory.mktemp("runs") / "whole_run"
    root.mkdir()
    runs = []
    for key, (case, lines, config, _) in BACKTESTS.items():
        # a file of its own per run: the source series are labelled by the file (target)
        src = fixture(f"whole_run/{case}.jsonl").read_text().splitlines()
        (root / f"{key}.jsonl").write_text("\n".join(src[:lines] if lines else src) + "\n")
        runs.append(run_of(case, config, str(root / f"{key}.jsonl")))
    out = backtest_many(runs, silence=[x[3] for x in BACKTESTS.values()])
    return dict(zip(BACKTESTS, out))


def stalls(res) -> dict[str, object]:
    """severity -> the first TrainingStalled hit of that severity after the run's last line."""
    out = {}
    for h in res.alerts:
        if h.alertname == n.ALERT_STALLED and h.first_t > res.timeline.end and h.severity not in out:
            out[h.severity] = h
    return out


def minutes_after_end(res, hit) -> float:
    return (hit.first_t - res.timeline.end) / 60


@pytest.mark.parametrize("lines", [1, 2], ids=["hang_in_step2", "hang_in_step3"])
def test_a_hang_in_step_2_or_3_pages(results, lines):
    """Early hangs (issue 30 item 5): no typical step exists yet (warm-up steps only), so the stages count in the
    longest warm-up step W (308 s here) from its end: warning at 2 W, critical at 3 W, each less min(W/4, 60 s), so each is
    firing by 2 W and 3 W (the rule's for:, the evaluation grid and Alertmanager's group_wait come within that); without a config nothing planned is assumed, and the annotation says so."""
    res = results[f"hang_in_step{lines + 1}"]
    assert res.steps == lines
    st = stalls(res)
    assert set(st) == {"info", "warning", "critical"}
    crit = st["critical"]
    assert crit.first_step == lines
    w = 308 / 60
    assert 2 * w - 1.5 <= minutes_after_end(res, st["warning"]) <= 2 * w, minutes_after_end(res, st["warning"])
    assert 3 * w - 1.5 <= minutes_after_end(res, crit) <= 3 * w, minutes_after_end(res, crit)
    assert minutes_after_end(res, st["info"]) <= 1.5 * w + 1
    text = crit.annotations["description"]
    assert "allowed with no normal step yet: 3 x its longest warm-up step (5m 8s), less up to 75 s for the message to arrive" in text
    assert "No trainer configuration was read for this run: no first checkpoint or validation is assumed" in text


def test_a_hang_in_step_3_with_its_config_pages_as_soon(results):
    """The config says step 3 carries no checkpoint or validation (save_freq=10, test_freq=10, 40 steps): no
    reserve for a first one either, the same 3 W (less the delivery allowance), and the annotation no longer says what was assumed."""
    res = results["hang_in_step3_config"]
    assert res.run.trainer_config is not None and res.steps == 2
    st = stalls(res)
    assert set(st) == {"info", "warning", "critical"}
    assert 3 * 308 / 60 - 1.5 <= minutes_after_end(res, st["critical"]) <= 3 * 308 / 60
    assert "No trainer configuration" not in st["critical"].annotations["description"]


@pytest.mark.parametrize("key", ["finish", "finish_pprint", "finish_hydra"])
def test_a_finish_on_both_cadences(results, key):
    """40 steps, checkpoint and validation every 10: without a config the end cannot be told from a hang
    (it pages, and says what was assumed); with it the run is finished and nothing fires after it."""
    config = BACKTESTS[key][2]
    res = results[key]
    run = res.run
    st = stalls(res)
    if config is None:
        assert {"warning", "critical"} <= set(st)
        assert "cannot tell its end from a hang" in st["critical"].annotations["description"]
        assert tc.assumptions(run.trainer_config)[0].startswith("no trainer configuration read")
    else:
        assert st == {}
        assert tc.assumptions(run.trainer_config) == []
    # planned work mid-run is info at most, with or without
    assert not [h for h in res.alerts if h.alertname == n.ALERT_STALLED and h.severity != "info"
                and h.first_t <= res.timeline.end]


def test_the_off_cadence_control_is_finished_without_a_config(results):
    assert results["finished_off_cadence"].steps > 10
    assert stalls(results["finished_off_cadence"]) == {}


def test_validation_off_in_the_config_removes_the_reserve(results):
    """15-minute steps, test_freq=-1, hung after step 25: today's permanent "unseen kind" reserve makes
    critical wait 10 typical steps + the checkpoint; the config's test_freq=-1 takes the reserve away."""
    bare, conf = results["no_validation_bare"], results["no_validation_config"]
    assert bare.steps == conf.steps == 25
    b, c = stalls(bare)["critical"], stalls(conf)["critical"]
    reserve = "plus 4 typical steps for a first checkpoint or validation not seen yet"
    assert reserve in b.annotations["description"] and reserve not in c.annotations["description"]
    assert minutes_after_end(bare, b) - minutes_after_end(conf, c) > 55  # 4 typical steps of ~15 min


@pytest.mark.parametrize("config", [None, "mfu_sp4.pprint.log"])
def test_sp4_reporting_1_12_is_judged_per_gpu(results, config):
    res = results["mfu_sp4_config" if config else "mfu_sp4"]
    assert (res.run.trainer_config is not None) == bool(config)
    hits = [h for h in res.alerts if h.alertname == n.ALERT_MFU_IMPOSSIBLE]
    if config is None:
        assert hits and "omniwatch assumed Ulysses SP=1" in hits[0].annotations["description"]
    else:
        assert hits == []


def test_separate_async_gpu_counts_in_the_report():
    """4 trainer + 4 standalone-rollout GPUs: the log sees 4; the config names both pools; --gpus 8 wins."""
    def gpus(config=None, flag=None):
        run = run_of("v1_separate_async", config=config)
        f = facts_of_runs([run], gpus=flag, alerts=False)[0]
        return f.gpus, f.gpus_source, f.trainer_config, f.assumed

    g, src, cfg, assumed = gpus()
    assert (g, src, cfg) == (4, "log", None) and any("GPUs from the log" in a for a in assumed)
    g, src, cfg, assumed = gpus(config="v1_separate_async.hydra/config.yaml")
    assert (g, src) == (8, "config") and cfg["gpus_rollout_pool"] == 4 and assumed == []
    assert gpus(flag=8)[:2] == (8, "flag")
    assert gpus(config="v1_separate_async.pprint.log", flag=6)[:2] == (6, "flag")


def test_backtest_cli_reads_a_console_log_config_and_says_what_it_assumed(tmp_path, capsys):
    from omniwatch.cli import main
    assert main(["backtest", str(fixture("whole_run/mfu_sp4.jsonl")), "--json", "--quiet", "--trainer-config",
                 str(fixture("trainer_config/mfu_sp4.pprint.log"))]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["trainer_config"]["sp"] == 4 and d["assumed"] == []
    assert not [a for a in d["alerts"] if a["alertname"] == n.ALERT_MFU_IMPOSSIBLE]
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [")
    assert main(["backtest", str(fixture("whole_run/hang_in_step3.jsonl")), "--json", "--quiet",
                 "--trainer-config", str(bad)]) == 0
    io = capsys.readouterr()
    assert json.loads(io.out)["assumed"] and "trainer config skipped (malformed_yaml)" in io.err
