"""``omniwatch serve``: the exporter process — sources, the run model, and the FastAPI app on one port.
Areas with background work (relay delivery, GPU sampling, Ray discovery) start with the app's lifespan
(``app.on_lifespan``); their options reach them through ``Settings.extra``."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from dataclasses import dataclass, field


from . import cliargs
from . import discovery, httpguard
from .app import create_app
from .core.exposition import make_registry
from .httpguard import GuardedServer, server_config
from .gpu.loop import gpu_option, settings_extra
from . import config as alert_config
from .core.model import RunStore
from .redact import install_log_redaction
from .settings import DEFAULT_EXPORTER_PORT, DEFAULT_HOST, Settings, parse_listen
from .sources import api as sources_api
from .sources.files import FileSource, FilesCollector
from .core.planned import CheckpointWatch, LogWriterWatch
from .trainer_config import ConfigWatch
from .core.state import Checkpointer
from .core.statelock import StateDirBusy, StateDirLock

log = logging.getLogger(__name__)

@dataclass
class Exporter:
    settings: Settings
    store: RunStore
    registry: object
    app: object
    sources: list = field(default_factory=list)
    checkpointer: object = None
    writers: object = None  # planned.LogWriterWatch: is a trainer still holding each log open?
    checkpoints: object = None  # planned.CheckpointWatch (--checkpoint-root): is the next checkpoint being written?
    lock: object = None  # statelock.StateDirLock: one exporter per --state-dir
    configs: object = None  # trainer_config.ConfigWatch (--trainer-config): the runs' trainer configurations

    @classmethod
    def build(cls, settings: Settings) -> "Exporter":
        """Raises statelock.StateDirBusy when another exporter holds ``settings.state_dir``."""
        lock = StateDirLock(settings.state_dir).acquire() if settings.state_dir else None
        try:
            return cls._build(settings, lock)
        except BaseException:
            if lock is not None:
                lock.release()
            raise

    @classmethod
    def _build(cls, settings: Settings, lock) -> "Exporter":
        store = RunStore(window=settings.window_steps, baseline=settings.baseline_steps,
                         warmup=settings.warmup_steps, max_runs=settings.max_runs, max_keys=settings.max_keys,
                         run_expiry=settings.run_expiry_seconds, stalled_expiry=settings.stalled_expiry_seconds,
                         gpus=settings.gpus, stale_horizon=settings.stale_horizon_seconds,
                         alert_config=alert_config.load(settings.alert_config))
        registry = make_registry(store)
        app = create_app(store, registry, settings)
        ex = cls(settings, store, registry, app, lock=lock)
        files = dict(poll_seconds=settings.poll_seconds, max_line=settings.max_line_bytes,
                     max_open=settings.max_open_files, follow_symlinks=settings.follow_symlinks)
        if settings.watch:
            ex.sources.append(FileSource(store, settings.watch, "jsonl", **files))
        if settings.console:
            ex.sources.append(FileSource(store, settings.console, "console", **files))
        sources_api.init(app, ex.sources)
        if ex.sources:
            registry.register(FilesCollector(ex.sources))
            ex.writers = LogWriterWatch(store, ex.sources)
        if settings.checkpoint_roots:
            ex.checkpoints = CheckpointWatch(store, settings.checkpoint_roots)
        if settings.trainer_configs:
            ex.configs = ConfigWatch(store, settings.trainer_configs)
        if settings.state_dir:
            ex.checkpointer = Checkpointer(store, ex.sources, settings.state_dir)
            ex.checkpointer.load()
        return ex

    def start_sources(self) -> None:
        for s in self.sources:
            s.start()
        if self.checkpointer is not None:
            self.checkpointer.start()
        if self.writers is not None:
            self.writers.start()
        if self.checkpoints is not None:
            self.checkpoints.start()
        if self.configs is not None:
            self.configs.start()

    def stop(self) -> None:
        for w in (self.writers, self.checkpoints, self.configs):
            if w is not None:
                w.stop()
        for s in reversed(self.sources):
            try:
                s.stop()
            except Exception:
                log.exception("stopping %s", s)
        if self.checkpointer is not None:
            self.checkpointer.stop()  # the final checkpoint, after the sources stopped reading
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def add_exporter_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", type=cliargs.listen, default=f"{DEFAULT_HOST}:{DEFAULT_EXPORTER_PORT}",
                   help="HOST:PORT to serve on (default %(default)s; binding beyond loopback is your decision)")
    p.add_argument("--watch", action="append", default=[], metavar="PATH",
                   help="verl JSONL file, glob, or VERL_FILE_LOGGER_ROOT dir (<root>/<project>/<experiment>.jsonl); repeatable")
    p.add_argument("--console", action="append", default=[], metavar="PATH",
                   help="log file with verl console lines (step:N - key:value - ...); repeatable")
    p.add_argument("--window-steps", type=cliargs.positive_int, default=None, help="k: normal steps in the alert window (default 3)")
    p.add_argument("--baseline-steps", type=cliargs.positive_int, default=None, help="N: normal steps in the MFU/step-time baseline (default 20)")
    p.add_argument("--warmup-steps", type=cliargs.nonneg_int, default=None, help="steps after each (re)start treated as warm-up (default 2)")
    p.add_argument("--max-keys", type=cliargs.positive_int, default=None, help="cap on passthrough verl keys per run (default 512)")
    p.add_argument("--max-runs", type=cliargs.positive_int, default=None, help="cap on runs held (default 64); at the cap a new run takes "
                   "the place of the least recently active (logged once, alert RunCapReached)")
    p.add_argument("--run-expiry", type=cliargs.nonneg_float, default=None, metavar="SECONDS",
                   help="a run without a new step for this long leaves /metrics, so a finished run stops "
                        "alerting (default 21600 = 6 h; 0 = never). Applies to runs that look finished: the "
                        "last step was the planned last (total reached, forced final checkpoint/validation) or "
                        "the process writing the log was seen and has exited")
    p.add_argument("--stalled-run-expiry", type=cliargs.nonneg_float, default=None, metavar="SECONDS",
                   help="a run with no evidence that it finished (a log written on another node, a push feed) "
                        "keeps alerting this long without a step (default 259200 = 3 d; 0 = never); a run "
                        "whose log a live process still holds open never expires: it is hung")
    p.add_argument("--checkpoint-root", action="append", default=[], metavar="DIR",
                   help="where the trainers save checkpoints, laid out <DIR>/<project>/<experiment>/global_step_<N> "
                        "(verl's trainer.default_local_dir = checkpoints/<project>/<experiment>: pass that "
                        "checkpoints dir); while the next step's checkpoint keeps being written, TrainingStalled "
                        "stays at info; repeatable")
    p.add_argument("--trainer-config", action="append", default=[], metavar="FILE|GLOB|DIR",
                   help="the trainers' resolved configs (Hydra's <run dir>/.hydra/config.yaml, a saved YAML/JSON config, "
                        "or a console log with VeRL-Omni's config print), one per run, matched to runs by "
                        "trainer.project_name / trainer.experiment_name; a DIR is searched for .hydra/config.yaml "
                        "and config files; re-read when they change; repeatable")
    p.add_argument("--stale-horizon", type=float, default=None, metavar="SECONDS",
                   help="a run whose newest line, when omniwatch first sees it, is older than a few of its typical "
                        "steps plus its planned allowance (stall.history_steps), or than this, and whose log no live "
                        "process holds open, is history: reported once at info, never escalated "
                        "(default 21600 = 6 h; 0 = off: no run is history)")
    p.add_argument("--state-dir", default=None, help="directory for durable state (alert history, relay outbox)")
    p.add_argument("--gpus", type=cliargs.positive_int, default=None, metavar="N",
                   help="GPUs of a run whose keys cannot tell (the GPU-hours ledger multiplies by it; derived from "
                        "perf/throughput when the run logs it)")
    p.add_argument("--poll-interval", type=cliargs.positive_float, default=None, help="seconds between file polls (default 0.5)")
    p.add_argument("--max-open-files", type=cliargs.positive_int, default=None, metavar="N",
                   help="descriptors each file source keeps open (default 128): unchanged files are checked with "
                        "stat() and opened only when they change, so a watch of thousands of files fits `ulimit -n`")
    p.add_argument("--follow-symlinks", action="store_true", default=None,
                   help="follow symlinks that lead out of a watched directory (default: refused, logged once)")
    p.add_argument("--max-connections", type=cliargs.positive_int, default=None, metavar="N",
                   help="HTTP connections held at once (default 256, lowered to fit the descriptor limit); at the cap "
                        "the oldest connection still waiting for its request head is closed for the new one")
    p.add_argument("--header-timeout", type=cliargs.positive_float, default=None, metavar="SECONDS",
                   help="seconds a client has to send its request head (default 10)")
    p.add_argument("--body-timeout", type=cliargs.positive_float, default=None, metavar="SECONDS",
                   help="seconds a client has to send its request body after the head (default 30)")
    p.add_argument("--gpu", type=gpu_option, default=None, metavar="auto|on|off|replay:TRACE.json",
                   help="NVML GPU sampler: auto (when nvidia-ml-py and a driver are present), on (required), off "
                        "(default: $OMNIWATCH_GPU or auto); replay:TRACE.json plays a recorded NVML trace as a "
                        "live GPU, looping (replay: alone = the committed H200 trace): demos without a GPU")
    p.add_argument("--gpu-node", default=None, help="node label for GPU series (default: hostname)")


def settings_from_args(args) -> Settings:
    host, port = parse_listen(args.listen)
    extra = settings_extra(getattr(args, "gpu", None))  # a replay: value carries its backend object
    if getattr(args, "gpu_node", None) is not None:
        extra["gpu_node"] = args.gpu_node
    extra["discovery"] = discovery.from_args(args) if hasattr(args, "ray_address") else False
    return Settings.from_env(extra=extra,host=host, port=port, watch=args.watch, console=args.console,
                             window_steps=args.window_steps, baseline_steps=args.baseline_steps,
                             warmup_steps=args.warmup_steps, max_keys=args.max_keys, max_runs=args.max_runs,
                             state_dir=args.state_dir, poll_seconds=args.poll_interval,
                             run_expiry_seconds=args.run_expiry, gpus=args.gpus,
                             stalled_expiry_seconds=getattr(args, "stalled_run_expiry", None),
                             checkpoint_roots=getattr(args, "checkpoint_root", None) or None,
                             trainer_configs=getattr(args, "trainer_config", None) or None,
                             stale_horizon_seconds=getattr(args, "stale_horizon", None),
                             max_open_files=getattr(args, "max_open_files", None),
                             follow_symlinks=getattr(args, "follow_symlinks", None),
                             max_connections=getattr(args, "max_connections", None),
                             header_timeout=getattr(args, "header_timeout", None),
                             body_timeout=getattr(args, "body_timeout", None))


def serve(args) -> int:
    settings = settings_from_args(args)
    try:
        ex = Exporter.build(settings)
    except StateDirBusy as e:
        log.error("%s", e)
        print(f"omniwatch serve: {e}", file=sys.stderr)
        return 2
    stats = httpguard.GuardStats()
    ex.registry.register(httpguard.GuardCollector(stats))
    config = server_config(ex.app, settings, stats, sources=len(ex.sources))
    install_log_redaction()  # after uvicorn configured its loggers: every handler redacts
    ex.start_sources()
    if not settings.push_token:
        log.info("push endpoint disabled (set OMNIWATCH_PUSH_TOKEN or OMNIWATCH_PUSH_TOKEN_FILE to enable)")
    if not settings.webhook_token:
        log.info("Alertmanager webhook disabled (set OMNIWATCH_WEBHOOK_TOKEN or OMNIWATCH_WEBHOOK_TOKEN_FILE)")
    server = GuardedServer(config, stats)
    log.info("omniwatch exporter on http://%s:%d/metrics watching %s", settings.host, settings.port,
             ", ".join(settings.watch + settings.console) or "nothing (push only)")
    # uvicorn re-raises the signal that stopped it once it has shut down; with the default SIGTERM action
    # that kills the process before the final checkpoint below. A handler that only notes it lets serve()
    # finish: sources stopped, state saved, exit 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    try:
        server.run()
    finally:
        ex.stop()
    # Everything durable is written (checkpoint, SQLite commits). Interpreter teardown would free the run
    # model object by object — 1.5 s for 5,000 runs on a loaded 2-core machine, most of the 2 s SIGTERM
    # budget — so flush and leave without it.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def add_commands(sub) -> None:
    p = sub.add_parser("serve", help="run the exporter alone (sources + /metrics + push + webhook)")
    add_exporter_args(p)
    discovery.add_arguments(p)
    p.set_defaults(func=serve)
