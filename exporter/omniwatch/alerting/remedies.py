"""Remedy text, once, keyed by alert, by the run's detected modes and by the run's own trainer config.

The alert annotations (``remedy`` and its one-line ``action``), the relay's messages (which show them), the
runbooks' "Fix" lines that quote them, the overview's "Why slow" row (``omniwatch_remedy_info``) and the run
report's verdict all come from here. A remedy branches on

- the labels of ``omniwatch_run_info`` — ``trainer`` (legacy | v1), ``reward`` (colocated | streamed) and
  ``async_mode`` (sync | separate_async) — so a run that already has a reward pool is not told to enable one;
- the settings the run's trainer config states (``omniwatch_trainer_config_setting{setting, value}``,
  trainer_config.SETTINGS; issue 32): a remedy never proposes a setting the config already has, quotes the run's
  own values, tells a reward model from a reward function, and says which keys would sharpen it when no config
  was read (``SettingSwitch``'s ``unknown`` branch).

Every remedy is a :class:`~.prose.Remedy`: the full text and a one-line ``action`` (<= ``ACTION_MAX``
characters in every branch; tests/test_remedies.py renders them all). Every VeRL-Omni config key a remedy names
goes through :func:`key`, which records it; ``tests/test_remedies.py`` checks each against the keys of
VeRL-Omni's composed trainer config (``tests/fixtures/verl_omni/config_keys.txt``). Sources for every statement:
docs/verl-source.md.
"""
from __future__ import annotations

from .. import names
from .prose import (LabelSwitch, P, Prose, Query, Remedy, SeriesValue, SettingValue, SettingWord, by_value, remedy,
                    settings, switch)
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


def sharpen(*paths: str) -> str:
    """The sentence a config-dependent remedy ends with when no trainer config was read for the run: the keys whose
    values would sharpen it (each recorded for the key check)."""
    return (" No trainer config was read for this run: its " + ", ".join(key(p) for p in paths)
            + " would say which of these it already has (give omniwatch the config: VeRL-Omni's console log, Hydra's "
              ".hydra/config.yaml or --trainer-config).")


def now(setting: str, fmt: str = "f0") -> SettingValue:
    """" (now N)" with the run's own value of ``setting``; nothing when its config does not say."""
    return SettingValue(setting, " (now ", ")", fmt=fmt)


def now_word(setting: str) -> SettingWord:
    return SettingWord(setting, " (now ", ")")


# --- the actor engine's offload keys and the MFU levers (OMNI docs/perf/diffusion_mfu.md "Tuning and Improving MFU",
# L524-549; docs/verl-source.md H13) --------------------------------------------------------------------------------
def _actor_key(engine: str, name: str, value: str = "") -> str:
    if engine == "veomni":
        return veomni_key(f"actor_rollout_ref.actor.veomni_config.{name}", value)
    return key(f"actor_rollout_ref.actor.fsdp_config.{name}", value)


MICRO = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"


def _sp_key() -> Prose:
    return P(_config("engine", "veomni", veomni_key("actor_rollout_ref.actor.veomni_config.ulysses_parallel_size"),
                     key("actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size")))


def offload(what: str) -> Prose:
    """The offload clause for the run's engine and config: turn off what is on (parameters first: the largest gain),
    never what is already off; with nothing offloaded, the next levers (micro batch, SP). No config: both keys of the
    engine the config info names (FSDP's when unknown)."""
    def param(engine: str) -> Prose:
        return P(_actor_key(engine, "param_offload", "False"), " (this run offloads its parameters) ", what,
                 settings([({"optimizer_offload": "true"}, P(", then ", _actor_key(engine, "optimizer_offload", "False"),
                                                             " (its optimizer too)"))], "", ""))

    def optimizer(engine: str) -> Prose:
        return P("its parameters are not offloaded, its optimizer is: ",
                 _actor_key(engine, "optimizer_offload", "False"), " ", what)

    nothing = P("nothing is offloaded in this run's config (param_offload and optimizer_offload are False), so offload "
                "is not where the time goes; a larger ", key(MICRO), now("micro_batch"),
                " amortises the FSDP collectives if memory allows",
                settings([({"sp": "1"}, "")], P(", and Ulysses SP 1 (", _sp_key(), ", now ", SettingValue("sp"),
                                                ") removes its all-to-all for moderate sequence lengths"), ""))
    keys = (("param_offload", "False"), ("optimizer_offload", "False"))
    fsdp = [key(f"actor_rollout_ref.actor.fsdp_config.{k}", v) for k, v in keys]
    veo = [veomni_key(f"actor_rollout_ref.actor.veomni_config.{k}", v) for k, v in keys]
    unknown = P("offload: ", _config("engine", "veomni", f"{veo[0]} {what}, then {veo[1]}",
                                     f"{fsdp[0]} {what}, then {fsdp[1]}"))
    return settings([({"engine": "veomni", "param_offload": "true"}, param("veomni")),
                     ({"param_offload": "true"}, param("fsdp")),
                     ({"engine": "veomni", "optimizer_offload": "true"}, optimizer("veomni")),
                     ({"optimizer_offload": "true"}, optimizer("fsdp")),
                     ({"param_offload": "false", "optimizer_offload": "false"}, nothing)],
                    unknown, unknown)


OFFLOAD_KEYS = ("actor_rollout_ref.actor.fsdp_config.param_offload", "actor_rollout_ref.actor.fsdp_config.optimizer_offload")


def offload_action() -> Prose:
    """The one-line actor action: the offload to turn off, or the micro batch when nothing is offloaded."""
    return settings([({"engine": "veomni", "param_offload": "true"},
                      P(_actor_key("veomni", "param_offload", "False"), " (now True): the largest MFU gain")),
                     ({"param_offload": "true"},
                      P(_actor_key("fsdp", "param_offload", "False"), " (now True): the largest MFU gain")),
                     ({"engine": "veomni", "optimizer_offload": "true"},
                      P(_actor_key("veomni", "optimizer_offload", "False"), " (now True)")),
                     ({"optimizer_offload": "true"},
                      P(_actor_key("fsdp", "optimizer_offload", "False"), " (now True)")),
                     ({"param_offload": "false"},
                      P("Nothing offloaded: raise ", key(MICRO), now("micro_batch"), " if memory allows"))],
                    P("Raise ", key(MICRO), " if memory allows"),
                    P(key("actor_rollout_ref.actor.fsdp_config.param_offload", "False"), " if it is on: the largest "
                      "gain"))


def layered_summon() -> Prose:
    """``layered_summon`` for LoRA weight sync (collect_lora_params; OMNI diffusion_mfu.md L541-546): keep it on while
    parameters are offloaded (off it tends to OOM in update_weights), off when nothing is; never proposed when the
    run already has it."""
    k_on = key("actor_rollout_ref.rollout.layered_summon", "True")
    k_off = key("actor_rollout_ref.rollout.layered_summon", "False")
    known = settings([({"param_offload": "true", "layered_summon": "false"},
                       P("; while parameters stay offloaded set ", k_on, " (off, update_weights tends to OOM)")),
                      ({"param_offload": "false", "optimizer_offload": "false", "layered_summon": "true"},
                       P("; with nothing offloaded ", k_off, " lets weight sync load the whole model at once"))], "", "")
    return P(settings([({"lora_rank": "0"}, "")], known,
                      P(_config("lora", "unknown", f"; for a LoRA run with both on keep {k_on} (no trainer config "
                                                   "read: LoRA or not is unknown)"))))


# The dedicated reward pool: a P-GPU pool next to N trainer GPUs overlaps scoring with generation. Step time falls at
# best by reward's critical-path share s, GPUs rise from N to N + P: throughput per GPU improves only if
# 1 / ((1 - s)(N + P)) > 1 / N, i.e. s > P / (N + P). VeRL-Omni's own example pays 1 GPU on 4 for a 14 % step cut
# (420 s -> 360 s < 1/5): 0.305 -> 0.280 images/GPU/s (docs/algo/performance.md L16-17). The exporter publishes the
# largest P that still pays for the run (omniwatch_reward_pool_break_even_gpus, remedy_info.break_even).
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
BREAK_EVEN = by_value(names.REWARD_POOL_BREAK_EVEN, [
    (">", 0, P(Query(names.REWARD_POOL_BREAK_EVEN, "f0", " At this run's reward share a pool of up to ",
                     " GPUs pays (start with 1)."))),
    ("==", 0, " At this run's reward share no dedicated pool pays (a 1-GPU pool would lower throughput per GPU): make "
              "the reward model cheaper instead (a smaller model, fewer tokens).")], "")

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
# From the config (issue 32 item 3): a reward function, a reward model that already has its pool.
_RB_FUNCTION = (
    "The reward is a function, not a model (" + key("reward.reward_model.enable") + " is False in this run's config: "
    "a rule or an HTTP scorer such as " + key("reward.reward_functions.<name>.server_url", plus=True) + "), and it "
    "holds the tail of generation: make the function faster, or scale the scorer service behind it; there is no "
    "reward-model server to add GPUs to. The function runs in the reward-loop workers (CPU; legacy logs its time as "
    "agent_loop/compute_score), which a GPU profile of the step does not show: time it where it is defined ("
    + key("reward.custom_reward_function.path") + ", or the scorer service's own logs).")
_RB_POOL = P(
    "The reward model already has its own pool (", key("reward.reward_model.enable_resource_pool"), " is True in this "
    "run's config", SettingValue("reward_pool_gpus_per_node", ": ", " GPU(s) per node"),
    SettingValue("reward_pool_nodes", " x ", " node(s)"), ") and still holds the tail of generation. Grow it: raise ",
    key("reward.reward_model.n_gpus_per_node"), now("reward_pool_gpus_per_node"), " or lower ",
    key("reward.reward_model.rollout.tensor_model_parallel_size"), now("reward_tp"), " for more replicas (replicas = "
    "pool GPUs / TP), and set ", key("reward.num_workers"), now("reward_workers"), " to pool GPUs / TP.")
# A colocated reward model, from the config: the example's pool settings less the ones the run already has
# (reward.reward_model.enable is True), the pool size from the break-even, the run's own TP.
_RB_COLOCATED_CONFIG = P(
    "The colocated reward model gates every step: give it its own GPUs so scoring overlaps generation. A P-GPU pool "
    "next to this run's ", SettingValue("trainer_gpus", "", " trainer GPUs", default="N trainer GPUs"), " pays only "
    "if reward's share of the step's critical path exceeds P/(N+P) (VeRL-Omni's own 1-on-4 example cuts the step "
    "14 % and loses throughput per GPU, 0.305 -> 0.280 images/GPU/s).", BREAK_EVEN, " Set ",
    line(("reward.reward_model.enable_resource_pool", "True"), ("reward.reward_model.nnodes", "1"),
         ("reward.reward_model.n_gpus_per_node", "<P>"), ("reward.num_workers", "<P/TP>")),
    " (TP: ", key("reward.reward_model.rollout.tensor_model_parallel_size"), now("reward_tp"), "; settings from ",
    POOL_EXAMPLE, ").")


def _reward_layout(v1_colocated: "Prose | str", colocated: "Prose | str", streamed: "Prose | str",
                   default: "Prose | str") -> Prose:
    return switch([({"trainer": V1, "reward": COLOCATED}, v1_colocated), ({"reward": COLOCATED}, colocated),
                   ({"reward": STREAMED}, streamed)], default)


def reward_bound_text() -> Prose:
    """RewardBoundRollout's remedy without its profile line: from the config when one was read (a reward function;
    a reward model with its pool; a colocated reward model with the break-even pool size), else from the layout."""
    v1_note = "In V1 the colocated reward model's timer also holds a rollout sleep and a weight re-sync; V1 supports the pool too. "
    colocated = switch([({"trainer": V1}, P(v1_note, _RB_COLOCATED_CONFIG))], _RB_COLOCATED_CONFIG)
    layout = _reward_layout(_RB_V1_COLOCATED, _RB_COLOCATED, _RB_STREAMED, _RB_DEFAULT)
    return settings([({"reward_model": "false"}, _RB_FUNCTION),
                     ({"reward_model": "true", "reward_pool": "true"}, _RB_POOL),
                     ({"reward_model": "true", "reward_pool": "false"}, colocated)],
                    layout, P(layout, sharpen("reward.reward_model.enable", "reward.reward_model.enable_resource_pool")))


_POOL_ON = line(("reward.reward_model.enable_resource_pool", "True"), ("reward.reward_model.n_gpus_per_node", "1"))
_RB_ACTION_POOL_ON = by_value(names.REWARD_POOL_BREAK_EVEN, [
    (">", 0, P(_POOL_ON, Query(names.REWARD_POOL_BREAK_EVEN, "f0", " (up to ", " GPUs pay)"))),
    ("==", 0, "No reward pool pays at this share: make the reward model cheaper (a smaller model, fewer tokens)")],
    "Give scoring its own GPUs: " + _POOL_ON)


def reward_bound_action() -> Prose:
    layout = _reward_layout(
        _RB_ACTION_POOL_ON, _RB_ACTION_POOL_ON,
        P("Scale what scores while generating: the reward pool (", key("reward.reward_model.n_gpus_per_node"),
          ") or the scorer"),
        P("Colocated reward model? ", key("reward.reward_model.enable_resource_pool", "True"),
          "; streamed? scale the pool or scorer"))
    return settings([({"reward_model": "false"}, "Speed up the reward function or scale its scorer service (no reward "
                                                 "model to give GPUs)"),
                     ({"reward_model": "true", "reward_pool": "true"},
                      P("Grow the reward pool: raise ", key("reward.reward_model.n_gpus_per_node"),
                        now("reward_pool_gpus_per_node"))),
                     ({"reward_model": "true", "reward_pool": "false"}, _RB_ACTION_POOL_ON)],
                    layout, layout)


def reward_profile() -> Prose:
    """The reward-model servers' profile line, left out for a reward function (no server to profile)."""
    return settings([({"reward_model": "false"}, "")], profile("reward"), profile("reward"))


def reward_bound() -> Remedy:
    return remedy(reward_bound_text() + reward_profile(), reward_bound_action())


# --- InterStageIdleGPU ---------------------------------------------------------------------------------
_V1_IDLE = (
    "In V1 the untimed work is the TransferQueue fetch (diffusion_tq_batch_to_dataproto), the padding "
    "(_balance_batch) and the write-back (put_dataproto_fields_to_tq) inside _step_once. Spread storage over "
    "more units (" + key("transfer_queue.backend.SimpleStorage.num_data_storage_units")
    + ", at least 2 x nodes), move trajectories over RDMA (" + key("transfer_queue.backend.storage_backend", "MooncakeStore")
    + " with " + key("transfer_queue.backend.MooncakeStore.protocol", "rdma") + ", experimental), or store less "
    "per trajectory (frames, resolution).")
_IDLE_SEPARATE_ASYNC = P(
    _V1_IDLE + " separate_async overlaps generation with training but runs the same fetch and write-back, "
    "once per " + key("trainer.v1.separate_async.parameter_sync_step"), now("parameter_sync_step"), " sub-step.")
_IDLE_SYNC = (
    _V1_IDLE + " Switching to " + key("trainer.v1.trainer_mode", "separate_async")
    + " does not shrink this work (the same _step_once runs); it only overlaps generation with training.")
# PolicyGradientRayTrainer.fit (OMNI ray_diffusion_trainer.py L1140-1158; docs/verl-source.md C9): building gen_batch
# and its repeat run BEFORE the step timer (time outside the step, not this gap); inside it, between the timers, only
# the post-generation batch.repeat / union (L1177-1178), the bypass-mode copy (L1197) and the rollout-correction
# metrics (L1208-1214) are untimed.
_IDLE_LEGACY = (
    "The legacy step times almost everything: between its timers run only the post-generation batch.repeat / union, "
    "the bypass-mode log-prob copy and the rollout-correction metrics (building gen_batch and its repeat happen before "
    "the step timer, as time outside the step). So a large gap is a barrier waiting on a straggler rank or host work "
    "between phases: in an nsys trace of one step (below) look for the rank that arrives last.")
_IDLE_DEFAULT = (
    "Find the untimed work between phases with an nsys trace of one step (below); in V1 it is the TransferQueue "
    "fetch / write-back (" + key("transfer_queue.backend.SimpleStorage.num_data_storage_units") + ").")


def inter_stage_idle_text() -> Prose:
    return switch([({"trainer": V1, "async_mode": SEPARATE_ASYNC}, _IDLE_SEPARATE_ASYNC),
                   ({"trainer": V1}, _IDLE_SYNC),
                   ({"trainer": LEGACY}, _IDLE_LEGACY)], _IDLE_DEFAULT)


def inter_stage_idle_action() -> Prose:
    return switch([({"trainer": V1}, P("Spread TransferQueue storage: raise ",
                                       key("transfer_queue.backend.SimpleStorage.num_data_storage_units"))),
                   ({"trainer": LEGACY}, "Profile one step with nsys (the remedy's line) and find the rank that "
                                         "reaches each barrier last")],
                  "Find the untimed work between phases in an nsys trace of one step (V1: the TransferQueue fetch)")


def inter_stage_idle() -> Remedy:
    return remedy(inter_stage_idle_text() + profile("nsys"), inter_stage_idle_action())


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
DEVICE_PEAK_SHORT = Query(names.MFU_DEVICE_PEAK, "f0", default="<peak TFLOP/s>", matchers='role=%q',
                          label_args=("role",))


def mfu_impossible() -> Remedy:
    return remedy(_peak_override(DEVICE_PEAK) + (
        " If the peak is right, a FLOPs metadata field misses the DP gather (allgather_diffusion_flops_meta)."),
        P("Pin the real peak: `'+ray_kwargs.ray_init.runtime_env.env_vars.VERL_OMNI_DEVICE_FLOPS_TFLOPS=\"",
          DEVICE_PEAK_SHORT, "\"'`"))


def _knob(path: str, setting: str, word: bool = False) -> Prose:
    return P(key(path), now_word(setting) if word else now(setting))


def mfu_drop() -> Remedy:
    sp = _config("engine", "veomni", veomni_key("actor_rollout_ref.actor.veomni_config.ulysses_parallel_size"),
                 key("actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size"))
    return remedy(
        P("Something inside the timed actor update got slower (offload changes are outside the MFU timer and show "
          "as StepTimeRegression instead): compare ", _knob(MICRO, "micro_batch"), ", ", sp, now("sp"), " and ",
          _knob("actor_rollout_ref.model.enable_gradient_checkpointing", "gradient_checkpointing", word=True),
          " with the baseline steps' config, and check GPU clocks / power for throttling.",
          settings([], "", sharpen(MICRO, "actor_rollout_ref.model.enable_gradient_checkpointing")), profile("actor")),
        "Compare micro batch, Ulysses SP and gradient checkpointing with the baseline steps; check GPU clocks")


def mfu_low() -> Remedy:
    return remedy(
        P("Check that the estimator matches the model (only Qwen-Image pipelines are registered), that the "
          "trainer saw the right device peak (", "`VERL_OMNI_DEVICE_FLOPS_TFLOPS`", ")",
          settings([({"gradient_checkpointing": "true"},
                      P(", that gradient checkpointing is counted (",
                        key("actor_rollout_ref.model.enable_gradient_checkpointing"), " is True here: the physical MFU "
                        "is ~33 % above the reported one, which counts no recompute pass)"))], "", ""),
          ", and that the actor is not starved: ", offload("gives the largest MFU gain"),
          settings([({"param_offload": "false", "optimizer_offload": "false"}, "")],
                   P(" and a larger ", key(MICRO), now("micro_batch")), P(" and a larger ", key(MICRO))),
          ".", settings([], "", sharpen(*OFFLOAD_KEYS, MICRO)),
          profile("actor")),
        mfu_low_action())


def mfu_low_action() -> Prose:
    def off(engine: str, name: str) -> Prose:
        return P("Check the device peak, then ", _actor_key(engine, name, "False"), " (now True)")
    return settings([({"engine": "veomni", "param_offload": "true"}, off("veomni", "param_offload")),
                     ({"param_offload": "true"}, off("fsdp", "param_offload")),
                     ({"engine": "veomni", "optimizer_offload": "true"}, off("veomni", "optimizer_offload")),
                     ({"optimizer_offload": "true"}, off("fsdp", "optimizer_offload")),
                     ({"param_offload": "false"}, P("Check the device peak, then raise ", key(MICRO),
                                                    now("micro_batch"), " if memory allows"))],
                    P("Check the device peak, then raise ", key(MICRO)),
                    P("Check the device peak, then ", key("actor_rollout_ref.actor.fsdp_config.param_offload", "False"),
                      " if on"))


def mfu_unsupported() -> Remedy:
    return remedy(
        P("Nothing to fix in training: MFU 0 means VeRL-Omni has no FLOPs estimator for this pipeline (only "
          "QwenImagePipeline is registered; edit / img2img / ControlNet variants report 0) or did not know the "
          "GPU name. To compare configurations, read throughput (perf/throughput) instead."),
        "Nothing to fix in training: compare configurations by perf/throughput, not MFU")


# --- StepTimeRegression (branches on its own `cause` label) -----------------------------------------
def _weight_sync() -> Prose:
    """Weight sync grew: the knobs of this run's sync path (docs/verl-source.md H14): the colocated path (backend
    naive: layered_summon, free_cache_engine; LoRA pushes only the adapter once the base is synced) or the checkpoint
    engine of a disaggregated rollout (backend, bucket size)."""
    head = "Weight sync grew (the nightly gives it its own 20 % threshold). "
    bucket = key("actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes")
    backend = key("actor_rollout_ref.rollout.checkpoint_engine.backend")
    lora = settings([({"lora_rank": "0"}, " Full weights are synced every step (no LoRA): a LoRA run would push only "
                                          "its adapter.")],
                    P(SettingValue("lora_rank", " With LoRA (rank ", ") each sync after the first pushes only the "
                                   "adapter (VeRL-Omni's LoRA-only fast path).")), "")
    colocated = P(
        "This run syncs colocated (", backend, " is naive): the trainer pushes weights into the sleeping rollout "
        "in-process. Its knobs: ", key("actor_rollout_ref.rollout.layered_summon"), now_word("layered_summon"),
        ", which gathers one FSDP unit at a time (less memory, more gathers), and ",
        key("actor_rollout_ref.rollout.free_cache_engine"), now_word("free_cache_engine"), ", with which the rollout "
        "first resumes its weight memory; check GPU memory pressure and the vLLM-Omni version.", lora)
    engine = P(
        "This run syncs through the checkpoint engine to a disaggregated rollout: ", backend,
        SettingWord("checkpoint_backend", " is "), ", and weights travel in buckets of ", bucket,
        SettingValue("bucket_megabytes", " = ", " MB"), ": a larger bucket means fewer transfers if memory allows.", lora)
    unknown = P("Sensitive to vLLM-Omni, LoRA, IPC, free-cache and ", key("actor_rollout_ref.rollout.layered_summon"),
                " on the colocated path (", backend, "=naive), and to ", backend, " and ", bucket,
                " when the rollout is disaggregated.",
                sharpen("actor_rollout_ref.rollout.checkpoint_engine.backend",
                        "actor_rollout_ref.rollout.layered_summon", "actor_rollout_ref.model.lora_rank"))
    return P(head, settings([({"checkpoint_backend": "naive"}, colocated)], engine, unknown))


def _weight_sync_action() -> Prose:
    return settings([({"checkpoint_backend": "naive"},
                      P("Colocated sync: check ", key("actor_rollout_ref.rollout.layered_summon"),
                        now_word("layered_summon"), " and GPU memory"))],
                    P("Raise ", key("actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"),
                      now("bucket_megabytes"), " if memory allows"),
                    P("Check the sync path: ", key("actor_rollout_ref.rollout.checkpoint_engine.backend"),
                      " and its bucket size"))


_ROLLOUT_KNOBS = P(key("actor_rollout_ref.rollout.max_num_seqs"), now("max_num_seqs"), ", ",
                   key("actor_rollout_ref.rollout.step_execution"), now_word("step_execution"))
STEP_CAUSES = {
    "reward": P("Reward scoring grew. ", reward_bound_text()),
    "inter_stage_idle": P("Untimed work between phases grew. ", inter_stage_idle_text()),
    "actor": P("The actor phases grew. If MFU held, the time went outside the timed train_batch: ",
               offload("gives the largest gain"), layered_summon(), ". If MFU dropped too, see MFUDrop.",
               settings([], "", sharpen(*OFFLOAD_KEYS, "actor_rollout_ref.model.lora_rank"))),
    "rollout": P("Generation grew: check rollout batching (", _ROLLOUT_KNOBS, ") and the rollout servers' queue."),
    "weight_sync": _weight_sync(),
    "other": P("Find the phase that grew in a trace of one step."),
}
CAUSE_ACTIONS = {
    "reward": reward_bound_action(),
    "inter_stage_idle": inter_stage_idle_action(),
    "actor": offload_action(),
    "rollout": P("Check rollout batching: ", key("actor_rollout_ref.rollout.max_num_seqs"), now("max_num_seqs"),
                 " and the servers' queue"),
    "weight_sync": _weight_sync_action(),
    "other": P("Find the phase that grew on the stage-share panel, then profile one step with nsys"),
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


def _cause_profile(cause: str) -> Prose:
    return reward_profile() if cause == "reward" else profile(CAUSE_PROFILE[cause])


def step_regression() -> Remedy:
    cases = tuple((c, (switch([({"trainer": V1, "reward": STREAMED}, _ROLLOUT_V1_STREAMED)], t) if c == "rollout"
                       else P(t)) + CREEP + _cause_profile(c)) for c, t in STEP_CAUSES.items())
    actions = tuple((c, switch([({"trainer": V1, "reward": STREAMED},
                                 "Check the scorer first (V1 gen includes scoring), then rollout batching")], a)
                     if c == "rollout" else P(a)) for c, a in CAUSE_ACTIONS.items())
    return remedy(P(LabelSwitch("cause", cases, P("Find the phase that grew on the stage-share panel.") + CREEP
                                + profile("nsys"))),
                  P(LabelSwitch("cause", actions, P("Find the phase that grew on the stage-share panel"))))


# What a creep (the description says "a creep of X% over N steps": no single step jumped) usually is.
CREEP = P(" If it is a creep (the description says so), it grows with the run rather than with a config: host memory "
          "or the dataloader filling up (node memory and swap), GPUs throttling as they heat (clocks and power on the "
          "GPUs dashboard), a checkpoint or log directory on a filling disk; compare a profiled step with one near the "
          "start.")


def workload_changed() -> Remedy:
    return remedy(
        P("Nothing to fix if the change was intended (a curriculum stage, a new ", key("data.train_batch_size"),
          " or ", key("actor_rollout_ref.rollout.n"), "): step time is judged per image from here on, so only a "
          "slower image pages. If it was not intended, check the batch settings of the resumed run."),
        "Nothing to fix if intended: step time is judged per image from here on")


def reward_saturation() -> Remedy:
    return remedy(
        P("Rewards no longer separate samples within groups (check critic/rewards/std_mean): harder or more "
          "diverse prompts, a finer-grained reward, or fix a broken scorer. Algorithm change, not a performance "
          "knob: more samples per group (", key("actor_rollout_ref.rollout.n"), ")."),
        "Check critic/rewards/std_mean: harder prompts or a finer reward (an algorithm change, not a knob)")


# --- TrainingStalled: info is perhaps planned work; past warning it is a hang -----------------------------------
def stalled_notice() -> Remedy:
    """TrainingStalled (info): perhaps planned work."""
    return remedy(
        P("Usually nothing to do yet: a checkpoint save (", key("trainer.save_freq"), "; written under ",
          key("trainer.default_local_dir"), "/global_step_<next step>, growing while it saves) or a validation "
          "pass (", key("trainer.test_freq"), ") may be running; verl forces both on the last step. If the warning "
          "follows, treat it as a hang."),
        "Perhaps planned work (a checkpoint or validation): if the warning follows, treat it as a hang")


def stall_resume() -> Prose:
    """How to continue after fixing a hang, from the run's ``trainer.resume_mode`` (never proposes auto to a run that
    has it; docs/verl-source.md D11). No config: the advice as before issue 32."""
    auto = key("trainer.resume_mode", "auto")
    old = P(" resume from the last checkpoint with ", auto, " after fixing it.")
    return settings([({"resume_mode": "auto"}, P(" after fixing it the same command resumes from the last checkpoint "
                                                 "(this run's ", key("trainer.resume_mode"), " is auto).")),
                     ({"resume_mode": "resume_path"}, P(" after fixing it point ", key("trainer.resume_from_path"),
                                                        " at the last checkpoint (this run's ", key("trainer.resume_mode"),
                                                        " is resume_path) or set ", auto, ".")),
                     ({"resume_mode": "disable"}, P(" after fixing it set ", auto, " (now disable) to continue from the "
                                                    "last checkpoint instead of step 1."))],
                    old, old)


def stalled() -> Remedy:
    """TrainingStalled past its warning (warning, critical): a hang, never "nothing to do": where the step is held
    first (the Ray task-event source's holder and the held call's stack, issue 31; nothing without the source:
    stalls.HOLDER_REMEDY), then what to check and how to resume."""
    from .stalls import HOLDER_REMEDY
    return remedy(
        P(HOLDER_REMEDY, "Check the trainer process and Ray (ray status, driver and worker logs): a hung NCCL "
          "collective, a dead actor or an OOM kill is the usual cause;", stall_resume()),
        "A hang: `omniwatch ps` names the held call, its node and pid; py-spy dump it, then check ray status")


def crashed() -> Remedy:
    """TrainingCrashed: the run's Ray job failed (issue 31); its error is in the description."""
    return remedy(
        P("Read the error above and the driver / TaskRunner log (`ray job logs <job>` for a submitted job; the "
          "driver's console otherwise): it says what failed;", stall_resume()),
        "Read the job's error and driver log (`ray job logs <job>`), fix it, then resume from the last checkpoint")


# --- RolloutStraggler (legacy: V1 logs no agent-loop keys) ---------------------------------------------
def straggler() -> Remedy:
    return remedy(
        P("One sample's generation took far longer than queueing behind equal requests explains, and gen waits "
          "for it. Find the slow replica on the Rollout engine dashboard (per-replica request latency, running "
          "requests; a replica on a throttling or shared GPU shows there and on the GPU dashboard) and replace or "
          "drain that node. If timing_s/agent_loop/slowest/num_preempted is above 0 the request was preempted for "
          "memory: lower ", key("actor_rollout_ref.rollout.max_num_seqs"), now("max_num_seqs"), " or raise ",
          key("actor_rollout_ref.rollout.gpu_memory_utilization"), ". Prompts of very different cost (resolution, "
          "frames) in one batch make the same tail: bucket them.", profile("rollout")),
        "Find the slow replica on the Rollout engine dashboard and drain its node")


# --- GradNormNonFinite -------------------------------------------------------------------------------------
def grad_nonfinite() -> Remedy:
    return remedy(
        P("VeRL-Omni skipped these updates: the pre-clip gradient norm was NaN/Inf, so it zeroed the gradients "
          "(the actor worker's log says 'WARN: grad_norm is not finite'); the LR schedule still advanced. Find "
          "where the non-finite value enters: rewards or advantages (critic/rewards/*, critic/advantages/* "
          "missing from the same steps: a reward function returning NaN), the loss (actor/loss missing), or "
          "diverging weights (actor/grad_norm growing before it broke). Then lower ",
          key("actor_rollout_ref.actor.optim.lr"), ", keep clipping on (", key("actor_rollout_ref.actor.optim.clip_grad"),
          "), and if no update succeeds any more resume from a checkpoint before the skips (",
          key("trainer.resume_mode", "resume_path"), " with ", key("trainer.resume_from_path"), ")."),
        P("Find where NaN enters (rewards, loss, weights), then lower ", key("actor_rollout_ref.actor.optim.lr")))


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
_RS_DECOUPLED_ACTION = P("Match the rollout's numerics to training, or widen ",
                         key("algorithm.rollout_correction.rollout_rs_threshold"))


def rs_rejection() -> Remedy:
    return remedy(
        P(LabelSwitch("mode", (("bypass", _RS_BYPASS), ("decoupled", _RS_DECOUPLED)), _RS_DECOUPLED)),
        P(LabelSwitch("mode", (("bypass", P(key("algorithm.rollout_correction.bypass_mode", "False"),
                                           ", or match the rollout's numerics to training")),
                               ("decoupled", _RS_DECOUPLED_ACTION)), _RS_DECOUPLED_ACTION)))


# --- TimeOutsideStep ------------------------------------------------------------------------------------------
_OUT_V1 = (
    "After every step V1 fetches the whole batch from TransferQueue a second time (_compute_metrics), then "
    "runs kv_clear and logging, all outside timing_s/step. It moves as much data as the in-step fetch: spread "
    "storage over more units (" + key("transfer_queue.backend.SimpleStorage.num_data_storage_units")
    + "), move trajectories over RDMA (" + key("transfer_queue.backend.storage_backend", "MooncakeStore") + " with "
    + key("transfer_queue.backend.MooncakeStore.protocol", "rdma") + ", experimental), or store less per trajectory; "
    "and check the logger backends (" + key("trainer.logger") + ") as below.")
_OUT_LEGACY = (
    "Between two steps the legacy trainer loads the next batch, builds the generation batch and repeats it (before "
    "the step timer starts), computes the metrics and logs them synchronously to every backend in " + key("trainer.logger")
    + " (a slow or unreachable wandb / mlflow server blocks the loop). Give the dataloader more workers ("
    + key("data.dataloader_num_workers") + "), and drop or fix a slow logger backend.")
_OUT_DEFAULT = (
    "Something between two steps runs outside every timer: the dataloader (" + key("data.dataloader_num_workers")
    + "), metric computation, synchronous logging (" + key("trainer.logger")
    + "), and in V1 the second TransferQueue fetch of the batch after the step.")


def outside_step() -> Remedy:
    return remedy(switch([({"trainer": V1}, _OUT_V1), ({"trainer": LEGACY}, _OUT_LEGACY)], _OUT_DEFAULT),
                  P("Check the logger backends (", key("trainer.logger"), ") and ", key("data.dataloader_num_workers")))


# --- TimersExceedStep ---------------------------------------------------------------------------------------------
def timers_exceed() -> Remedy:
    return remedy(
        P("A timing_s/<name> timer runs inside another phase (a marked_timer nested in gen, reward or "
          "update_actor), so omniwatch adds its seconds twice and the untimed time between phases is hidden: "
          "InterStageIdleGPU cannot see it from timers (its GPU evidence, --gpu on, still can). Log the nested "
          "timer as a sub-key (timing_s/<phase>/<name>: keys with a further '/' are not added) or drop it; the "
          "exporter's log names the timers it does not know."),
        "Log the nested timer as timing_s/<phase>/<name>, or drop it")


# --- RankStraggler and RayTaskEventsLost (Ray's task events) ----------------------------------------------------
def rank_straggler() -> Remedy:
    return remedy(
        P("The same worker finishes last every time, so the whole worker group waits for it at every dispatch. "
          "Look at that node: a GPU throttling or shared with another job (GPU dashboard: SM clock, utilisation, "
          "other processes), a slower interconnect link, a data shard much larger than the others (uneven "
          "micro-batches), or host contention (CPU, page cache, dataloader). Cordon or replace the node, or "
          "rebalance the batch; `omniwatch ps` names the node and pid while it runs."),
        "Look at that rank's node (`omniwatch ps`): a throttled or shared GPU, a slow link; cordon it")


def ray_events_lost() -> Remedy:
    return remedy(
        P("If the count of events Ray dropped rises (the worker-lanes dashboard): Ray keeps a bounded "
          "number of task events and evicts the oldest beyond it; start the cluster with a larger "
          "RAY_task_events_max_num_task_in_gcs (GCS, default 100000) and, if the driver drops them, a "
          "larger RAY_task_events_max_num_status_events_buffer_on_worker. If it does not: more calls ran "
          "at once than omniwatch's page of 2000, and the calls past it were not seen."),
        "If Ray's dropped count rises, restart Ray with a larger RAY_task_events_max_num_task_in_gcs")


# --- RolloutQueueSaturated (branches on the alert's `role`, then on the run's layout) ---------------------------
# It fires only while the step waits on the server (docs/verl-source.md C8): legacy and V1 sync submit the whole
# batch (train_batch_size x rollout.n requests) at once, so a queue at max_num_seqs is normal during gen and costs
# time only because gen holds the step; a separate_async standalone rollout is busy by design and holds the step
# only when the trainer waits for samples. Fewer samples per prompt or a smaller batch would shrink the queue but
# change the algorithm: not offered here (docs/runbooks.md#rolloutqueuesaturated says so).
_STEPWISE = P("try step-wise batching (", key("actor_rollout_ref.rollout.step_execution", "True"),
              ", less memory per concurrent request)")
_RQ_MORE_AT_ONCE = P(
    "raise ", key("actor_rollout_ref.rollout.max_num_seqs"), now("max_num_seqs"), " if memory allows (published "
    "Qwen-Image LoRA: 1 -> 32 concurrent requests cut gen from 226 s to 108 s; true CFG at 512x512 runs out of "
    "memory above 32)", settings([({"step_execution": "true"}, " (this run already batches step-wise)")],
                                 P(", ", _STEPWISE), P(", ", _STEPWISE)))
_RQ_SYNC = P(
    "Every step submits its whole batch (train_batch_size x rollout.n requests) at once, so requests queue whenever "
    "the batch is larger than the slots of the replicas, and gen holds the step meanwhile. Let more run at once: ",
    _RQ_MORE_AT_ONCE, ", or add rollout replicas (more GPUs, or a lower ",
    key("actor_rollout_ref.rollout.tensor_model_parallel_size"), now("rollout_tp"), " for more replicas on the same GPUs).")
_RQ_SEPARATE_ASYNC = P(
    "The standalone rollout is busy by design, but here the trainer waits for its samples (a large timing_s/gen): "
    "it cannot keep up. Give it more GPUs (" + key("actor_rollout_ref.rollout.nnodes") + " x "
    + key("actor_rollout_ref.rollout.n_gpus_per_node") + ") or ", _RQ_MORE_AT_ONCE, ".")
_RQ_DEFAULT = P(
    "The step waits on generation while requests queue at every slot: ", _RQ_MORE_AT_ONCE,
    ", or add rollout replicas (GPUs; in separate_async " + key("actor_rollout_ref.rollout.nnodes") + " x "
    + key("actor_rollout_ref.rollout.n_gpus_per_node") + " size the standalone rollout).")
_RQ_REWARD = P(
    "Scoring requests queue at the reward servers while the step waits for them: add reward replicas (pool GPUs "
    + key("reward.reward_model.n_gpus_per_node") + " x " + key("reward.reward_model.nnodes") + ", or a lower "
    + key("reward.reward_model.rollout.tensor_model_parallel_size"), now("reward_tp"), " for more replicas on the same "
    "GPUs) or raise " + key("reward.reward_model.rollout.max_num_seqs") + " if memory allows ("
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


# A serial engine although the config has step_execution on: the clamp does not apply then (G1: `and not
# step_execution`), so the ceiling is max_num_seqs itself or a pipeline that serves one request per step.
_RQ_SERIAL_STEPWISE = P(
    "This replica is a serial engine: it generates one request at a time although step-wise batching is on (",
    key("actor_rollout_ref.rollout.step_execution"), now_word("step_execution"), "), so VeRL-Omni does not clamp "
    "max_num_seqs: check ", key("actor_rollout_ref.rollout.max_num_seqs"), now("max_num_seqs"),
    " (raise it if memory allows) and that the pipeline implements prepare_encode / denoise_step / step_scheduler / "
    "post_decode; otherwise add rollout replicas (more GPUs, or a lower ",
    key("actor_rollout_ref.rollout.tensor_model_parallel_size"), now("rollout_tp"), " for more replicas on the same "
    "GPUs).")


def rollout_saturated() -> Remedy:
    by_layout = switch([({"async_mode": SEPARATE_ASYNC}, _RQ_SEPARATE_ASYNC), ({"async_mode": SYNC}, _RQ_SYNC)],
                       _RQ_DEFAULT)
    more = P("Let more run at once: raise ", key("actor_rollout_ref.rollout.max_num_seqs"), now("max_num_seqs"),
             " if memory allows")
    by_layout_action = switch([({"async_mode": SEPARATE_ASYNC},
                                P("Give the standalone rollout more GPUs: ",
                                  key("actor_rollout_ref.rollout.n_gpus_per_node")))], more)
    serial = P(key("actor_rollout_ref.rollout.step_execution", "True"), ": this engine serves one request at a time")
    serial_action = settings([({"step_execution": "true"},
                               P("Step-wise on: raise ", key("actor_rollout_ref.rollout.max_num_seqs"),
                                 now("max_num_seqs"), "; the engine runs one request at a time"))], serial, serial)
    return remedy(
        P(LabelSwitch("role", (("reward", P(_RQ_REWARD) + profile("reward")),),
                      P(LabelSwitch("engine", (("serial", settings([({"step_execution": "true"}, _RQ_SERIAL_STEPWISE)],
                                                                   _RQ_SERIAL, _RQ_SERIAL)),), by_layout))
                      + profile("rollout"))),
        P(LabelSwitch("role", (("reward", P("Add reward replicas: ", key("reward.reward_model.n_gpus_per_node"),
                                            " or a lower reward TP")),),
                      P(LabelSwitch("engine", (("serial", serial_action),), by_layout_action)))))


# --- TransferQueue (V1 only: legacy runs have no TransferQueue) ------------------------------------------------
_TQ_STOPGAP = "raise " + key("transfer_queue.backend.SimpleStorage.total_storage_size") + " only as a stopgap"
# How far separate_async's rollout may run ahead (OMNI diffusion_trainer.yaml L243-260: num_warmup_batches,
# max_off_policy_threshold, max_off_policy_strategy drop | wait; docs/verl-source.md H13): never proposes the
# strategy the run already has.
_TQ_STRATEGY_DROP = key("trainer.v1.sampler.max_off_policy_strategy", "drop")
_TQ_BOUND_AHEAD = P(
    "bound how far rollout runs ahead of training (fewer batches queued ahead: ",
    key("trainer.v1.separate_async.num_warmup_batches"), now("warmup_batches"), "; a tighter staleness bound: ",
    key("trainer.v1.sampler.max_off_policy_threshold"), now("off_policy_threshold"), ", the model versions a trajectory "
    "may span, ", settings([({"off_policy_strategy": "drop"}, "whose stale trajectories this run already drops"),
                            ({"off_policy_strategy": "wait"}, P("with ", _TQ_STRATEGY_DROP, " (now wait)"))],
                           P("with ", _TQ_STRATEGY_DROP), P("with ", _TQ_STRATEGY_DROP)), ")")
_TQB_SEPARATE_ASYNC = P(
    "Make the consumer clear what it consumed (kv_clear / clear_samples after every step) and, since separate_async "
    "lets rollout run ahead of training, ", _TQ_BOUND_AHEAD, "; " + _TQ_STOPGAP + ".")
_TQB_SYNC = (
    "In sync mode rollout cannot run ahead of training, so samples that accumulate are samples nobody clears: make "
    "the consumer clear what it consumed (kv_clear / clear_samples after every step, custom code that reads from "
    "TransferQueue included); " + _TQ_STOPGAP + ".")
_TQB_DEFAULT = P(
    "Make the consumer clear what it consumed (kv_clear / clear_samples after every step); in separate_async also ",
    _TQ_BOUND_AHEAD, "; " + _TQ_STOPGAP + ".")


def tq_backlog() -> Remedy:
    return remedy(switch([({"async_mode": SEPARATE_ASYNC}, _TQB_SEPARATE_ASYNC), ({"trainer": V1}, _TQB_SYNC)],
                         _TQB_DEFAULT),
                  switch([({"async_mode": SEPARATE_ASYNC}, "Clear consumed samples after every step; bound how far "
                                                           "rollout runs ahead")],
                         "Clear consumed samples (kv_clear / clear_samples) after every step"))


_TQC = (
    "Find why the consumer stopped clearing (trainer hung or crashed, kv_clear failing: see TrainingStalled); free "
    "storage (clear stale partitions) or restart with a larger "
    + key("transfer_queue.backend.SimpleStorage.total_storage_size"))


def tq_backlog_critical() -> Remedy:
    return remedy(switch([({"async_mode": SEPARATE_ASYNC}, P(_TQC + ", then ", _TQ_BOUND_AHEAD, ".")),
                          ({"trainer": V1}, _TQC + ".")],
                         P(_TQC + "; in separate_async then also ", _TQ_BOUND_AHEAD, ".")),
                  "Find why the consumer stopped clearing (see TrainingStalled); free storage")


def tq_slow_leak() -> Remedy:
    return remedy(
        P("List what stays (tq.kv_list() per partition) and clear it: kv_clear the keys or clear_partition a "
          "partition that is no longer read; then fix the code path that skips clearing (failed samples, "
          "validation partitions)."),
        "List what stays (tq.kv_list()) and clear it; fix the code path that skips clearing")


# The alert labels each remedy branches on, with the values it knows (the remedy's default branch takes any other):
# remedy_info renders one text per case, docs/alerts.md lists them, tests render every one.
LABEL_CASES: dict[str, tuple[dict[str, str], ...]] = {
    names.ALERT_STEP_REGRESSION: tuple({"cause": c} for c in STEP_CAUSES),
    names.ALERT_RS_REJECTION: ({"mode": "bypass"}, {"mode": "decoupled"}),
    names.ALERT_ROLLOUT_SATURATED: ({"role": "rollout"}, {"role": "rollout", "engine": "serial"}, {"role": "reward"}),
}
