"""The configurations tests/test_matrix.py backtests (a verl-shaped run per trainer x reward layout x async mode,
faults, restarts after a fix) and the alerts each must raise: data shared by the test and the table of
docs/alerts.md that ``omniwatch generate`` renders from it (tests/doc_tables.py), so the table says what the
test asserts and is drift-checked, not pasted."""
from __future__ import annotations

from dataclasses import dataclass, field

from omniwatch import names as n
from omniwatch.simulate import Fault

STEPS = 40
ONSET = 12
PLANNED = dict(pace=240.0, checkpoint_every=10, checkpoint_factor=4.5, validation_every=8, validation_factor=2.5,
               total_steps=STEPS)
LAYOUTS = {
    "legacy-colocated": dict(trainer="legacy", reward="colocated"),
    "legacy-pool": dict(trainer="legacy", reward="pool"),
    "legacy-function": dict(trainer="legacy", reward="function"),
    "v1-colocated": dict(trainer="v1", reward="colocated"),
    "v1-function": dict(trainer="v1", reward="function"),
    "v1-separate-async": dict(trainer="v1", reward="function", async_mode="separate_async"),
}
# How much slower each reward layout's scoring gets: a reward model 5x, a pool that cannot keep up 12x,
# a reward function (an HTTP scorer) 50x (it starts ~1 % of the step, a model ~12 %).
REWARD_SLOW = {"colocated": 5.0, "pool": 12.0, "function": 50.0}
K = 3
FLAGGED = {s for s in range(1, STEPS + 1) if s % 10 == 0 or s % 8 == 0 or s == STEPS}


def kth_normal(onset: int, k: int = K) -> int:
    """The step at which a fault starting at ``onset`` fills the k-step window of normal steps."""
    normal = [s for s in range(onset, STEPS + 1) if s not in FLAGGED]
    return normal[k - 1]


FIRST = kth_normal(ONSET)
# StepTimeRegression of a cause no alert of its own names (generation): 2 of the window's 3 steps 25 % over the
# reference already fire it, on the window median (a 1.6x generation: at the 2nd or, with a fast step, the 3rd)
MEDIAN_FIRST = kth_normal(ONSET, 2)


@dataclass
class Exp:
    alert: str
    first: int
    last: int | None = None                          # None: any
    labels: dict = field(default_factory=dict)
    severity: str = "warning"
    remedy: tuple[str, ...] = ()                     # substrings the rendered remedy must contain
    not_remedy: tuple[str, ...] = ()                 # ... and must not
    first_max: int | None = None                     # first may be any step from `first` to this one


@dataclass
class Case:
    layout: str
    scenario: str
    faults: list = field(default_factory=list)
    expect: list[Exp] = field(default_factory=list)
    after_restart: tuple[int, dict, list] | None = None  # (resume step, layout changes, faults) after a fix
    extra: dict = field(default_factory=dict)            # more RunSpec fields


def reward_remedy(layout: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if LAYOUTS[layout]["reward"] == "colocated":
        return ("reward.reward_model.enable_resource_pool=True",), ("already scored",)
    return ("already scored", "reward.num_workers"), ("enable_resource_pool=True",)


def idle_remedy(layout: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    lay = LAYOUTS[layout]
    if lay["trainer"] == "legacy":
        return ("straggler",), ("TransferQueue",)
    if lay.get("async_mode") == "separate_async":
        return ("put_dataproto_fields_to_tq", "parameter_sync_step"), ()
    return ("put_dataproto_fields_to_tq", "does not shrink"), ()


def cases() -> list[Case]:
    out = []
    for layout in LAYOUTS:
        out.append(Case(layout, "healthy"))
    for layout, lay in LAYOUTS.items():
        slow = Fault("reward_slow", ONSET, factor=REWARD_SLOW[lay["reward"]])
        if lay["trainer"] == "v1" and lay["reward"] != "colocated":
            # V1 scores inside the agent loop and logs no per-sample timers: a slow reward is only generation
            # getting slower (documented limit): the regression names the rollout.
            exp = [Exp(n.ALERT_STEP_REGRESSION, MEDIAN_FIRST, STEPS, labels={"cause": "rollout"}, first_max=FIRST)]
        else:
            yes, no = reward_remedy(layout)
            exp = [Exp(n.ALERT_REWARD_BOUND, FIRST, STEPS, remedy=yes, not_remedy=no),
                   Exp(n.ALERT_STEP_REGRESSION, FIRST, STEPS, labels={"cause": "reward"})]
        # a slowdown that lasts is judged against the anchored reference: held to the last step
        out.append(Case(layout, "reward_slow", [slow], exp))
    for layout in ("legacy-colocated", "v1-function", "v1-separate-async"):
        yes, no = idle_remedy(layout)
        out.append(Case(layout, "idle_gap", [Fault("idle_gap", ONSET, seconds_share=0.3)], [
            Exp(n.ALERT_IDLE, FIRST, STEPS, {"evidence": "timers"}, remedy=yes, not_remedy=no),
            Exp(n.ALERT_STEP_REGRESSION, FIRST, STEPS, labels={"cause": "inter_stage_idle"})]))
    for layout in ("legacy-pool", "v1-colocated"):
        out.append(Case(layout, "actor_slow", [Fault("actor_slow", ONSET, factor=2.0)], [
            Exp(n.ALERT_MFU_DROP, FIRST, STEPS, labels={"role": "actor"}, remedy=("ppo_micro_batch_size_per_gpu",),
                not_remedy=("param_offload",)),
            Exp(n.ALERT_STEP_REGRESSION, FIRST, STEPS, labels={"cause": "actor"}, remedy=("param_offload=False",))]))
    # Generation 1.6x slower to the end (rollout batching, a slower rollout server): held to the last step.
    for layout in ("legacy-colocated", "v1-function"):
        out.append(Case(layout, "gen_slow", [Fault("gen_slow", ONSET, factor=1.6)], [
            Exp(n.ALERT_STEP_REGRESSION, MEDIAN_FIRST, STEPS, labels={"cause": "rollout"}, first_max=FIRST)]))
    # An episode that ends (update_actor 2x from step 12 to 24): MFUDrop is held until the window median is back,
    # the first healthy normal step (25) is its last; the regression (not held: MFUDrop names its cause) lasts as
    # long, on its creep condition (the window's median and the last 10 steps' still over 1.13x at step 25).
    out.append(Case("legacy-colocated", "actor_slow_episode", [Fault("actor_slow", ONSET, factor=2.0, end=24)], [
        Exp(n.ALERT_MFU_DROP, FIRST, 25, labels={"role": "actor"}),
        Exp(n.ALERT_STEP_REGRESSION, FIRST, 25, labels={"cause": "actor"})]))
    # Creeping drifts: generation and the actor update grow a little every step from step 10 (the reference of 20
    # normal steps holds their first steps: generation is caught at 35, not 31 as against 10 steps).
    out.append(Case("legacy-pool", "gen_creep", [Fault("creep", 10, value=0.02, phase="gen")], [
        Exp(n.ALERT_STEP_REGRESSION, 35, STEPS, labels={"cause": "rollout"})]))
    out.append(Case("v1-colocated", "actor_creep", [Fault("creep", 10, value=0.035, phase="update_actor")], [
        Exp(n.ALERT_STEP_REGRESSION, 31, STEPS, labels={"cause": "actor"}),
        Exp(n.ALERT_MFU_DROP, 22, STEPS, labels={"role": "actor"})]))  # the actor's MFU slides as it creeps
    # A wrong device peak (MFU 2.62 from step 1), fixed through a restart that resumes at 15 with the peak
    # pinned (after step 20 was logged): MFUImpossible stands while the fixed trainer warms up (the old window,
    # the last known state) and resolves once its first normal steps show MFU 0.31 (the resumed step 17), and no
    # MFUDrop against the old incarnation's MFU after it.
    out.append(Case("legacy-colocated", "mfu_peak_fix", [Fault("mfu_value", 1, value=2.62)], [
        Exp(n.ALERT_MFU_IMPOSSIBLE, kth_normal(1 + 2), 17, {"role": "actor", "evidence": "value"},
            remedy=("VERL_OMNI_DEVICE_FLOPS_TFLOPS",)),
        Exp(n.ALERT_MFU_IMPOSSIBLE, kth_normal(1 + 2), 17, {"role": "actor_infer", "evidence": "value"})],
        after_restart=(15, {}, [])))
    # A colocated reward model gating every step, fixed by a restart at 25 with a reward pool: the alert
    # stops once the fixed trainer's first step is in its window (25), nothing fires against the old
    # incarnation's baselines.
    out.append(Case("legacy-colocated", "reward_pool_fix", [Fault("reward_slow", ONSET, factor=5.0)], [
        Exp(n.ALERT_REWARD_BOUND, FIRST, 25, remedy=("enable_resource_pool=True",)),
        Exp(n.ALERT_STEP_REGRESSION, FIRST, labels={"cause": "reward"})],
        after_restart=(25, {"reward": "pool"}, [])))
    # A collective that hangs for 50 minutes inside step 25 of a 4-minute-step run: it pages.
    out.append(Case("v1-function", "hang", [Fault("hang", 25, value=3000.0)], [
        Exp(n.ALERT_STALLED, 24, 24, severity="warning"), Exp(n.ALERT_STALLED, 24, 24, severity="critical")]))
    # Signals the seeds name.
    # the straggler also lengthens gen: the regression names the rollout (Alertmanager lets the straggler
    # alert silence it; its window-median condition stands aside while the straggler ratio is up)
    out.append(Case("legacy-function", "straggler", [Fault("straggler", ONSET, factor=3.2)],
                    [Exp(n.ALERT_STRAGGLER, FIRST, STEPS), Exp(n.ALERT_STEP_REGRESSION, FIRST, STEPS, labels={"cause": "rollout"})]))
    out.append(Case("v1-separate-async", "grad_nonfinite", [Fault("grad_nonfinite", ONSET)],
                    [Exp(n.ALERT_GRAD_NONFINITE, kth_normal(ONSET, 3), STEPS)]))
    out.append(Case("legacy-colocated", "rs_drift", [Fault("rs_drift", ONSET, value=0.12)],
                    [Exp(n.ALERT_RS_REJECTION, FIRST, STEPS, {"mode": "decoupled"})],
                    extra={"rollout_corr": "decoupled"}))
    out.append(Case("v1-colocated", "nested_timer", [Fault("nested_timer", ONSET, seconds_share=0.05)],
                    [Exp(n.ALERT_TIMERS_EXCEED, FIRST, STEPS, severity="info")]))
    return out


CASES = cases()


def matrix_table() -> str:
    """The docs/alerts.md table of which alert was proven on which configuration (CASES)."""
    rows: dict[str, list[str]] = {}
    for c in CASES:
        for e in c.expect:
            key = e.alert + (f" ({e.severity})" if e.severity != "warning" else "")
            item = f"{c.layout}: {c.scenario.replace('_', ' ')}"
            if item not in rows.setdefault(key, []):
                rows[key].append(item)
    rows.setdefault(f"{n.ALERT_STALLED} (info)", []).append("every layout: heavy planned work (info only)")
    out = ["", "| alert | proven on (layout: scenario) |", "|---|---|"]
    out += [f"| `{k}` | {'; '.join(v)} |" for k, v in sorted(rows.items())]
    out.append(f"| every other alert | quiet on the healthy run of every layout ({', '.join(LAYOUTS)}) with the planned work above |")
    return "\n".join(out + [""])
