"""The one in-memory model of runs that every source feeds and the collector renders.

``RunStore.ingest(project, experiment, parsed_step, source)`` is the single entry point. It is
thread-safe (one lock; sources run in their own threads, the collector takes a snapshot under the
lock), bounded (runs, keys per run, steps kept), and idempotent per step: a step number seen again is
a re-run after a trainer restart — it replaces the stored step but never increments a counter.
"""
from __future__ import annotations

import bisect
import dataclasses
import hashlib
import logging
import operator
import struct
from array import array
from functools import lru_cache
import re
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import orjson

from .. import names
from .analytics import (
    CONTRACT_KEYS, TIMER_OVERLAP_LOG_SHARE, WINDOW_VALUE_KEYS, KeyLayout, RunWindow, StepRecord, WindowStats, analyze_step, is_validation_key, key_layout,
    time_outside, PHASE_ORDER, TIMING,
)
from . import ledger
from ..config import DEFAULT as ALERT_DEFAULT, DEFAULT_BASELINE_STEPS, DEFAULT_WARMUP_STEPS, DEFAULT_WINDOW_STEPS
from ..config import Config as AlertConfig
from .parse import ParsedStep
from .planned import OPEN, UNKNOWN, PlannedWork
from ..runlabel import fit_label
from ..trainer_config import TrainerConfig

DEFAULT_MAX_RUNS = 64
DEFAULT_RUN_EXPIRY = 6 * 3600.0  # a run without a step for this long leaves /metrics (a finished run)
# A run that may be hung (no evidence it finished, its log writer not seen) keeps alerting this long;
# one whose log a live process still holds open for writing never expires (planned.py).
DEFAULT_STALLED_EXPIRY = 3 * 24 * 3600.0
DEFAULT_MAX_KEYS = 512
# Distinct in-step phases (timing_s/<name>, the untracked rest included) per run: each is a series in
# omniwatch_stage_seconds_total, _stage_duration_seconds and _gpu_seconds_total. verl logs about a dozen.
DEFAULT_MAX_PHASES = 64
# A run whose newest line is older than this when omniwatch first sees it is history, not news: reported
# once as stale (info), never escalated (docs/alerts.md#trainingstalled-the-staging-planned-work-never-pages).
DEFAULT_STALE_HORIZON = 6 * 3600.0
MAX_LABEL_CHARS = 128
_NAME_OK = re.compile(r"[^a-zA-Z0-9_]")


@lru_cache(maxsize=1 << 16)
def passthrough_name(key: str) -> str:
    """verl key -> ``verl_`` metric family name. ``@`` becomes ``_at_`` (as verl's MLflow backend
    does), every other character outside ``[a-zA-Z0-9_]`` becomes ``_``. Two keys that map to one
    family stay distinct series: the original key is the ``key`` label, so the mapping can never
    merge two verl keys."""
    return names.PASSTHROUGH_PREFIX + _NAME_OK.sub("_", key.replace("@", "_at_"))


class SeenSteps:
    """Set of step numbers as sorted disjoint [lo, hi] ranges (a run of 100k steps is one range)."""

    def __init__(self) -> None:
        self.ranges: list[list[int]] = []

    def __contains__(self, s: int) -> bool:
        r = self.ranges
        if not r or s > r[-1][1]:  # the usual step: past everything seen
            return False
        i = bisect.bisect_right(self.ranges, [s, float("inf")]) - 1
        return i >= 0 and self.ranges[i][0] <= s <= self.ranges[i][1]

    def add(self, s: int) -> None:
        r = self.ranges
        if r and r[-1][1] == s - 1:  # the usual step: the next one
            r[-1][1] = s
            return
        if s in self:
            return
        i = bisect.bisect_right(self.ranges, [s, float("inf")])
        left = i > 0 and self.ranges[i - 1][1] == s - 1
        right = i < len(self.ranges) and self.ranges[i][0] == s + 1
        if left and right:
            self.ranges[i - 1][1] = self.ranges[i][1]
            del self.ranges[i]
        elif left:
            self.ranges[i - 1][1] = s
        elif right:
            self.ranges[i][0] = s
        else:
            self.ranges.insert(i, [s, s])


DIGESTS_KEPT = 1031  # recent steps whose content is remembered (a prime >= push.MAX_STEPS_PER_BODY): a retried
                     # push of a whole body is not a re-run
WARM_KEPT = 64       # warm-up records of the current incarnation a late, lower step can make normal
LEVEL_SHIFT = 3.0    # a step after a pause whose MFU / step time moved this many times: a new incarnation
PAUSE_STEPS = 3.0    # ... where a pause is longer than this many typical steps


def step_digest(values: dict[str, float], layout: KeyLayout | None = None) -> int:
    """The content of a step as a signed 64-bit integer, the same in every process and whatever the order of
    its keys (Python's ``hash()`` of a str is salted per process, and digests are checkpointed: an exporter
    restart must still recognise a re-sent step): blake2b over the sorted keys, then their values as
    little-endian IEEE doubles. The keys' part is prepared once per key set (``layout``, analytics.key_layout)."""
    if layout is None:
        layout = KeyLayout(values)
    prep = layout.digest_prefix
    if prep is None:
        keys = layout.sorted_keys
        prep = layout.digest_prefix = (
            hashlib.blake2b("\0".join(keys).encode("utf-8", "surrogatepass") + b"\1", digest_size=8),
            operator.itemgetter(*keys) if len(keys) > 1 else (lambda v, k=keys: tuple(v[x] for x in k)),
            struct.Struct(f"<{len(keys)}d"))
    prefix, get, pack = prep
    h = prefix.copy()
    h.update(pack.pack(*get(values)))
    return int.from_bytes(h.digest(), "big", signed=True)


def legacy_step_digest(values: dict[str, float]) -> int:
    """The digest state files of version 2 hold (orjson of the sorted values): compared only with a step
    re-sent after a restart from such a file (``StepDigests.legacy``)."""
    raw = hashlib.blake2b(orjson.dumps(values, option=orjson.OPT_SORT_KEYS), digest_size=8).digest()
    return int.from_bytes(raw, "big", signed=True)


_EMPTY = -(1 << 63)


class StepDigests:
    """(feed, content digest) of the last DIGESTS_KEPT distinct steps of a run, in bounded memory: a dict for a
    run's first SMALL steps (a run of a few steps costs a few hundred bytes), then three arrays indexed by
    ``step % DIGESTS_KEPT`` (a prime, so any stride of step numbers but its multiples uses every slot; a
    newer step takes its slot from an older one): 18 KiB per run however long it runs."""

    SMALL = 128
    __slots__ = ("small", "steps", "hashes", "feed_of", "feeds", "_feed_ids", "legacy")

    def __init__(self) -> None:
        self.small: dict[int, tuple[int, int]] | None = {}  # step -> (feed index, digest) until SMALL steps
        self.steps: array | None = None
        self.hashes: array | None = None
        self.feed_of: array | None = None
        self.feeds: list[str] = []
        self._feed_ids: dict[str, int] = {}
        self.legacy = False  # restored from a version-2 state file: its digests are legacy_step_digest's

    def get(self, step: int) -> tuple[str, int] | None:
        if self.small is not None:
            got = self.small.get(step)
            return None if got is None else (self.feeds[got[0]], got[1])
        i = step % DIGESTS_KEPT
        return (self.feeds[self.feed_of[i]], self.hashes[i]) if self.steps[i] == step else None

    def put(self, step: int, feed: str, digest: int) -> None:
        fid = self._feed_ids.get(feed)
        if fid is None:
            if len(self.feeds) >= DIGESTS_KEPT:  # feeds are a few per run; bounded whatever comes
                self.__init__()
                return self.put(step, feed, digest)
            fid = self._feed_ids[feed] = len(self.feeds)
            self.feeds.append(feed)
        digest = ((digest + (1 << 63)) % (1 << 64)) - (1 << 63)  # a signed 64-bit value, whatever a state file held
        if self.small is not None:
            self.small[step] = (fid, digest)
            if len(self.small) < self.SMALL:
                return
            small, self.small = self.small, None
            self.steps = array("q", [_EMPTY]) * DIGESTS_KEPT
            self.hashes = array("q", [0]) * DIGESTS_KEPT
            self.feed_of = array("I", [0]) * DIGESTS_KEPT
            for s_, (f, h) in sorted(small.items()):
                i = s_ % DIGESTS_KEPT
                self.steps[i], self.hashes[i], self.feed_of[i] = s_, h, f
            return
        i = step % DIGESTS_KEPT
        self.steps[i], self.hashes[i], self.feed_of[i] = step, digest, fid

    def items(self):
        """(step, feed, digest) of every remembered step, by step."""
        return [(s, self.feeds[f], h) for s, f, h in self.rows()]

    def rows(self) -> list[tuple[int, int, int]]:
        """(step, index in ``feeds``, digest) of every remembered step, by step (the checkpoint's table)."""
        if self.small is not None:
            return sorted((s, f, h) for s, (f, h) in self.small.items())
        return sorted((s, self.feed_of[i], self.hashes[i]) for i, s in enumerate(self.steps) if s != _EMPTY)

    def __len__(self) -> int:
        return len(self.rows())


@dataclass
class Run:
    project: str
    experiment: str
    window: RunWindow
    warmup_steps: int
    last: StepRecord | None = None       # the highest step of the current trainer incarnation
    last_arrival: float | None = None    # when the latest step was observed (liveness)
    _stats: WindowStats = field(default_factory=WindowStats)
    stats_dirty: bool = False
    seen: SeenSteps = field(default_factory=SeenSteps)
    steps_total: int = 0
    replayed_total: int = 0
    restarts_total: int = 0
    stage_seconds_total: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    flagged_total: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # validation, checkpoint
    # `keys`: verl key -> latest value (contract keys too); `key_steps`: verl key -> the step whose line
    # carried that value. /metrics exports a key only while the latest step carried it; validation keys
    # (val-*, val/*) keep their last value, with this step beside it. Both are properties: the latest step's
    # values wait in `_pending` and are written into them when read (a scrape, a checkpoint), so a run that
    # logs the same keys every step does no per-key bookkeeping per step.
    _keys: dict[str, float] = field(default_factory=dict)
    _key_steps: dict[str, int] = field(default_factory=dict)
    _pending: tuple | None = None         # (values, step, KeyLayout) of the latest step, not yet in _keys
    layouts: list = field(default_factory=list)  # the run's last key layouts (analytics.key_layout)
    untrimmed: StepRecord | None = None   # the latest applied record, its raw values not yet cut to WINDOW_VALUE_KEYS
    feeds: dict[str, int] = field(default_factory=dict)  # feed (source:target) -> last step it sent
    # The current trainer incarnation (a restart starts a new one: window, baselines and warm-up start over).
    inc_low: int | None = None           # its lowest step
    inc_steps: int = 0                   # steps applied in it
    warmup_done: int = 0                 # warm-up steps of the finished incarnations
    warm: list[StepRecord] = field(default_factory=list)
    new_incarnation: bool = False        # the next applied step becomes `last`, whatever its number
    replay_from: int | None = None       # re-running after a restart: a seen step at/after this continues it
    digests: StepDigests = field(default_factory=StepDigests)  # step -> (feed, content digest), the last 1031
    modes: dict[str, str] = field(default_factory=dict)  # detected layout of the current incarnation
    gpu_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # ledger bucket -> GPU s
    gpus: ledger.Gpus | None = None      # the run's GPUs (from its keys, else --gpus)
    live_arrival: float | None = None    # arrival of the latest step observed live (ledger intervals)
    # False for a run restored from a checkpoint until a current source produces it (a step arrives,
    # or one of its files is watched now): an old exporter's runs (the demo's) never reach /metrics.
    visible: bool = True
    grad_nonfinite_total: int = 0        # distinct steps whose actor/grad_norm was logged non-finite
    overlap_logged: bool = False         # the "timers exceed the step" line was logged for this run
    # Checkpoint / validation durations and cadence, the announced total, the log writer (planned.py).
    planned: PlannedWork = field(default_factory=PlannedWork)
    phase_names: set[str] = field(default_factory=set)  # distinct phases (timing_s/<name>) so far, <= max_phases
    config: TrainerConfig | None = None  # the trainer's configuration, when read (trainer_config.py)
    stale: bool = False                  # first seen as history (RunStore.history: decided from first_sight)
    # When omniwatch first saw this run, if that was from a file's backlog (its lines older than omniwatch): the
    # age of its last line at that moment decides whether it is history (RunStore.history). None: first seen live.
    first_sight: float | None = None
    # The configuration in force when the current incarnation's first step came, and the previous incarnation's:
    # a restart whose configuration changed starts a new reference (RunWindow.drop_prior).
    inc_config: TrainerConfig | None = None
    prior_config: TrainerConfig | None = None
    # Its log was written faster than its own steps ran (a copy or a restore: cp -r, rsync without -t): the file's
    # time says nothing of when the steps were, so the run is history until live evidence (issue 35 item 8).
    copied: bool = False

    @property
    def keys(self) -> dict[str, float]:
        if self._pending is not None:
            self._flush_keys()
        return self._keys

    @keys.setter
    def keys(self, value: dict[str, float]) -> None:
        self._flush_keys()
        self._keys = value

    @property
    def key_steps(self) -> dict[str, int]:
        if self._pending is not None:
            self._flush_keys()
        return self._key_steps

    @key_steps.setter
    def key_steps(self, value: dict[str, int]) -> None:
        self._flush_keys()
        self._key_steps = value

    def _flush_keys(self) -> None:
        if self._pending is not None:
            vals, step, _ = self._pending
            self._pending = None
            self._keys.update(vals)
            self._key_steps.update(dict.fromkeys(vals, step))

    def passthrough_count(self) -> int:
        """Keys held for the verl_* prefix (the contract keys have their own series), toward --max-keys;
        those the latest step carried, and the validation keys, are exported."""
        return len(self.keys) - len(self.keys.keys() & CONTRACT_KEYS)

    @property
    def stats(self) -> WindowStats:
        """Window statistics, computed when read (at scrape), not on every ingested step."""
        if self.stats_dirty:
            self._stats = self.window.stats()
            self.stats_dirty = False
        return self._stats

    @stats.setter
    def stats(self, value: WindowStats) -> None:
        self._stats, self.stats_dirty = value, False

    def cost_per_day(self) -> tuple[dict[str, float], dict[str, float]]:
        """What the run's time goes to at the current rate, in GPU-hours per day: per ledger bucket, its
        share of the window's step time x GPUs x 24 h (``ledger.rate_per_day``); and per StepTimeRegression
        cause, the growth over the baseline as a share of the window's median step x GPUs x 24 h. Empty
        while the GPUs or the window are unknown (the alert annotations then leave the figure out)."""
        st = self.stats
        recs = list(self.window.normal)[-self.window.k:]
        if self.gpus is None or len(recs) < self.window.k:
            return {}, {}
        cost = ledger.rate_per_day(recs, self.gpus.count)
        per_day = self.gpus.count * 24.0
        reg = {}
        if st.regression and st.duration:
            reg = {c: max(0.0, g) / st.duration["median"] * per_day for c, g in st.regression.items()}
        return cost, reg

    def warmup_total(self) -> int:
        """Steps flagged warm-up so far: the first ``warmup_steps`` of every incarnation (by step number,
        so out-of-order arrival cannot inflate it)."""
        return self.warmup_done + min(self.warmup_steps, self.inc_steps)

    def restart(self, forget: bool = False) -> None:
        """A new trainer incarnation: the old one's window is not compared with it; its reference is kept for the
        new one while the workload is the same (RunWindow.reset); ``forget``: nothing of it is (a level shift)."""
        self.restarts_total += 1
        self.warmup_done = self.warmup_total()
        self.inc_low, self.inc_steps, self.warm = None, 0, []
        self.new_incarnation = True
        self.replay_from = -1
        self.feeds.clear()
        self.modes = {}
        if forget:
            self.window.forget()
        else:
            self.window.reset()
        self.prior_config, self.inc_config = self.inc_config, None
        self.stats_dirty = True
        self._flush_keys()
        # Nothing the old incarnation logged is the present of the new one (validation values keep their
        # step, which says where they came from).
        for k in [k for k in self.keys if not is_validation_key(k)]:
            del self.keys[k]
            self.key_steps.pop(k, None)

    def level_shift(self, rec: StepRecord, arrival: float) -> bool:
        """A step after a pause of several typical steps whose MFU or step time moved by LEVEL_SHIFT x
        against the baseline: a restart the log did not show (resumed at its high-water mark, an
        appended console log)."""
        if self.last_arrival is None or not rec.normal or arrival <= self.last_arrival:
            return False
        typical = self.window.typical_step()
        if not typical or arrival - self.last_arrival <= PAUSE_STEPS * typical:
            return False  # no pause: the window statistics are not computed for every ingested step
        st = self.stats
        pairs = [(rec.mfu.get(role), base) for role, base in st.mfu_baseline.items()]
        pairs.append((rec.duration, st.duration_baseline))
        return any(v and b and max(v / b, b / v) > LEVEL_SHIFT for v, b in pairs)

def _config_changed(old: TrainerConfig | None, new: TrainerConfig | None) -> bool:
    """Both configurations known and saying different things (where it was read from aside)."""
    if old is None or new is None:
        return False
    return dataclasses.replace(old, source="", path="") != dataclasses.replace(new, source="", path="")


class RunStore:
    def __init__(self, *, window: int = DEFAULT_WINDOW_STEPS, baseline: int = DEFAULT_BASELINE_STEPS,
                 warmup: int = DEFAULT_WARMUP_STEPS, max_runs: int = DEFAULT_MAX_RUNS,
                 max_keys: int = DEFAULT_MAX_KEYS, run_expiry: float = DEFAULT_RUN_EXPIRY, clock=time.time,
                 stalled_expiry: float = DEFAULT_STALLED_EXPIRY, gpus: int | None = None,
                 max_phases: int = DEFAULT_MAX_PHASES, gpus_override: bool = False,
                 stale_horizon: float = DEFAULT_STALE_HORIZON, trainer_configs: dict | None = None,
                 alert_config: AlertConfig = ALERT_DEFAULT):
        self.window, self.baseline, self.warmup = window, baseline, warmup
        self.max_runs, self.max_keys, self.run_expiry = max_runs, max_keys, run_expiry
        self.max_phases = max_phases
        self.clock = clock
        self.stalled_expiry = stalled_expiry
        self.gpus = gpus  # --gpus: GPUs of a run whose keys cannot tell (the ledger's multiplier)
        self.gpus_override = gpus_override  # report --gpus: the user's count wins over config and keys
        self.ray_pools: dict[tuple[str, str], dict[str, int]] = {}   # GPUs per pool from Ray's placement groups
        self.stale_horizon = stale_horizon  # 0: never stale
        self.history_steps = alert_config.stall.history_steps      # typical steps (+ allowance) that make history
        self.notice_steps = alert_config.stall.notice_steps
        self.provisional_factor = alert_config.stall.provisional_factor
        # The alert configuration the rules were made with: the ledger books outside time beyond its stall
        # tolerance as stalled (ledger.stall_tolerance_steps).
        self.stall_tolerance_steps = ledger.stall_tolerance_steps(alert_config)
        # (project, experiment) -> TrainerConfig, applied to the run when it exists (trainer_config.py)
        self.trainer_configs: dict[tuple[str, str], TrainerConfig] = dict(trainer_configs or {})
        self.lock = threading.RLock()
        self.runs: dict[tuple[str, str], Run] = {}
        self.errors: dict[tuple[str, str], int] = defaultdict(int)  # (source, reason) -> count
        self.sources: dict[tuple[str, str], int] = {}  # (source, target) -> up
        self.notifications: dict[str, int] = defaultdict(int)
        self.evicted_total = 0       # runs dropped at the run cap to make room for a new one
        self.cap_logged = False      # the run-cap line was logged (again once the runs fall below the cap)
        self._changes = 0            # bumped whenever an existing run is touched (the run cap's refusal cache)
        self._full_at: tuple | None = None   # (changes, second) when the cap was last found full of runs that page
        # Called as fn(run, record) after every applied step, outside the lock (GPU attribution, ...).
        self.listeners: list = []

    # -- bookkeeping used by sources ---------------------------------------------------------------
    def count_error(self, source: str, reason: str, n: int = 1) -> None:
        with self.lock:
            self.errors[(source, reason)] += n

    def set_source_up(self, source: str, target: str, up: bool) -> None:
        with self.lock:
            self.sources[(source, fit_label(target))] = 1 if up else 0

    def remove_source(self, source: str, target: str) -> None:
        with self.lock:
            self.sources.pop((source, fit_label(target)), None)

    def _run(self, project: str, experiment: str, source: str) -> Run | None:
        key = (fit_label(project), fit_label(experiment))
        run = self.runs.get(key)
        self._changes += run is not None   # a run's state may change (what _evict_least_active judges)
        if run is None:
            if len(self.runs) >= self.max_runs:
                # at the cap with nothing to drop: until a run changes (or a second passes: expiry), a newcomer is
                # refused without judging every run again (100,000 new one-line files at the cap cost O(1) each)
                full = (self._changes, int(self.clock()))
                if full == self._full_at or (not self._evict_expired()
                                             and (self.max_runs <= 0 or not self._evict_least_active(key, source))):
                    self._full_at = full
                    self.errors[(source, "too_many_runs")] += 1
                    self._refused(key, source)
                    return None
            run = Run(key[0], key[1], RunWindow(self.window, self.baseline), self.warmup)
            self.runs[key] = run
            if self.cap_logged and len(self.runs) < self.max_runs:
                self.cap_logged = False
            if (cfg := self.trainer_configs.get(key)) is not None:
                self._configure(run, cfg)
        return run

    def set_ray_pools(self, project: str | None, experiment: str | None, pools: dict[str, int]) -> None:
        """The GPU pools Ray's placement groups show for the run the task-event source watches
        (discovery/pools.py): the ledger's GPUs when the run's config does not say (origin ``ray``)."""
        if not project or not experiment:
            return
        with self.lock:
            key = (fit_label(project), fit_label(experiment))
            if key in self.ray_pools or len(self.ray_pools) < 4 * self.max_runs:
                self.ray_pools[key] = {str(p)[:32]: int(v) for p, v in list(pools.items())[:16]}
            run = self.runs.get(key)
            # a run that exists takes them now, not at its next step (a hung run gets no next step), where they are
            # what decides its count (_gpus_of: a --gpus override and the config's pools come first)
            got = self._gpus_of(run, None) if run is not None else None
            if got is not None and got[1] == "ray":
                run.gpus = ledger.Gpus(*got)

    def pools(self, run: "Run") -> tuple[dict[str, int], str]:
        """The run's GPU pools and where they came from: config | ray | "" (unknown)."""
        if run.config is not None and run.config.gpus:
            return run.config.pools(), "config"
        got = self.ray_pools.get((run.project, run.experiment))
        return (dict(got), "ray") if got else ({}, "")

    def set_trainer_config(self, cfg: TrainerConfig, labels: tuple[str, str] | None = None) -> None:
        """The trainer's configuration for the run it names (``trainer.project_name`` /
        ``trainer.experiment_name``) and, for a pprint read from a console log, the run that log's lines
        go to (``labels``). Applied now if the run exists, else when it appears. Of two configs naming one run
        the newer file wins (an experiment name reused across days of Hydra outputs). Bounded: at most
        ``4 x max_runs`` configs; beyond, the oldest config of a run that does not exist makes room (said once)."""
        with self.lock:
            for key in {k for k in (cfg.key, labels) if k}:
                key = (fit_label(key[0]), fit_label(key[1]))
                old = self.trainer_configs.get(key)
                if old is not None and old.mtime > cfg.mtime and cfg.source != "console":
                    continue   # an older file naming the same run (a console print read live is the run's own)
                if old is None and len(self.trainer_configs) >= 4 * self.max_runs and not self._drop_oldest_config(cfg):
                    self.errors[("trainer_config", "too_many_configs")] += 1
                    continue
                self.trainer_configs[key] = cfg
                if (run := self.runs.get(key)) is not None:
                    self._configure(run, cfg)

    def _drop_oldest_config(self, newcomer: TrainerConfig) -> bool:
        """Make room for ``newcomer`` (call under the lock): the oldest config (by its file's time) of a run that
        does not exist, when it is older than the newcomer. Said once (``omniwatch_ingest_errors_total
        {source="trainer_config", reason="config_evicted"}`` counts each)."""
        spare = [(c.mtime, k) for k, c in self.trainer_configs.items() if k not in self.runs]
        if not spare:
            return False
        mtime, k = min(spare)
        if mtime > newcomer.mtime:
            return False
        del self.trainer_configs[k]
        self.errors[("trainer_config", "config_evicted")] += 1
        if not getattr(self, "_config_cap_said", False):
            self._config_cap_said = True
            logging.getLogger(__name__).warning(
                "trainer configs: %d kept (4 x --max-runs); the oldest config of a run not seen (%s/%s) made room "
                "for a newer one; older configs make room from now on (counted config_evicted)",
                len(self.trainer_configs) + 1, k[0], k[1])
        return True

    def _configure(self, run: Run, cfg: TrainerConfig) -> None:
        run.config = cfg
        if run.window.borrowed and _config_changed(run.prior_config, cfg):
            run.window.drop_prior("config_changed")  # a new configuration printed for the restarted trainer
            run.stats_dirty = True
        run.planned.configure(cfg.total_steps, {"checkpoint": cfg.save_freq, "validation": cfg.test_freq})
        if cfg.gpus and not (self.gpus_override and self.gpus):
            run.gpus = ledger.Gpus(cfg.gpus, "config")

    def expired(self, run: Run, now: float | None = None) -> bool:
        """No step for longer than the run's expiry: not exported, so its alerts resolve instead of
        firing for weeks; it comes back with its next step. Expiry is for runs that ended: a finished
        run (its last step was the planned last) or one whose log writer was seen and is gone expire
        after ``run_expiry``; a run whose log a live process holds open is hung, never expired; a run
        with no such evidence (a remote log, a push feed) after ``stalled_expiry``."""
        if run.last_arrival is None:
            return False
        bound = self.expiry_of(run)
        return bool(bound) and (self.clock() if now is None else now) - run.last_arrival > bound

    def expiry_of(self, run: Run) -> float:
        """Seconds without a step after which ``run`` leaves /metrics (0 = never)."""
        state = run.planned.liveness(run.last.step if run.last else None)
        if state == OPEN:
            return 0.0
        return self.stalled_expiry if state == UNKNOWN else self.run_expiry

    def set_total_steps(self, project: str, experiment: str, total: int) -> None:
        """The trainer announced its total training steps (console ``Total training steps: N``)."""
        with self.lock:
            run = self._run(project, experiment, "console")  # printed before the first step line
            if run is not None:
                run.planned.total = total

    def set_checkpoint_write(self, project: str, experiment: str, step: int, newest: float) -> None:
        """The checkpoint directory of ``step`` was last written at ``newest`` (--checkpoint-root)."""
        with self.lock:
            run = self.runs.get((fit_label(project), fit_label(experiment)))
            if run is not None:
                run.planned.ckpt_write = (step, newest)

    def set_log_open(self, project: str, experiment: str, is_open: bool, pids: set[int] | None = None) -> None:
        """A process holds the run's log open for writing now (or not). Not seen open yet and not open
        now stays unknown: a log written on another node is never seen open here."""
        with self.lock:
            run = self.runs.get((fit_label(project), fit_label(experiment)))
            if run is not None:
                run.planned.writer_pids = frozenset(pids or ())
            if run is not None and (is_open or run.planned.log_open is not None):
                run.planned.log_open = is_open
                if is_open:  # a live process holds its log: a hung run, not history
                    run.stale, run.first_sight, run.copied = False, None, False

    def writer_pids(self) -> dict[tuple[str, str], frozenset]:
        """Runs whose log a local process writes now -> those pids (discovery/jobs.py matches them to Ray jobs)."""
        with self.lock:
            return {k: r.planned.writer_pids for k, r in self.runs.items() if r.planned.writer_pids}

    def has_run(self, project: str, experiment: str) -> bool:
        with self.lock:
            return (fit_label(project), fit_label(experiment)) in self.runs

    def unmatched_runs(self) -> dict[tuple[str, str], float]:
        """Runs with no Ray job matched yet -> the arrival of their last line (discovery/jobs.py)."""
        with self.lock:
            return {k: r.last_arrival for k, r in self.runs.items()
                    if r.planned.ray is None and r.last_arrival is not None and r.visible}

    def ray_jobs(self) -> dict[tuple[str, str], str]:
        """Runs matched to a Ray job -> its id."""
        with self.lock:
            return {k: r.planned.ray.job_id for k, r in self.runs.items() if r.planned.ray is not None}

    def set_ray_job(self, project: str, experiment: str, state) -> bool:
        """The run's Ray job and its state (discovery/jobs.py): finished, crashed or running (then never
        history: a stop is a hang). False when there is no such run."""
        with self.lock:
            run = self.runs.get((fit_label(project), fit_label(experiment)))
            if run is None:
                return False
            run.planned.ray = state
            if state.status in ("RUNNING", "PENDING"):
                run.stale, run.first_sight, run.copied = False, None, False
            return True

    def copied_log(self, project: str, experiment: str) -> bool:
        """The run's log, first read whole, was written faster than its own steps ran (sources/files.py: its steps'
        timers against the file's birth): a copy or a restore, whose modification time is not its last step's. It is
        history (info once, never escalated) until a live line, a live writer or its running Ray job."""
        with self.lock:
            run = self.runs.get((fit_label(project), fit_label(experiment)))
            if run is None or run.planned.log_open is True or \
                    (run.planned.ray is not None and run.planned.ray.status in ("RUNNING", "PENDING")):
                return False
            run.copied = True
            return True

    def history_threshold(self, run: Run) -> float | None:
        """Seconds a run's last line may be old at first sight before it is history: ``stall.history_steps`` of its
        typical steps (provisional before the first normal step) plus its planned allowance. None: no step time
        known yet (then only ``--stale-horizon`` decides)."""
        typ = run.window.typical_step()
        if typ is None:
            durs = [r.duration for r in run.warm if r.duration]
            typ = self.provisional_factor * max(durs) if durs else None
        if typ is None:
            return None
        return self.history_steps * typ + run.planned.allowance(run.last.step if run.last else None)

    def stalled(self, project: str, experiment: str) -> bool:
        """Has the run gone without a step past TrainingStalled's first stage (``stall.notice_steps`` typical
        steps; before the first normal step, one provisional step)? The task-event source then dumps the stack of
        the call holding the step (discovery/traceback.py), so it is there by the warning."""
        with self.lock:
            run = self.runs.get((fit_label(project), fit_label(experiment)))
            if run is None or run.last_arrival is None or run.planned.finished(run.last.step if run.last else None):
                return False
            typ = run.window.typical_step()
            if typ is not None:
                limit = self.notice_steps * typ
            else:
                durs = [r.duration for r in run.warm if r.duration]
                if not durs:
                    return False
                limit = self.provisional_factor * max(durs)
            return self.clock() - run.last_arrival > limit

    def history(self, run: Run) -> bool:
        """Was the run history when omniwatch first saw it (issue 31 item 6)? Its last line, read from a file's
        backlog, was older than a few of its typical steps plus its planned allowance (or than --stale-horizon),
        and no live evidence says otherwise. Decided from ``first_sight`` (kept in ``run.stale``); a live step, a
        live writer of its log or its running Ray job clear it."""
        if run.copied and self.stale_horizon > 0:
            run.stale = True   # judged by its steps' own times (copied_log), not by its file's time
        elif run.first_sight is not None and run.last_arrival is not None:
            if self.stale_horizon <= 0 or run.planned.log_open is True:
                run.stale = False
            else:
                age = run.first_sight - run.last_arrival
                limit = self.history_threshold(run)
                run.stale = age > (self.stale_horizon if limit is None else min(limit, self.stale_horizon))
        return run.stale

    def hidden(self, run: Run, now: float | None = None) -> bool:
        """Not exported: expired (finished), or restored from a checkpoint and not produced by any
        current source yet."""
        return not run.visible or self.expired(run, now)

    def _evict_expired(self) -> bool:
        now = self.clock()
        # cheap first: no run can have expired while the oldest latest step is younger than the shortest expiry
        oldest = min((r.last_arrival for r in self.runs.values() if r.last_arrival is not None), default=None)
        if oldest is None or now - oldest <= min(x for x in (self.run_expiry, self.stalled_expiry) if x > 0):
            return False
        stale = [k for k, r in self.runs.items() if self.expired(r, now)]
        stale.sort(key=lambda k: self.runs[k].last_arrival)
        if not stale:
            return False
        del self.runs[stale[0]]
        return True

    def pages(self, run: Run) -> bool:
        """Can ``run`` page (call under the lock)? A run with a step that is not finished and not history: it is
        live, or stalled (TrainingStalled fires for it), or its log writer is gone and it has not expired yet.
        Such a run is never dropped at the run cap (issue 35 item 6)."""
        last = run.last.step if run.last else None
        return run.visible and run.last is not None and not self.history(run) and not run.planned.finished(last)

    def _evict_least_active(self, newcomer: tuple[str, str], source: str) -> bool:
        """The run cap is full and no run has expired: a run that cannot page makes room -- one restored and not
        produced by any current source first, then one without a step, a finished one, one that was history at
        first sight; the least recently active of them. A run that can page (live, stalled, its writer just gone:
        :meth:`pages`) is never dropped: then nothing is, and the newcomer is refused (``_refused``). Counted
        (``omniwatch_runs_evicted_total``, alert RunCapReached); logged once until the runs fall below the cap.
        Returns whether a run made room."""
        order = sorted(self.runs, key=lambda k: (self.runs[k].visible, self.runs[k].last is not None,
                                                 self.runs[k].last_arrival or 0.0))
        victim = next((k for k in order if not self.pages(self.runs[k])), None)   # judged lazily, in that order
        if victim is None:
            return False
        old = self.runs.pop(victim)
        self.evicted_total += 1
        if not self.cap_logged:
            self.cap_logged = True
            logging.getLogger(__name__).warning(
                "run cap reached (--max-runs %d): run %s/%s (latest step %s, observed %s; finished, history or not "
                "produced now) was dropped to make room for %s/%s from %s; such runs make room for each new one from "
                "now on, a live or stalled run never does (omniwatch_runs_evicted_total, alert RunCapReached). Raise "
                "--max-runs or watch fewer runs. Logged once until the runs fall below the cap.",
                self.max_runs, old.project, old.experiment, old.last.step if old.last else None,
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(old.last_arrival)) if old.last_arrival else "never",
                newcomer[0], newcomer[1], source)
        return True

    def _refused(self, newcomer: tuple[str, str], source: str) -> None:
        """Every run at the cap can page: the newcomer is not admitted (its steps are counted ``too_many_runs``).
        Said once per newcomer (at most 64 names remembered), so the log names the run that is not watched."""
        said = self.__dict__.setdefault("_refused_said", set())
        if newcomer in said or len(said) >= 64:
            return
        said.add(newcomer)
        logging.getLogger(__name__).warning(
            "run cap reached (--max-runs %d): run %s/%s from %s is NOT watched: all %d runs are live, stalled or "
            "paging, and none is dropped for a newcomer (its steps are counted as too_many_runs). Raise --max-runs "
            "or watch fewer runs.", self.max_runs, newcomer[0], newcomer[1], source, len(self.runs))

    def reveal(self, project: str, experiment: str) -> None:
        """A current source produces this restored run (its file is watched now)."""
        with self.lock:
            run = self.runs.get((fit_label(project), fit_label(experiment)))
            if run is not None:
                run.visible = True

    def trainer_restarted(self, project: str, experiment: str, source: str) -> None:
        """A source saw the log truncated (verl reopens its file with "wb" on every start)."""
        with self.lock:
            run = self._run(project, experiment, source)
            if run is not None:
                run.restart()

    # -- the entry point -------------------------------------------------------------------------
    def ingest(self, project: str, experiment: str, parsed: ParsedStep, source: str,
               arrival: float | None = None, feed: str | None = None, backlog: bool = False) -> StepRecord | None:
        """Add one step. ``feed`` names the stream it came from (a file, a pusher); a feed whose step
        goes back is a resumed trainer. A step already seen that arrives from another feed (the console
        twin of a JSONL file, say), or again from the same feed (a push retried), is a duplicate: counted
        as a skip, not applied twice."""
        rec = self._ingest(project, experiment, parsed, source, arrival, feed, backlog)
        if rec is not None:
            if self.listeners:
                run = self.runs.get((fit_label(project), fit_label(experiment)))
                for fn in list(self.listeners):
                    try:
                        fn(run, rec)
                    except Exception:  # a listener must never break ingestion
                        logging.getLogger(__name__).exception("step listener failed")
        return rec

    def _ingest(self, project, experiment, parsed, source, arrival, feed, backlog=False):
        arrival = self.clock() if arrival is None else arrival
        feed = feed or source
        with self.lock:
            if parsed.dropped:
                for reason, n in parsed.dropped.items():
                    self.errors[(source, reason)] += n
            run = self._run(project, experiment, source)
            if run is None:
                return None
            run.visible = True
            if run.last is None and backlog and self.stale_horizon > 0 and run.planned.log_open is not True:
                # first seen from a file's backlog (arrival = its mtime): history or not is decided from the age of
                # its last line at this moment, once its typical step is known (history())
                run.first_sight = self.clock()
            elif not backlog:
                run.stale, run.first_sight, run.copied = False, None, False
                if run.planned.ray is not None and run.planned.ray.status in ("SUCCEEDED", "FAILED", "STOPPED"):
                    run.planned.ray = None   # a step after its job ended: a new job (a resume), matched anew
            step = parsed.step
            layout = key_layout(parsed.values, run.layouts)
            digest = step_digest(parsed.values, layout)
            seen = step in run.seen
            if seen:
                known = run.digests.get(step)
                replaying = run.replay_from is not None and step >= run.replay_from
                if known is not None and known[1] != digest and run.digests.legacy:
                    digest = known[1] if legacy_step_digest(parsed.values) == known[1] else digest
                if known is not None and (known[0] != feed or (known[1] == digest and not replaying)):
                    # another feed already gave this step (the console twin of a JSONL file), or the same
                    # content again (a retried push): a duplicate, not new work
                    self.errors[(source, "duplicate_step")] += 1
                    run.feeds[feed] = step
                    return None
                if not replaying:  # the same feed, different content: the step ran again, the trainer restarted
                    run.restart()
            run.feeds[feed] = step
            if (prev := run.untrimmed) is not None:  # kept records hold only the raw keys window computations
                vals = prev.values                  # read; the latest keeps all until the next (its callers read them)
                prev.values = {k: vals[k] for k in WINDOW_VALUE_KEYS if k in vals}
            low = run.inc_low
            warm = step < low + run.warmup_steps if low is not None and step >= low else self._place(run, step)
            rec = analyze_step(step, parsed.values, arrival, warmup=warm, non_finite=parsed.non_finite, layout=layout)
            if not rec.phases.keys() <= run.phase_names and (capped := self._cap_phases(run, rec, parsed, source)):
                parsed, layout = capped, None
                rec = analyze_step(step, parsed.values, arrival, warmup=warm, non_finite=parsed.non_finite)
            if not seen and run.last_arrival is not None and arrival > run.last_arrival and run.level_shift(rec, arrival):
                run.restart(forget=True)
                warm = self._place(run, step)
                rec = analyze_step(step, parsed.values, arrival, warmup=warm, non_finite=parsed.non_finite, layout=layout)
            if not backlog:
                self._outside(run, rec, backlog)
            if run.inc_steps == 0:
                run.inc_config = run.config
                if _config_changed(run.prior_config, run.config):
                    run.window.drop_prior("config_changed")
            run.inc_steps += 1
            if warm and len(run.warm) < WARM_KEPT:
                run.warm.append(rec)
            if seen:
                run.replayed_total += 1
                run.replay_from = step
            else:
                run.replay_from = None
                run.seen.add(step)
                run.steps_total += 1
                for ph, sec in rec.phases.items():
                    run.stage_seconds_total[ph] += sec
                if rec.flags:
                    for flag in rec.flags - {"warmup"}:
                        run.flagged_total[flag] += 1
                if rec.grad_norm_nonfinite:
                    run.grad_nonfinite_total += 1
            self._account(run, rec, arrival, backlog)
            run.digests.put(step, feed, digest)
            run.window.add(rec)
            run.planned.observe(step, parsed.values)
            run.stats_dirty = True
            if run.last is None or run.new_incarnation or step >= run.last.step:
                run.last, run.new_incarnation = rec, False
            run.last_arrival = arrival if run.last_arrival is None else max(run.last_arrival, arrival)
            if rec.modes != run.modes:
                for k, v in rec.modes.items():
                    if not (k == "async_mode" and run.modes.get(k) == "separate_async"):  # sticky per incarnation
                        run.modes[k] = v
            vals = parsed.values
            pending = run._pending
            # the same key set as the latest step, all of whose keys are held: nothing new (no set difference)
            new = () if layout is not None and pending is not None and pending[2] is layout else \
                vals.keys() - run.keys.keys()
            if new and not new <= CONTRACT_KEYS:  # a key this run never had: apply the cap
                vals = dict(vals)
                count = run.passthrough_count()
                for key in new - CONTRACT_KEYS:
                    if count >= self.max_keys:
                        del vals[key]
                        self.errors[(source, "cardinality_cap")] += 1
                    else:
                        count += 1
            self._keep_keys(run, rec, vals, layout if vals is parsed.values else None)
            if not run.overlap_logged:
                self._timers_exceed_step(run, rec)
            run.untrimmed = rec
            return rec

    def _cap_phases(self, run: Run, rec: StepRecord, parsed: ParsedStep, source: str) -> ParsedStep | None:
        """At most ``max_phases`` distinct phases per run (the untracked rest included): the step's new
        phases join ``run.phase_names`` while there is room; a timer beyond the cap is dropped from the step
        and counted (``phase_cap``), so its time stays in the step's untracked rest instead of becoming
        series of its own. Returns the step without those timers, or None when nothing was dropped."""
        over = []
        for ph in [p for p in rec.phases if p not in run.phase_names]:  # in the step's order: deterministic
            if ph == names.UNTRACKED_PHASE or len(run.phase_names) < self.max_phases:
                run.phase_names.add(ph)
            else:
                over.append(ph)
        if not over:
            return None
        self.errors[(source, "phase_cap")] += len(over)
        drop = {TIMING + ph for ph in over}
        return ParsedStep(parsed.step, {k: v for k, v in parsed.values.items() if k not in drop}, parsed.dropped,
                          parsed.non_finite)

    def _gpus_of(self, run: Run, n: int | None) -> tuple[int, str] | None:
        """The run's GPU count and its origin, in order: a --gpus override, the config's pools, Ray's placement
        groups, the step's own keys (``n``), the --gpus default. None: nothing says."""
        if self.gpus_override and self.gpus:  # report --gpus N: the user's count
            return (self.gpus, "flag")
        if run.config is not None and run.config.gpus:  # every pool the config names (separate_async)
            return (run.config.gpus, "config")
        if self.ray_pools.get((run.project, run.experiment)):   # Ray's placement groups (discovery/pools.py)
            return (sum(self.ray_pools[(run.project, run.experiment)].values()), "ray")
        if n is not None:
            return (n, "log")
        if run.gpus is None and self.gpus:
            return (self.gpus, "flag")
        return None

    def _account(self, run: Run, rec: StepRecord, arrival: float, backlog: bool) -> None:
        """Add the step's interval to the GPU-hours ledger (ledger.split: the one implementation)."""
        gpus = self._gpus_of(run, ledger.gpus_from_keys(rec.values))
        if gpus is not None and (run.gpus is None or (run.gpus.count, run.gpus.source) != gpus):
            run.gpus = ledger.Gpus(*gpus)
        interval = None
        if not backlog:
            if run.live_arrival is not None and arrival >= run.live_arrival:
                interval = arrival - run.live_arrival
            run.live_arrival = arrival
        if run.gpus is None:
            return
        # The typical step of the steps before this one, read from the window itself (cached there): the
        # scrape-time statistics would make the ledger depend on when /metrics was last read. Only an
        # interval with time beyond the step and its validation needs it (the stall tolerance).
        typical = None
        if interval is not None and rec.duration is not None and interval > rec.duration:
            typical = run.window.typical_step()
        gs, count = run.gpu_seconds, run.gpus.count
        for bucket, sec in ledger.split(rec, interval, typical, self.stall_tolerance_steps).items():
            gs[bucket] += sec * count

    @staticmethod
    def _keep_keys(run: Run, rec: StepRecord, vals: dict[str, float], layout: KeyLayout | None = None) -> None:
        """Remember each key's value and the step that carried it. The latest step's keys wait in
        ``run._pending`` until read (``Run.keys``); a next latest step with the same key set (``layout``, all
        of them held) replaces it without touching a key. A late, older step only sets keys no newer step has."""
        if run.last is rec and layout is not None:
            if run._pending is not None and run._pending[2] is not layout:
                run._flush_keys()
            run._pending = (vals, rec.step, layout)
            return
        if run.last is rec:
            run.keys.update(vals)
            run.key_steps.update(dict.fromkeys(vals, rec.step))
            return
        ks, step = run.key_steps, rec.step
        for k, v in vals.items():
            if ks.get(k, -1) <= step:
                run.keys[k] = v
                ks[k] = step

    @staticmethod
    def _outside(run: Run, rec: StepRecord, backlog: bool = False) -> None:
        """Time outside the step timer, from the arrival gap to the previous step of the same trainer
        incarnation (consecutive step numbers only). A line read from a backlog (its arrival is the file's
        mtime) is not measured. A gap too short for the step's own timers was not observed live either (a
        push batch arrives at once, a replay is accelerated): the step is not measured, nor is the previous
        one, whose arrival stamp was that batch's too."""
        prev = run.last
        if backlog or prev is None or run.new_incarnation or prev.step != rec.step - 1:
            return
        out = time_outside(rec.arrival - prev.arrival, rec)
        if out is None:
            if prev.outside_seconds is not None:
                prev.outside_seconds = prev.outside_ratio = None
            return
        rec.outside_seconds, rec.outside_ratio = out

    @staticmethod
    def _timers_exceed_step(run: Run, rec: StepRecord) -> None:
        """One log line per run the first time its timers sum to more than timing_s/step (a timer nested
        in another phase is counted twice and hides the untimed time between phases)."""
        if run.overlap_logged or rec.timer_residual is None or not rec.duration:
            return
        if rec.timer_residual < -TIMER_OVERLAP_LOG_SHARE * rec.duration:
            run.overlap_logged = True
            extra = sorted(ph for ph in rec.phases if ph not in PHASE_ORDER and ph != names.UNTRACKED_PHASE)
            logging.getLogger(__name__).warning(
                "%s/%s step %d: the in-step timers sum to %.1f s more than timing_s/step (%.1f s); a timer nested "
                "inside another phase%s is counted twice, so untimed time between phases is hidden "
                "(omniwatch_step_timer_residual_seconds, alert TimersExceedStep). Logged once per run.",
                run.project, run.experiment, rec.step, -rec.timer_residual, rec.duration,
                f" (timers omniwatch does not know: {', '.join('timing_s/' + p for p in extra)})" if extra else "")

    @staticmethod
    def _place(run: Run, step: int) -> bool:
        """Place ``step`` in its incarnation; True when it is one of the incarnation's first warm-up steps
        (by step number). A late step below the incarnation's lowest turns the warm-up records it
        overtakes into normal steps."""
        if run.inc_low is None or step < run.inc_low:
            run.inc_low = step
            still = []
            for r in run.warm:
                if r.step >= step + run.warmup_steps:
                    r.flags = r.flags - {"warmup"}
                    run.window.add(r)
                else:
                    still.append(r)
            run.warm = still
        return step < run.inc_low + run.warmup_steps

    def count_notification(self, status: str) -> None:
        with self.lock:
            self.notifications[status] += 1
