"""Planned work and the end of a run: the facts TrainingStalled's staging and the run expiry need.

A step that carries a checkpoint save (``timing_s/save_checkpoint``, inside ``timing_s/step``) or a
validation pass (``timing_s/testing``, after the step and before its log line) arrives later than a
normal one: that is planned work, not a stall. verl saves and validates on its ``save_freq`` /
``test_freq`` cadence (``global_steps % freq == 0``) **and always on the last step** (``is_last_step``),
and the ``file`` backend never says which step is the last (docs/verl-source.md D9, D10). So, per run:

- **durations**: the longest of the last :data:`RECENT` occurrences of each kind;
- **cadence** (steps between on-cadence occurrences, i.e. ``save_freq`` / ``test_freq``): every
  on-cadence step is a multiple of it, and no multiple was skipped since the lowest step seen. One
  occurrence at step *s* already says a lot (seen from step 1: the cadence is *s*); a step that should
  have carried one and did not raises the estimate; an occurrence that fits no cadence consistent with
  the earlier ones is the forced one of the **last step** (or a legacy ESI save before the capacity
  block expires): the run is **finished**;
- the **total** (``Total training steps: N``, console logs only): the run is finished when step N
  arrived, and the cadence then tells which next step is due;
- the **allowance**: the planned work that may come before the next step line: every kind seen whose
  occurrence is due on the next step by the cadence, whose cadence is unknown, or — while the total is
  unknown, i.e. for every JSONL run — that the next step could be the last one, which forces all of
  them. Kinds not seen yet (the first checkpoint cannot be announced) are counted, and the rules add a
  reserve of typical steps for them;
- the **log writer**: whether a process (other than omniwatch) holds the run's log file open for
  writing now (``/proc/<pid>/fd``, best effort, local files only). A live writer is a live trainer: a
  stalled run that must keep alerting; a writer seen and gone is a process that ended (finished or
  crashed); never seen is unknown (a log on another node, another user's process, a push feed).

Pure bookkeeping per run (:class:`PlannedWork`, checkpointed by ``state.py``) plus two small pieces of
I/O: :class:`LogWriterWatch` (the ``/proc`` scan) and :func:`total_steps_in` (the console line).
Thresholds live in the rules (``config.py`` ``Stall``); counting stays here.
"""
from __future__ import annotations

import logging
import math
import os
import re
from collections import deque
from dataclasses import dataclass, field

from .. import names as n
from .analytics import K_SAVE, K_TESTING
from ..periodic import Periodic
from ..runlabel import run_labels

log = logging.getLogger(__name__)

CHECKPOINT, VALIDATION = "checkpoint", "validation"
KIND_KEYS = {CHECKPOINT: K_SAVE, VALIDATION: K_TESTING}
KINDS = tuple(KIND_KEYS)
RECENT = 3  # occurrences whose longest duration is the allowance for the next one

# Liveness of a run's log writer.
OPEN, CLOSED, UNKNOWN = "open", "closed", "unknown"

# legacy: print(f"Total training steps: {...}"); V1: logger.info(f"Total diffusion training steps: {...}")
# (docs/verl-source.md D10)
_TOTAL = re.compile(rb"Total (?:diffusion )?training steps: (\d{1,12})\b")


def total_steps_in(line: bytes | str) -> int | None:
    """The total a trainer announces on its stdout, or None."""
    if isinstance(line, str):
        line = line.encode("utf-8", "replace")
    if b"raining steps" not in line:
        return None
    m = _TOTAL.search(line)
    return int(m.group(1)) if m and int(m.group(1)) > 0 else None


def _divisors_from(n: int, lb: int) -> int | None:
    """The smallest divisor of ``n`` that is >= ``lb`` (None when there is none)."""
    if n <= 0:
        return None
    best = None
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            for c in (d, n // d):
                if c >= lb and (best is None or c < best):
                    best = c
    return best


@dataclass
class KindState:
    """One kind of planned work (checkpoint or validation) of one run."""
    durations: deque = field(default_factory=lambda: deque(maxlen=RECENT))
    last_step: int | None = None       # step of the latest occurrence
    g: int = 0                          # gcd of the on-cadence occurrence steps (0: none yet)
    lb: int = 1                         # the cadence is at least this (steps seen without an occurrence)
    every: int | None = None           # the cadence estimate: smallest divisor of g that is >= lb
    off_cadence_step: int | None = None  # latest occurrence that fits no cadence: the forced last step
    configured: int | None = None       # save_freq / test_freq from the trainer's config (<= 0: never)

    @property
    def seen(self) -> bool:
        return bool(self.durations)

    @property
    def seconds(self) -> float | None:
        return max(self.durations) if self.durations else None

    @property
    def never(self) -> bool:
        """The trainer's config says this kind never happens (freq <= 0: verl checks ``freq > 0`` first)."""
        return self.configured is not None and self.configured <= 0

    def _estimate(self) -> None:
        if self.configured is not None and self.configured > 0:
            self.every = self.configured
            return
        self.every = _divisors_from(self.g, self.lb) if self.g else None

    def occurred(self, step: int, seconds: float, low: int) -> None:
        self.durations.append(seconds)
        self.last_step = step if self.last_step is None else max(self.last_step, step)
        if self.configured is not None and self.configured > 0:
            if step % self.configured:  # off the configured cadence: the forced last step (or an ESI save)
                self.off_cadence_step = step
            return
        if not self.g:
            # the first occurrence: every multiple of the cadence from the lowest step seen on carried
            # one, so the cadence is more than step - low (seen from step 1: it is the step itself)
            self.g, self.lb = step, max(self.lb, step - low + 1)
            self._estimate()
            if self.every is None:  # contradicts what was seen: keep it as an occurrence, cadence unknown
                self.g = 0
            return
        g = math.gcd(self.g, step)
        if g >= self.lb and _divisors_from(g, self.lb) is not None:
            self.g = g
            self._estimate()
        else:
            self.off_cadence_step = step

    def missed(self, step: int) -> None:
        """``step`` arrived without this kind although the estimate said it was due: the cadence is
        larger."""
        if self.configured is not None:
            return
        if self.every and step % self.every == 0 and (self.last_step is None or step > self.last_step):
            self.lb = self.every + 1
            self._estimate()

    def due(self, step: int) -> bool:
        if self.never:
            return False
        return self.every is None or step % self.every == 0

    def to_json(self) -> dict:
        return {"durations": list(self.durations), "last_step": self.last_step, "g": self.g, "lb": self.lb,
                "off": self.off_cadence_step, "configured": self.configured}

    @classmethod
    def from_json(cls, d: dict) -> "KindState":
        k = cls(deque((float(x) for x in d.get("durations", [])), maxlen=RECENT), d.get("last_step"),
                int(d.get("g", 0)), int(d.get("lb", 1)), None, d.get("off"), d.get("configured"))
        k._estimate()
        return k


MAX_ERROR_CHARS = 300   # Ray's error message in omniwatch_ray_job_info: one line, bounded


@dataclass(frozen=True)
class JobState:
    """The run's Ray job as discovery/jobs.py read it (kept with the run: a finish or a crash survives a restart)."""
    job_id: str
    type: str           # SUBMISSION | DRIVER
    status: str         # RUNNING | SUCCEEDED | FAILED | STOPPED | PENDING
    error: str = ""
    end: float | None = None
    how: str = ""       # how it was matched: flag | log_writer | only_job

    def to_json(self) -> dict:
        return {"job_id": self.job_id, "type": self.type, "status": self.status, "error": self.error,
                "end": self.end, "how": self.how}

    @classmethod
    def from_json(cls, d) -> "JobState | None":
        if not isinstance(d, dict) or not isinstance(d.get("job_id"), str):
            return None
        end = d.get("end")
        return cls(d["job_id"][:64], str(d.get("type", ""))[:16], str(d.get("status", ""))[:16],
                   str(d.get("error", ""))[:MAX_ERROR_CHARS], float(end) if isinstance(end, (int, float)) else None,
                   str(d.get("how", ""))[:16])


@dataclass
class PlannedWork:
    """Planned-work facts and end-of-run evidence of one run (``Run.planned``)."""
    kinds: dict[str, KindState] = field(default_factory=lambda: {k: KindState() for k in KINDS})
    low: int | None = None              # lowest training step seen (>= 1)
    total: int | None = None            # total training steps announced on the console
    log_open: bool | None = None        # a writer holds the log open now; False: seen and gone; None: unknown
    ckpt_write: tuple[int, float] | None = None  # (step, newest mtime) of its global_step_<step> dir (--checkpoint-root)
    ray: JobState | None = None         # JobState of the run's Ray job, when matched (issue 31)
    writer_pids: frozenset = frozenset()  # local pids writing its log now (matching it to a Ray job; not kept)

    def observe(self, step: int, values: dict[str, float]) -> None:
        """One applied step. Step 0 is verl's ``val_before_train`` line (``val-*`` keys only, no timer):
        it is no occurrence of the validation cadence."""
        if step < 1:
            return
        self.low = step if self.low is None else min(self.low, step)
        for kind, key in KIND_KEYS.items():
            st = self.kinds[kind]
            v = values.get(key)
            if v is not None and v > 0:
                st.occurred(step, float(v), self.low)
            else:
                st.missed(step)

    # -- what the rules need -----------------------------------------------------------------------
    def finished(self, last_step: int | None) -> bool:
        """The latest step was the run's planned last: the announced total was reached, or it carried
        a checkpoint / validation that fits no cadence (verl forces both on the last step)."""
        if self.ray is not None and self.ray.status in ("SUCCEEDED", "STOPPED"):
            return True   # its Ray job finished (or a person stopped it): no stall (discovery/jobs.py)
        if last_step is None:
            return False
        if self.total is not None and last_step >= self.total:
            return True
        return any(k.off_cadence_step == last_step for k in self.kinds.values())

    @property
    def crashed(self) -> bool:
        """Its Ray job failed: the crash pages (TrainingCrashed), not a stall."""
        return self.ray is not None and self.ray.status == "FAILED"

    def configure(self, total: int | None, every: dict[str, int | None]) -> None:
        """The trainer's config: ``trainer.total_training_steps`` and each kind's ``save_freq`` /
        ``test_freq`` (None: the config does not say; <= 0: never)."""
        if total is not None and total > 0:
            self.total = total
        for kind, freq in every.items():
            if kind in self.kinds and freq is not None:
                st = self.kinds[kind]
                st.configured = int(freq)
                st._estimate()

    def unseen(self, last_step: int | None = None) -> int:
        """Kinds of planned work not seen yet whose first occurrence may come before the next step line
        (it cannot be announced, so TrainingStalled waits a reserve for it). A kind the config says never
        happens is no such kind; one with a configured cadence only when the next step is due by it (or
        may be the last one)."""
        nxt = None if last_step is None else last_step + 1
        final_possible = self.total is None or (nxt is not None and nxt >= self.total)
        out = 0
        for k in self.kinds.values():
            if k.seen or k.never:
                continue
            if k.configured is not None and nxt is not None and not final_possible and not k.due(nxt):
                continue
            out += 1
        return out

    def unseen_configured(self, last_step: int | None = None) -> int:
        """Kinds not seen yet that the trainer's config says may come before the next step line: a configured
        cadence (> 0) due on the next step, or the next step may be the last (total unknown or reached).
        TrainingStalled's early stages (no normal step yet) wait a reserve for them; without a config nothing
        is known and this is 0."""
        nxt = None if last_step is None else last_step + 1
        final_possible = self.total is None or (nxt is not None and nxt >= self.total)
        return sum(1 for k in self.kinds.values()
                   if not k.seen and k.configured is not None and k.configured > 0
                   and (final_possible or nxt is None or k.due(nxt)))

    def allowance(self, last_step: int | None) -> float:
        """Seconds of planned work that may come before the line of the step after ``last_step``."""
        if last_step is None:
            return 0.0
        nxt = last_step + 1
        final_possible = self.total is None or nxt >= self.total
        out = 0.0
        for k in self.kinds.values():
            if k.seen and not k.never and (final_possible or k.due(nxt)):
                out += k.seconds
        return out

    def liveness(self, last_step: int | None) -> str:
        if self.finished(last_step):
            return "finished"
        if self.crashed:
            return CLOSED
        if self.ray is not None and self.ray.status in ("RUNNING", "PENDING"):
            return OPEN   # its Ray job runs: a stop is a hang, never expired
        if self.log_open is None:
            return UNKNOWN
        return OPEN if self.log_open else CLOSED

    def checkpoint_write(self, last_step: int | None) -> float | None:
        """When the checkpoint directory of the step after ``last_step`` was last written (None: no such
        directory seen)."""
        if last_step is None or self.ckpt_write is None or self.ckpt_write[0] != last_step + 1:
            return None
        return self.ckpt_write[1]

    def to_json(self) -> dict:
        return {"kinds": {k: s.to_json() for k, s in self.kinds.items()}, "low": self.low,
                "total": self.total, "log_open": self.log_open, "ray": self.ray.to_json() if self.ray else None}

    @classmethod
    def from_json(cls, d: dict | None) -> "PlannedWork":
        if not d:
            return cls()
        p = cls(low=d.get("low"), total=d.get("total"), log_open=d.get("log_open"), ray=JobState.from_json(d.get("ray")))
        for k, s in (d.get("kinds") or {}).items():
            if k in p.kinds:
                p.kinds[k] = KindState.from_json(s)
        return p


# --- who writes a log file -----------------------------------------------------------------------------
WRITER_SCAN_SECONDS = 10.0
MAX_FDS_SCANNED = 200_000  # bounded: a scan of a huge host stops here (and says so once)


def writers(paths: set[str], proc: str = "/proc", exclude: set[int] | None = None,
            pids_out: dict[str, set[int]] | None = None) -> set[str] | None:
    """Which of ``paths`` (real paths) some process other than ``exclude`` holds open for writing (and, into
    ``pids_out``, which processes: a Ray job's driver or TaskRunner, discovery/jobs.py).
    None when ``proc`` cannot be read at all (no procfs): the answer is unknown, not "nobody"."""
    exclude = exclude if exclude is not None else {os.getpid()}
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return None
    found: set[str] = set()
    budget = MAX_FDS_SCANNED
    for pid in pids:
        if int(pid) in exclude or budget <= 0:
            continue
        fd_dir = f"{proc}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or another user's process
            continue
        for fd in fds:
            budget -= 1
            if budget <= 0:
                log.warning("log writer scan stopped after %d file descriptors", MAX_FDS_SCANNED)
                break
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target not in paths or (target in found and pids_out is None):
                continue
            try:
                with open(f"{proc}/{pid}/fdinfo/{fd}", "rb") as f:
                    info = f.read(4096)
            except OSError:
                continue
            m = re.search(rb"^flags:\s*([0-7]+)", info, re.M)
            if m and int(m.group(1), 8) & 0o3:  # O_WRONLY or O_RDWR
                found.add(target)
                if pids_out is not None:
                    pids_out.setdefault(target, set()).add(int(pid))
    return found


CHECKPOINT_SCAN_SECONDS = 5.0
MAX_CHECKPOINT_ENTRIES = 20_000  # files looked at per checkpoint directory and scan (bounded walk)


def newest_write(path: str, limit: int = MAX_CHECKPOINT_ENTRIES) -> float | None:
    """The newest mtime of ``path`` and everything under it (None when it is not a directory); looks at
    no more than ``limit`` entries."""
    try:
        newest = os.stat(path).st_mtime
    except OSError:
        return None
    if not os.path.isdir(path):
        return None
    todo, seen = [path], 0
    while todo and seen < limit:
        try:
            with os.scandir(todo.pop()) as it:
                for e in it:
                    seen += 1
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    newest = max(newest, st.st_mtime)
                    if e.is_dir(follow_symlinks=False):
                        todo.append(e.path)
                    if seen >= limit:
                        break
        except OSError:
            continue
    return newest


class CheckpointWatch(Periodic):
    """``--checkpoint-root``: verl writes checkpoint N to ``<trainer.default_local_dir>/global_step_<N>``
    (default ``checkpoints/<project>/<experiment>``, docs/verl-source.md D9). Every ``interval`` seconds,
    for each run, the newest write under ``<root>/<project>/<experiment>/global_step_<last step + 1>``:
    live evidence that the next step is saving a checkpoint (TrainingStalled's warning and critical wait
    while it keeps being written; a write that stopped progressing is a hang again)."""

    thread_name, what = "omniwatch-checkpoints", "checkpoint directory scan"

    def __init__(self, store, roots: list[str], interval: float = CHECKPOINT_SCAN_SECONDS):
        super().__init__(interval)
        self.store, self.roots = store, list(roots)

    def scan_once(self) -> None:
        with self.store.lock:
            runs = [(r.project, r.experiment, r.last.step) for r in self.store.runs.values() if r.last is not None]
        for project, experiment, last in runs:
            newest = None
            for root in self.roots:
                t = newest_write(os.path.join(root, project, experiment, f"global_step_{last + 1}"))
                if t is not None:
                    newest = t if newest is None else max(newest, t)
            if newest is not None:
                self.store.set_checkpoint_write(project, experiment, last + 1, newest)



class LogWriterWatch(Periodic):
    """Every ``interval`` seconds: for each log file the file sources follow, is a writer holding it
    open? Reported to the store per run (``RunStore.set_log_open``)."""

    thread_name, what = "omniwatch-log-writers", "log writer scan"

    def __init__(self, store, sources: list, interval: float = WRITER_SCAN_SECONDS, proc: str = "/proc"):
        super().__init__(interval)
        self.store, self.sources, self.proc = store, sources, proc

    def scan_once(self) -> None:
        files: dict[str, tuple[str, str]] = {}
        for src in self.sources:
            for path in list(getattr(src, "tails", {})):
                try:
                    files[os.path.realpath(path)] = run_labels(path)
                except OSError:
                    continue
        if not files:
            return
        pids: dict[str, set[int]] = {}
        found = writers(set(files), self.proc, pids_out=pids)
        if found is None:
            return
        runs: dict[tuple[str, str], bool] = {}
        run_pids: dict[tuple[str, str], set[int]] = {}
        for path, key in files.items():
            runs[key] = runs.get(key, False) or path in found
            run_pids.setdefault(key, set()).update(pids.get(path, ()))
        for (project, experiment), is_open in runs.items():
            self.store.set_log_open(project, experiment, is_open, run_pids.get((project, experiment)))



# --- exposition -----------------------------------------------------------------------------------------
def owned() -> tuple[str, ...]:
    """The families :class:`PlannedCollector` renders."""
    return (n.PLANNED_WORK, n.PLANNED_EVERY, n.PLANNED_ALLOWANCE, n.PLANNED_UNSEEN, n.PLANNED_UNSEEN_CONFIGURED,
            n.RUN_TOTAL_STEPS,
            n.RUN_FINISHED, n.RUN_LOG_OPEN, n.CHECKPOINT_WRITE_TS, n.WARMUP_STEP, n.RUN_STALE, n.STALE_RUNS,
            n.RUN_CRASHED, n.RAY_JOB_INFO)


def warmup_seconds(run) -> float | None:
    """The longest warm-up step of the run's current incarnation (the provisional typical step)."""
    durs = [r.duration for r in run.warm if r.duration is not None and r.duration > 0]
    return max(durs) if durs else None


class PlannedCollector:
    """Renders the planned-work facts of every exported run (registered next to the run collector)."""

    def __init__(self, store):
        self.store = store

    def describe(self):
        return n.describe(owned())

    def collect(self):
        fams = {name: n.family(name) for name in owned()}
        s = self.store
        stale = 0
        with s.lock:
            now = s.clock()
            for (project, experiment), run in s.runs.items():
                if s.hidden(run, now) or run.last is None:
                    continue
                stale += s.history(run)
                rl, p, last = [project, experiment], run.planned, run.last.step
                for kind, k in p.kinds.items():
                    if k.seen:
                        fams[n.PLANNED_WORK].add_metric(rl + [kind], k.seconds)
                    if k.every:
                        fams[n.PLANNED_EVERY].add_metric(rl + [kind], k.every)
                fams[n.PLANNED_ALLOWANCE].add_metric(rl, p.allowance(last))
                fams[n.PLANNED_UNSEEN].add_metric(rl, p.unseen(last))
                fams[n.PLANNED_UNSEEN_CONFIGURED].add_metric(rl, p.unseen_configured(last))
                if p.total is not None:
                    fams[n.RUN_TOTAL_STEPS].add_metric(rl, p.total)
                fams[n.RUN_FINISHED].add_metric(rl, 1 if p.finished(last) else 0)
                if p.log_open is not None:
                    fams[n.RUN_LOG_OPEN].add_metric(rl, 1 if p.log_open else 0)
                if (written := p.checkpoint_write(last)) is not None:
                    fams[n.CHECKPOINT_WRITE_TS].add_metric(rl, written)
                if (warm := warmup_seconds(run)) is not None:
                    fams[n.WARMUP_STEP].add_metric(rl, warm)
                fams[n.RUN_STALE].add_metric(rl, 1 if run.stale else 0)
                if (job := p.ray) is not None:
                    fams[n.RUN_CRASHED].add_metric(rl, 1 if p.crashed else 0)
                    fams[n.RAY_JOB_INFO].add_metric(rl + [job.job_id, job.type, job.status, job.error], 1)
        fams[n.STALE_RUNS].add_metric([], stale)
        yield from fams.values()
