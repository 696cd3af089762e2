"""Rollout engine: vLLM-Omni diffusion replicas (``vllm_omni:``) and the reward-model vLLM servers
(``vllm:``, role="reward"), per replica. Both are scraped with target labels project, experiment,
role and replica, which is what joins their series to a run."""
from __future__ import annotations

from .. import names as n
from . import external as x
from .spec import Dashboard, Panel, Row, Step, Target, default_tags, hist_mean, hist_quantile, rate, sel

R = x.L_REPLICA
ROLLOUT = {x.L_ROLE: x.ROLE_ROLLOUT}
REWARD = {x.L_ROLE: x.ROLE_REWARD}
BY = f"{x.L_ROLE}, {R}"
LEG = "{{role}} {{replica}}"

SERVERS = Row("vLLM-Omni rollout replicas", (
    Panel("Scheduler state", "Requests running and waiting per rollout replica. Waiting > 0 while running sits "
          "at max_num_seqs means the replicas are saturated; running near 0 during gen means the trainer is "
          "not feeding them (or they wait for the reward model).",
          (Target(f"sum by ({BY}) ({sel(x.OMNI_RUNNING, **ROLLOUT)})", LEG + " running"),
           Target(f"sum by ({BY}) ({sel(x.OMNI_WAITING, **ROLLOUT)})", LEG + " waiting", dashed=True)),
          unit="none", min=0, w=8, runbook=n.ALERT_REWARD_BOUND),
    Panel("End-to-end request latency", "Mean and P90 of vllm_omni:e2e_request_latency_s per replica (P50/P99 "
          "are not meaningful at max_num_seqs=1). One replica far above the others is a straggler that sets "
          "the gen time of every step.",
          (Target(hist_mean(x.OMNI_E2E, BY, **ROLLOUT), LEG + " mean"),
           Target(hist_quantile(0.9, x.OMNI_E2E, BY, **ROLLOUT), LEG + " p90", dashed=True)),
          unit="s", min=0, w=8),
    Panel("Images per second", "Images generated per second per replica (vllm_omni:image_count_total). Drops "
          "with unchanged request rate mean fewer images per request.",
          (Target(f"sum by ({BY}) ({rate(sel(x.OMNI_IMAGES, **ROLLOUT))})", LEG),),
          unit="short", min=0, w=8),
))

DIFFUSION = Row("Diffusion timing", (
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
))

FAILURES = Row("Failures", (
    Panel("Failed requests", "Failed requests per second by replica and reason (vllm_omni:requests_failed). "
          "Any sustained rate means samples are regenerated or dropped; the step takes longer.",
          (Target(f"sum by ({BY}, {x.L_FAIL_REASON}) ({rate(sel(x.OMNI_FAILED))})", LEG + " {{reason}}"),),
          unit="reqps", min=0, thresholds=(Step(None, "green"), Step(0.01, "red")), show_thresholds="dashed", w=12),
    Panel("Successful requests", "Finished requests per second by replica.",
          (Target(f"sum by ({BY}) ({rate(sel(x.OMNI_SUCCESS))})", LEG),),
          unit="reqps", min=0, w=12),
))

REWARD_SERVERS = Row("Reward-model servers (vLLM)", (
    Panel("Reward scheduler state", "vllm:num_requests_running/waiting of the reward-model servers. A standing "
          "waiting queue means scoring cannot keep up with generation: the reward-bound case.",
          (Target(f"sum by ({BY}) ({sel(x.VLLM_RUNNING, **REWARD)})", LEG + " running"),
           Target(f"sum by ({BY}) ({sel(x.VLLM_WAITING, **REWARD)})", LEG + " waiting", dashed=True)),
          unit="none", min=0, w=8, runbook=n.ALERT_REWARD_BOUND),
    Panel("Reward request latency", "Mean and P90 of vllm:e2e_request_latency_seconds on the reward servers.",
          (Target(hist_mean(x.VLLM_E2E, BY, **REWARD), LEG + " mean"),
           Target(hist_quantile(0.9, x.VLLM_E2E, BY, **REWARD), LEG + " p90", dashed=True)),
          unit="s", min=0, w=8, runbook=n.ALERT_REWARD_BOUND),
    Panel("Reward KV-cache usage", "vllm:kv_cache_usage_perc (0-1). Near 1 means preemptions and a slower "
          "scorer; add reward replicas or shorten prompts.",
          (Target(f"max by ({BY}) ({sel(x.VLLM_KV_USAGE, **REWARD)})", LEG),),
          unit="percentunit", min=0, max=1, thresholds=(Step(None, "green"), Step(0.9, "red")),
          show_thresholds="dashed", w=8),
))

DASHBOARD = Dashboard(
    uid="omniwatch-rollout",
    title="omniwatch / Rollout engine",
    description="vLLM-Omni diffusion rollout replicas and reward-model vLLM servers of the selected runs.",
    rows=(SERVERS, DIFFUSION, FAILURES, REWARD_SERVERS),
    tags=default_tags("vllm-omni", "rollout"),
    variable_metrics=(x.OMNI_RUNNING, x.VLLM_RUNNING),
)
