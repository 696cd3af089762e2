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

PROFILE_ONE_STEP = ("profile one lightweight step first (" + key("global_profiler.steps", "[N]") + ", "
                    + key("trainer.save_freq", "-1") + ", " + key("trainer.test_freq", "-1") + ")")

# --- RewardBoundRollout --------------------------------------------------------------------------------
_RB_COLOCATED = (
    "The colocated reward model gates every step: give it its own GPUs with "
    + key("reward.reward_model.enable_resource_pool", "True") + " (pool size "
    + key("reward.reward_model.n_gpus_per_node") + " x " + key("reward.reward_model.nnodes")
    + ") so scoring overlaps generation; " + PROFILE_ONE_STEP + " with "
    + key("reward.reward_model.rollout.profiler.enable", "True") + ".")
_RB_V1_COLOCATED = (
    "The colocated reward model gates every step (in V1 its timer also holds a rollout sleep and a weight "
    "re-sync): give it its own GPUs with " + key("reward.reward_model.enable_resource_pool", "True")
    + " (pool size " + key("reward.reward_model.n_gpus_per_node") + " x " + key("reward.reward_model.nnodes")
    + "), which V1 supports too; " + PROFILE_ONE_STEP + ".")
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
                   ({"reward": STREAMED}, _RB_STREAMED)], _RB_DEFAULT)


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
    "so a large gap is a barrier waiting on a straggler rank or host work between phases: take an nsys trace "
    "of one step (" + key("global_profiler.tool", "nsys") + ", " + key("global_profiler.steps", "[N]")
    + ") and look for the rank that arrives last.")
_IDLE_DEFAULT = (
    "Find the untimed work between phases with an nsys trace of one step (" + key("global_profiler.tool", "nsys")
    + "); in V1 it is the TransferQueue fetch / write-back (" + key("transfer_queue.backend.SimpleStorage.num_data_storage_units") + ").")


def inter_stage_idle() -> Prose:
    return switch([({"trainer": V1, "async_mode": SEPARATE_ASYNC}, _IDLE_SEPARATE_ASYNC),
                   ({"trainer": V1}, _IDLE_SYNC),
                   ({"trainer": LEGACY}, _IDLE_LEGACY)], _IDLE_DEFAULT)


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
             " with the baseline steps' config, check GPU clocks / power for throttling, and profile one update_actor "
             "step (", key("actor_rollout_ref.actor.profiler.enable", "True"), ", tool torch).")


def mfu_low() -> Prose:
    return P("Check that the estimator matches the model (only Qwen-Image pipelines are registered), that the "
             "trainer saw the right device peak (", "`VERL_OMNI_DEVICE_FLOPS_TFLOPS`",
             "), and that the actor is not starved: ", offload("gives the largest MFU gain"),
             " and a larger ", key("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"), ".")


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
    "other": "Profile one step to find the phase that grew (global_profiler.tool=nsys).",
}


def step_regression() -> Prose:
    return P(LabelSwitch("cause", tuple((c, P(t)) for c, t in STEP_CAUSES.items()),
                         P("Profile one step to find the phase that grew; see the stage-share panel.")))


def reward_saturation() -> Prose:
    return P("Rewards no longer separate samples within groups (check critic/rewards/std_mean): harder or more "
             "diverse prompts, a finer-grained reward, or fix a broken scorer. Algorithm change, not a performance "
             "knob: more samples per group (", key("actor_rollout_ref.rollout.n"), ").")


def stalled() -> Prose:
    return P("Check the trainer process and Ray (ray status, driver and worker logs): a hung NCCL collective, a dead "
             "actor or an OOM kill is the usual cause; resume from the last checkpoint with ",
             key("trainer.resume_mode", "auto"), " after fixing it.")


# --- RolloutStraggler (legacy: V1 logs no agent-loop keys) ---------------------------------------------
def straggler() -> Prose:
    return P("One sample's generation took far longer than queueing behind equal requests explains, and gen waits "
             "for it. Find the slow replica on the Rollout engine dashboard (per-replica request latency, running "
             "requests; a replica on a throttling or shared GPU shows there and on the GPU dashboard) and replace or "
             "drain that node. If timing_s/agent_loop/slowest/num_preempted is above 0 the request was preempted for "
             "memory: lower ", key("actor_rollout_ref.rollout.max_num_seqs"), " or raise ",
             key("actor_rollout_ref.rollout.gpu_memory_utilization"), ". Prompts of very different cost (resolution, "
             "frames) in one batch make the same tail: bucket them.")


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


def rollout_saturated() -> Prose:
    by_layout = switch([({"async_mode": SEPARATE_ASYNC}, _RQ_SEPARATE_ASYNC), ({"async_mode": SYNC}, _RQ_SYNC)],
                       _RQ_DEFAULT)
    return P(LabelSwitch("role", (("reward", P(_RQ_REWARD)),), by_layout))


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
