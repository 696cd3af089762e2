"""Worker lanes: inside the step, live, from Ray's task events (the exporter's ``--ray-tasks`` source):
who holds the step now, one lane per worker rank (a state timeline of the phase each rank runs; a role
with more workers than ``--ray-lanes-max`` shows counts per phase instead), straggler spread per role and
phase, GPU time by fleet (gpu/fleet.py), and what the source itself costs and loses. Every aggregation keeps ``project, experiment``."""
from __future__ import annotations

from .. import names as n, palette
from ..config import Config
from ..discovery.phases import PHASES
from .panels import EXP, Dashboard, Panel, Row, Step, Target, by_run, cfg_step, default_tags, rate, run_max, sel

ROLE, PHASE, RANK = n.L_ROLE_T, n.L_PHASE_T, n.L_RANK
# omniwatch_ray_worker_phase's codes (discovery/taskmetrics.PHASE_CODE): 0 idle, then PHASES in order, each method
# in the colour of the step phase it runs (palette.RAY_METHOD_PHASE: one colour per phase on every dashboard)
PHASE_MAPPINGS = ((0, "idle", "transparent"),) + tuple(
    (i + 1, p, "text" if p == "other" else palette.color(p)) for i, p in enumerate(PHASES))
LANE_EXPR = run_max(sel(n.RAY_WORKER_PHASE), ROLE, RANK)

def dashboard(cfg: Config) -> Dashboard:
    """This dashboard drawn with ``cfg`` (thresholds, windows, selectors, the words of its descriptions)."""
    NOW = Row("Who holds the step", (
        Panel("Holder now",
              "The one-line answer from Ray's task events (what TrainingStalled's description and `omniwatch ps` say): "
              "the phase in progress, how many ranks are done, the slowest worker and its node; or the replica holding "
              "requests; or a dead actor; or that no worker call runs (the driver is between calls).",
              (Target(run_max(sel(n.STEP_HOLDER_INFO), ROLE, PHASE, n.L_HOLDER), "holding the step", instant=True,
                      table=True, mappings=((1, "now", "orange"),)),),
              unit="none", kind="table", w=16, h=5,
              columns=(("experiment", "run", None), (ROLE, "role", None), (PHASE, "phase", None),
                       (n.L_HOLDER, "who holds the step", "wrap")), hide_columns=("project",)),
        Panel("Held for", "How long the holder has held the step.",
              (Target(run_max(sel(n.STEP_HOLDER_SECONDS)), EXP, instant=True),), unit="s", kind="stat", w=8, h=5),
    ))

    LANES = Row("Worker lanes", (
        Panel("Phase per worker rank",
              "One lane per worker rank (rank = the worker group's order, as verl assigns it): the phase of the call it "
              "runs, idle between calls. Calls shorter than the poll interval may not show. Query: "
              f"`{LANE_EXPR}`.",
              (Target(LANE_EXPR, EXP + " {{role}} rank {{rank}}"),),
              unit="none", kind="statetimeline", w=24, h=12, mappings=PHASE_MAPPINGS),
        Panel("Workers per phase: $experiment",
              "Worker calls running, per role and phase: the lanes of a large role collapse to this "
              "(N of M ranks in phase X).",
              (Target(f"sum by ({by_run(ROLE, PHASE)}) ({sel(n.RAY_WORKERS_RUNNING)})", EXP + " {{role}} {{phase}}"),),
              unit="none", stack=True, min=0, w=24, h=8, repeat=True,
              fixed_colors=tuple((f".* {p}", palette.color(p)) for p in PHASES if palette.color(p, ""))),
    ))

    STRAGGLERS = Row("Stragglers", (
        Panel("Dispatch spread (slowest / median worker)",
              "Latest finished dispatch of each role's phase: the slowest worker's duration over the median worker's. "
              "Ranks doing equal work stay near 1; RankStraggler fires when the same rank is last in several "
              "dispatches in a row above the red line.",
              (Target(run_max(sel(n.RAY_DISPATCH_SPREAD), ROLE, PHASE), EXP + " {{role}} {{phase}}"),),
              unit="none", min=1, thresholds=(Step(None, "green"), cfg_step(cfg, "rank_straggler.spread", "red")),
              show_thresholds="dashed", w=12, runbook=n.ALERT_RANK_STRAGGLER),
        Panel("Last rank streak",
              "The rank that finished last in the most recent dispatches of each role's phase, how many dispatches in a "
              "row, and its node.",
              (Target(run_max(sel(n.RAY_STRAGGLER_STREAK), ROLE, PHASE, RANK, n.L_NODE),
                      EXP + " {{role}} {{phase}} rank {{rank}} ({{node}})"),),
              unit="none", min=0, thresholds=(Step(None, "green"), cfg_step(cfg, "rank_straggler.dispatches", "orange")),
              show_thresholds="dashed", w=12, runbook=n.ALERT_RANK_STRAGGLER),
    ))

    FLEET_EXPR = f"sum by ({by_run('fleet', 'bucket')}) ({rate(sel(n.GPU_FLEET_SECONDS_TOTAL))})"
    FLEET_NODE_EXPR = f"sum by ({by_run(n.L_NODE, 'bucket')}) ({rate(sel(n.GPU_FLEET_SECONDS_TOTAL))})"
    FLEETS = Row("GPU time by fleet", (
        Panel("GPUs by fleet and bucket, cluster: $experiment",
              "GPU-seconds per second (= GPUs) of every sampled GPU of the cluster (the exporter's and every node "
              "agent's, summed over node), by the fleet of the Ray worker call holding each GPU (actor / rollout / "
              "reward / other) and goodput bucket: productive (busy in a compute call), overhead (weight sync, "
              "checkpoint, init, wake / sleep calls, and busy with no call), idle; unmeasured: a node whose agent is "
              f"down (its GPUs counted, not as idle). Query: `{FLEET_EXPR}`.",
              (Target(FLEET_EXPR, EXP + " {{fleet}} {{bucket}}"),),
              unit="none", stack=True, min=0, w=24, h=8, repeat=True),
        Panel("GPUs by node and bucket: $experiment",
              "The same GPU-seconds per second per node (one series per node and bucket): which node's GPUs are idle, "
              f"and which node's agent is down (unmeasured). Query: `{FLEET_NODE_EXPR}`.",
              (Target(FLEET_NODE_EXPR, EXP + " {{node}} {{bucket}}"),),
              unit="none", stack=True, min=0, w=24, h=8, repeat=True),
        Panel("How GPUs were mapped to workers",
              "Each node's GPUs by how the fleet time maps each to a worker: nvml_pid (NVML lists the worker's pid; "
              "often empty in containers), placement (verl's bundle = local rank), node (server replicas), unmapped, "
              "agent_down (the node's agent is down).",
              (Target(run_max(sel(n.GPU_FLEET_GPUS), n.L_NODE, "fleet", n.L_MAPPING), "GPUs",
                      instant=True, table=True),),
              unit="none", kind="table", w=24, h=5),
    ))

    SOURCE = Row("Task-event source", (
        Panel("Poll cost", "Wall and exporter-CPU seconds of the latest poll of Ray's state API.",
              (Target(f"max by (kind) ({n.RAY_TASK_POLL_SECONDS})", "{{kind}}"),), unit="s", min=0, w=8, scope="global"),
        Panel("Task events Ray dropped", "Ray's GCS keeps a bounded number of task events and reports how many it "
              "dropped; while this grows, lanes are incomplete (the source closes no call it merely failed to see).",
              (Target(f"max({n.RAY_TASK_EVENTS_DROPPED})", "dropped"),
               Target(f"max({n.RAY_TASK_EVENTS_LOSSY})", "latest poll lossy", dashed=True)),
              unit="none", min=0, w=8, scope="global", runbook=n.ALERT_RAY_TASK_EVENTS_LOST),
        Panel("State-API calls", "Calls per second to Ray's state API (3 per poll, + the finished rows of the calls "
              "that ended and the pages of calls only a node observer saw, + the actor / node / placement-group tables "
              "when they change).", (Target(f"sum({rate(n.RAY_STATE_API_CALLS_TOTAL + '{}')})", "calls/s"),),
              unit="reqps", min=0, w=8, scope="global"),
    ), collapsed=True)

    return Dashboard(
        config=cfg,
        uid="omniwatch-worker-lanes",
        title="omniwatch / Worker lanes",
        description="Inside the step, live, from Ray's own task events: who holds the step, one lane per worker rank, "
                    "stragglers per role and phase, and the task-event source's own cost.",
        rows=(NOW, LANES, STRAGGLERS, FLEETS, SOURCE),
        tags=default_tags("ray"),
        variable_metrics=(n.STEP_HOLDER_INFO,),
    )
