"""Where a held call is stuck: the stack of the Ray worker running it, from Ray's dashboard (issue 31 item 1).

Ray 2.60's dashboard serves ``GET /task/traceback?task_id=…&attempt_number=…&node_id=…[&native=1]``
(``ray/dashboard/modules/reporter/reporter_head.py``): it looks the task attempt up in the state API, asks the
node's reporter agent to run ``py-spy dump -p <worker pid>`` (``--native`` with ``native=1``: C/C++ frames, where
NCCL waits) and answers the dump as text. Its failure modes, each said once with its fix and never retried in a
loop (docs/verl-source.md R14):

- **403** "Profiling is disabled by default for security reasons": the head runs without
  ``RAY_DASHBOARD_ENABLE_PROFILING=1`` (Ray 2.60's default). Cluster-wide; asked again after an hour.
- **500** "py-spy is not installed" (``ray[default]`` brings it), or py-spy failing for lack of permission
  (ptrace: root, passwordless sudo or a setuid py-spy; in a container ``--cap-add SYS_PTRACE``): per node.
- **500** "The task attempt is not running": the call ended meanwhile; nothing to retry.
- **401/403** with token authentication and no token: the state API's own error says so.
- **404**: a dashboard without the reporter module (an older Ray, ``--include-dashboard=false``).

A dump is asked for the call holding the step and for the rank RankStraggler names while it runs, at most once
per call per ``interval`` (a hang's stack does not change; a slow call's moves), never two at once. The dump
pauses the worker for the time py-spy reads its memory (tens of ms). ``summary`` keeps the innermost frames of the
training code of the thread running the call — ``func (file:line)`` joined by ``←``, innermost first, up to and
including the task's own method, bounded and redacted — for the alert annotation and ``omniwatch ps``; the whole
dump (bounded) is kept for the exporter's ``/stacks`` page and the report.
"""
from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field


from ..redact import redact
from .rayapi import RayAPIError

log = logging.getLogger("omniwatch.raytasks")

DUMP_INTERVAL_S = 60.0      # at most one dump per held call per this many seconds
REFUSED_RETRY_S = 3600.0    # a refusal that needs an operator's fix is asked again after this long, not before
MAX_DUMP_CHARS = 64 * 1024  # the whole dump kept (the exporter page, the report)
MAX_SUMMARY_CHARS = 400     # the one line in annotations and ps
MAX_FRAMES = 6
KEPT_DUMPS = 16             # newest whole dumps served at /stacks

# Frames of the runtime around a task, not of the training code: Ray's worker loop, Python's threading/asyncio.
_RUNTIME = re.compile(r"(^|/)(ray/_private/|ray/_raylet|_raylet\.pyx|ray/actor\.py|ray/remote_function\.py|"
                      r"ray/util/tracing/|ray/dag/|default_worker\.py|threading\.py|asyncio/|concurrent/futures/|"
                      r"selectors\.py|runpy\.py)")
_THREAD = re.compile(r'^Thread (\S+) \(([^)]*)\)(?::\s*"(.*)")?\s*$')
_FRAME = re.compile(r"^\s+(?P<func>.+?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)\s*$")


@dataclass(frozen=True)
class Frame:
    func: str
    file: str
    line: int | None

    def text(self) -> str:
        return f"{self.func} ({self.file}:{self.line})" if self.line is not None else f"{self.func} ({self.file})"


@dataclass
class Thread:
    tid: str
    state: str
    name: str
    frames: list[Frame] = field(default_factory=list)


def parse(dump: str) -> list[Thread]:
    """``py-spy dump`` text -> threads with their frames, innermost first (py-spy's order). Lines that are
    neither a thread header nor a frame (the process and Python version lines, Ray's multi-task warning) are
    skipped."""
    threads: list[Thread] = []
    for raw in dump.splitlines()[:5000]:
        m = _THREAD.match(raw)
        if m:
            threads.append(Thread(m[1], m[2], m[3] or ""))
            continue
        f = _FRAME.match(raw)
        if f and threads:
            threads[-1].frames.append(Frame(f["func"][:120], f["file"][-160:], int(f["line"]) if f["line"] else None))
    return threads


def _training(frames: list[Frame]) -> list[Frame]:
    return [f for f in frames if not _RUNTIME.search(f.file)]


def summary(dump: str, method: str = "") -> tuple[str, bool]:
    """The one line: the innermost training-code frames of the thread running the call, up to and including its
    method's frame (``update_actor``; verl binds ``actor_rollout_update_actor`` in a WorkerDict, whose frame calls
    the worker's own ``update_actor``). Returns (text, whether the method's frame was found)."""
    threads = [t for t in parse(dump) if t.frames]
    if not threads:
        return "", False

    def has(t: Thread, name: str) -> int | None:   # py-spy 0.4 on Python >= 3.11 shows qualified names
        return next((i for i, f in enumerate(t.frames) if f.func == name or f.func.endswith("." + name)), None)

    names = [m for m in dict.fromkeys((method, method.split("_", 2)[-1] if method.count("_") >= 2 else "")) if m]
    pick, at = None, None
    for name in names:
        for t in threads:
            i = has(t, name)
            if i is not None and (at is None or i < at):
                pick, at = t, i
        if pick:
            break
    if pick is None:
        pick = next((t for t in threads if any(f.func in ("actor_method_executor", "main_loop") for f in t.frames)),
                    next((t for t in threads if t.name == "MainThread"), threads[0]))
    frames = pick.frames
    found = at is not None
    if found:
        inner = _training(frames[:at]) + [frames[at]]
        if len(inner) > MAX_FRAMES:
            inner = inner[:MAX_FRAMES - 2] + [Frame("…", "", None)] + [frames[at]]
    else:
        inner = _training(frames)[:MAX_FRAMES - 1] or frames[:MAX_FRAMES - 1]
    text = " ← ".join("…" if f.func == "…" else f.text() for f in inner)
    text = redact(text)
    return (text[:MAX_SUMMARY_CHARS - 1] + "…") if len(text) > MAX_SUMMARY_CHARS else text, found


@dataclass
class Dump:
    key: tuple[str, int]          # (task id, attempt)
    of: str                       # "holder" | "straggler"
    role: str
    phase: str
    method: str
    rank: int | None
    node: str
    pid: int | None
    at: float
    text: str = ""                # the one-line summary (or why there is none)
    full: str = ""                # the whole dump (bounded, redacted)
    ok: bool = False
    method_found: bool = False

    def to_json(self) -> dict:
        return {"of": self.of, "task_id": self.key[0], "attempt": self.key[1], "role": self.role, "phase": self.phase,
                "method": self.method, "rank": self.rank, "node": self.node, "pid": self.pid, "at": self.at,
                "ok": self.ok, "stack": self.text, "dump": self.full}


# (status, a phrase of Ray's answer) -> (scope, why, fix); scope "cluster" stops asking anywhere, "node" on that node
REFUSALS = (
    (403, "profiling is disabled", "cluster", "Ray's dashboard has profiling disabled (Ray 2.60's default)",
     "start the head node with RAY_DASHBOARD_ENABLE_PROFILING=1"),
    (500, "py-spy is not installed", "node", "py-spy is not installed on that node",
     "install py-spy there (`pip install py-spy`; ray[default] includes it)"),
    (500, "permission", "node", "py-spy may not attach to the worker (ptrace permission)",
     "run Ray as root or with passwordless sudo, or make py-spy setuid root; in a container add SYS_PTRACE "
     "(docker run --cap-add SYS_PTRACE)"),
    (401, "", "cluster", "Ray's dashboard demands a token", "set RAY_AUTH_TOKEN or ~/.ray/auth_token for omniwatch"),
    (403, "", "cluster", "Ray's dashboard refused the request (token authentication)",
     "set RAY_AUTH_TOKEN or ~/.ray/auth_token for omniwatch"),
    (404, "", "cluster", "this Ray dashboard has no /task/traceback (Ray older than 2.9, or the dashboard's "
     "reporter module is off)", "run Ray >= 2.9 with its dashboard (ray[default])"),
)


def classify(status: int, body: str) -> tuple[str, str, str] | None:
    """A refusal an operator must fix -> (scope, why, fix); None for anything else (transient, or the call ended)."""
    low = body.lower()
    for code, phrase, scope, why, fix in REFUSALS:
        if status == code and phrase in low:
            return scope, why, fix
    return None


class StackDumper:
    """Asks Ray for the stacks of held calls; bounded, rate-limited, refusals remembered (one instance per
    exporter, beside the task-event poller: it uses the poller's HTTP client, token and cost counter)."""

    def __init__(self, api, interval: float = DUMP_INTERVAL_S, native: bool = False, timeout: float = 15.0,
                 clock=time.time):
        self.api, self.interval, self.native, self.timeout, self.clock = api, interval, native, timeout, clock
        self.latest: dict[str, Dump] = {}                 # of -> the newest dump of that kind
        self.dumps: deque[Dump] = deque(maxlen=KEPT_DUMPS)
        self._asked: dict[tuple[str, int], float] = {}     # call -> when last asked
        self.refused: dict[str, tuple[float, str]] = {}   # "cluster" or node id -> (until, why + fix)
        self.calls = 0
        self.lock = threading.Lock()

    def refusal(self, node_id: str) -> str | None:
        now = self.clock()
        for scope in ("cluster", node_id):
            until, text = self.refused.get(scope, (0.0, ""))
            if now < until:
                return text
        return None

    def due(self, key: tuple[str, int], node_id: str) -> bool:
        """May this call be dumped now (not dumped within the interval, nothing refused for its node)?"""
        last = self._asked.get(key)
        return (last is None or self.clock() - last >= self.interval) and self.refusal(node_id) is None

    def dump(self, task, of: str, rank: int | None, node: str) -> Dump:
        """One ``/task/traceback`` request for ``task`` (a taskevents.Task); never raises."""
        now = self.clock()
        self._asked[task.key] = now
        if len(self._asked) > 4096:   # bounded: forget the oldest calls
            for k in sorted(self._asked, key=self._asked.get)[:2048]:
                del self._asked[k]
        d = Dump(task.key, of, task.call.role, task.call.phase, task.call.method, rank, node, task.pid, now)
        params = {"task_id": task.key[0], "attempt_number": str(task.key[1]), "node_id": task.node_id,
                  "native": "1" if self.native else "0"}
        try:   # the state API's client: a total deadline, the dump read up to its bound (rayapi.py)
            status, raw = self.api.get("/task/traceback", params, timeout=self.timeout, max_bytes=4 * MAX_DUMP_CHARS,
                                       cut=True)
            body = raw.decode("utf-8", "replace")[:MAX_DUMP_CHARS]
        except RayAPIError as e:
            status, body = 0, "timed out" if "within" in str(e) else "no answer"
        finally:
            self.calls += 1
        if status == 200:
            d.ok, d.full = True, redact(body)
            d.text, d.method_found = summary(body, task.call.method)
            if not d.text:
                d.ok, d.text = False, "not available: Ray's answer held no stack frames"
        else:
            why = classify(status, body)
            if why is not None:
                scope, reason, fix = why
                text = f"not available: {reason}; fix: {fix}"
                key = "cluster" if scope == "cluster" else task.node_id
                if key not in self.refused or self.refused[key][1] != text:
                    log.warning("Ray refused a stack dump (%s): %s. Fix: %s. Not asked again for %d min%s.",
                                f"HTTP {status}", reason, fix, REFUSED_RETRY_S // 60,
                                "" if scope == "cluster" else f" on node {node}")
                self.refused[key] = (now + REFUSED_RETRY_S, text)
                d.text = text
            elif "not running" in body.lower():
                d.text = "not available: the call ended before its stack was read"
            else:
                d.text = f"not available: Ray answered {'HTTP ' + str(status) if status else body} (asked again in " \
                         f"{self.interval:.0f} s)"
        with self.lock:
            self.latest[of] = d
            if d.ok:
                self.dumps.append(d)
        return d

    def current(self, of: str, key: tuple[str, int] | None) -> Dump | None:
        """The newest dump of kind ``of`` if it is of the call ``key`` (a dump of an earlier call is not shown)."""
        d = self.latest.get(of)
        return d if d is not None and key is not None and d.key == key else None


class StackWatch:
    """The poller's hook (taskwatch.TaskPoller.hooks): after each poll, at most one dump, of

    - the call holding the step, once the run's stall has passed its first stage (``stalled(project,
      experiment)``: no step for ``stall.notice_steps`` typical steps, so the stack is there by the warning), or as
      soon as it is a lone laggard: other ranks of its dispatch finished and it has run two poll intervals past the
      slowest of them (a hung rank; at most one such dump per ``interval`` over all calls);
    - the rank RankStraggler names (last in ``rank_straggler.dispatches`` dispatches in a row) while it runs its
      call of that phase.

    Each call at most once per ``interval``; refusals as StackDumper says."""

    def __init__(self, dumper: StackDumper, run_labels, stalled=None, straggler_dispatches: int = 3):
        self.dumper, self.run_labels, self.stalled = dumper, run_labels, stalled
        self.straggler_dispatches = straggler_dispatches
        self.holder_key: tuple[str, int] | None = None      # the call holding the step now
        self.straggler_key: tuple[str, int] | None = None
        self.meta: dict = {}
        self._laggard_at = 0.0

    def _holder_task(self, led, snap):
        """The running task the holder text names: the slowest running call of the oldest worker dispatch."""
        for g in snap.groups:
            if g["role"].endswith("_server"):
                continue
            pid = (g.get("slowest") or {}).get("pid")
            cands = [t for t in led.running.values() if t.call.method == g["method"] and (t.call.group or t.actor_id) ==
                     g["group"] and (pid is None or t.pid == pid)]
            if cands:
                return min(cands, key=lambda t: t.start), g
        return None, None

    def __call__(self, poller, snap) -> None:
        if not snap.up:
            return
        from .taskmetrics import straggler_streaks
        with poller.lock:
            led = poller.ledger
            task, g = self._holder_task(led, snap)
            rank = led.rank(task) if task is not None else None
            node = (g.get("slowest") or {}).get("node", "") if g else ""
            streaks = straggler_streaks(led)
            strag = None
            for s in streaks:
                if s["streak"] >= self.straggler_dispatches:
                    for t in led.running.values():
                        if (t.call.role, t.call.phase) == (s["role"], s["phase"]) and led.rank(t) == s["rank"]:
                            strag = (t, s["rank"], s["node"])
        self.holder_key = task.key if task is not None else None
        self.straggler_key = strag[0].key if strag else None
        self.meta = {"holder": (task, rank, node) if task is not None else None, "straggler": strag}
        now = self.dumper.clock()
        if task is not None and self.dumper.due(task.key, task.node_id):
            project, experiment = self.run_labels()
            stalled = bool(self.stalled and project is not None and self.stalled(project, experiment or ""))
            laggard = (g["done"] > 0 and g.get("done_within_s") is not None
                       and task.age(now) >= (g["done_within_s"] or 0) + 2 * poller.interval
                       and now - self._laggard_at >= self.dumper.interval)
            if stalled or laggard:
                if laggard and not stalled:
                    self._laggard_at = now
                self.dumper.dump(task, "holder", rank, node)
                return
        if strag and self.dumper.due(strag[0].key, strag[0].node_id):
            self.dumper.dump(strag[0], "straggler", strag[1], strag[2])

    def shown(self, of: str) -> Dump | None:
        """What to show for ``of`` now: the dump of the current call, or why none can be had."""
        key = self.holder_key if of == "holder" else self.straggler_key
        d = self.dumper.current(of, key)
        if d is not None:
            return d
        meta = self.meta.get(of)
        if key is not None and meta and (why := self.dumper.refusal(meta[0].node_id)):
            t, rank, node = meta
            return Dump(key, of, t.call.role, t.call.phase, t.call.method, rank, node, t.pid, self.dumper.clock(), why)
        return None
