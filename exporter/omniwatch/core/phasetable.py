"""The phase table (issue 34 item 3), pure data: one row per timed phase of a verl step (timer ``timing_s/<name>``,
in the trainers' order; ``untracked``, the untimed rest, last) with its StepTimeRegression cause (analytics), ledger
bucket (ledger) and colour (palette); one row per Ray worker method (discovery/phases, docs/verl-source.md §R) with
the phase it runs, its fleet on a colocated actor+rollout worker and whether its GPU time is overhead (gpu/fleet).
Every other list of phases or methods is computed from these (tests/test_vocabulary.py keeps it so)."""
from dataclasses import dataclass

from ..names import UNTRACKED_PHASE

TIMING = "timing_s/"  # verl's timer keys: timing_s/<phase>, timing_s/step, timing_s/agent_loop/...
CAUSES = ("reward", "inter_stage_idle", "actor", "rollout", "weight_sync", "other")  # StepTimeRegression's
# The ledger buckets a phase is booked under when not its own name (ledger.NON_PHASE names the rest).
REWARD, IDLE, CHECKPOINT = "reward_critical_path", "inter_stage_idle", "checkpoint"


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    cause: str | None      # StepTimeRegression cause; None: its time is no cause (checkpoint steps are left out)
    colour: str            # hex (Grafana's fixed colours, Bokeh, matplotlib)
    bucket: str = ""       # ledger bucket; "": its own name
    overhead: bool = False  # its Ray methods' GPU time is overhead, not productive (gpu/fleet.py)
    timed: bool = True     # a timing_s/<name> timer inside timing_s/step

    @property
    def key(self) -> str:
        return TIMING + self.name


# Tableau-20-like hues, chosen so neighbouring phases of a step differ; grey for time no phase owns.
PHASES = (
    Phase("feed", "rollout", "#17becf"), Phase("gen", "rollout", "#1f77b4"),
    Phase("reward", "reward", "#d62728", REWARD), Phase("old_log_prob", "actor", "#98df8a"),
    Phase("rollout_corr", "actor", "#ffbb78"), Phase("ref", "actor", "#aec7e8"), Phase("teacher", "actor", "#c5b0d5"),
    Phase("adv", "actor", "#dbdb8d"), Phase("prepare_actor_batch", "actor", "#9edae5"),
    Phase("update_actor", "actor", "#2ca02c"), Phase("save_checkpoint", None, "#8c564b", CHECKPOINT, overhead=True),
    Phase("update_weights", "weight_sync", "#9467bd", overhead=True), Phase("dump_rollout_generations", "other", "#f7b6d2"),
    Phase(UNTRACKED_PHASE, "inter_stage_idle", "#7f7f7f", IDLE, timed=False),
)
PHASE = {p.name: p for p in PHASES}


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    phase: str | None = None  # the step phase it runs (its colour); None: no phase
    fleet: str = "actor"      # a colocated actor+rollout WorkerDict's fleet while it runs it
    overhead: bool = False    # (no phase) its GPU time is overhead; a phase's method: the phase's
    colour: str = ""          # (no phase) its own neutral colour, none a phase's


# Ray worker methods (docs/verl-source.md §R) in the order of omniwatch_ray_worker_phase's codes: append, never reorder.
# update_actor's train_(mini_)batch, the old log-prob's forward passes, weight-sync helpers (wake-up and sleep too).
METHODS = (
    Method("update_actor", "update_actor"), Method("infer_actor_batch", "old_log_prob"), Method("infer_ref_batch", "ref"),
    Method("infer_teacher_batch", "teacher"), Method("compute_log_prob", "old_log_prob"),
    Method("compute_ref_log_prob", "ref"), Method("compute_values", colour="#bcbd22"),
    Method("update_critic", colour="#8c6d31"), Method("compute_rm_score", "reward"),
    Method("generate_sequences", "gen", "rollout"), Method("update_weights", "update_weights"),
    Method("save_checkpoint", "save_checkpoint"), Method("load_checkpoint", "save_checkpoint"),
    Method("init_model", overhead=True, colour="#c49c94"), Method("copy_adapter", "update_weights"),
    Method("ema_update_adapter", "update_weights"), Method("execute_checkpoint_engine", "update_weights"),
    Method("async_calls_finalize_fn_exec", overhead=True, colour="#c7c7c7"),
    Method("start_profile", overhead=True, colour="#dbdbdb"), Method("stop_profile", overhead=True, colour="#dbdbdb"),
    Method("train_batch", "update_actor"), Method("train_mini_batch", "update_actor"), Method("infer_batch", "old_log_prob"),
    Method("generate", "gen", "rollout"), Method("wake_up", "update_weights", "rollout"),
    Method("sleep", "update_weights", "rollout"), Method("compute_score", "reward"),
    Method("compute_score_batch", "reward"), Method("compute_score_disrm", "reward"),
)
