"""The Alertmanager model of the scorecard (omniwatch/scorecard/amsim.py), from alerts/alertmanager.yml: the literal
notifications it sends for the scripted scenarios (tests/scorecard_am_scenarios.py; a real Alertmanager 0.25 is held
to the same model in tests/test_scorecard_alertmanager.py), what Prometheus sends for a firing interval, and the
parsing of routes and matchers."""
from __future__ import annotations

import pytest

from omniwatch import rules
from omniwatch.scorecard import amsim

from . import scorecard_am_scenarios as sc
from omniwatch.yamlio import load as yaml_load


def _config() -> amsim.AMConfig:
    return amsim.parse_config(sc.scaled(yaml_load(rules.alertmanager_config_path().read_text())))


def _run_model(started: float = -7.0) -> list[tuple]:
    am = amsim.Alertmanager(_config(), started=started)
    posts = sorted((p.at, name, p) for name, ps in sc.SCENARIOS.items() for p in ps)
    for at, _, p in posts:
        am.post(at, sc.model_alerts(p, 0.0, at))
    am.advance(max(sc.DURATION.values()))
    return sorted((round(x.t, 3), *sc.summary(x)) for x in am.notifications
                  if x.t <= sc.DURATION[sc.summary(x)[0]])


def test_the_model_sends_what_alertmanager_025_would_for_each_scenario():
    got = _run_model()
    S1, S2, S3, S4, S5 = sc.S1, sc.S2, sc.S3, sc.S4, sc.S5
    want = sorted((t, e, st, tuple(sorted(f)), tuple(sorted(r))) for t, e, st, f, r in [
        (0.1, S1, "firing", ("RewardBoundRollout",), ()),
        (0.1, S1, "firing", ("StepTimeRegression{cause=actor}",), ()),  # cause=reward muted by RewardBoundRollout
        (0.2, S1, "firing", ("StepTimeRegression{cause=rollout}",), ()),  # its route waits 20 s (scaled: 0.2)
        (3.1, S1, "resolved", (), ("RewardBoundRollout",)),
        (3.1, S1, "firing", ("StepTimeRegression{cause=actor}", "StepTimeRegression{cause=reward}"), ()),
        (0.1, S2, "firing", ("MFUDrop{role=actor}", "MFUDrop{role=actor_infer}"), ()),
        # 3.1: the resolve at 0.8 and re-fire at 1.6 fell between two flushes: nothing sent
        (6.1, S2, "firing", ("MFUDrop{role=actor_infer}",), ("MFUDrop{role=actor}",)),
        (9.1, S2, "firing", ("MFUDrop{role=actor}", "MFUDrop{role=actor_infer}"), ()),
        (0.1, S3, "firing", ("TrainingStalled{severity=warning}",), ()),  # info muted; RewardBoundRollout muted
        (1.3, S3, "firing", ("TrainingStalled{severity=critical}",), ()),  # the warning muted; the escalation flush (0.3 s)
        (0.1, S4, "firing", ("InterStageIdleGPU{evidence=timers}",), ()),
        (15.1, S4, "firing", ("InterStageIdleGPU{evidence=timers}",), ()),  # repeat_interval 14.4 s
        (0.1, S5, "firing", ("StepTimeRegression{cause=weight_sync}",), ()),
        (3.1, S5, "resolved", (), ("StepTimeRegression{cause=weight_sync}",)),
        (34.7, S5, "firing", ("StepTimeRegression{cause=weight_sync}",), ()),  # a new group: group_wait again
    ])
    assert got == want


def test_a_group_still_alive_waits_for_its_next_flush():
    """Without the dispatcher's cleanup (a 100 s cleanup period), the emptied group of the last scenario lives on and
    the re-fire waits for its group_interval tick (36.1), not group_wait: the cleanup is what makes 34.7."""
    am = amsim.Alertmanager(_config(), started=-7.0, cleanup_interval=100.0)
    for p in sc.SCENARIOS[sc.S5]:
        am.post(p.at, sc.model_alerts(p, 0.0, p.at))
    am.advance(40.0)
    assert [round(x.t, 3) for x in am.notifications] == [0.1, 3.1, 36.1]


def test_prometheus_sends_on_firing_every_resend_delay_and_the_resolve_for_15_minutes():
    f = amsim.Firing({"alertname": "A", "severity": "warning"}, first_t=1000.0, last_t=1150.0, resolved_t=1165.0,
                     active_t=985.0, end_t=9999.0)
    posts = amsim.prometheus_posts([f], eval_interval=15.0)
    firing = [(t, a.ends) for t, a in posts if a.ends > t]
    resolved = [t for t, a in posts if a.ends <= t]
    # LastSentAt + 1m before the evaluation: every 75 s on a 15 s grid; endsAt 4 x max(1m, 15s) ahead
    assert firing == [(1000.0, 1240.0), (1075.0, 1315.0), (1150.0, 1390.0)]
    assert resolved == [1165.0 + 75.0 * k for k in range(13)]  # re-sent for 15 minutes (resolvedRetention)
    assert all(a.starts == 1000.0 for _, a in posts)  # startsAt = when it fired


def test_a_resolved_alert_stops_being_resent_when_its_labels_go_pending_again():
    a = amsim.Firing({"alertname": "A"}, 1000.0, 1100.0, 1115.0, 985.0, 9999.0)
    b = amsim.Firing({"alertname": "A"}, 1300.0, 1400.0, None, 1285.0, 1400.0)
    posts = amsim.prometheus_posts([a, b], 15.0, hold_open=60.0)
    resolved = [t for t, x in posts if x.ends <= t]
    assert resolved == [1115.0, 1190.0, 1265.0]  # the next pending evaluation (1285) replaces it
    assert [t for t, x in posts if x.starts == 1300.0] == [1300.0, 1375.0, 1450.0]  # hold_open: firing past 1400


def test_routes_and_matchers_are_read_from_the_file():
    cfg = _config()
    stalled_info = {"alertname": "TrainingStalled", "severity": "info", "project": "p", "experiment": "e"}
    rollout = {"alertname": "StepTimeRegression", "cause": "rollout", "project": "p", "experiment": "e"}
    reward = {"alertname": "StepTimeRegression", "cause": "reward", "project": "p", "experiment": "e"}
    assert [r.repeat_interval for r in cfg.route.match(stalled_info)] == [pytest.approx(168 * 3600 * sc.REPEAT_FACTOR)]
    assert [r.group_wait for r in cfg.route.match(rollout)] == [pytest.approx(0.2)]
    assert cfg.route.match(reward) == [cfg.route]
    assert cfg.route.group_labels(reward) == (("alertname", "StepTimeRegression"), ("experiment", "e"), ("project", "p"))
    m = amsim.LabelMatcher.parse('severity =~ "warning|critical"')
    assert (m.matches({"severity": "critical"}), m.matches({"severity": "info"}), m.matches({})) == (True, False, False)
    assert amsim.LabelMatcher.parse("cause != reward").matches({}) is True
    with pytest.raises(amsim.ConfigError):
        amsim.parse_config({"route": {"receiver": "x", "mute_time_intervals": ["night"]}})


def test_an_integration_without_send_resolved_sends_only_firing_alerts():
    cfg = amsim.parse_config({"route": {"receiver": "r", "group_by": ["alertname"], "group_wait": "1s",
                                        "group_interval": "10s"},
                              "receivers": [{"name": "r", "slack_configs": [{"channel": "#x"}]}]})
    am = amsim.Alertmanager(cfg, started=-7.0)
    am.post(0.0, [amsim.AmAlert({"alertname": "A", "i": "1"}, 0.0, 100.0), amsim.AmAlert({"alertname": "A", "i": "2"}, 0.0, 100.0)])
    am.post(5.0, [amsim.AmAlert({"alertname": "A", "i": "1"}, 0.0, 5.0)])
    am.post(15.0, [amsim.AmAlert({"alertname": "A", "i": "2"}, 0.0, 15.0)])
    am.advance(40.0)
    assert [(x.t, x.status, len(x.firing), len(x.resolved)) for x in am.notifications] == [(1.0, "firing", 2, 0)]
