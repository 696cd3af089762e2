"""The one home of every alert threshold, window and ``for:`` (kubernetes-mixin's ``_config``).

``alerts/*.rules.yml``, the alert prose, the dashboards' threshold lines and the threshold table of
``docs/alerts.md`` are generated from / read from :data:`DEFAULT` (``omniwatch rules generate``; ``make check`` fails on drift). Users tune a copy:
``omniwatch rules generate --config my.yml --out DIR`` renders rule files from a YAML file that
overrides any field below (validated; unknown keys are errors).

Each field's description says why the number is what it is (the calibration); docs/alerts.md shows it.
Counting in steps (which steps are in a window, baselines, warm-up) stays in the exporter
(``core/analytics.py``); only its default step counts, thresholds and ``for:`` live here.
"""
from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

# The exporter's step counts (core/analytics.py counts them; --window-steps, --baseline-steps, --warmup-steps)
DEFAULT_WINDOW_STEPS = 3
DEFAULT_BASELINE_STEPS = 20
DEFAULT_WARMUP_STEPS = 2
# The reference MFUDrop, StepTimeRegression and the per-cause regression judge against is anchored to the
# trainer incarnation: the median of its first REFERENCE_STEPS normal steps (warm-up, validation and
# checkpoint steps left out), frozen once the window has moved past them; until then the median of the
# normal steps before the window (at least MIN_BASELINE_STEPS). A rolling baseline forgives a fault that
# lasts (it becomes the new normal in ~N/2 steps) and never sees a creep; an anchored one holds the alert
# until the run is back near where it started. 20: the median of 10 steps is off by ~3.4 % (1 sd) under 15 %
# step jitter, and a run whose first steps were an unlucky fast stretch then pages for the rest of its life
# (scorecard corpus healthy_pool_jittery: its first 10 normal steps 9 % under its level); 20 halve that. A fault
# that starts inside them is cut out by the level-shift test (shift.reference_shift), so the reference is never
# a fault (docs/alerts.md, "How each reference is chosen").
REFERENCE_STEPS = 20
# The creep series: the median of the last DRIFT_STEPS normal steps against the same reference (a creep that is
# too slow for the k-step window to see before it has cost tens of steps).
DRIFT_STEPS = 10


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Selectors(_Part):
    job: str = Field("omniwatch", description="Prometheus job name of the exporter's scrape job "
                     "(OmniwatchSourceDown's `up{job=...}`; the native stack and compose name it so).")
    extra: str = Field("", description="Extra label matchers added to every omniwatch series the rules "
                       "read, e.g. `cluster=\"prod\"` for a central Prometheus that holds several clusters.")


class Window(_Part):
    """The exporter's step-window defaults, quoted in alert prose (the exporter's flags set the real ones)."""
    k: int = Field(DEFAULT_WINDOW_STEPS, description="Normal steps in the alert window (`--window-steps`).")
    baseline: int = Field(DEFAULT_BASELINE_STEPS,
                          description="Normal steps in the MFU / step-time baselines (`--baseline-steps`).")
    warmup: int = Field(DEFAULT_WARMUP_STEPS, description="Steps after each trainer (re)start left out as warm-up (`--warmup-steps`).")
    reference: int = Field(REFERENCE_STEPS, description=(
        "Normal steps in the anchored reference of MFUDrop and StepTimeRegression: the first ones of each trainer "
        "incarnation (config.REFERENCE_STEPS), re-chosen where a shift inside them is found (docs/alerts.md)."))
    drift: int = Field(DRIFT_STEPS, description=(
        "Normal steps the creep conditions of StepTimeRegression and MFUDrop take the median of (config.DRIFT_STEPS)."))


class RewardBound(_Part):
    ratio: float = Field(0.4, description=(
        "Window min of reward's share of the generation window (gen + reward). Healthy colocated runs "
        "measure 0.19-0.24, healthy async-reward runs 0.06-0.09, a 5x slower reward model 0.52-0.61 "
        "(tests/fixtures/verl): 0.4 sits in the gap with margin on both sides."))
    step_share: float = Field(0.2, description=(
        "Window min of reward's critical-path seconds / step seconds: reward must also matter to the step. "
        "With actor-dominated steps (reward ~10 % of the step) a separate reward pool buys little and "
        "costs GPUs; the VeRL-Omni tuning guide's 'significant fraction of step time'. Healthy colocated "
        "fixtures 0.11-0.13, faulty 0.36-0.42."))
    resolve_ratio: float = Field(0.3, description=(
        "Hysteresis: once firing, RewardBoundRollout stays while the window *median* of the ratio is above this (and "
        "the step share's median above resolve_step_share), so it resolves when most of the last k steps are back "
        "near healthy. 0.3 is above every healthy run (0.19-0.24 colocated) and under the fault (0.52-0.61): a fault "
        "hovering at the 0.4 line with step jitter is one alert, not one per crossing."))
    resolve_step_share: float = Field(0.15, description=(
        "Hysteresis of the step-share condition: above healthy colocated runs (0.11-0.13), under the fault (0.36-0.42)."))


class InterStageIdle(_Part):
    ratio: float = Field(0.10, description=(
        "Window min of untimed (or GPU-measured idle) seconds between timed phases / step seconds. Healthy "
        "runs 0.004-0.007; the V1 transfer fault (90 s untimed TransferQueue work per step) 0.26-0.33. "
        "10 % is 15x healthy and under a third of the fault."))
    resolve_ratio: float = Field(0.07, description=(
        "Hysteresis: once firing, InterStageIdleGPU stays while the window median is above this: 10x healthy, so a "
        "fault at the 10 % line is one alert, and an ended fault resolves within about k steps."))


class MFU(_Part):
    impossible: float = Field(1.0, description=(
        "MFU 1.0 = every DP GPU at its advertised peak for the timed call; above is physically impossible "
        "(VeRL-Omni docs/perf/diffusion_mfu.md). The relabeled-SKU fixture reports 2.6."))
    impossible_resolve: float = Field(0.95, description=(
        "Hysteresis: once firing, MFUImpossible stays while the window median per GPU is above this (a value that "
        "hovers at 1.0 is one alert)."))
    drop_ratio: float = Field(0.7, description=(
        "Window max / baseline. VeRL-Omni's nightly flags 15 % as a regression (PERF_THRESHOLD=0.15); a "
        "30 % drop of even the best window step is a fault, not noise."))
    drift_ratio: float = Field(0.87, description=(
        "MFUDrop's creep condition: the median MFU of the last 10 normal steps after the reference / the reference, "
        "and the window median over it too, below this. The mirror of StepTimeRegression's creep (1.13 ~ 1 / 0.885): "
        "a slow update_actor creep with flat step time lowers MFU long before the step notices. Healthy simulated "
        "runs (MFU jitter +-3 %, 300 steps, every layout) stay above 0.95."))
    drop_resolve: float = Field(0.92, description=(
        "Hysteresis: once firing (a drop or a creep), MFUDrop stays while the window median / the reference is below "
        "this, i.e. until most of the last k steps are back within 8 % of the reference: one alert per lasting drop, "
        "above both firing conditions (0.7 and the creep's 0.87) so it never resolves while either still holds."))
    floor: float = Field(0.05, description=(
        "Window max below this is implausibly low. Lowest healthy value VeRL-Omni published: ~0.17 actor "
        "(full FT, param+optimizer offload, Ulysses SP=2, H200; commit 41cd0ed0); LoRA reports at least "
        "as much (its FLOPs are counted as full FT); gradient checkpointing under-reports by ~1/3. 0.05 is "
        "3.4x below the lowest healthy point and far above a two-orders-of-magnitude error."))
    floor_resolve: float = Field(0.06, description="Hysteresis: MFUImplausiblyLow stays while the window median is below this.")


class StepTime(_Part):
    regression_ratio: float = Field(1.15, description=(
        "Window min / baseline: the nightly's PERF_THRESHOLD=0.15 for perf/time_per_step; the fastest of "
        "the window's steps must be 15 % slower. Judged per unit of work (perf/total_num_images where every step "
        "logs it): more images per step is a workload change (WorkloadChanged), not a regression."))
    median_ratio: float = Field(1.25, description=(
        "StepTimeRegression's second step-change condition: the window *median* per unit of work / the reference over "
        "this, i.e. 2 of the last 3 steps 25 % slow. One fast step in a jittery run keeps the fastest-of-3 condition "
        "under 1.15 for 3 steps (a generation 1.55x slower at 15 % stage jitter: window min 1.11, median 1.26-1.33); "
        "healthy runs at 15 % step jitter stay under 1.2 in 2 of 3 steps even against a reference 3 % low. It fires a step "
        "before the other conditions, so it stands aside where an alert of the step's own cause is about to fire (the "
        "named cause is reward, untimed gaps or the actor; the straggler ratio is up): that alert speaks first."))
    part_share: float = Field(0.10, description=(
        "StepTimeRegression's part condition: one part of the step (a cause: generation, reward, the actor phases, "
        "weight sync, untimed gaps) took this many more points of the step than in the reference in every window step "
        "(window min of its share minus the reference's share). A part that grew while the others jittered down hides "
        "its growth in the step total (weight sync 8x slower adds 15 points; generation 1.55x 11). Shares do not move "
        "when the whole node slows: healthy runs at 15 % phase jitter stay under 8 points in a single step (the largest "
        "part, generation at 43 % of the step, at +15 % with the rest at -15 %), so every one of 3 steps never passes 10. "
        "VeRL-Omni's nightly judges weight sync on a threshold of its own for the same reason."))
    part_resolve: float = Field(0.05, description=(
        "Hysteresis of the part condition: the alert also stays while some part's window median share is this many "
        "points over the reference's."))
    resolve_ratio: float = Field(1.08, description=(
        "Hysteresis: once firing (a step change or a creep), StepTimeRegression stays while the window median per unit "
        "of work / the reference is above this, i.e. until most of the last k steps are back within 8 % of it. Under "
        "both firing conditions (1.15, and the creep's 1.13), so it never resolves while either still holds; above a "
        "healthy run's window median (within ~5 % of its reference at 8-15 % step jitter)."))


class StepDrift(_Part):
    ratio: float = Field(1.13, description=(
        "StepTimeRegression's creep condition: the median step time per unit of work of the last 10 normal steps after "
        "the anchored reference's 10th / the reference, and the last 3 steps' median over it too. A creep the k-step "
        "window sees late: the step-change condition needs the fastest of 3 steps 15 % over. Healthy simulated runs, "
        "300 steps, checkpoint 4.5x every 10 and validation 2.5x every 8, 100 runs (5 layouts) per jitter level, "
        "highest value of the condition over every step: every phase +-10 % and the whole step +-8 % 1.111; the whole "
        "step +-10 % 1.128, none of 100 over 1.13 (the 20-step reference is off by up to ~4 %: tests/test_analytics.py, "
        "tests/test_whole_run.py)."))


class RewardSaturation(_Part):
    zero_std_ratio: float = Field(0.5, description=(
        "VeRL-Omni docs/start/metrics.md: critic/rewards/zero_std_ratio persistently > 0.5 means most GRPO "
        "groups carry no advantage signal."))
    resolve: float = Field(0.4, description="Hysteresis: RewardSaturation stays while the window median is above this.")


class Workload(_Part):
    change: float = Field(0.1, description=(
        "WorkloadChanged (info): images per step (perf/total_num_images = train_batch_size x rollout.n) moved by more "
        "than this share from the reference's. Step time is judged per image, so the change pages nothing; the notice "
        "says the step got longer because it does more (a curriculum or batch-size change) and whether the cost per "
        "image moved."))


class Stall(_Part):
    notice_steps: float = Field(3, description=(
        "info: no step for this many typical steps. A checkpoint or validation step may still explain it."))
    unseen_planned_steps: float = Field(4, description=(
        "warning/critical wait this many more typical steps while the run has not yet shown a checkpoint "
        "and a validation (their first occurrence cannot be announced by the log): a first checkpoint of "
        "4-5x the step must not page."))
    critical_extra_steps: float = Field(3, description=(
        "critical = the warning threshold + this many typical steps. With nothing planned known that is "
        "3 + 4 + 3 = 10 typical steps: a 50-minute hang on a 4-minute step pages."))
    provisional_factor: float = Field(1.5, description=(
        "Until the run has a typical step (its first normal step, after the warm-up steps), its provisional "
        "typical step is this many times its longest warm-up step, and TrainingStalled's info stage fires after "
        "one of them: a second step merely slower than the first is a notice, not a page."))
    early_warning_warmups: float = Field(2, description=(
        "Early hangs (no normal step yet): warning after this many times the longest warm-up step since it "
        "ended (less the delivery allowance), plus the planned work that may come before the next step. The "
        "first update and the first weight sync are where OOMs and NCCL hangs happen; a video run whose first "
        "step took 21 minutes warns at 41 minutes (it was 1 h 35 min with 10.5 warm-up steps)."))
    early_critical_warmups: float = Field(3, description=(
        "Early hangs: critical after this many times the longest warm-up step (less the same delivery allowance), "
        "plus the same planned work."))
    early_delivery_seconds: float = Field(75, description=(
        "Early hangs: the warning and critical thresholds come this much sooner (at most a quarter of the warm-up "
        "step), so the message reaches a person by 2 and 3 warm-up steps. What comes after the threshold is "
        "crossed, at worst: the age's scrape (15 s), one evaluation interval (15 s), TrainingStalled's for: (15 s) "
        "and the escalation group's flush (group_interval 30 s in alerts/alertmanager.yml; the first stage's "
        "group_wait is 10 s). A fraction of W would not do: the delay is the same for a 1-minute and a 20-minute "
        "warm-up step (the scorecard's hang_after_warmup_video took 2.02 W at 1.95 W, a 5-minute one 2.03 W)."))
    early_unseen_planned_warmups: float = Field(3, description=(
        "Early hangs: while the trainer's config says a first checkpoint or validation may come before the next "
        "step (save_freq / test_freq due on it, or it may be the last), warning and critical wait this many more "
        "warm-up steps (a first checkpoint of 4-5 normal steps; a warm-up step is 1.3-2 normal ones). Without a "
        "config nothing is known and nothing is added: early hangs page on time, and the annotation says what "
        "was assumed."))
    history_steps: float = Field(3, description=(
        "History at first sight: a run first seen from a file's backlog whose last line was already older than "
        "this many of its typical steps (provisional before its first normal step) plus its planned allowance "
        "is history: reported once at info, never paged, whatever its age (a run an hour past its last step "
        "paged critical 37 s after the first `up`). Its next step makes it live again; a live writer of its "
        "log or its Ray job still running say it is a hang, not history."))
    checkpoint_write_idle_steps: float = Field(2, description=(
        "With `--checkpoint-root`: warning/critical wait while the next step's checkpoint directory "
        "(global_step_<N>) was written within this many typical steps; a save that stopped writing for "
        "longer is a hang again (FSDP shards are written file by file; gathering a shard can pause writes)."))


class GPUMemory(_Part):
    ratio: float = Field(0.95, description=(
        "Memory is sampled, not stepped: colocated runs free memory between phases (vLLM sleep, offload), "
        "so staying above 95 % means no headroom in any phase."))
    for_: str = Field("5m", alias="for", description="Wall time above the ratio before firing.")


class SourceDown(_Part):
    for_: str = Field("2m", alias="for", description=(
        "A source failing for 2 minutes (files polled every 0.5 s, discovery every few s) is broken, not "
        "flapping; 8 failed scrapes at 15 s."))


class RunCap(_Part):
    window: str = Field("1h", description=(
        "RunCapReached fires while a run was dropped at the run cap (--max-runs) within this range: the exporter "
        "made room for a new run by dropping the least recently active one, whose series ended. An hour keeps "
        "one eviction visible past a sweep's start; the next eviction keeps it firing."))


class RayTaskEvents(_Part):
    for_: str = Field("2m", alias="for", description=(
        "RayTaskEventsLost fires once the Ray task-event source lost events at every evaluation for this long "
        "(omniwatch_ray_task_events_lossy: Ray's GCS dropped task events, or a poll's answer was cut at the page "
        "size). One lossy poll is a blip; 2 minutes (8 evaluations at 15 s) of them means the lanes stay incomplete."))


class RolloutQueue(_Part):
    """RolloutQueueSaturated: a vLLM-Omni rollout (or vLLM reward) server replica keeps requests waiting
    with every slot running, while the training step waits on that server (issue 13 item 10)."""
    saturated_share: float = Field(0.75, description=(
        "Share of the time the server's phase ran (gen; gen + reward for reward servers) over the last `window` "
        "that a replica was saturated (waiting > 0 with every slot running): generation time, not wall time, as a "
        "colocated engine sleeps between gens. A burst that drains within gen stays under it; a queue through 75 % "
        "of gen is a server that cannot keep up."))
    window: str = Field("10m", description=(
        "Range over which the saturated share is averaged and over which the step share below must hold."))
    ceiling_window: str = Field("10m", description=(
        "Without max_num_seqs (no --max-num-seqs, not discovered) a replica's ceiling is its own peak of "
        "running requests over this range: long enough to hold a whole generation burst (a legacy step submits "
        "its whole batch at once, so running sits at max_num_seqs during gen), short enough to follow a "
        "replica restarted with another max_num_seqs."))
    critical_path_share: float = Field(0.15, description=(
        "The step must wait on the server: the lowest share of the step its phase held over `window` must be "
        "above this (rollout servers: timing_s/gen; reward servers: gen + reward, as a reward pool scores during "
        "gen and a colocated reward model inside timing_s/reward). Legacy submits all train_batch_size x rollout.n "
        "requests at once, so a queue at max_num_seqs is normal during gen; a separate_async standalone rollout is "
        "busy by design and the trainer waits on it only when gen is large (docs/verl-source.md C8). Per step, "
        "steps 3-40: gen of sync layouts (legacy and V1 sync, every reward layout) 0.27-0.67 on the fixtures "
        "(0.27: reward x5 swells the step) and 0.32-0.52 in the simulator (10 seeds, checkpoint and validation "
        "every 5 steps or never); separate_async trainer-bound 0.055-0.095 (simulator); a separate_async run's "
        "colocated reward model, inside the step, gen + reward 0.17-0.26. 0.15 is 1.6x the trainer-bound "
        "maximum and under every step that waits on its servers."))
    for_: str = Field("1m", alias="for", description="Wall time the condition must hold.")


class RewardServer(_Part):
    rate_window: str = Field("5m", description=(
        "Range of the reward servers' latency and queue-time rates (run:omniwatch_reward_server_*:mean, "
        "dashboards only): 20 scrapes at 15 s, several reward bursts."))


class Straggler(_Part):
    ratio: float = Field(2.5, description=(
        "Window min of timing_s/agent_loop/generate_sequences/max / .../mean (legacy trainer; V1 logs no agent-loop "
        "keys). Per-sample times include server queueing: W equal waves of requests give max/mean = 2W/(W+1), "
        "under 2 however many waves or however unevenly they are spread over replicas of equal speed. The "
        "fixtures and the healthy simulator measure 1.43; a sample that takes 3x the mean (simulator "
        "`straggler` fault) 3.0. 2.5 is 25 % beyond anything queueing explains."))
    resolve: float = Field(2.0, description=(
        "Hysteresis: RolloutStraggler stays while the window median is above this (what queueing alone can explain)."))


class RankStraggler(_Part):
    spread: float = Field(1.5, description=(
        "Smallest slowest/median duration over the streak's dispatches (Ray task events). Ranks of a verl worker "
        "group doing equal work measure 1.00 (they close on the same poll; verl's single controller, "
        "tests/test_raytasks_live.py); a rank sleeping 2.6x as long measured 2.22-2.64 with 0.5 s polls (ends known "
        "to a poll + Ray's 1 s report lag). 1.5 is far above jitter and catches a rank 50 % slower."))
    dispatches: int = Field(3, description=(
        "Finished dispatches in a row with the same last rank. On equal work the last rank is a coin toss "
        "among N ranks (3 in a row: 1/N^2), and the spread condition must hold in all of them."))


class GradNorm(_Part):
    nonfinite_steps: int = Field(3, description=(
        "Skipped updates (actor/grad_norm logged non-finite: VeRL-Omni zeroes the gradients and skips the "
        "optimizer step) among the last `window.baseline` normal steps. One skip is a bad batch (noise); "
        "3 in 20 is a pattern (15 % of the updates lost), and a run that skips every update from some step on "
        "fires at its 3rd skip, the same budget as the other step alerts. Fixtures and the healthy "
        "simulator: 0."))


class RolloutRejection(_Part):
    seq_masked_fraction: float = Field(0.05, description=(
        "Window min of rollout_corr/rollout_rs_seq_masked_fraction (bypass mode: actor/rollout_corr/...). "
        "VeRL-Omni docs/algo/rollout_correction.md: 'consistently above ~5 %, the rollout backend is drifting "
        "too far' (and widen the band above ~10 % over several steps: gradient dilution). The healthy simulator "
        "(matched backends, mean abs(dlogp) ~1e-5) measures 0.5-1.3 %; a drifting backend (simulator `rs_drift`) "
        "10-13 %."))
    resolve: float = Field(0.03, description=(
        "Hysteresis: RolloutRejectionHigh stays while the window median is above this (2x the healthy maximum)."))


class OutsideStep(_Part):
    ratio: float = Field(0.10, description=(
        "Window min of the time outside every verl timer / the gap between two steps' arrivals (dataloader, "
        "metric computation, logging; V1 re-fetches the batch from TransferQueue after the step). Live "
        "arrivals only. Healthy simulator runs 0.1-0.4 % (legacy) and 0.5-3.7 % (V1) — assumed levels, no "
        "recorded run carries arrival times; GPUs idle for 10 % of the wall time is the same bar as "
        "InterStageIdleGPU's. The simulator's `outside_gap` fault (30 % of the step) measures 22-36 %."))
    resolve: float = Field(0.07, description="Hysteresis: TimeOutsideStep stays while the window median is above this.")


class TimerOverlap(_Part):
    tolerance: float = Field(0.01, description=(
        "Window max of (timing_s/step - sum of in-step timers) / step below minus this: in every window step "
        "the timers add up to more than the step by over 1 % of it. Timers are perf_counter spans, so only a "
        "timer nested inside another phase (counted twice) does that; the fixtures and the healthy simulator "
        "measure +0.3 to +2 % (never negative), a timer of 5 % of the step nested in gen -4 to -8 %."))
    resolve: float = Field(0.005, description=(
        "Hysteresis: TimersExceedStep stays while the window median residual is below minus this."))


class TransferQueue(_Part):
    """TransferQueue backlog (live samples in the storage units), calibrated on a real TransferQueue 0.1.11
    under load (4,000 keys over two units, 10 s metric refresh, 15 s scrape): docs/alerts.md."""
    net_rate_window: str = Field("2m", description=(
        "Window of the net-rate regression (deriv of live keys): 8 scrapes at 15 s with TQ refreshing every 10 s; "
        "averages out a step's fill-and-clear cycle for steps up to ~2 min."))
    ttf_seconds: float = Field(300, description=(
        "Time to full at that net rate that counts as filling. The measured backlog (+16 live samples/s) filled "
        "in ~250 s; 600 s fires only ~25 s sooner and also fires on a healthy run putting a batch of 15 % of "
        "capacity per step (its lowest time-to-full estimate: 425 s)."))
    min_utilization: float = Field(0.1, description=(
        "The fullest unit must be past this before time-to-full counts (healthy V1 runs sit at 0.8 %); also the "
        "margin above its 2h floor the firing alert must drain back within to resolve."))
    full_utilization: float = Field(0.9, description=(
        "Nearly full whatever the rate: a full unit refuses puts, so its net rate reads 0; 0.9 is where TQ's "
        "bundled dashboard turns red."))
    for_: str = Field("30s", alias="for", description="Three evaluations; the regression already smooths.")
    stall_factor: float = Field(1.5, description=(
        "critical: the backlog while the run has not stepped for this many typical steps (half a step overdue; "
        "TrainingStalled itself waits for 3): the backlog is stalling training."))
    leak_min_rise: float = Field(0.02, description=(
        "TransferQueueSlowLeak: each nested floor (30m > 1h > 2h of the fullest unit's utilisation) above the "
        "next by this share of capacity: a leak of > 4 %/h, full within a day."))
    leak_for: str = Field("15m", description=(
        "Covers a leak that grows in steps (one partition left uncleared per validation)."))
    floor_short: str = Field("30m", description=(
        "TransferQueueSlowLeak's shortest floor window (lowest utilisation of the fullest unit): many steps, "
        "so it is the level every step drains to, not a step's in-flight peak."))
    floor_mid: str = Field("1h", description="TransferQueueSlowLeak's middle floor window.")
    floor_long: str = Field("2h", description=(
        "TransferQueueSlowLeak's longest floor window, and the level a firing TransferQueueBacklog must drain "
        "back to (within min_utilization) to resolve."))
    rate_window: str = Field("5m", description=(
        "Range of the sample write / clear rates (run:tq_sample_writes:rate, run:tq_samples_cleared:rate; "
        "dashboards only): 20 scrapes at 15 s."))


class Config(_Part):
    """Every number the rules, their prose, tests, dashboards and docs use."""
    selectors: Selectors = Selectors()
    window: Window = Window()
    step_for: str = Field("15s", description=(
        "`for:` of the step-based alerts: one default evaluation interval, so the condition must hold at "
        "two consecutive evaluations. Persistence itself is counted in steps by the exporter."))
    runbook_base: str = Field("http://127.0.0.1:19095/runbooks", description=(
        "Each alert's runbook_url is `<runbook_base>#<alertname lower-cased>`. The default is the exporter "
        "itself (`GET /runbooks` serves docs/runbooks.md), so the link works with no internet; set it to the "
        "address people reach the exporter at (or a docs site) when that is not 127.0.0.1:19095."))
    reward_bound: RewardBound = RewardBound()
    inter_stage_idle: InterStageIdle = InterStageIdle()
    mfu: MFU = MFU()
    step_time: StepTime = StepTime()
    step_drift: StepDrift = StepDrift()
    reward_saturation: RewardSaturation = RewardSaturation()
    workload: Workload = Workload()
    stall: Stall = Stall()
    gpu_memory: GPUMemory = GPUMemory()
    source_down: SourceDown = SourceDown()
    run_cap: RunCap = RunCap()
    rollout_queue: RolloutQueue = RolloutQueue()
    reward_server: RewardServer = RewardServer()
    transferqueue: TransferQueue = TransferQueue()
    straggler: Straggler = Straggler()
    rank_straggler: RankStraggler = RankStraggler()
    grad_norm: GradNorm = GradNorm()
    rollout_rejection: RolloutRejection = RolloutRejection()
    outside_step: OutsideStep = OutsideStep()
    timer_overlap: TimerOverlap = TimerOverlap()
    ray_task_events: RayTaskEvents = RayTaskEvents()

    def runbook_url(self, alertname: str) -> str:
        return f"{self.runbook_base}#{alertname.lower()}"


DEFAULT = Config()


class ConfigFileError(ValueError):
    """An alert-config file that cannot be read or is not YAML (the CLI says it in one line, exit 2)."""


def load(path: str | Path | None) -> Config:
    """The default configuration with the overrides of a YAML file (nested like :class:`Config`)."""
    if path is None:
        return DEFAULT
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as e:
        raise ConfigFileError(f"alert config {path}: cannot read it ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        raise ConfigFileError(f"alert config {path}: not YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"alert config {path}: expected a mapping of overrides")
    merged = _merge(DEFAULT.model_dump(by_alias=True), data)
    return Config.model_validate(merged)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def runbook_rewrite(host: str, port: int) -> tuple[str, str] | None:
    """(the runbook base the rules are generated with by default, the exporter's own ``/runbooks`` at ``host:port``)
    when they differ, else None: the default links to 127.0.0.1:19095, and an exporter on another port serves the
    runbooks. ``omniwatch up`` gives Prometheus rule files with this exporter's links (stack.py; issue 35 item 14),
    and the relay rewrites the links of messages from rules made elsewhere."""
    default = Config.model_fields["runbook_base"].default
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    own = f"http://{'[' + host + ']' if ':' in host else host}:{port}/runbooks"
    return None if own == default else (default, own)

