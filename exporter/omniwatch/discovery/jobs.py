"""Finish or hang, told by Ray (issue 31 item 2): the run's Ray job and its TaskRunner say whether a run that stopped
stepping finished, crashed or hangs, with no trainer config.

Ray 2.60's dashboard lists every job at ``GET /api/jobs/`` (``ray/dashboard/modules/job/job_head.py`` ``list_jobs``;
docs/verl-source.md R15): submission jobs (``ray job submit``) with the supervisor's ``status`` (PENDING, RUNNING,
STOPPED, SUCCEEDED, FAILED), ``message`` (for a failure: the entrypoint's exit code and the tail of its logs),
``error_type`` and ``driver_exit_code``; and driver jobs (a script that called ``ray.init``, the usual
``python -m verl_omni.trainer.main_diffusion``), whose status Ray derives from the GCS job table alone:
``SUCCEEDED if is_dead else RUNNING`` (``ray/dashboard/modules/job/utils.py`` ``get_driver_jobs``) — a driver that
raised is "SUCCEEDED" too. VeRL-Omni runs the whole training inside one actor call, ``TaskRunner.run``
(``ray.get(runner.run.remote(config))``, ``DiffusionTaskRunnerV1.run`` in V1); an exception in training fails that
call and Ray records it as a FAILED task with the exception as ``error_message``. So for a driver job that ended,
omniwatch asks once for the job's FAILED tasks (one state-API call): a failed ``*TaskRunner*.run`` (or, without a
TaskRunner, a failed call of the job) is the crash and its message; none is a finish.

**Which job is the run's** (in order; the match is kept with the run, across exporter restarts):

1. ``--ray-job ID`` (a job id or a submission id) — with the task-event source's run labels;
2. the job whose driver process, or whose TaskRunner actor, holds the run's log file open for writing (the
   exporter's ``/proc`` scan of log writers: the file logger writes from the TaskRunner, a console log is the
   driver's stdout): only on the exporter's own node;
3. the only training job on the cluster (a job with a TaskRunner actor or worker calls, or the only job not
   finished), matched to the task-event source's run (``--discovery-project/--discovery-experiment``, or the
   exporter's only live run) once that run exists;
4. a job that ended unmatched (a run too short for the log-writer scan, every 10 s, to see its writer): the one
   run without a job whose last line arrived while the job ran.

No match (several jobs and no flag, a log written elsewhere): the run is judged as without Ray (TrainingStalled
stages, the config if given); the exporter logs once why, and ``omniwatch_ray_job_info`` is absent for it.

What follows, per run (``RunStore.set_ray_job``): a job that finished (SUCCEEDED; STOPPED by a person) makes the run
finished (``omniwatch_run_finished`` 1: TrainingStalled never fires, it expires after ``--run-expiry``); a FAILED
one makes it crashed (``omniwatch_run_crashed`` 1: TrainingCrashed pages at once with Ray's error, TrainingStalled
stays quiet); a RUNNING one is a live run (never history): a stop is judged as today. A later step makes the run
live again (a resumed run is a new job, matched anew).
"""
from __future__ import annotations

import logging
import socket
import time

import orjson

from ..core.planned import MAX_ERROR_CHARS, JobState
from ..redact import redact
from .rayapi import RayAPIError

log = logging.getLogger("omniwatch.raytasks")

JOBS_INTERVAL_S = 5.0        # the job table is asked at most this often (one call)
MAX_JOBS = 2000              # rows of the job list read
RUNNER_SUFFIXES = ("TaskRunner.run", "TaskRunnerV1.run")   # verl / VeRL-Omni (V1: DiffusionTaskRunnerV1)
ENDED = ("SUCCEEDED", "FAILED", "STOPPED")


def one_line(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """Ray's multi-line error (a traceback) as one bounded, redacted line: its last non-empty lines first (the
    exception), so the cut keeps what matters."""
    raw = str(text or "").splitlines()
    lines = [x.strip() for x in raw if x.strip()]
    if not lines:
        return ""
    # a Python traceback ends with the exception after its last `File "…", line N` and that frame's source line
    last = max((i for i, x in enumerate(lines) if x.startswith("File ")), default=None)
    exc = [x for x in lines[last + 2:] if not set(x) <= set("^~ ")] if last is not None else []
    text = " | ".join(exc or lines[-1:])
    text = redact(text)
    return text[: limit - 1] + "…" if len(text) > limit else text


def _local_ips() -> set[str]:
    ips = {"127.0.0.1", "localhost", ""}
    try:
        ips |= {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        pass
    return ips


class JobWatch:
    """The poller's hook (taskwatch.TaskPoller.hooks): every ``interval`` s one ``/api/jobs/`` call, and for a driver
    job that just ended one FAILED-task query; the outcome goes to the run store."""

    def __init__(self, api, store, run_labels, job_id: str | None = None, interval: float = JOBS_INTERVAL_S,
                 clock=time.time):
        self.api, self.store, self.run_labels, self.job_flag = api, store, run_labels, job_id
        self.interval, self.clock = interval, clock
        self._at = 0.0
        self._said: dict[str, str] = {}
        self._ended: dict[str, JobState] = {}   # job id -> its final state (asked once)
        self.up: bool | None = None
        self.local = _local_ips()

    def _say(self, key: str, text: str, level=logging.INFO) -> None:
        if self._said.get(key) != text:
            self._said[key] = text
            log.log(level, "%s", text)

    def list_jobs(self) -> list[dict]:
        try:   # the state API's client: a total deadline and a byte cap (rayapi.py)
            status, raw = self.api.get("/api/jobs/")
        except RayAPIError as e:
            raise OSError(str(e).replace("Ray at", "Ray job API at", 1)) from None
        if status != 200:
            raise OSError(f"Ray job API at {self.api.base}: HTTP {status}")
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise OSError(f"Ray job API at {self.api.base}: not JSON") from None
        if not isinstance(body, list):
            raise OSError(f"Ray job API at {self.api.base}: not a list")
        return [j for j in body[:MAX_JOBS] if isinstance(j, dict)]

    def _failed_call(self, job_id: str) -> str | None:
        """The error of the job's failed TaskRunner.run (else of its latest failed call); None: nothing failed."""
        page = self.api.list("tasks", [("job_id", "=", job_id), ("state", "=", "FAILED")], detail=True, limit=200)
        rows = [r for r in page.rows if r.get("error_message") or r.get("error_type")]
        runner = [r for r in rows if str(r.get("name", "")).endswith(RUNNER_SUFFIXES)]
        pick = runner or sorted(rows, key=lambda r: r.get("end_time_ms") or 0)[-1:]
        if not pick:
            return None
        r = pick[0]
        where = f" (in {str(r.get('name', ''))[:80]})" if r.get("name") else ""
        return one_line(str(r.get("error_message") or r.get("error_type")), MAX_ERROR_CHARS - len(where)) + where

    def state_of(self, j: dict, how: str) -> JobState:
        jid = str(j.get("job_id") or j.get("submission_id") or "")
        typ = str(j.get("type") or "")
        status = str(j.get("status") or "")
        end = (j.get("end_time") or 0) / 1000.0 or None
        if typ == "SUBMISSION":
            err = one_line(j.get("message") or j.get("error_type") or "") if status == "FAILED" else ""
            return JobState(jid, typ, status, err, end, how)
        if status != "SUCCEEDED":   # a driver job: RUNNING until its driver is dead
            return JobState(jid, typ, status, "", end, how)
        known = self._ended.get(jid)
        if known is None:
            err = self._failed_call(jid)
            known = JobState(jid, typ, "FAILED" if err else "SUCCEEDED", err or "", end, how)
            self._ended[jid] = known
            if len(self._ended) > 256:
                self._ended.pop(next(iter(self._ended)))
        return JobState(known.job_id, known.type, known.status, known.error, known.end, how)

    def _training_jobs(self, poller, jobs: list[dict]) -> list[dict]:
        with poller.lock:
            led = poller.ledger
            busy = {t.job_id for t in led.running.values()} | {a.job_id for a in led.actors.values()}
            runners = {a.job_id for a in led.actors.values() if a.class_name.endswith(("TaskRunner", "TaskRunnerV1"))}
        hot = [j for j in jobs if j.get("job_id") in (runners or busy)]
        if hot:
            return hot
        live = [j for j in jobs if j.get("status") in ("RUNNING", "PENDING")]
        return live if len(live) == 1 else []

    def _writer_match(self, poller, jobs: list[dict]) -> dict[tuple[str, str], dict]:
        """Runs whose log a local process writes -> the job whose driver or TaskRunner is that process."""
        pids = self.store.writer_pids()
        if not pids:
            return {}
        with poller.lock:
            runner_pid = {a.pid: a.job_id for a in poller.ledger.actors.values() if a.pid}
        out = {}
        for run, ps in pids.items():
            for j in jobs:
                d = j.get("driver_info") or {}
                try:
                    dpid = int(d.get("pid") or 0)
                except (TypeError, ValueError):
                    dpid = 0
                if (dpid in ps and str(d.get("node_ip_address", "")) in self.local) or \
                        any(runner_pid.get(p) == j.get("job_id") for p in ps):
                    out[run] = j
        return out

    def __call__(self, poller, snap) -> None:
        now = self.clock()
        if now - self._at < self.interval:
            return
        self._at = now
        try:
            jobs = self.list_jobs()
            self.up = True
        except (OSError, ValueError) as e:
            self.up = False
            self._say("api", f"Ray job state unavailable: {e} (finish vs hang is judged without Ray)", logging.WARNING)
            return
        matches: dict[tuple[str, str], tuple[dict, str]] = {}
        project, experiment = self.run_labels()
        label = (project, experiment or "") if project else None
        if self.job_flag:
            j = next((j for j in jobs if self.job_flag in (j.get("job_id"), j.get("submission_id"))), None)
            if j is not None and label:
                matches[label] = (j, "flag")
        for run, j in self._writer_match(poller, jobs).items():
            matches.setdefault(run, (j, "log_writer"))
        known = self.store.ray_jobs()
        if not matches:
            train = self._training_jobs(poller, jobs)
            if len(train) == 1 and label and self.store.has_run(*label) and label not in known:
                matches[label] = (train[0], "only_job")
            elif label or train:
                self._say("nomatch", f"Ray job <-> run: no match ({len(train)} training job(s), run "
                          f"{'/'.join(label) if label else 'labels unknown'}): finish vs hang is judged without Ray; "
                          "give --ray-job and --discovery-project/--discovery-experiment")
        # a job that ended unmatched (a short run: its log writer came and went between two scans) is the run
        # whose last line arrived while it ran, when exactly one run without a job did
        # (both ways: the run fits no other such job, the job no other such run)
        taken = {j.get("job_id") for j, _ in matches.values()} | set(known.values())
        free = {run: last for run, last in self.store.unmatched_runs().items() if run not in matches}
        fits: dict[str, list] = {}
        for j in jobs:
            if j.get("job_id") in taken or j.get("status") not in ("SUCCEEDED", "FAILED", "STOPPED"):
                continue
            start, end = (j.get("start_time") or 0) / 1000.0, (j.get("end_time") or 0) / 1000.0
            if start and end:
                fits[j["job_id"]] = [run for run, last in free.items() if start <= last <= end + 2 * self.interval]
        for j in jobs:
            runs = fits.get(j.get("job_id"), [])
            if len(runs) == 1 and sum(runs[0] in rs for rs in fits.values()) == 1:
                matches[runs[0]] = (j, "by_time")
        # a run matched before keeps its job (its writer is gone once it ended)
        for run, job_id in known.items():
            if run not in matches:
                j = next((j for j in jobs if j.get("job_id") == job_id), None)
                if j is not None:
                    matches[run] = (j, "kept")
        for (p, e), (j, how) in matches.items():
            st = self.state_of(j, how)
            if not self.store.set_ray_job(p, e, st):
                continue
            self._say(f"job:{p}/{e}", f"run {p}/{e} is Ray job {st.job_id} ({st.type}, matched by {how}): {st.status}"
                      + (f": {st.error}" if st.error else ""))
