"""Durable exporter state: the run model and the file offsets, checkpointed together so that an
exporter killed at any moment (SIGKILL included) restarts where its last checkpoint was — no step
counted twice, none lost, counters only moving forward.

The checkpoint is one JSON file written atomically (temp file, fsync, rename) every ``interval``
seconds when something changed. File offsets and the model are captured under the sources' poll
locks and the store lock, so the offset of every file is exactly the point up to which its lines are
in the model: lines after it are read again on restart and, their steps being new to the restored
model, counted once. A write that fails (disk full, read-only dir) is logged once per cause and
reported as ``omniwatch_source_up{source="state"} 0``; the exporter keeps serving.
"""
from __future__ import annotations

import logging
import os
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path

import orjson

from . import signals, statefile
from .analytics import CAUSES, K_IMAGES, REFERENCE_REASONS
from .ledger import Gpus
from .statelock import Checkpoint
from .model import RunStore, SeenSteps, StepDigests
from ..periodic import Periodic
from .planned import PlannedWork
from ..trainer_config import TrainerConfig
from ..runlabel import run_labels

log = logging.getLogger(__name__)
VERSION = statefile.VERSION  # 3: step records under StepRecord's field names (statefile.py); 2 is read and upgraded
_rec_to, _rec_from = statefile.record_to_json, statefile.record_from_json  # the one step-record schema
FILENAME = "exporter-state.json"
SOURCE = "state"


def snapshot_store(store: RunStore) -> dict:
    runs = []
    for run in store.runs.values():
        runs.append({
            "project": run.project, "experiment": run.experiment, "steps_total": run.steps_total,
            "replayed_total": run.replayed_total, "restarts_total": run.restarts_total,
            "stage_seconds_total": dict(run.stage_seconds_total), "flagged_total": dict(run.flagged_total),
            "keys": run.keys, "feeds": run.feeds, "seen": run.seen.ranges,
            "last": _rec_to(run.last) if run.last else None, "last_arrival": run.last_arrival,
            "window": [_rec_to(r) for r in run.window.normal],
            "reference": [_rec_to(r) for r in run.window.reference],
            "window_state": _window_to(run.window),
            "prior_config": run.prior_config.to_json() if run.prior_config else None,
            "incarnation": {"low": run.inc_low, "steps": run.inc_steps, "warmup_done": run.warmup_done,
                            "warm": [_rec_to(r) for r in run.warm], "new": run.new_incarnation,
                            "replay_from": run.replay_from},
            # the digests as a table: each feed (a file path, a push feed) once, not once per step
            "digests": [], "digest_table": {"feeds": list(run.digests.feeds), "rows": run.digests.rows()},
            "legacy_digests": run.digests.legacy,
            "modes": run.modes,
            "gpu_seconds": dict(run.gpu_seconds), "live_arrival": run.live_arrival,
            "gpus": [run.gpus.count, run.gpus.source] if run.gpus else None,
            "key_steps": run.key_steps, "grad_nonfinite_total": run.grad_nonfinite_total,
            "planned": run.planned.to_json(),
            "trainer_config": run.config.to_json() if run.config else None, "stale": store.history(run),
            "first_sight": run.first_sight, "copied": run.copied,
        })
    return {"runs": runs, "errors": [[s, r, n] for (s, r), n in store.errors.items()],
            "notifications": dict(store.notifications)}


def restore_store(store: RunStore, data: dict) -> None:
    with store.lock:
        for d in data.get("runs", []):
            run = store._run(d["project"], d["experiment"], SOURCE)
            if run is None:
                continue
            run.steps_total, run.replayed_total = d["steps_total"], d["replayed_total"]
            run.restarts_total = d["restarts_total"]
            inc = d["incarnation"]
            run.inc_low, run.inc_steps, run.warmup_done = inc["low"], inc["steps"], inc["warmup_done"]
            run.warm = [_rec_from(x) for x in inc["warm"]]
            run.new_incarnation, run.replay_from = inc["new"], inc["replay_from"]
            run.digests = StepDigests()
            for k, f, h in d["digests"]:  # a checkpoint written before the table
                run.digests.put(k, f, h)
            table = d.get("digest_table") or {"feeds": [], "rows": []}
            for k, fid, h in table["rows"]:
                run.digests.put(k, table["feeds"][fid], h)
            run.digests.legacy = d.get("legacy_digests") is True
            run.modes = dict(d["modes"])
            run.planned = PlannedWork.from_json(d.get("planned"))  # absent in older checkpoints
            run.config = _config_from(d.get("trainer_config"))
            run.stale = d.get("stale") is True
            fs = d.get("first_sight")   # absent in older checkpoints: their stale stands as saved
            run.first_sight = float(fs) if isinstance(fs, (int, float)) and not isinstance(fs, bool) else None
            run.copied = d.get("copied") is True
            run.last_arrival = d["last_arrival"]
            run.gpu_seconds = defaultdict(float, d["gpu_seconds"])
            run.live_arrival = d["live_arrival"]
            run.gpus = Gpus(*d["gpus"]) if d["gpus"] else None
            run.visible = False  # until a current source produces it (Checkpointer.load, RunStore.ingest)
            run.stage_seconds_total = defaultdict(float, d["stage_seconds_total"])
            run.flagged_total = defaultdict(int, d["flagged_total"])
            run.keys, run.feeds = dict(d["keys"]), dict(d["feeds"])
            # A state written before key_steps existed says nothing about which step carried a key: none is
            # exported until a step carries it again (held keys still count toward the cap).
            run.key_steps = {k: int(s) for k, s in d.get("key_steps", {}).items() if k in run.keys}
            run.grad_nonfinite_total = int(d.get("grad_nonfinite_total", 0))
            run.seen = SeenSteps()
            run.seen.ranges = [list(x) for x in d["seen"]]
            run.last = _rec_from(d["last"]) if d["last"] else None
            run.window.forget()  # empties the window and its cached typical step
            run.window.normal.extend(_rec_from(x) for x in d["window"])
            w = run.window.normal
            # The anchored reference (absent in older checkpoints: the earliest window steps stand in for it).
            by_step = {r.step: r for r in w}
            ref = [by_step.get(x["step"]) or _rec_from(x) for x in d.get("reference", [])] if "reference" in d \
                else list(w)[:run.window.r]
            run.window.reference[:] = ref[:run.window.r]
            short = len(run.window.reference) < run.window.r and bool(w)
            if short and run.window.reference and w[0].step <= run.window.reference[-1].step + 1:
                for r in w:  # the window continues the reference: what this version would have kept (an older state
                    run.window._add_reference(r)  # held fewer reference steps)
            _window_from(run.window, d.get("window_state"))
            run.prior_config = _config_from(d.get("prior_config"))
            if run.last and w and (w[-1].step, w[-1].arrival) == (run.last.step, run.last.arrival):
                run.last = w[-1]  # one object again, as before the snapshot (later steps may amend it)
            run.stats = run.window.stats()
            run.phase_names = set(run.stage_seconds_total) | set(run.last.phases if run.last else ())
        missing = _lacking(store, K_IMAGES, any)
        if missing:  # a state from before the images per step were kept with each step
            log.info("the kept steps of %s do not carry perf/total_num_images (an older state): step time is judged "
                     "per step, not per image, and WorkloadChanged waits, until the window holds k new steps", missing)
        for sig in signals.SIGNALS:  # a state from before a signal existed: none of its kept steps carry the key
            lost = _lacking(store, sig.key, all)
            if lost:  # (a reference whose kept steps do carry it is rebuilt from them by stats() above)
                log.warning("the kept steps of %s do not carry %s (a state from before the %s signal): its window "
                            "statistics wait for k new steps%s", lost, sig.key, sig.name, "; its reference cannot be "
                            "rebuilt from them and stays absent until the trainer's next incarnation" if sig.reference
                            else "")
        for s, r, n in data.get("errors", []):
            store.errors[(s, r)] = n
        for status, n in data.get("notifications", {}).items():
            store.notifications[status] = n


def _lacking(store: RunStore, key: str, how=any) -> str:
    """The restored runs that log ``key`` but whose kept window steps lack it (``how``: any or all of them), as
    "N restored run(s) (p/e, ...)" for the log; "" when none."""
    runs = [f"{r.project}/{r.experiment}" for r in store.runs.values()
            if key in r.keys and r.window.normal and how(key not in x.values for x in r.window.normal)]
    return f"{len(runs)} restored run(s) ({', '.join(runs[:3])}{' ...' if len(runs) > 3 else ''})" if runs else ""


def _config_from(d) -> TrainerConfig | None:
    if isinstance(d, dict):
        try:
            return TrainerConfig.from_json(d)
        except (TypeError, ValueError):
            return None
    return None


def _window_to(w) -> dict:
    return {"history": [[s, dur, img, sorted(mfu.items())] for s, dur, img, mfu in w.history],
            "prior": [_rec_to(r) for r in w.prior] if w.prior is not None else None, "prior_leader": w.prior_leader,
            "kept": [_rec_to(r) for r in w.kept] if w.kept is not None else None, "reason": w.reason,
            "leader": w._leader, "leader_at": w._leader_at, "carry": w._carry,
            "carried": [_rec_to(r) for r in w.carried],
            "carried_history": [[s, dur, img, sorted(mfu.items())] for s, dur, img, mfu in w.carried_hist]}


def _window_from(w, d: dict | None) -> None:
    """A run window's history, kept reference and named cause (absent in checkpoints written before them: the
    history starts over from the kept steps, the named cause is worked out again)."""
    if not d:
        for r in w.normal:
            w._add_history(r)
        return
    w.history.extend((int(s), dur, img, {str(k): float(v) for k, v in mfu}) for s, dur, img, mfu in d["history"])
    w.prior = [_rec_from(x) for x in d["prior"]] if d.get("prior") is not None else None
    w.kept = [_rec_from(x) for x in d["kept"]] if d.get("kept") is not None else None
    cause = lambda c: c if c in CAUSES else None  # noqa: E731 - a cause this version names, else none
    w.prior_leader, w.reason = cause(d.get("prior_leader")), d.get("reason", "") if d.get("reason") in REFERENCE_REASONS else ""
    w.carried = [_rec_from(x) for x in d.get("carried", [])]
    w.carried_hist = [(int(s), dur, img, {str(k): float(v) for k, v in mfu}) for s, dur, img, mfu in d.get("carried_history", [])]
    w._leader, w._leader_at, w._carry = cause(d.get("leader")), d.get("leader_at", -1), cause(d.get("carry"))


MAX_CORRUPT_COPIES = 10


def corrupt_copy_path(path: Path) -> Path:
    """Where an unusable state file is set aside: ``<name>.corrupt``, else the first free
    ``<name>.corrupt.2`` … ``.corrupt.10`` — a second corrupt file never overwrites the first saved copy
    (the evidence of the first failure). All ten taken: the oldest is reused (bounded disk)."""
    first = path.with_suffix(".corrupt")
    names = [first] + [first.with_name(f"{first.name}.{n}") for n in range(2, MAX_CORRUPT_COPIES + 1)]
    for p in names:
        if not os.path.lexists(p):
            return p

    def mtime(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:
            return 0.0
    return min(names, key=mtime)


class Checkpointer(Periodic):
    # every interval s, the first one interval after start() (load() ran before); stop() saves once more
    thread_name, what, join_timeout, wait_first = "omniwatch-checkpoint", "checkpoint", 10.0, True
    # at most 2 % of a core: every 2 s for a few runs; 64 runs stepping every 2 s (issue 35's soak) cost ~0.16 s a
    # save, 8 % of a core at every 2 s, and are saved every ~8 s. A file source's steps after the last save are
    # read again from its saved offset after a restart, so a longer wait loses none of them.
    duty = 0.02

    def __init__(self, store: RunStore, sources: list, state_dir: str, interval: float = 2.0):
        super().__init__(interval)
        self.store, self.sources = store, sources
        self.path = Path(state_dir) / FILENAME
        self._file = Checkpoint(self.path)

    # -- load ------------------------------------------------------------------------------------
    def load(self) -> bool:
        """Restore the model and hand saved offsets to the file sources. False when there is nothing
        (or nothing usable) to restore; a corrupt file is counted and set aside, never fatal."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return False
        except OSError as e:
            log.error("cannot read exporter state %s: %s", self.path, e)
            self.store.count_error(SOURCE, "unreadable_state")
            return False
        try:
            # The whole document is checked against the schema before anything is restored (statefile.py).
            doc = orjson.loads(raw)
            old = doc.get("version") if isinstance(doc, dict) and doc.get("version") != VERSION else None
            data, secret_keys = statefile.check(doc, VERSION)
            if old is not None:
                log.info("exporter state %s was written by an older omniwatch (state format %s): read and upgraded "
                         "to format %s (step records under their own field names); written in the new format at "
                         "the next checkpoint", self.path, old, VERSION)
            if secret_keys:
                self.store.count_error(SOURCE, "secret_key", secret_keys)
            restore_store(self.store, data["model"])
            for src in self.sources:
                if hasattr(src, "restore_offsets"):
                    src.restore_offsets(data.get("files", {}).get(src.kind, {}))
            self._reveal_watched(data)
        except (ValueError, KeyError, TypeError) as e:
            bad = corrupt_copy_path(self.path)
            log.error("exporter state %s is unusable (%s); moved to %s, starting fresh", self.path, e, bad)
            with self.store.lock:
                self.store.runs.clear()  # nothing half-restored survives
            self.store.count_error(SOURCE, "corrupt_state")
            try:
                os.replace(self.path, bad)
            except OSError:
                pass
            return False
        log.info("restored %d runs from %s", len(data["model"].get("runs", [])), self.path)
        return True

    def _reveal_watched(self, data: dict) -> None:
        """Restored runs stay off /metrics until a current source produces them. A run whose log file
        is watched by this exporter now is produced by it (a stalled run must still alert); a run only
        an earlier configuration watched (the demo's, a log no longer watched, a pusher that has not
        pushed since) waits for its next step."""
        watched = [p for src in self.sources if hasattr(src, "watches")
                   for p in data.get("files", {}).get(src.kind, {}) if src.watches(p)]
        for run in list(self.store.runs.values()):
            feeds = [f.partition(":") for f in run.feeds]
            watched += [path for kind, _, path in feeds for src in self.sources
                        if getattr(src, "kind", None) == kind and hasattr(src, "watches") and src.watches(path)]
        for path in watched:
            self.store.reveal(*run_labels(path))
        hidden = sum(1 for r in self.store.runs.values() if not r.visible)
        if hidden:
            log.info("%d restored runs are not watched now; they stay off /metrics until a step arrives", hidden)

    # -- save ------------------------------------------------------------------------------------
    def snapshot(self) -> bytes:
        with ExitStack() as stack:
            for src in self.sources:
                lock = getattr(src, "poll_lock", None)
                if lock is not None:
                    stack.enter_context(lock)
            stack.enter_context(self.store.lock)
            files = {src.kind: src.offsets() for src in self.sources if hasattr(src, "offsets")}
            model = snapshot_store(self.store)
        return orjson.dumps({"version": VERSION, "files": files, "model": model})

    def save(self) -> bool:
        f = self._file
        if not f.write(self.snapshot()):
            if f.error_is_new:
                log.error("cannot write exporter state to %s (%s); serving on, counters will restart from "
                          "the last good checkpoint after an exporter restart", self.path, f.error)
            self.store.count_error(SOURCE, "write_failed")
            self.store.set_source_up(SOURCE, str(self.path), False)
            return False
        if f.recovered:
            log.info("exporter state written again to %s", self.path)
        self.store.set_source_up(SOURCE, str(self.path), True)
        return True

    def scan_once(self) -> None:
        self.save()

    def stop(self) -> None:
        super().stop()
        try:
            self.save()
        except Exception:
            log.exception("final checkpoint failed")
