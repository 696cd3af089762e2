"""Rollout engine: vLLM-Omni diffusion replicas and the reward-model vLLM servers (LLM judges), per run
and replica. Both are scraped with target labels project, experiment, role and replica, which is what
joins their series to a run; every aggregation keeps them.

vLLM-Omni's metric prefix depends on its version: ``vllm_omni:`` (current), ``vllm:omni_`` (before vllm
PR #42331; pipeline families only) and upstream ``vllm:`` per engine for AR stages. Every panel reads
all the forms alerts/endpoints.rules.yml accepts (``a or b or c``: the first form a replica exposes),
the scheduler panels through the rules' own replica:* recording rules."""
from __future__ import annotations

from .. import names as n
from ..config import Config
from ..alerting.records import (REC_ROLLOUT_RUNNING, REC_ROLLOUT_SATURATED, REC_ROLLOUT_SLOTS_USED,
                                REC_ROLLOUT_WAITING)
from .. import external as x
from .panels import saturation_rule, ALERT_ROLLOUT_SATURATED, EXP, Dashboard, Panel, Row, Step, Target, by_run, cfg_step, default_tags, first_of, hist_mean, hist_quantile, rate, run_max, sel

R = x.L_REPLICA
ROLLOUT = {x.L_ROLE: x.ROLE_ROLLOUT}
REWARD = {x.L_ROLE: x.ROLE_REWARD}
BY = by_run(x.L_ROLE, R)
LEG = EXP + " {{role}} {{replica}}"


def replica(record: str, **extra: str) -> str:
    return run_max(sel(record, **extra), x.L_ROLE, R)


def e2e_mean(**extra: str) -> str:
    return first_of(hist_mean(x.OMNI_E2E, BY, **extra), hist_mean(x.OMNI_V0_E2E, BY, **extra),
                    hist_mean(x.VLLM_E2E, BY, **extra))


def e2e_p90(**extra: str) -> str:
    return first_of(*(hist_quantile(0.9, m, BY, **extra) for m in (x.OMNI_E2E, x.OMNI_V0_E2E, x.VLLM_E2E)))


def successes(**extra: str) -> str:
    return first_of(*(f"sum by ({BY}) ({rate(sel(m, **extra))})" for m in (x.OMNI_SUCCESS, x.OMNI_V0_SUCCESS,
                                                                          x.VLLM_SUCCESS)))


def dashboard(cfg: Config) -> Dashboard:
    """This dashboard drawn with ``cfg`` (thresholds, windows, selectors, the words of its descriptions)."""
    SERVERS = Row("Rollout and reward replicas", (
        Panel("Slots used",
              "Requests running / the replica's slot ceiling (max_num_seqs when omniwatch knows it, else the replica's "
              f"own 10-minute peak of running): the rules' {REC_ROLLOUT_SLOTS_USED}, every metric name "
              "form. At 1 every slot runs; below 1 during gen the trainer is not feeding the replica.",
              (Target(replica(REC_ROLLOUT_SLOTS_USED), LEG),), unit="percentunit", min=0, w=8,
              runbook=ALERT_ROLLOUT_SATURATED),
        Panel("Saturated share (10 min)",
              lambda CONFIG: ("Share of the last 10 minutes a replica had requests waiting while every slot ran "
              f"({REC_ROLLOUT_SATURATED}). {saturation_rule(CONFIG)} A generation burst saturates part of every "
              "step; a replica far above the others is a straggler."),
              (Target(replica(REC_ROLLOUT_SATURATED), LEG),), unit="percentunit", min=0, max=1,
              thresholds=(Step(None, "green"), cfg_step(cfg, "rollout_queue.saturated_share", "red")),
              show_thresholds="dashed+area", w=8, runbook=ALERT_ROLLOUT_SATURATED),
        Panel("Scheduler state",
              "Requests running and waiting per replica (the rules' replica:* recording rules: vllm_omni:, vllm:omni_ "
              "or vllm: num_requests_*). Waiting > 0 while running sits at max_num_seqs means the replica is saturated; "
              "a standing reward queue means scoring cannot keep up with generation.",
              (Target(replica(REC_ROLLOUT_RUNNING), LEG + " running"),
               Target(replica(REC_ROLLOUT_WAITING), LEG + " waiting", dashed=True)),
              unit="none", min=0, w=8, runbook=(ALERT_ROLLOUT_SATURATED, n.ALERT_REWARD_BOUND)),
        Panel("Rollout end-to-end request latency",
              "Mean and P90 of the rollout replicas' end-to-end request latency (vllm_omni:e2e_request_latency_s, "
              "vllm:omni_e2e_request_latency_s or vllm:e2e_request_latency_seconds). One replica far above the others "
              "is a straggler that sets the gen time of every step; the run-level straggler ratio (slowest sample / "
              "mean sample, RolloutStraggler) is on Bottlenecks, row Stragglers.",
              (Target(e2e_mean(**ROLLOUT), LEG + " mean"), Target(e2e_p90(**ROLLOUT), LEG + " p90", dashed=True)),
              unit="s", min=0, w=8, runbook=n.ALERT_STRAGGLER),
        Panel("Finished requests",
              "Finished requests per second per replica (requests_success_total in any name form).",
              (Target(successes(**ROLLOUT), LEG),), unit="reqps", min=0, w=8),
        Panel("Images per second",
              "Images generated per second per replica (vllm_omni:image_count_total). Drops with unchanged request "
              "rate mean fewer images per request.",
              (Target(f"sum by ({BY}) ({rate(sel(x.OMNI_IMAGES, **ROLLOUT))})", LEG),), unit="suffix: images/s", min=0, w=8),
    ))

    DIFFUSION = Row("Diffusion timing (vllm_omni: only)", (
        Panel("DiT execution per denoising step", "Mean seconds per denoising step (vllm_omni:diffusion_exec_per_step_s). "
              "Independent of the step count, so a rise is a slower GPU (throttling, a co-located process) or "
              "larger images.",
              (Target(hist_mean(x.OMNI_EXEC_PER_STEP, BY, **ROLLOUT), LEG),),
              unit="s", min=0, w=8),
        Panel("DiT execution per request", "Mean and P90 of vllm_omni:diffusion_exec_s (all denoising steps of a "
              "request).",
              (Target(hist_mean(x.OMNI_EXEC, BY, **ROLLOUT), LEG + " mean"),
               Target(hist_quantile(0.9, x.OMNI_EXEC, BY, **ROLLOUT), LEG + " p90", dashed=True)),
              unit="s", min=0, w=8),
        Panel("Pre- and post-processing", "Mean preprocess (prompt encoding) and postprocess (VAE decode) seconds. "
              "Postprocess growing against exec means decode, not denoising, is the cost.",
              (Target(hist_mean(x.OMNI_PREPROCESS, BY, **ROLLOUT), LEG + " preprocess"),
               Target(hist_mean(x.OMNI_POSTPROCESS, BY, **ROLLOUT), LEG + " postprocess")),
              unit="s", min=0, w=8),
        Panel("Failed requests", "Failed requests per second by replica and reason (vllm_omni:requests_failed). "
              "Any sustained rate means samples are regenerated or dropped; the step takes longer.",
              (Target(f"sum by ({BY}, {x.L_FAIL_REASON}) ({rate(sel(x.OMNI_FAILED))})", LEG + " {{reason}}"),),
              unit="reqps", min=0,
              thresholds=(Step(None, "green"), Step(0.01, "red", note="any sustained failure rate; no alert")),
              show_thresholds="dashed", w=24, h=7),
    ), collapsed=True)

    REWARD_SERVERS = Row("Reward-model servers (LLM judge, vLLM)", (
        Panel("Reward request latency", "Mean and P90 of vllm:e2e_request_latency_seconds on the reward servers.",
              (Target(hist_mean(x.VLLM_E2E, BY, **REWARD), LEG + " mean"),
               Target(hist_quantile(0.9, x.VLLM_E2E, BY, **REWARD), LEG + " p90", dashed=True)),
              unit="s", min=0, w=8, runbook=n.ALERT_REWARD_BOUND),
        Panel("Reward queue time", "Mean seconds a reward request waited for a scheduler slot "
              "(vllm:request_queue_time_seconds) against its end-to-end latency (dashed). Queue time close to the latency "
              "means scoring waits for a free server: add reward replicas.",
              (Target(hist_mean(x.VLLM_QUEUE_TIME, BY, **REWARD), LEG + " queued"),
               Target(hist_mean(x.VLLM_E2E, BY, **REWARD), LEG + " end-to-end", dashed=True)),
              unit="s", min=0, w=8, runbook=n.ALERT_REWARD_BOUND),
        Panel("Time to first token (judge)", "P50 and P90 of vllm:time_to_first_token_seconds: prefill of the judge "
              "prompt (image tokens included). Rising with unchanged queue time is longer prompts or a slower judge.",
              (Target(hist_quantile(0.5, x.VLLM_TTFT, BY, **REWARD), LEG + " p50"),
               Target(hist_quantile(0.9, x.VLLM_TTFT, BY, **REWARD), LEG + " p90", dashed=True)),
              unit="s", min=0, w=8, runbook=n.ALERT_REWARD_BOUND),
        Panel("Reward preemptions", "Requests preempted per second (vllm:num_preemptions_total): the KV cache is full "
              "and work is recomputed, so scoring slows down. Sustained preemptions: raise gpu_memory_utilization, "
              "lower max_num_seqs or add reward replicas.",
              (Target(f"sum by ({BY}) ({rate(sel(x.VLLM_PREEMPTIONS, **REWARD))})", LEG),),
              unit="suffix: preemptions/s", min=0, w=8, runbook=n.ALERT_REWARD_BOUND),
        Panel("Reward KV-cache usage", "vllm:kv_cache_usage_perc (0-1). Near 1 means preemptions and a slower "
              "scorer; add reward replicas or shorten prompts.",
              (Target(f"max by ({BY}) ({sel(x.VLLM_KV_USAGE, **REWARD)})", LEG),),
              unit="percentunit", min=0, max=1,
              thresholds=(Step(None, "green"), Step(0.9, "red", note="preemptions start near a full KV cache; no alert")),
              show_thresholds="dashed", w=8),
        Panel("Reward finished requests", "Scored requests per second per reward replica.",
              (Target(successes(**REWARD), LEG),), unit="reqps", min=0, w=8),
    ))

    return Dashboard(
        config=cfg,
        uid="omniwatch-rollout",
        title="omniwatch / Rollout engine",
        description="vLLM-Omni diffusion rollout replicas and reward-model (LLM judge) vLLM servers of the selected runs, "
                    "per replica, in every metric name form.",
        rows=(SERVERS, REWARD_SERVERS, DIFFUSION),
        tags=default_tags("vllm-omni", "rollout"),
        variable_metrics=(x.OMNI_RUNNING, x.OMNI_V0_RUNNING, x.VLLM_RUNNING),
    )
