"""One colour per phase and ledger bucket, everywhere: the Grafana dashboards (fixed colour overrides on every
panel split by phase or bucket), the PNG previews and the offline report's charts (issue 26 item 10). A phase keeps
its colour whether it is a timed phase (``phase`` label), a ledger bucket (``bucket``) or a GPU phase
(``inter_stage``): the reader learns the colours once.

Colours are hex strings (Grafana's fixed colour mode and Bokeh/matplotlib all take them); the phases come in step
order (analytics.PHASE_ORDER), the non-phase buckets after them (ledger.NON_PHASE)."""
from __future__ import annotations

from . import ledger
from . import names as n
from .analytics import PHASE_ORDER

# Tableau-20-like hues, chosen so neighbouring phases of a step differ; grey family for time no phase owns.
PHASE_COLORS: dict[str, str] = {
    "feed": "#17becf",
    "gen": "#1f77b4",
    "reward": "#d62728",
    "old_log_prob": "#98df8a",
    "rollout_corr": "#ffbb78",
    "ref": "#aec7e8",
    "teacher": "#c5b0d5",
    "adv": "#dbdb8d",
    "prepare_actor_batch": "#9edae5",
    "update_actor": "#2ca02c",
    "save_checkpoint": "#8c564b",
    "update_weights": "#9467bd",
    "dump_rollout_generations": "#f7b6d2",
    n.UNTRACKED_PHASE: "#7f7f7f",
    # ledger buckets that are not a timed phase of their own
    ledger.REWARD: "#d62728",        # reward on the critical path: reward's colour
    ledger.IDLE: "#7f7f7f",          # inter-stage idle: the untracked time between phases
    ledger.CHECKPOINT: "#8c564b",    # save_checkpoint's colour
    ledger.VALIDATION: "#bcbd22",
    ledger.OUTSIDE: "#c7c7c7",
    ledger.STALLED: "#000000",
    "inter_stage": "#7f7f7f",        # the GPU sampler's name for the gap between timed phases
}
# Ray actor methods (worker lanes) that run a step phase take that phase's colour (discovery/phases.py): the actor
# update's train_batch / train_mini_batch are update_actor, the forward passes infer_batch / infer_actor_batch the
# old log-prob, the servers' generate and the agent loops' generate_sequences gen, the reward loops' scoring reward,
# the weight-sync helpers (checkpoint engine, adapter copies, the rollout's wake-up and sleep) update_weights
# (issue 32 item 7: train_batch was drawn in reward's red).
RAY_METHOD_PHASE = {"generate_sequences": "gen", "generate": "gen", "compute_rm_score": "reward",
                    "compute_score": "reward", "compute_score_batch": "reward", "compute_score_disrm": "reward",
                    "compute_log_prob": "old_log_prob", "infer_actor_batch": "old_log_prob", "infer_batch": "old_log_prob",
                    "compute_ref_log_prob": "ref", "infer_ref_batch": "ref", "infer_teacher_batch": "teacher",
                    "update_actor": "update_actor", "train_batch": "update_actor", "train_mini_batch": "update_actor",
                    "update_weights": "update_weights", "execute_checkpoint_engine": "update_weights",
                    "copy_adapter": "update_weights", "ema_update_adapter": "update_weights", "wake_up": "update_weights",
                    "sleep": "update_weights", "save_checkpoint": "save_checkpoint", "load_checkpoint": "save_checkpoint"}
# Ray methods that run no step phase: one neutral colour each, none a phase's (hex: Grafana and the previews alike)
RAY_OTHER_METHODS = {"init_model": "#c49c94", "start_profile": "#dbdbdb", "stop_profile": "#dbdbdb",
                     "async_calls_finalize_fn_exec": "#c7c7c7", "compute_values": "#bcbd22", "update_critic": "#8c6d31"}
OTHER = "#e377c2"  # a phase no list knows (a new verl timer)

assert set(PHASE_ORDER) <= set(PHASE_COLORS), "every phase has its colour"
assert set(ledger.PHASE_BUCKETS) | set(ledger.NON_PHASE) <= set(PHASE_COLORS), "every ledger bucket has its colour"


def color(name: str, default: str = OTHER) -> str:
    """The colour of a phase, ledger bucket or Ray method (the phase it runs; ``default`` for an unknown one)."""
    return PHASE_COLORS.get(RAY_METHOD_PHASE.get(name, name)) or RAY_OTHER_METHODS.get(name, default)
