"""Remedy text, once, keyed by alert and by the run's detected modes.

The alert annotations (``remedy``), the relay's messages (which show that annotation), the runbooks'
"Fix" lines that quote it and the run report's verdict all come from :func:`remedy`. A remedy branches
on the labels of ``omniwatch_run_info`` — ``trainer`` (legacy | v1), ``reward`` (colocated | streamed)
and ``async_mode`` (sync | separate_async) — so a run that already has a reward pool is not told to
enable one. Every VeRL-Omni config key a remedy names goes through :func:`key`, which records it;
``tests/test_remedies.py`` checks each against the keys of VeRL-Omni's composed trainer config
(``tests/fixtures/verl_omni/config_keys.txt``). Sources for every statement: docs/verl-source.md.
"""
from __future__ import annotations

from .. import names
from .prose import LabelSwitch, P, Prose, Query, SeriesValue, switch
from .records import REC_REWARD_LATENCY, REC_REWARD_QUEUE_RATIO

# Config keys the remedies name: key -> True when it must be added with a Hydra '+' (not in the
# composed config), False when it exists there.
NAMED_KEYS: dict[str, bool] = {}


def key(path: str, value: str = "", plus: bool = False) -> str:
    """A VeRL-Omni config override as the user types it, recorded for the key check."""
    NAMED_KEYS[path] = plus
    return f"`{'+' if plus else ''}{path}{'=' + value if value else ''}`"


# Keys only the VeOmni engine variant has (tests/fixtures/verl_omni/config_keys_veomni_only.txt): named only
# where the run's trainer config says engine=veomni.
VEOMNI_KEYS: set[str] = set()


def veomni_key(path: str, value: str = "") -> str:
    VEOMNI_KEYS.add(path)
    return f"`{path}{'=' + value if value else ''}`"


def _config(label: str, value: str, text: "Prose | str", default: str = "") -> SeriesValue:
    """``text`` when the run's trainer config says ``label=value`` (omniwatch_trainer_config_info), else
    ``default``."""
    return SeriesValue(names.TRAINER_CONFIG_INFO, "f0", text if isinstance(text, str) else "", default=default,
                       fixed=((label, value),), show=False)


def offload(what: str) -> Prose:
    """The offload keys of the run's engine: VeOmni's when its config says so, FSDP's otherwise."""
    keys = (("param_offload", "False"), ("optimizer_offload", "False"))
    fsdp = [key(f"actor_rollout_ref.actor.fsdp_config.{k}", v) for k, v in keys]
    veo = [veomni_key(f"actor_rollout_ref.actor.veomni_config.{k}", v) for k, v in keys]
    return P(_config("engine", "veomni", f"{veo[0]} {what}, then {veo[1]}", f"{fsdp[0]} {what}, then {fsdp[1]}"))


def layered_summon() -> Prose:
    """``layered_summon`` only matters to LoRA weight sync (collect_lora_params): named for a LoRA run, or
    conditionally when no config said."""
    k = key("actor_rollout_ref.rollout.layered_summon", "True")
    return P(_config("lora", "true", f"; with both on keep {k}"),
             _config("lora", "unknown", f"; for a LoRA run with both on keep {k} (no trainer config read: "
                                        "LoRA or not is unknown)"))


LEGACY, V1 = "legacy", "v1"
COLOCATED, STREAMED = "colocated", "streamed"
SYNC, SEPARATE_ASYNC = "sync", "separate_async"



def line(*pairs: tuple[str, str]) -> str:
    """Several overrides as ONE pasteable code span (`a=1 b=2`), each key recorded for the key check."""
    for path, _ in pairs:
        NAMED_KEYS[path] = False
    return "`" + " ".join(f"{path}={value}" for path, value in pairs) + "`"


# --- "Profile one step" (issue 22 item 9): one complete line per alert, by layout ---------------------------------
# docs/perf/profiler.md ("Lightweight profiling recipe"): the trainer.* overrides are not optional (the last step
# force-saves and validates when save_freq / test_freq > 0, and a leftover checkpoint auto-resumes past the profiled
# step); step 2, as step 1 carries the warm-up and the profiler's start-up (recipe 4a). V1 has no per-step profiling
# lifecycle (main_diffusion_v1.py L58-71 only launches the TaskRunner under nsys; docs/verl-source.md G3).
PROFILE_STEP = "2"
_PROFILE_RUN = (("trainer.total_training_steps", PROFILE_STEP), ("trainer.resume_mode", "disable"),
                ("trainer.save_freq", "-1"), ("trainer.test_freq", "-1"))
PROFILE_TARGETS: dict[str, tuple[tuple[str, str], ...]] = {
    "actor": (("global_profiler.tool", "torch"), ("actor_rollout_ref.actor.profiler.enable", "True"),
              ("actor_rollout_ref.actor.profiler.ranks", "[0]"), ("actor_rollout_ref.actor.profiler.tool", "torch")),
    "rollout": (("global_profiler.tool", "torch"), ("actor_rollout_ref.rollout.profiler.enable", "True"),
                ("actor_rollout_ref.rollout.profiler.ranks", "[0]"), ("actor_rollout_ref.rollout.profiler.tool", "torch"),
                ("actor_rollout_ref.rollout.profiler.tool_config.torch.discrete", "True")),
    "reward": (("global_profiler.tool", "torch"), ("reward.reward_model.rollout.profiler.enable", "True"),
               ("reward.reward_model.rollout.profiler.ranks", "[0]"), ("reward.reward_model.rollout.profiler.tool", "torch"),
               ("reward.reward_model.rollout.profiler.tool_config.torch.discrete", "True")),
    "nsys": (("global_profiler.tool", "nsys"), ("actor_rollout_ref.actor.profiler.enable", "True"),
             ("actor_rollout_ref.actor.profiler.all_ranks", "True"), ("actor_rollout_ref.actor.profiler.tool", "nsys")),
}
PROFILE_WHAT = {"actor": "the actor update", "rollout": "the rollout servers", "reward": "the reward-model servers",
                "nsys": "every rank (an nsys timeline)"}


def profile_line(target: str) -> str:
    """The overrides that profile one step of ``target`` on the legacy trainer, as one code span."""
    return line(*_PROFILE_RUN, *PROFILE_TARGETS[target], ("global_profiler.steps", f"[{PROFILE_STEP}]"),
                ("global_profiler.save_path", "./outputs/profile"))


_V1_NO_PROFILE = ("V1 has no per-step profiling lifecycle (main_diffusion_v1 only launches its TaskRunner under "
                  "nsys; global_profiler.steps starts and stops nothing there), so a profiling override on this run "
                  "records nothing useful. To profile the compute of one step, run the same config once with the "
                  "legacy entry point (python -m verl_omni.trainer.main_diffusion) and append ")


def profile(target: str) -> Prose:
    """' Profile one step: ...' for the run's layout (legacy: the line; V1: says it has no per-step lifecycle)."""
    what = PROFILE_WHAT[target]
    return switch([({"trainer": V1}, f" Profile one step of {what}: " + _V1_NO_PROFILE + profile_line(target)
                     + " (V1's TransferQueue work is not in that trace)."),
                   ({"trainer": LEGACY}, f" Profile one step of {what}: append " + profile_line(target)
                    + " to the run's launch command (a fresh 2-step run; step 1 carries warm-up).")],
                  f" Profile one step of {what} (legacy trainer; V1 has no per-step profiling lifecycle): append "
                  + profile_line(target) + " to the run's launch command (a fresh 2-step run; step 1 carries warm-up).")


# The dedicated reward pool: a P-GPU pool next to N trainer GPUs overlaps scoring with generation. Step time falls at
# best by reward's critical-path share s, GPUs rise from N to N + P: throughput per GPU improves only if
# 1 / ((1 - s)(N + P)) > 1 / N, i.e. s > P / (N + P). VeRL-Omni's own example pays 1 GPU on 4 for a 14 % step cut
# (420 s -> 360 s < 1/5): 0.305 -> 0.280 images/GPU/s (docs/algo/performance.md L16-17).
POOL_EXAMPLE = "examples/flowgrpo_trainer/qwen_image/run_qwen_image_ocr_lora_async_reward.sh"
POOL_BREAK_EVEN = (
    "A P-GPU reward pool next to N GPUs pays only if reward's share of the step's critical path exceeds P/(N+P) (1 "
    "GPU on 4: 20 %; 2 on 8: 20 %; 1 on 8: 11 %): VeRL-Omni's own 1-on-4 example cuts the step 14 % (420 s -> 360 s) "
    "and loses throughput per GPU (0.305 -> 0.280 images/GPU/s). Its settings (" + POOL_EXAMPLE + "): "
    + line(("reward.reward_model.enable", "True"), ("reward.reward_model.enable_resource_pool", "True"),
           ("reward.reward_model.nnodes", "1"), ("reward.reward_model.n_gpus_per_node", "<P>"),
           ("reward.num_workers", "<P/TP>"), ("reward.reward_model.rollout.tensor_model_parallel_size", "<TP>"),
           ("reward.reward_model.rollout.gpu_memory_utilization", "0.9"),
           ("reward.reward_model.rollout.free_cache_engine", "False")) + ".")

# --- RewardBoundRollout --------------------------------------------------------------------------------
_RB_COLOCATED = (
    "The colocated reward model gates every step: give it its own GPUs with "
    + key("reward.reward_model.enable_resource_pool", "True") + " (pool size "
    + key("reward.reward_model.n_gpus_per_node") + " x " + key("reward.reward_model.nnodes")
    + ") so scoring overlaps generation. " + POOL_BREAK_EVEN)
_RB_V1_COLOCATED = (
    "The colocated reward model gates every step (in V1 its timer also holds a rollout sleep and a weight "
    "re-sync): give it its own GPUs with " + key("reward.reward_model.enable_resource_pool", "True")
    + " (pool size " + key("reward.reward_model.n_gpus_per_node") + " x " + key("reward.reward_model.nnodes")
    + "), which V1 supports too. " + POOL_BREAK_EVEN)
_RB_STREAMED = (
    "Reward is already scored while samples generate (a reward pool, or a reward function without a reward "
    "model) and still holds the tail of generation. With a reward pool: add pool GPUs ("
    + key("reward.reward_model.n_gpus_per_node") + ", " + key("reward.reward_model.nnodes")
    + "), lower " + key("reward.reward_model.rollout.tensor_model_parallel_size")
    + " for more replicas (replicas = pool GPUs / TP) and set " + key("reward.num_workers")
    + " to pool GPUs / TP. With a reward function (rule or HTTP scorer, "
    + key("reward.reward_functions.<name>.server_url", plus=True)
    + "): make the function faster or scale the scorer service.")
_RB_DEFAULT = (
    "Find where scoring sits: colocated reward model (long `timing_s/reward`) -> "
    + key("reward.reward_model.enable_resource_pool", "True")
    + "; already scored while generating (long tail of `timing_s/gen`) -> scale the reward pool ("
    + key("reward.reward_model.n_gpus_per_node") + ", " + key("reward.num_workers") + ") or the scorer.")


def reward_bound() -> Prose:
    return switch([({"trainer": V1, "reward": COLOCATED}, _RB_V1_COLOCATED),
                   ({"reward": COLOCATED}, _RB_COLOCATED),
                   ({"reward": STREAMED}, _RB_STREAMED)], _RB_DEFAULT) + profile("reward")


# --- InterStageIdleGPU ---------------------------------------------------------------------------------
_V1_IDLE = (
    "In V1 the untimed work is the TransferQueue fetch (diffusion_tq_batch_to_dataproto), the padding "
    "(_balance_batch) and the write-back (put_dataproto_fields_to_tq) inside _step_once. Spread storage over "
    "more units (" + key("transfer_queue.backend.SimpleStorage.num_data_storage_units")
    + ", at least 2 x nodes), move trajectories over RDMA (" + key("transfer_queue.backend.storage_backend", "MooncakeStore")
    + " with " + key("transfer_queue.backend.MooncakeStore.protocol", "rdma") + ", experimental), or store less "
    "per trajectory (frames, resolution).")
_IDLE_SEPARATE_ASYNC = (
    _V1_IDLE + " separate_async overlaps generation with training but runs the same fetch and write-back, "
    "once per " + key("trainer.v1.separate_async.parameter_sync_step") + " sub-step.")
_IDLE_SYNC = (
    _V1_IDLE + " Switching to " + key("trainer.v1.trainer_mode", "separate_async")
    + " does not shrink this work (the same _step_once runs); it only overlaps generation with training.")
_IDLE_LEGACY = (
    "The legacy step times almost everything (only batch.repeat/union and building gen_batch are untimed), "
    "so a large gap is a barrier waiting on a straggler rank or host work between phases: in an nsys trace of one "
    "step (below) look for the rank that arrives last.")
_IDLE_DEFAULT = (
    "Find the untimed work between phases with an nsys trace of one step (below); in V1 it is the TransferQueue "
    "fetch / write-back (" + key("transfer_queue.backend.SimpleStorage.num_data_storage_units") + ").")


def inter_stage_idle() -> Prose:
    return switch([({"trainer": V1, "async_mode": SEPARATE_ASYNC}, _IDLE_SEPARATE_ASYNC),
                   ({"trainer": V1}, _IDLE_SYNC),
                   ({"trainer": LEGACY}, _IDLE_LEGACY)], _IDLE_DEFAULT) + profile("nsys")


# --- MFU ------------------------------------------------------------------------------------------------
def _peak_override(peak: Query) -> Prose:
    return P("Pin the real bf16 dense peak for every actor worker: ",
             "`'" + "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_OMNI_DEVICE_FLOPS_TFLOPS" + '="', peak, "\"'`",
             " (quoted: Ray wants a string; a shell export reaches the workers only when the trainer starts Ray "
             "itself, not on a cluster started with `ray start`). verl's device table matches the GPU name by "
             "substring, so a relabeled card (an H200 reporting as NVIDIA L20X hits L20, 119.5) inflates MFU.")


NAMED_KEYS["ray_kwargs.ray_init.runtime_env.env_vars.VERL_OMNI_DEVICE_FLOPS_TFLOPS"] = True
DEVICE_PEAK = Query(names.MFU_DEVICE_PEAK, "f0", default="<the GPU's bf16 dense peak in TFLOP/s, e.g. 989 for H100/H800/H200>",
                    matchers='role=%q', label_args=("role",))


def mfu_impossible() -> Prose:
    return _peak_override(DEVICE_PEAK) + (
        " If the peak is right, a FLOPs metadata field misses the DP gather (allgather_diffusion_flops_meta).")


def mfu_drop() -> Prose:
    return P("Something inside the timed actor update got slower (offload changes are outside the MFU timer and show "
             "as StepTimeRegression instead): compare ", key("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
             ", ", _config("engine", "veomni", veomni_key("actor_rollout_ref.actor.veomni_config.ulysses_parallel_size"),
                           key("actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size")), " and ",
             key("actor_rollout_ref.model.enable_gradient_checkpointing"),
             " with the baseline steps' config, and check GPU clocks / power for throttling.", profile("actor"))


def mfu_low() -> Prose:
    return P("Check that the estimator matches the model (only Qwen-Image pipelines are registered), that the "
             "trainer saw the right device peak (", "`VERL_OMNI_DEVICE_FLOPS_TFLOPS`",
             "), and that the actor is not starved: ", offload("gives the largest MFU gain"),
             " and a larger ", key("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"), ".", profile("actor"))


def mfu_unsupported() -> Prose:
    return P("Nothing to fix in training: MFU 0 means VeRL-Omni has no FLOPs estimator for this pipeline (only "
             "QwenImagePipeline is registered; edit / img2img / ControlNet variants report 0) or did not know the "
             "GPU name. To compare configurations, read throughput (perf/throughput) instead.")


# --- StepTimeRegression (branches on its own `cause` label) -----------------------------------------
STEP_CAUSES = {
    "reward": "Reward scoring grew: see RewardBoundRollout's remedy for this run's reward layout.",
    "inter_stage_idle": "Untimed work between phases grew: see InterStageIdleGPU.",
    "actor": P("The actor phases grew. If MFU held, the time went outside the timed train_batch: offload (",
               offload("gives the largest gain"), layered_summon(), "); if MFU dropped too, see MFUDrop."),
    "rollout": ("Generation grew: check rollout batching (" + key("actor_rollout_ref.rollout.max_num_seqs") + ", "
                + key("actor_rollout_ref.rollout.step_execution") + ") and the rollout servers' queue."),
    "weight_sync": ("Weight sync grew (the nightly gives it its own 20 % threshold: sensitive to vLLM-Omni, LoRA, "
                    "IPC, free-cache and " + key("actor_rollout_ref.rollout.layered_summon") + ")."),
    "other": "Find the phase that grew in a trace of one step.",
}
# The profile line each cause's remedy ends with.
CAUSE_PROFILE = {"reward": "reward", "inter_stage_idle": "nsys", "actor": "actor", "rollout": "rollout",
                 "weight_sync": "nsys", "other": "nsys"}


# V1 with streamed reward (a reward function, an HTTP scorer, or a reward-model pool): the agent loop scores each
# sample before it writes it to TransferQueue, inside the trainer's timing_s/gen (docs/verl-source.md G2), and V1
# logs no reward timer for it. A slower scorer then reads as cause=rollout: name the scorer first, with the
# reward servers' latency and queueing omniwatch scrapes (endpoints rules), before rollout batching.
GEN_INCLUDES_SCORING = ("timing_s/gen, which in V1 with streamed reward includes reward scoring: the agent loop "
                        "scores every sample before writing it to TransferQueue, so generation or scoring grew")
_ROLLOUT_V1_STREAMED = P(
    "Generation grew, and in V1 timing_s/gen includes reward scoring: the agent loop scores every sample (reward "
    "function, HTTP scorer or reward-model pool) before writing it to TransferQueue, and V1 logs no reward timer, "
    "so a slower scorer shows as slower gen. Check the scorer before rollout batching: ",
    Query(REC_REWARD_LATENCY, "f2", prefix="the reward servers answer in ", suffix=" s per request",
          default="omniwatch scrapes no reward server for this run, so the scorer is a reward function or HTTP "
                  "scorer whose time V1 does not log (time it, or let omniwatch discover its server)"),
    Query(REC_REWARD_QUEUE_RATIO, "pct", prefix=" (", suffix=" of it queued)"),
    ". A grown latency that is mostly queueing: add reward replicas (" + key("reward.reward_model.n_gpus_per_node")
    + " x " + key("reward.reward_model.nnodes") + ", " + key("reward.num_workers") + "); a grown latency with "
    "little queueing, or a slower reward function: the scorer itself got slower (a changed reward function, a "
    "slower scorer service; see RewardBoundRollout's remedy). Only if scoring did not grow check rollout batching ("
    + key("actor_rollout_ref.rollout.max_num_seqs") + ", " + key("actor_rollout_ref.rollout.step_execution")
    + ") and the rollout servers' queue.")


def gen_includes_scoring() -> Prose:
    """The description's note after "most of the growth is in <cause>": only for cause=rollout of a V1 run with
    streamed reward, where gen holds the scoring too."""
    return P(LabelSwitch("cause", (("rollout", switch([({"trainer": V1, "reward": STREAMED},
                                                         " (" + GEN_INCLUDES_SCORING + ")")], "")),), P()))


def step_regression() -> Prose:
    cases = tuple((c, (switch([({"trainer": V1, "reward": STREAMED}, _ROLLOUT_V1_STREAMED)], t) if c == "rollout"
                       else P(t)) + profile(CAUSE_PROFILE[c])) for c, t in STEP_CAUSES.items())
    return P(LabelSwitch("cause", cases, P("Find the phase that grew on the stage-share panel.") + profile("nsys")))


def step_drift() -> Prose:
    return P("The step has been getting slower for tens of steps without one step jumping: a creep, not a config "
             "change. The usual causes grow with the run: host memory or the dataloader filling up (watch node memory and "
             "swap), GPUs throttling as they heat (clocks and power on the GPUs dashboard), a checkpoint or log "
             "directory on a filling disk. Compare where the step goes now with "
             "the reference steps (the stage-share panel; the description names the part that grew), and compare a "
             "profiled step with one near the start.") + profile("nsys")


def reward_saturation() -> Prose:
    return P("Rewards no longer separate samples within groups (check critic/rewards/std_mean): harder or more "
             "diverse prompts, a finer-grained reward, or fix a broken scorer. Algorithm change, not a performance "
             "knob: more samples per group (", key("actor_rollout_ref.rollout.n"), ").")


def stalled() -> Prose:
    """TrainingStalled past its warning: where the step is held first (the Ray task-event source's holder and the
    held call's stack, issue 31; nothing without the source), then what to check."""
    from .stalls import HOLDER_REMEDY  # the holder / stack join belongs to the stall's own text (stalls.py)
    return P(HOLDER_REMEDY, "Check the trainer process and Ray (ray status, driver and worker logs): a hung NCCL "
             "collective, a dead actor or an OOM kill is the usual cause; resume from the last checkpoint with ",
             key("trainer.resume_mode", "auto"), " after fixing it.")


# --- RolloutStraggler (legacy: V1 logs no agent-loop keys) ---------------------------------------------
def straggler() -> Prose:
    return P("One sample's generation took far longer than queueing behind equal requests explains, and gen waits "
             "for it. Find the slow replica on the Rollout engine dashboard (per-replica request latency, running "
             "requests; a replica on a throttling or shared GPU shows there and on the GPU dashboard) and replace or "
             "drain that node. If timing_s/agent_loop/slowest/num_preempted is above 0 the request was preempted for "
             "memory: lower ", key("actor_rollout_ref.rollout.max_num_seqs"), " or raise ",
             key("actor_rollout_ref.rollout.gpu_memory_utilization"), ". Prompts of very different cost (resolution, "
             "frames) in one batch make the same tail: bucket them.", profile("rollout"))


# --- GradNormNonFinite -------------------------------------------------------------------------------------
def grad_nonfinite() -> Prose:
    return P("VeRL-Omni skipped these updates: the pre-clip gradient norm was NaN/Inf, so it zeroed the gradients "
             "(the actor worker's log says 'WARN: grad_norm is not finite'); the LR schedule still advanced. Find "
             "where the non-finite value enters: rewards or advantages (critic/rewards/*, critic/advantages/* "
             "missing from the same steps: a reward function returning NaN), the loss (actor/loss missing), or "
             "diverging weights (actor/grad_norm growing before it broke). Then lower ",
             key("actor_rollout_ref.actor.optim.lr"), ", keep clipping on (", key("actor_rollout_ref.actor.optim.clip_grad"),
             "), and if no update succeeds any more resume from a checkpoint before the skips (",
             key("trainer.resume_mode", "resume_path"), " with ", key("trainer.resume_from_path"), ").")


# --- RolloutRejectionHigh (branches on the alert's `mode`: where the RS metrics came from) -----------------
_RS_BYPASS = P(
    "Bypass mode reuses the rollout's log-probs as the old policy's, and rejection sampling masks the samples "
    "whose current/rollout ratio left the band: the rollout backend drifts from the trainer (precision, "
    "attention backend). Fall back to recomputing old log-probs (", key("algorithm.rollout_correction.bypass_mode", "False"),
    ", ~20 % more step time), or match the rollout's numerics to training. If the drift is accepted, rejected "
    "samples still dilute the gradient: widen the band (", key("algorithm.rollout_correction.rollout_rs_threshold"),
    ", e.g. \"0.3_3.0\"; VeRL-Omni says so above ~10 %).")
_RS_DECOUPLED = P(
    "The recomputed old log-probs and the rollout's disagree for many samples (rollout_corr/kl, "
    "rollout_corr/log_ppl_abs_diff): the rollout backend drifts from the trainer (precision, attention backend, "
    "guidance). Match the rollout's numerics to training; with a two-step SDE window one outlier step rejects a "
    "whole sample under seq_mean_k1, so widen the band (", key("algorithm.rollout_correction.rollout_rs_threshold"),
    ", e.g. \"0.3_3.0\" or \"0.2_5.0\") if the drift is accepted: rejected samples dilute the gradient.")


def rs_rejection() -> Prose:
    return P(LabelSwitch("mode", (("bypass", _RS_BYPASS), ("decoupled", _RS_DECOUPLED)), _RS_DECOUPLED))


# --- TimeOutsideStep ------------------------------------------------------------------------------------------
_OUT_V1 = (
    "After every step V1 fetches the whole batch from TransferQueue a second time (_compute_metrics), then "
    "runs kv_clear and logging, all outside timing_s/step. It moves as much data as the in-step fetch: spread "
    "storage over more units (" + key("transfer_queue.backend.SimpleStorage.num_data_storage_units")
    + "), move trajectories over RDMA (" + key("transfer_queue.backend.storage_backend", "MooncakeStore") + " with "
    + key("transfer_queue.backend.MooncakeStore.protocol", "rdma") + ", experimental), or store less per trajectory; "
    "and check the logger backends (" + key("trainer.logger") + ") as below.")
_OUT_LEGACY = (
    "Between two steps the legacy trainer loads the next batch, builds the generation batch, computes the metrics "
    "and logs them synchronously to every backend in " + key("trainer.logger")
    + " (a slow or unreachable wandb / mlflow server blocks the loop). Give the dataloader more workers ("
    + key("data.dataloader_num_workers") + "), and drop or fix a slow logger backend.")
_OUT_DEFAULT = (
    "Something between two steps runs outside every timer: the dataloader (" + key("data.dataloader_num_workers")
    + "), metric computation, synchronous logging (" + key("trainer.logger")
    + "), and in V1 the second TransferQueue fetch of the batch after the step.")


def outside_step() -> Prose:
    return switch([({"trainer": V1}, _OUT_V1), ({"trainer": LEGACY}, _OUT_LEGACY)], _OUT_DEFAULT)


# --- TimersExceedStep ---------------------------------------------------------------------------------------------
def timers_exceed() -> Prose:
    return P("A timing_s/<name> timer runs inside another phase (a marked_timer nested in gen, reward or "
             "update_actor), so omniwatch adds its seconds twice and the untimed time between phases is hidden: "
             "InterStageIdleGPU cannot see it from timers (its GPU evidence, --gpu on, still can). Log the nested "
             "timer as a sub-key (timing_s/<phase>/<name>: keys with a further '/' are not added) or drop it; the "
             "exporter's log names the timers it does not know.")


def stalled_notice() -> Prose:
    """TrainingStalled (info): perhaps planned work."""
    return P("Usually nothing to do yet: a checkpoint save (", key("trainer.save_freq"), "; written under ",
             key("trainer.default_local_dir"), "/global_step_<next step>, growing while it saves) or a validation "
             "pass (", key("trainer.test_freq"), ") may be running; verl forces both on the last step. If the warning "
             "follows, treat it as a hang.")


# --- RolloutQueueSaturated (branches on the alert's `role`, then on the run's layout) ---------------------------
# It fires only while the step waits on the server (docs/verl-source.md C8): legacy and V1 sync submit the whole
# batch (train_batch_size x rollout.n requests) at once, so a queue at max_num_seqs is normal during gen and costs
# time only because gen holds the step; a separate_async standalone rollout is busy by design and holds the step
# only when the trainer waits for samples. Fewer samples per prompt or a smaller batch would shrink the queue but
# change the algorithm: not offered here (docs/runbooks.md#rolloutqueuesaturated says so).
_RQ_MORE_AT_ONCE = (
    "raise " + key("actor_rollout_ref.rollout.max_num_seqs") + " if memory allows (published Qwen-Image LoRA: 1 -> 32 "
    "concurrent requests cut gen from 226 s to 108 s; true CFG at 512x512 runs out of memory above 32), try step-wise "
    "batching (" + key("actor_rollout_ref.rollout.step_execution", "True") + ", less memory per concurrent request)")
_RQ_SYNC = (
    "Every step submits its whole batch (train_batch_size x rollout.n requests) at once, so requests queue whenever "
    "the batch is larger than the slots of the replicas, and gen holds the step meanwhile. Let more run at once: "
    + _RQ_MORE_AT_ONCE + ", or add rollout replicas (more GPUs, or a lower "
    + key("actor_rollout_ref.rollout.tensor_model_parallel_size") + " for more replicas on the same GPUs).")
_RQ_SEPARATE_ASYNC = (
    "The standalone rollout is busy by design, but here the trainer waits for its samples (a large timing_s/gen): "
    "it cannot keep up. Give it more GPUs (" + key("actor_rollout_ref.rollout.nnodes") + " x "
    + key("actor_rollout_ref.rollout.n_gpus_per_node") + ") or " + _RQ_MORE_AT_ONCE + ".")
_RQ_DEFAULT = (
    "The step waits on generation while requests queue at every slot: " + _RQ_MORE_AT_ONCE
    + ", or add rollout replicas (GPUs; in separate_async " + key("actor_rollout_ref.rollout.nnodes") + " x "
    + key("actor_rollout_ref.rollout.n_gpus_per_node") + " size the standalone rollout).")
_RQ_REWARD = (
    "Scoring requests queue at the reward servers while the step waits for them: add reward replicas (pool GPUs "
    + key("reward.reward_model.n_gpus_per_node") + " x " + key("reward.reward_model.nnodes") + ", or a lower "
    + key("reward.reward_model.rollout.tensor_model_parallel_size") + " for more replicas on the same GPUs) or raise "
    + key("reward.reward_model.rollout.max_num_seqs") + " if memory allows ("
    + key("reward.reward_model.rollout.gpu_memory_utilization") + ").")


# A serial engine (engine="serial": one running request while others wait). vllm_omni_async_server.py clamps
# max_num_seqs to 1 for a pipeline without request-level batching unless step_execution is on
# (docs/verl-source.md G1), so "raise max_num_seqs" changes nothing there.
_RQ_SERIAL = (
    "This replica is a serial engine: it generates one request at a time. For a pipeline without request-level "
    "batching VeRL-Omni clamps max_num_seqs to 1 unless step_execution is on, so raising max_num_seqs alone changes "
    "nothing: set " + key("actor_rollout_ref.rollout.step_execution", "True")
    + " (step-wise continuous batching: the pipeline must implement prepare_encode / denoise_step / step_scheduler "
    "/ post_decode; the Qwen-Image example runs it with up to 256 concurrent requests). Published Qwen-Image LoRA: "
    "gen 226 s serial, 106-108 s batched. A pipeline with neither batching mode stays serial: add rollout replicas (more "
    "GPUs, or a lower " + key("actor_rollout_ref.rollout.tensor_model_parallel_size")
    + " for more replicas on the same GPUs).")


def rollout_saturated() -> Prose:
    by_layout = switch([({"async_mode": SEPARATE_ASYNC}, _RQ_SEPARATE_ASYNC), ({"async_mode": SYNC}, _RQ_SYNC)],
                       _RQ_DEFAULT)
    return P(LabelSwitch("role", (("reward", P(_RQ_REWARD) + profile("reward")),),
                         P(LabelSwitch("engine", (("serial", P(_RQ_SERIAL)),), by_layout)) + profile("rollout")))


# --- TransferQueue (V1 only: legacy runs have no TransferQueue) ------------------------------------------------
_TQ_STOPGAP = "raise " + key("transfer_queue.backend.SimpleStorage.total_storage_size") + " only as a stopgap"
_TQ_BOUND_AHEAD = (
    "bound how far rollout runs ahead of training (fewer batches queued ahead: "
    + key("trainer.v1.separate_async.num_warmup_batches") + "; a tighter staleness bound: "
    + key("trainer.v1.sampler.max_off_policy_threshold") + ", the model versions a trajectory may span, with "
    + key("trainer.v1.sampler.max_off_policy_strategy", "drop") + ")")
_TQB_SEPARATE_ASYNC = (
    "Make the consumer clear what it consumed (kv_clear / clear_samples after every step) and, since separate_async "
    "lets rollout run ahead of training, " + _TQ_BOUND_AHEAD + "; " + _TQ_STOPGAP + ".")
_TQB_SYNC = (
    "In sync mode rollout cannot run ahead of training, so samples that accumulate are samples nobody clears: make "
    "the consumer clear what it consumed (kv_clear / clear_samples after every step, custom code that reads from "
    "TransferQueue included); " + _TQ_STOPGAP + ".")
_TQB_DEFAULT = (
    "Make the consumer clear what it consumed (kv_clear / clear_samples after every step); in separate_async also "
    + _TQ_BOUND_AHEAD + "; " + _TQ_STOPGAP + ".")


def tq_backlog() -> Prose:
    return switch([({"async_mode": SEPARATE_ASYNC}, _TQB_SEPARATE_ASYNC), ({"trainer": V1}, _TQB_SYNC)],
                  _TQB_DEFAULT)


_TQC = (
    "Find why the consumer stopped clearing (trainer hung or crashed, kv_clear failing: see TrainingStalled); free "
    "storage (clear stale partitions) or restart with a larger "
    + key("transfer_queue.backend.SimpleStorage.total_storage_size"))


def tq_backlog_critical() -> Prose:
    return switch([({"async_mode": SEPARATE_ASYNC}, _TQC + ", then " + _TQ_BOUND_AHEAD + "."),
                   ({"trainer": V1}, _TQC + ".")],
                  _TQC + "; in separate_async then also " + _TQ_BOUND_AHEAD + ".")


def tq_slow_leak() -> Prose:
    return P("List what stays (tq.kv_list() per partition) and clear it: kv_clear the keys or clear_partition a "
             "partition that is no longer read; then fix the code path that skips clearing (failed samples, "
             "validation partitions).")
