"""Issue 22 item 8: in V1 with streamed reward, scoring runs inside timing_s/gen (the agent loop scores every sample
before writing it to TransferQueue; docs/verl-source.md G2), so a slower scorer must not be blamed on rollout
batching. The whole-run case v1_reward_slow (V1 sync, reward function ~30x slower from step 12) back-tested by the
real Prometheus engine: StepTimeRegression still names the part of the step that grew (cause=rollout, i.e. gen),
but says gen includes scoring and leads with the scorer (no reward server is scraped: it says so). The promtool
side (reward servers' latency and queueing in the remedy; legacy keeps rollout batching) is
alerts/tests/v1_streamed_reward.test.yml."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from omniwatch import names
from omniwatch.alerting import remedies

from .conftest import FIXTURES, require_binary, require_tool

CASE = FIXTURES / "whole_run" / "v1_reward_slow.jsonl"


@pytest.mark.integration
def test_v1_slower_scorer_is_not_blamed_on_rollout_batching():
    require_binary("promtool"), require_binary("prometheus")
    res = subprocess.run([sys.executable, "-m", "omniwatch", "backtest", "--json", str(CASE)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    regs = [a for a in doc["alerts"] if a["alertname"] == names.ALERT_STEP_REGRESSION]
    assert regs, doc["alerts"]
    for a in regs:
        assert a["labels"]["cause"] == "rollout" and a["first_step"] >= 12
        desc, remedy = a["annotations"]["description"], a["annotations"]["remedy"]
        assert ("most of the growth is in rollout (timing_s/gen, which in V1 with streamed reward includes reward "
                "scoring: the agent loop scores every sample before writing it to TransferQueue, so generation or "
                "scoring grew)") in desc, desc
        assert remedy.startswith("Generation grew, and in V1 timing_s/gen includes reward scoring"), remedy
        assert ("Check the scorer before rollout batching: omniwatch scrapes no reward server for this run, so the "
                "scorer is a reward function or HTTP scorer whose time V1 does not log") in remedy, remedy
        # rollout batching comes last, conditional on scoring not having grown
        assert "Only if scoring did not grow check rollout batching" in remedy
        assert not remedy.startswith("Generation grew: check rollout batching")


def test_the_promtool_cases_of_gen_with_scoring_pass():
    res = subprocess.run([require_tool("promtool"), "test", "rules", "alerts/tests/v1_streamed_reward.test.yml"],
                         cwd=FIXTURES.parents[1], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_only_v1_streamed_gets_the_scoring_note():
    from omniwatch.prosetext import Ctx
    note = remedies.gen_includes_scoring()
    lab = {"project": "p", "experiment": "e", "cause": "rollout"}
    assert "includes reward scoring" in note.expect(Ctx(lab, 1.0, {}, {"trainer": "v1", "reward": "streamed"}))
    for modes in ({"trainer": "legacy", "reward": "streamed"}, {"trainer": "v1", "reward": "colocated"}, None):
        assert note.expect(Ctx(lab, 1.0, {}, modes)) == ""
    assert note.expect(Ctx({**lab, "cause": "actor"}, 1.0, {}, {"trainer": "v1", "reward": "streamed"})) == ""
