"""The promtool unit tests of the generated rules, as data built from the same configuration.

Each alert is tested just before and just after its ``for:`` (kubernetes-mixin style), with input
values placed either side of its threshold, and with runs that must stay quiet (healthy, one noisy
step, warm-up, the other layouts). Expected annotations are the alert's own prose rendered for the
test's values by :meth:`Prose.expect` (the oracle), so prose, thresholds and tests cannot drift apart:
``omniwatch rules generate`` writes ``alerts/tests/*.test.yml``; ``promtool test rules`` runs them.
"""
from __future__ import annotations

import yaml

from .. import names as n
from . import endpoints, holder, rankstraggler, spec, stalls
from .config import Config
from .prose import STEP, Ctx, key_of
from .records import REC_STEP_DRIFT_CAUSE_TOP
from .testcase import INTERVAL, JOB, Case, Check, Expect, Series, dur, every, num, run_labels, secs

def expected_annotations(cfg: Config, alert: str, labels: dict, ctx: Ctx) -> dict:
    cands = [a for a in spec.alerts(cfg) if a.name == alert
             and all(labels.get(k) == v for k, v in a.all_labels().items())]
    if len(cands) != 1:
        raise ValueError(f"{alert} {labels}: {len(cands)} rules match")
    a = cands[0]
    out = {"summary": a.summary, "description": a.description.expect(ctx)}
    if a.step:
        out["step"] = STEP.expect(ctx)
    if a.remedy is not None:
        out["remedy"] = a.remedy.expect(ctx)
    out["runbook_url"] = cfg.runbook_url(a.name)
    return out


def _check_yaml(cfg: Config, c: Check) -> dict:
    d: dict = {"eval_time": secs(c.at), "alertname": c.alert}
    if c.expect:
        d["exp_alerts"] = [{"exp_labels": dict(e.labels),
                            "exp_annotations": expected_annotations(cfg, c.alert, e.labels, e.ctx)} for e in c.expect]
    return d


def _dump(doc) -> str:
    return yaml.safe_dump(doc, sort_keys=False, width=10**9, allow_unicode=True)


def render(cfg: Config, cases: list[Case], rule_file: str, header: str, interval: int = INTERVAL) -> str:
    """A promtool test file: ``interval`` is its ``evaluation_interval`` (and the input interval of every case
    that sets none). A case's comment is written above it."""
    doc = {"rule_files": [f"../{rule_file}"], "evaluation_interval": every(interval), "tests": []}
    body = [_dump({k: v for k, v in doc.items() if k != "tests"}), "tests:\n"]
    for case in cases:
        t: dict = {"name": case.name, "interval": every(case.interval or interval)}
        if case.series:
            t["input_series"] = [s.render() for s in case.series]
        if case.checks:
            t["alert_rule_test"] = [_check_yaml(cfg, c) for c in case.checks]
        if case.exprs:
            t["promql_expr_test"] = [e.render() for e in case.exprs]
        doc["tests"].append(t)
        body.append("".join(f"# {line}".rstrip() + "\n" for line in case.comment.split("\n")) if case.comment else "")
        body.append(_dump([t]))
    text = "".join(body)
    if yaml.safe_load(text) != doc:
        raise AssertionError(f"{rule_file}: rendered tests do not load back to their cases")
    return "".join(f"# {line}".rstrip() + "\n" for line in header.strip("\n").split("\n")) + "\n" + text


# --- the standard step-alert scenario ----------------------------------------------------------------------
ONSET = 4 * INTERVAL   # the window statistic crosses the threshold at the 5th sample (60 s)
RUN_SAMPLES = 9        # samples after the first (0 .. 135 s)


def step_series(project: str, experiment: str, first_step: int) -> list[Series]:
    return [Series(n.STEP, run_labels(project, experiment), f"{first_step}+1x{RUN_SAMPLES}"),
            Series(n.WINDOW_STEPS, run_labels(project, experiment), f"{3}x{RUN_SAMPLES}")]


def info_series(project: str, experiment: str, modes: dict) -> Series:
    return Series(n.RUN_INFO, run_labels(project, experiment, **modes), f"1x{RUN_SAMPLES}")


def onset(before: float, after: float) -> str:
    return f"{num(before)}x3 {num(after)}x{RUN_SAMPLES - 4}"


def fires(cfg: Config, alert: str, name: str, project: str, experiment: str, series: list[Series], value: float,
          labels: dict, first_step: int = 10, modes: dict | None = None, extra_ctx: dict | None = None) -> Case:
    """``series`` cross the threshold at 60 s: pending then (nothing yet), firing at 75 s with ``value``."""
    ser = list(series) + step_series(project, experiment, first_step)
    if modes is not None:
        ser.append(info_series(project, experiment, modes))
    fire_at = ONSET + dur(cfg.step_for)
    step_at_fire = first_step + fire_at // INTERVAL
    ctx = Ctx({"project": project, "experiment": experiment, **labels}, value,
              {n.STEP: step_at_fire, n.WINDOW_STEPS: 3, **(extra_ctx or {})}, modes)
    exp_labels = {**labels, "project": project, "experiment": experiment}
    return Case(name, ser, [Check(fire_at - INTERVAL, alert), Check(fire_at, alert, [Expect(exp_labels, ctx)])])


def quiet(alert: str, name: str, series: list[Series]) -> Case:
    return Case(name, series, [Check(ONSET + INTERVAL, alert), Check(5 * 60, alert)])


def window(metric: str, project: str, experiment: str, stat: str, values: str, **extra) -> Series:
    return Series(metric, {**({k: v for k, v in JOB.items()} if project != "p" else {}),
                           "project": project, "experiment": experiment, **extra, "stat": stat}, values)


def flat(v: float, samples: int = 20) -> str:
    return f"{num(v)}x{samples}"


# --- omniwatch.steps -------------------------------------------------------------------------------------
STEP_LABELS = {"severity": "warning", "persistence": "steps"}
LEGACY_COLOCATED = {"trainer": "legacy", "reward": "colocated", "async_mode": "sync"}
LEGACY_STREAMED = {"trainer": "legacy", "reward": "streamed", "async_mode": "sync"}
V1_COLOCATED = {"trainer": "v1", "reward": "colocated", "async_mode": "sync"}
V1_SYNC = {"trainer": "v1", "reward": "streamed", "async_mode": "sync"}
V1_ASYNC = {"trainer": "v1", "reward": "streamed", "async_mode": "separate_async"}


def reward_bound_cases(cfg: Config) -> list[Case]:
    t, share = cfg.reward_bound.ratio, cfg.reward_bound.step_share
    hi, lo = round(t + 0.15, 2), round(t * 0.5, 2)
    share_hi = round(share + 0.18, 2)
    out = []
    for exp, modes in (("qwen_ocr", LEGACY_COLOCATED), ("qwen_ocr_async", LEGACY_STREAMED),
                       ("wan_v1", V1_COLOCATED), ("unknown_layout", None)):
        out.append(fires(cfg, n.ALERT_REWARD_BOUND,
                         f"RewardBoundRollout fires at the window step that makes every step reward-bound "
                         f"({'no info series' if modes is None else modes['trainer'] + ', ' + modes['reward']} remedy)",
                         "flowgrpo", exp,
                         [window(n.REWARD_BOUND_WINDOW, "flowgrpo", exp, "min", onset(lo, hi)),
                          window(n.REWARD_STEP_SHARE_WINDOW, "flowgrpo", exp, "min", onset(share_hi, share_hi))]
                         + ([Series(n.GPU_HOURS_PER_DAY, run_labels("flowgrpo", exp, bucket="reward_critical_path"),
                                    f"40.2x{RUN_SAMPLES}")] if exp == "qwen_ocr" else []),
                         hi, STEP_LABELS, modes=modes,
                         extra_ctx={key_of(n.GPU_HOURS_PER_DAY, 'bucket="reward_critical_path"'): 40.2}
                         if exp == "qwen_ocr" else None))
    out.append(quiet(n.ALERT_REWARD_BOUND,
                     "RewardBoundRollout stays quiet for healthy, noisy, warm-up and actor-dominated runs", [
                         window(n.REWARD_BOUND_WINDOW, "p", "healthy_colocated", "min", flat(round(t * 0.5, 2))),
                         window(n.REWARD_STEP_SHARE_WINDOW, "p", "healthy_colocated", "min", flat(round(share * 0.6, 2))),
                         window(n.REWARD_BOUND_WINDOW, "p", "healthy_async", "min", flat(round(t * 0.15, 2))),
                         window(n.REWARD_BOUND_WINDOW, "p", "noisy", "min", flat(round(t * 0.55, 2))),
                         window(n.REWARD_BOUND_WINDOW, "p", "noisy", "max", f"{num(round(t * 0.55, 2))}x3 0.95x17"),
                         Series(n.REWARD_BOUND_RATIO, {"project": "p", "experiment": "warmup"}, flat(0.9)),
                         # reward holds the generation window but the step is actor-dominated: a reward pool
                         # would buy little and cost GPUs
                         window(n.REWARD_BOUND_WINDOW, "p", "actor_dominated", "min", flat(hi)),
                         window(n.REWARD_STEP_SHARE_WINDOW, "p", "actor_dominated", "min", flat(round(share * 0.5, 2))),
                     ]))
    return out


def idle_cases(cfg: Config) -> list[Case]:
    t = cfg.inter_stage_idle.ratio
    hi = round(t + 0.16, 2)
    gpu = {**STEP_LABELS, "evidence": "gpu"}
    timers = {**STEP_LABELS, "evidence": "timers"}
    out = []
    for exp, modes in (("wan_video", V1_SYNC), ("wan_video_async", V1_ASYNC), ("qwen_legacy", LEGACY_COLOCATED)):
        out.append(fires(cfg, n.ALERT_IDLE, f"InterStageIdleGPU fires on the timer residual ({modes['trainer']} "
                                            f"{modes['async_mode']} remedy)", "v1", exp,
                         [window(n.IDLE_WINDOW, "v1", exp, "min", onset(0.005, hi))], hi, timers, first_step=20,
                         modes=modes))
    out.append(fires(cfg, n.ALERT_IDLE, "InterStageIdleGPU fires on GPU evidence, once, even when the timer residual "
                                        "is also over", "v1", "gpu_measured",
                     [window(n.GPU_INTER_STAGE_IDLE_WINDOW, "v1", "gpu_measured", "min", onset(0.004, hi + 0.05)),
                      window(n.IDLE_WINDOW, "v1", "gpu_measured", "min", onset(0.005, hi + 0.07))],
                     hi + 0.05, gpu, first_step=20, modes=V1_SYNC))
    out.append(quiet(n.ALERT_IDLE, "InterStageIdleGPU stays quiet for healthy, noisy, warm-up runs and when the GPUs "
                                   "were busy during the untimed work", [
        window(n.IDLE_WINDOW, "p", "healthy", "min", flat(0.007)),
        window(n.IDLE_WINDOW, "p", "noisy", "min", flat(0.006)),
        window(n.IDLE_WINDOW, "p", "noisy", "max", "0.006x3 0.5x17"),
        Series(n.INTER_STAGE_IDLE_RATIO, {"project": "p", "experiment": "warmup"}, flat(0.6)),
        # untimed but the GPUs ran (a GPU-side transfer); GPU evidence just under the threshold is evidence too
        window(n.IDLE_WINDOW, "v1", "gpu_transfer", "min", flat(hi)),
        window(n.GPU_INTER_STAGE_IDLE_WINDOW, "v1", "gpu_transfer", "min", flat(0.02)),
        window(n.IDLE_WINDOW, "v1", "edge", "min", flat(0.4)),
        window(n.GPU_INTER_STAGE_IDLE_WINDOW, "v1", "edge", "min", flat(t)),
    ]))
    # timers per run; hand-over when GPU evidence appears (low, silences) and is withdrawn again
    v = round(t + 0.2, 2)
    ctx = lambda e: Ctx({"project": "v1", "experiment": e, **timers}, v, {}, None)  # noqa: E731
    exp = lambda e: Expect({**timers, "project": "v1", "experiment": e}, ctx(e))  # noqa: E731
    out.append(Case("InterStageIdleGPU falls back to timers per run, and hands over when GPU evidence appears or goes", [
        window(n.IDLE_WINDOW, "v1", "timers_only", "min", flat(v)),
        window(n.GPU_INTER_STAGE_IDLE_WINDOW, "v1", "other", "min", flat(0.01)),
        window(n.IDLE_WINDOW, "v1", "handover", "min", flat(v)),
        window(n.GPU_INTER_STAGE_IDLE_WINDOW, "v1", "handover", "min", "_x4 0.03x5 stale"),
    ], [Check(0, n.ALERT_IDLE), Check(45, n.ALERT_IDLE, [exp("timers_only"), exp("handover")]),
        Check(60, n.ALERT_IDLE, [exp("timers_only")]), Check(150, n.ALERT_IDLE, [exp("timers_only")]),
        Check(165, n.ALERT_IDLE, [exp("timers_only"), exp("handover")])],
        "GPU window present (low) from 60 s, withdrawn (stale: steps awaiting samples) at 150 s."))
    return out


def mfu_cases(cfg: Config) -> list[Case]:
    c = cfg.mfu
    out = []
    role = {"role": "actor"}
    cause = Series(n.MFU_SUSPECTED_CAUSE, run_labels("flowgrpo", "l20x", role="actor", cause="relabeled_sku"), "0x3 1x6")
    peak = Series(n.MFU_DEVICE_PEAK, run_labels("flowgrpo", "l20x", role="actor"), "989x9")
    out.append(fires(cfg, n.ALERT_MFU_IMPOSSIBLE, "MFUImpossible fires when every window step reports MFU above 1, "
                                                  "naming the suspected cause and the silicon's peak",
                     "flowgrpo", "l20x", [window(n.MFU_WINDOW, "flowgrpo", "l20x", "min", onset(0.45, 2.62), role="actor"),
                                          cause, peak],
                     2.62, {**STEP_LABELS, "evidence": "value", **role}, first_step=3, modes=LEGACY_COLOCATED,
                     extra_ctx={f"{n.MFU_SUSPECTED_CAUSE}:cause": "relabeled_sku", n.MFU_DEVICE_PEAK: 989}))
    out.append(fires(cfg, n.ALERT_MFU_IMPOSSIBLE, "MFUImpossible fires on a relabeled GPU although the inflated MFU is "
                                                  "below 1 (no silicon peak known: the remedy says which number to use)",
                     "flowgrpo", "l20x_low",
                     [window(n.MFU_WINDOW, "flowgrpo", "l20x_low", "min", flat(0.8, RUN_SAMPLES), role="actor"),
                      Series(n.MFU_SUSPECTED_CAUSE, run_labels("flowgrpo", "l20x_low", role="actor", cause="relabeled_sku"),
                             "0x3 1x6")],
                     1, {**STEP_LABELS, "evidence": "device", **role}, first_step=3))
    sp4 = run_labels("flowgrpo", "sp4_hot")
    out.append(fires(cfg, n.ALERT_MFU_IMPOSSIBLE, "MFUImpossible judges MFU per GPU with the trainer config's Ulysses "
                                                  "SP: reported 4.8 at SP=4 is 1.2 per GPU, still impossible",
                     "flowgrpo", "sp4_hot", [window(n.MFU_WINDOW, "flowgrpo", "sp4_hot", "min", onset(1.12, 4.8),
                                                    role="actor"),
                                             Series(n.TRAINER_CONFIG_SP, sp4, flat(4, RUN_SAMPLES))],
                     1.2, {**STEP_LABELS, "evidence": "value", **role}, first_step=3,
                     extra_ctx={n.TRAINER_CONFIG_SP: 4}))
    nocfg = run_labels("flowgrpo", "no_config", source="none", engine="unknown", trainer="unknown",
                       async_mode="unknown", lora="unknown")
    out.append(fires(cfg, n.ALERT_MFU_IMPOSSIBLE, "MFUImpossible on a run without a trainer config says that "
                                                  "Ulysses SP=1 was assumed",
                     "flowgrpo", "no_config", [window(n.MFU_WINDOW, "flowgrpo", "no_config", "min", onset(0.45, 1.12),
                                                      role="actor"),
                                               Series(n.TRAINER_CONFIG_INFO, nocfg, flat(1, RUN_SAMPLES))],
                     1.12, {**STEP_LABELS, "evidence": "value", **role}, first_step=3,
                     extra_ctx={key_of(n.TRAINER_CONFIG_INFO, 'source="none"'): 1}))
    out.append(quiet(n.ALERT_MFU_IMPOSSIBLE, "MFUImpossible stays quiet for healthy, noisy and warm-up runs and a healthy SP=4 run reporting 1.12", [
        window(n.MFU_WINDOW, "p", "healthy", "min", flat(0.45), role="actor"),
        window(n.MFU_WINDOW, "p", "noisy", "min", flat(0.45), role="actor"),
        window(n.MFU_WINDOW, "p", "noisy", "max", "0.45x3 1.4x17", role="actor"),
        Series(n.MFU, {"project": "p", "experiment": "warmup", "role": "actor"}, flat(2.62)),
        # Ulysses SP=4 (trainer config): VeRL-Omni reports 4 x the per-GPU MFU; 1.12 is 0.28 per GPU
        window(n.MFU_WINDOW, "p", "sp4", "min", flat(1.12), role="actor"),
        Series(n.TRAINER_CONFIG_SP, {"project": "p", "experiment": "sp4"}, flat(4)),
        Series(n.MFU_SUSPECTED_CAUSE, {"project": "p", "experiment": "other_cause", "role": "actor",
                                       "cause": "flops_overcount"}, flat(1)),
    ]))
    low = round(c.floor / 25, 4)
    out.append(fires(cfg, n.ALERT_MFU_LOW, "MFUImplausiblyLow fires when even the best window step is two orders of "
                                           "magnitude under a plausible MFU", "flowgrpo", "tiny",
                     [window(n.MFU_WINDOW, "flowgrpo", "tiny", "max", onset(0.3, low), role="actor")],
                     low, {**STEP_LABELS, **role}))
    out.append(quiet(n.ALERT_MFU_LOW, "MFUImplausiblyLow stays quiet for healthy LoRA and offloaded full-FT runs, "
                                      "and for an unsupported estimator (zeros are not in the window)", [
        window(n.MFU_WINDOW, "p", "lora_h200", "max", flat(0.31), role="actor"),
        window(n.MFU_WINDOW, "p", "full_ft_offload_sp2", "max", flat(0.17), role="actor"),
        window(n.MFU_WINDOW, "p", "noisy", "min", flat(0.01), role="actor"),
        window(n.MFU_WINDOW, "p", "noisy", "max", flat(0.2), role="actor"),
        Series(n.MFU, {"project": "p", "experiment": "unsupported", "role": "actor"}, flat(0)),
    ]))
    out.append(fires(cfg, n.ALERT_MFU_UNSUPPORTED, "MFUEstimatorUnsupported is an info finding when MFU is exactly 0",
                     "flowgrpo", "qwen_edit",
                     [Series(n.MFU_UNSUPPORTED, run_labels("flowgrpo", "qwen_edit", role="actor"), onset(0, 1))],
                     1, {"severity": "info", "persistence": "steps", **role}))
    base, drop = 0.5, round(0.5 * c.drop_ratio * 0.85, 3)
    out.append(fires(cfg, n.ALERT_MFU_DROP, f"MFUDrop fires when the window's best MFU falls under "
                                            f"{c.drop_ratio:g} x the baseline", "flowgrpo", "qwen_full",
                     [window(n.MFU_WINDOW, "flowgrpo", "qwen_full", "max", onset(0.46, drop), role="actor"),
                      Series(n.MFU_BASELINE, run_labels("flowgrpo", "qwen_full", role="actor"), f"{base}x9")],
                     drop / base, {**STEP_LABELS, **role}, first_step=30))
    out.append(quiet(n.ALERT_MFU_DROP, "MFUDrop stays quiet for healthy, noisy, unsupported-estimator and warm-up runs", [
        window(n.MFU_WINDOW, "p", "healthy", "max", flat(0.44), role="actor"),
        Series(n.MFU_BASELINE, {"project": "p", "experiment": "healthy", "role": "actor"}, flat(0.5)),
        window(n.MFU_WINDOW, "p", "noisy", "min", "0.5x3 0.1x17", role="actor"),
        window(n.MFU_WINDOW, "p", "noisy", "max", flat(0.5), role="actor"),
        Series(n.MFU_BASELINE, {"project": "p", "experiment": "noisy", "role": "actor"}, flat(0.5)),
        window(n.MFU_WINDOW, "p", "warmup", "max", flat(0.1), role="actor"),
        window(n.MFU_WINDOW, "p", "zero", "max", flat(0.1), role="actor"),
        Series(n.MFU_BASELINE, {"project": "p", "experiment": "zero", "role": "actor"}, flat(0)),
    ]))
    return out


def step_time_cases(cfg: Config) -> list[Case]:
    r = cfg.step_time.regression_ratio
    base = 250
    slow = round(base * (r + 0.05))
    out = []
    for cause_name in ("actor", "reward", "rollout"):
        exp = f"qwen_{cause_name}"
        causes = [Series(n.STEP_REGRESSION, run_labels("flowgrpo", exp, cause=c),
                         f"0x3 {num(40 if c == cause_name else 3)}x6") for c in ("actor", "reward", "rollout")]
        out.append(fires(cfg, n.ALERT_STEP_REGRESSION, f"StepTimeRegression fires with the cause that grew most "
                                                       f"({cause_name})", "flowgrpo", exp,
                         [window(n.STEP_DURATION_WINDOW, "flowgrpo", exp, "min", onset(252, slow)),
                          Series(n.STEP_DURATION_BASELINE, run_labels("flowgrpo", exp), f"{base}x9"), *causes],
                         slow / base, {**STEP_LABELS, "cause": cause_name}, first_step=30))
    out.append(fires(cfg, n.ALERT_STEP_REGRESSION, "StepTimeRegression still fires when the exporter names no cause",
                     "flowgrpo", "no_cause",
                     [window(n.STEP_DURATION_WINDOW, "flowgrpo", "no_cause", "min", onset(252, slow)),
                      Series(n.STEP_DURATION_BASELINE, run_labels("flowgrpo", "no_cause"), f"{base}x9")],
                     slow / base, STEP_LABELS, first_step=30))
    out.append(quiet(n.ALERT_STEP_REGRESSION, "StepTimeRegression stays quiet for healthy, noisy and warm-up runs", [
        window(n.STEP_DURATION_WINDOW, "p", "healthy", "min", flat(round(base * (1 + (r - 1) * 0.6)))),
        Series(n.STEP_DURATION_BASELINE, {"project": "p", "experiment": "healthy"}, flat(base)),
        window(n.STEP_DURATION_WINDOW, "p", "noisy", "min", flat(base)),
        window(n.STEP_DURATION_WINDOW, "p", "noisy", "max", f"{base}x3 900x17"),
        Series(n.STEP_DURATION_BASELINE, {"project": "p", "experiment": "noisy"}, flat(base)),
        Series(n.STEP_DURATION, {"project": "p", "experiment": "warmup"}, flat(900)),
    ]))
    d = cfg.step_drift.ratio
    crept = round(d + 0.05, 2)
    causes = [Series(n.STEP_DRIFT, run_labels("flowgrpo", "creep", cause=c), f"0x3 {num(25 if c == 'rollout' else 4)}x6")
              for c in ("actor", "rollout")]
    out.append(fires(cfg, n.ALERT_STEP_DRIFT, f"StepTimeDrift fires when the median of the last steps crept over "
                                              f"{d:g} x the reference, naming the part that grew", "flowgrpo", "creep",
                     [Series(n.STEP_DURATION_DRIFT, run_labels("flowgrpo", "creep"), onset(1.05, crept)), *causes,
                      window(n.STEP_DURATION_WINDOW, "flowgrpo", "creep", "median", flat(round(250 * (d + 0.08)))),
                      Series(n.STEP_DURATION_BASELINE, run_labels("flowgrpo", "creep"), flat(250))],
                     crept, STEP_LABELS, first_step=60,
                     extra_ctx={f"{REC_STEP_DRIFT_CAUSE_TOP}:cause": "rollout"}))
    out.append(quiet(n.ALERT_STEP_DRIFT, "StepTimeDrift stays quiet for healthy runs and runs without a drift value yet", [
        Series(n.STEP_DURATION_DRIFT, {"project": "p", "experiment": "healthy"}, flat(round(1 + (d - 1) * 0.7, 3))),
        # an episode that ended: the 10-step median still lags over the threshold, the last k steps are back
        Series(n.STEP_DURATION_DRIFT, {"project": "p", "experiment": "ended"}, flat(round(d + 0.1, 2))),
        window(n.STEP_DURATION_WINDOW, "p", "ended", "median", flat(252)),
        Series(n.STEP_DURATION_BASELINE, {"project": "p", "experiment": "ended"}, flat(250)),
        Series(n.STEP_DURATION, {"project": "p", "experiment": "early"}, flat(900)),
    ]))
    return out


def saturation_cases(cfg: Config) -> list[Case]:
    t = cfg.reward_saturation.zero_std_ratio
    hi = round(t + 0.25, 2)
    return [
        fires(cfg, n.ALERT_REWARD_SATURATION, "RewardSaturation fires when every window step has most groups at zero std",
              "flowgrpo", "sd35_ocr", [window(n.ZERO_STD_WINDOW, "flowgrpo", "sd35_ocr", "min", onset(0.1, hi))],
              hi, STEP_LABELS, first_step=200),
        quiet(n.ALERT_REWARD_SATURATION, "RewardSaturation stays quiet for healthy, noisy and warm-up runs", [
            window(n.ZERO_STD_WINDOW, "p", "healthy", "min", flat(round(t * 0.4, 2))),
            window(n.ZERO_STD_WINDOW, "p", "noisy", "min", flat(round(t * 0.6, 2))),
            window(n.ZERO_STD_WINDOW, "p", "noisy", "max", f"{num(round(t * 0.6, 2))}x3 0.9x17"),
            Series("verl_critic_rewards_zero_std_ratio", {"project": "p", "experiment": "warmup",
                                                          "key": "critic/rewards/zero_std_ratio"}, flat(0.9)),
        ]),
    ]


def steps_cases(cfg: Config) -> list[Case]:
    return (reward_bound_cases(cfg) + idle_cases(cfg) + mfu_cases(cfg) + step_time_cases(cfg)
            + saturation_cases(cfg))


# --- omniwatch.health ------------------------------------------------------------------------------------
def health_cases(cfg: Config) -> list[Case]:
    c = cfg
    out = []
    # TrainingStalled in stages (info, warning, critical) and quiet through planned work: alerting/stalls.py
    out += stalls.cases(c)
    out += holder.cases(c)  # ... and names who holds the step (alerting/holder.py)
    out.append(quiet(n.ALERT_STALLED, "TrainingStalled stays quiet while steps arrive, through one slow step, and before "
                                      "the run has a typical step", [
        Series(n.LAST_STEP_TS, {"project": "p", "experiment": "healthy"}, " ".join(str(30 * (i // 2)) for i in range(21))),
        Series(n.TYPICAL_STEP, {"project": "p", "experiment": "healthy"}, flat(30)),
        Series(n.LAST_STEP_TS, {"project": "p", "experiment": "slow_step"},
               "0 0 0 0 0 " + " ".join(str(75 + 30 * (i // 2)) for i in range(16))),
        Series(n.TYPICAL_STEP, {"project": "p", "experiment": "slow_step"}, flat(30)),
        Series(n.LAST_STEP_TS, {"project": "p", "experiment": "warmup"}, flat(0)),
    ]))

    # GPUMemoryNearFull: one GPU per source over the ratio from 3m.
    g = c.gpu_memory
    hold = dur(g.for_)
    start = 12 * INTERVAL
    total = (start + hold) // INTERVAL + 10
    over_o = 146e9 / 150e9
    assert over_o > g.ratio, "test values must exceed the configured memory ratio"
    mem = lambda node, gpu, src, v: Expect({"severity": "warning", "source": src, "node": node, "gpu": gpu},  # noqa: E731
                                           Ctx({"node": node, "gpu": gpu, "source": src}, v))
    out.append(Case(f"GPUMemoryNearFull fires from omniwatch NVML, dcgm-exporter and Ray gauges after {g.for_}", [
        Series(n.GPU_MEMORY_USED, {"job": "omniwatch", "node": "gpu-node-0", "gpu": "0", "uuid": "GPU-aaaa"}, f"70e9x11 146e9x{total - 12}"),
        Series(n.GPU_MEMORY_TOTAL, {"job": "omniwatch", "node": "gpu-node-0", "gpu": "0", "uuid": "GPU-aaaa"}, f"150e9x{total}"),
        Series("DCGM_FI_DEV_FB_USED", {"job": "dcgm", "Hostname": "gpu-node-1", "gpu": "3", "UUID": "GPU-bbbb", "modelName": "NVIDIA H200"}, f"60000x11 139000x{total - 12}"),
        Series("DCGM_FI_DEV_FB_FREE", {"job": "dcgm", "Hostname": "gpu-node-1", "gpu": "3", "UUID": "GPU-bbbb", "modelName": "NVIDIA H200"}, f"83000x11 4000x{total - 12}"),
        Series("ray_node_gram_used", {"job": "ray", "ip": "10.0.0.7", "GpuIndex": "1", "GpuDeviceName": "NVIDIA H200", "SessionName": "s"}, f"60000x11 139000x{total - 12}"),
        Series("ray_node_gram_available", {"job": "ray", "ip": "10.0.0.7", "GpuIndex": "1", "GpuDeviceName": "NVIDIA H200", "SessionName": "s"}, f"83000x11 4000x{total - 12}"),
    ], [Check(start + hold - INTERVAL, "GPUMemoryNearFull"),
        Check(start + hold, "GPUMemoryNearFull", [mem("gpu-node-0", "0", "omniwatch", over_o),
                                                    mem("gpu-node-1", "3", "dcgm", 139000 / 143000),
                                                    mem("10.0.0.7", "1", "ray", 139000 / 143000)])]))
    peak = max(1, hold // INTERVAL // 2)   # a peak shorter than `for:` (a weight sync) that drops back
    healthy = round((g.ratio - 0.05) * 143000)  # just under the ratio all the time (vLLM's reservation)
    long = 2 * (hold // INTERVAL) + 10
    out.append(Case("GPUMemoryNearFull ignores short peaks, healthy GPUs and a zero total", [
        Series(n.GPU_MEMORY_USED, {"node": "n", "gpu": "0", "uuid": "GPU-a"}, f"70e9x3 149e9x{peak} 70e9x{long}"),
        Series(n.GPU_MEMORY_TOTAL, {"node": "n", "gpu": "0", "uuid": "GPU-a"}, f"150e9x{long + peak + 4}"),
        Series("DCGM_FI_DEV_FB_USED", {"Hostname": "n", "gpu": "1"}, f"{healthy}x{long}"),
        Series("DCGM_FI_DEV_FB_FREE", {"Hostname": "n", "gpu": "1"}, f"{143000 - healthy}x{long}"),
        Series("ray_node_gram_used", {"ip": "n", "GpuIndex": "2"}, f"0x{long}"),
        Series("ray_node_gram_available", {"ip": "n", "GpuIndex": "2"}, f"0x{long}"),
    ], [Check(2 * hold, "GPUMemoryNearFull")]))

    # OmniwatchSourceDown
    hold = dur(c.source_down.for_)
    samples = (ONSET + hold) // INTERVAL + 6
    src_labels = {**JOB, "source": "jsonl", "target": "/runs/flowgrpo/qwen_ocr.jsonl"}
    out.append(Case(f"OmniwatchSourceDown warns once a source has failed for {c.source_down.for_}", [
        Series(n.SOURCE_UP, src_labels, f"1x3 0x{samples}"),
        Series(n.SOURCE_UP, {**JOB, "source": "ray", "target": "10.0.0.7:8265"}, f"1x{samples + 3}"),
        Series("up", JOB, f"1x{samples + 3}"),
    ], [Check(ONSET + hold - INTERVAL, n.ALERT_SOURCE_DOWN),
        Check(ONSET + hold, n.ALERT_SOURCE_DOWN, [Expect({"severity": "warning", **src_labels}, Ctx(src_labels))])]))
    out.append(Case("OmniwatchSourceDown is critical when Prometheus cannot scrape the exporter", [
        Series("up", JOB, f"1x3 0x{samples}"),
        Series("up", {"job": "prometheus", "instance": "127.0.0.1:9090"}, f"1x{samples + 3}"),
    ], [Check(ONSET + hold - INTERVAL, n.ALERT_SOURCE_DOWN),
        Check(ONSET + hold, n.ALERT_SOURCE_DOWN, [Expect({"severity": "critical", **JOB}, Ctx(JOB))])]))
    out.append(Case("OmniwatchSourceDown is critical when the exporter is missing from the targets", [
        Series("up", {"job": "prometheus", "instance": "127.0.0.1:9090"}, f"1x{samples + 3}"),
    ], [Check(hold - INTERVAL, n.ALERT_SOURCE_DOWN),
        Check(hold, n.ALERT_SOURCE_DOWN, [Expect({"severity": "critical", "job": c.selectors.job}, Ctx({"job": c.selectors.job}))])]))
    blip = max(1, hold // INTERVAL - 4)
    out.append(quiet(n.ALERT_SOURCE_DOWN, "OmniwatchSourceDown stays quiet while everything is up, and through a short blip", [
        Series("up", JOB, f"1x3 0x{blip} 1x20"),
        Series(n.SOURCE_UP, {**JOB, "source": "jsonl", "target": "/runs/a.jsonl"}, f"1x3 0x{blip} 1x20"),
    ]))
    # RunCapReached: a run dropped at the cap (the counter moves from 0 to 1 at 60 s).
    out.append(Case(f"{n.ALERT_RUN_CAP} warns as soon as a run is dropped at the run cap", [
        Series(n.RUNS_EVICTED_TOTAL, JOB, "0x3 1x20"),
    ], [Check(ONSET - INTERVAL, n.ALERT_RUN_CAP),
        Check(ONSET + INTERVAL, n.ALERT_RUN_CAP, [Expect({"severity": "warning", **JOB}, Ctx(JOB))])]))
    out.append(quiet(n.ALERT_RUN_CAP, f"{n.ALERT_RUN_CAP} stays quiet while no run is dropped (at the cap or not)", [
        Series(n.RUNS_EVICTED_TOTAL, JOB, "0x40"),
        Series(n.MAX_RUNS, JOB, "64x40"),
    ]))
    out.append(Case("Watchdog always fires", [], [Check(0, "Watchdog", [Expect({"severity": "none"}, Ctx({}))])]))
    return out


HEADER = """\
promtool unit tests of {what} (group {group}).
GENERATED by `omniwatch rules generate` from exporter/omniwatch/alerting/promtests.py: inputs either side
of each threshold of config.py, checks just before and just after each `for:`, and expected annotations
rendered from the alerts' own prose. Do not edit. Run: promtool test rules alerts/tests/*.yml
"""


def test_files(cfg: Config) -> dict[str, str]:
    return {
        **{name: render(cfg, *t) for name, t in endpoints.test_specs(cfg).items()},
        "steps.test.yml": render(cfg, steps_cases(cfg), "omniwatch.rules.yml",
                                 HEADER.format(what="the step-based alerts", group="omniwatch.steps")),
        "signals.test.yml": render(cfg, signals_cases(cfg), "omniwatch.rules.yml",
                                   HEADER.format(what="the signal alerts", group="omniwatch.signals")),
        "health.test.yml": render(cfg, health_cases(cfg), "omniwatch.rules.yml",
                                  HEADER.format(what="liveness, GPU memory and the monitoring pipeline", group="omniwatch.health")),
    }


# --- omniwatch.signals ------------------------------------------------------------------------------------
def straggler_cases(cfg: Config) -> list[Case]:
    t = cfg.straggler.ratio
    hi = round(t + 0.5, 2)
    return [
        fires(cfg, n.ALERT_STRAGGLER, "RolloutStraggler fires when the slowest sample of every window step is far "
                                      "beyond what queueing explains", "flowgrpo", "qwen_tail",
              [window(n.ROLLOUT_STRAGGLER_WINDOW, "flowgrpo", "qwen_tail", "min", onset(1.43, hi))],
              hi, STEP_LABELS, first_step=40, modes=LEGACY_COLOCATED),
        quiet(n.ALERT_STRAGGLER, "RolloutStraggler stays quiet for equal waves of requests (< 2x), one slow step, "
                                 "the warm-up and just under the threshold", [
            window(n.ROLLOUT_STRAGGLER_WINDOW, "p", "healthy", "min", flat(1.43)),
            window(n.ROLLOUT_STRAGGLER_WINDOW, "p", "many_waves", "min", flat(1.95)),
            window(n.ROLLOUT_STRAGGLER_WINDOW, "p", "one_slow_step", "min", flat(1.43)),
            window(n.ROLLOUT_STRAGGLER_WINDOW, "p", "one_slow_step", "max", "1.43x3 4x17"),
            window(n.ROLLOUT_STRAGGLER_WINDOW, "p", "edge", "min", flat(t)),
            Series(n.ROLLOUT_STRAGGLER, {"project": "p", "experiment": "warmup"}, flat(5)),
        ]),
    ]


def grad_nonfinite_cases(cfg: Config) -> list[Case]:
    k = cfg.grad_norm.nonfinite_steps
    return [
        fires(cfg, n.ALERT_GRAD_NONFINITE, f"GradNormNonFinite fires at the {k}th skipped update among the recent "
                                           "normal steps", "flowgrpo", "qwen_nan",
              [Series(n.GRAD_NORM_NONFINITE_RECENT, run_labels("flowgrpo", "qwen_nan"), onset(max(0, k - 1), k))],
              k, STEP_LABELS, first_step=60),
        fires(cfg, n.ALERT_GRAD_NONFINITE, "GradNormNonFinite names how many of the recent updates were skipped",
              "flowgrpo", "all_nan",
              [Series(n.GRAD_NORM_NONFINITE_RECENT, run_labels("flowgrpo", "all_nan"), onset(0, 20))],
              20, STEP_LABELS, first_step=80),
        quiet(n.ALERT_GRAD_NONFINITE, "GradNormNonFinite stays quiet for a single or a second isolated skip", [
            Series(n.GRAD_NORM_NONFINITE_RECENT, {"project": "p", "experiment": "healthy"}, flat(0)),
            Series(n.GRAD_NORM_NONFINITE_RECENT, {"project": "p", "experiment": "isolated"}, flat(k - 1)),
            Series(n.GRAD_NORM_NONFINITE, {"project": "p", "experiment": "one_skip"}, flat(1)),
            Series(n.GRAD_NORM_NONFINITE_TOTAL, {"project": "p", "experiment": "long_run"}, flat(40)),
        ]),
    ]


def rs_rejection_cases(cfg: Config) -> list[Case]:
    t = cfg.rollout_rejection.seq_masked_fraction
    hi = round(t * 2.4, 3)
    out = []
    for mode in ("bypass", "decoupled"):
        exp = f"qwen_rc_{mode}"
        out.append(fires(cfg, n.ALERT_RS_REJECTION, f"RolloutRejectionHigh fires when every window step masks more "
                                                    f"than the documented level ({mode} mode remedy)", "flowgrpo", exp,
                         [window(n.RS_SEQ_MASKED_WINDOW, "flowgrpo", exp, "min", onset(0.01, hi), mode=mode)],
                         hi, {**STEP_LABELS, "mode": mode}, first_step=30))
    out.append(quiet(n.ALERT_RS_REJECTION, "RolloutRejectionHigh stays quiet for matched backends, one bad step and "
                                           "at the documented level", [
        window(n.RS_SEQ_MASKED_WINDOW, "p", "healthy", "min", flat(0.01), mode="bypass"),
        window(n.RS_SEQ_MASKED_WINDOW, "p", "noisy", "min", flat(0.012), mode="decoupled"),
        window(n.RS_SEQ_MASKED_WINDOW, "p", "noisy", "max", "0.012x3 0.4x17", mode="decoupled"),
        window(n.RS_SEQ_MASKED_WINDOW, "p", "edge", "min", flat(t), mode="bypass"),
    ]))
    return out


def outside_step_cases(cfg: Config) -> list[Case]:
    t = cfg.outside_step.ratio
    hi = round(t + 0.14, 2)
    out = []
    for exp, modes in (("wan_v1", V1_SYNC), ("qwen_legacy", LEGACY_COLOCATED), ("unknown_layout", None)):
        out.append(fires(cfg, n.ALERT_OUTSIDE_STEP, f"TimeOutsideStep fires when every window step spends more than "
                                                    f"the threshold outside the timers "
                                                    f"({'no info series' if modes is None else modes['trainer']} remedy)",
                         "flowgrpo", exp,
                         [window(n.OUTSIDE_STEP_WINDOW, "flowgrpo", exp, "min", onset(0.004, hi)),
                          Series(n.OUTSIDE_STEP_SECONDS, run_labels("flowgrpo", exp), f"1x3 75x{RUN_SAMPLES - 4}")],
                         hi, STEP_LABELS, first_step=25, modes=modes, extra_ctx={n.OUTSIDE_STEP_SECONDS: 75}))
    out.append(quiet(n.ALERT_OUTSIDE_STEP, "TimeOutsideStep stays quiet for healthy runs, one slow gap (a resume after "
                                           "a pause) and at the threshold", [
        window(n.OUTSIDE_STEP_WINDOW, "p", "healthy", "min", flat(0.003)),
        window(n.OUTSIDE_STEP_WINDOW, "p", "one_gap", "min", flat(0.004)),
        window(n.OUTSIDE_STEP_WINDOW, "p", "one_gap", "max", "0.004x3 0.9x17"),
        Series(n.OUTSIDE_STEP_SECONDS, {"project": "p", "experiment": "one_gap"}, "1x3 3000x17"),
        window(n.OUTSIDE_STEP_WINDOW, "p", "edge", "min", flat(t)),
    ]))
    return out


def timers_exceed_cases(cfg: Config) -> list[Case]:
    tol = cfg.timer_overlap.tolerance
    lo = -round(tol * 4.4, 4)
    info = {"severity": "info", "persistence": "steps"}
    return [
        fires(cfg, n.ALERT_TIMERS_EXCEED, "TimersExceedStep fires once every window step's timers exceed the step",
              "flowgrpo", "nested_timer",
              [window(n.TIMER_RESIDUAL_WINDOW, "flowgrpo", "nested_timer", "max", onset(0.006, lo))],
              lo, info, first_step=12),
        quiet(n.ALERT_TIMERS_EXCEED, "TimersExceedStep stays quiet while the timers leave a residual, for one "
                                     "overlapping step and at the tolerance", [
            window(n.TIMER_RESIDUAL_WINDOW, "p", "healthy", "max", flat(0.006)),
            window(n.TIMER_RESIDUAL_WINDOW, "p", "one_step", "max", flat(0.006)),
            window(n.TIMER_RESIDUAL_WINDOW, "p", "one_step", "min", "0.006x3 -0.05x17"),
            window(n.TIMER_RESIDUAL_WINDOW, "p", "edge", "max", flat(-tol)),
            Series(n.TIMER_RESIDUAL, {"project": "p", "experiment": "latest_only"}, flat(-30)),
        ]),
    ]


def signals_cases(cfg: Config) -> list[Case]:
    return (straggler_cases(cfg) + grad_nonfinite_cases(cfg) + rs_rejection_cases(cfg) + outside_step_cases(cfg)
            + timers_exceed_cases(cfg) + rankstraggler.cases(cfg))
