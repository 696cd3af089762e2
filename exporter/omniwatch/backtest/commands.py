"""``omniwatch replay``, ``omniwatch backfill`` and ``omniwatch backtest``."""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from ..rules import RulesError
from .backfill import DEFAULT_SCRAPE_INTERVAL, DEFAULT_TAIL, backfill
from .backtest import backtest
from .openmetrics import DEFAULT_INSTANCE, DEFAULT_JOB
from .feed import push_url, replay_to_file, replay_to_push, target_file
from .report import print_result, progress_for
from .ruleset import load
from .runfile import RunFileError, load_run
from .timeline import Timeline, parse_duration, parse_time
from ..promapi import PromError
from .tsdb import ToolError

HEAD_BLOCK_SECONDS = 3 * 3600


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _time(text: str) -> float:
    try:
        return parse_time(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive(what: str):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = 0
        if not v > 0 or v > 1e9:
            raise argparse.ArgumentTypeError(f"{what} must be a number > 0, got {text!r}")
        return v
    return parse


_speed = _positive("speed")
_pace = _positive("pace")
PACE_HELP = ("uniform wall-clock SECONDS per step instead of the step timers (what `omniwatch replay --pace` "
             "writes; with the live profile's intervals a backtest then fires at the replay's steps)")


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help="verl file-logger JSONL, or a console log (*.log)")
    p.add_argument("--project", help="project label (default: the file's parent directory, as the live source)")
    p.add_argument("--experiment", help="experiment label (default: the file name without suffix)")


def _guarded(fn):
    """Clear one-line errors instead of tracebacks; SIGTERM unwinds like Ctrl-C so every temporary
    directory and Prometheus process is cleaned up."""
    def wrapper(args) -> int:
        err = Console(stderr=True, soft_wrap=True)
        old = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            return fn(args)
        except (RunFileError, RulesError, ToolError, PromError, ValueError, OSError) as e:
            err.print(f"[red]error:[/] {escape(str(e))}", highlight=False)
            return 1
        except KeyboardInterrupt:
            err.print("interrupted; cleaned up")
            return 130
        finally:
            signal.signal(signal.SIGTERM, old)
    return wrapper


@_guarded
def cmd_replay(args) -> int:
    err = Console(stderr=True, soft_wrap=True)
    run = load_run(args.run, project=args.project, experiment=args.experiment)
    with progress_for(err, args.quiet) as prog:
        prog.phase(f"replay {args.pace:g} s/step" if args.pace else f"replay x{args.speed:g}", len(run.entries))
        if args.to:
            dest = target_file(args.to, run)
            stats = replay_to_file(run, dest, args.speed, prog, pace=args.pace)
            where = str(dest)
        else:
            stats = replay_to_push(run, args.push, args.speed, prog, pace=args.pace)
            where = push_url(args.push)
    err.print(f"replayed {stats.sent}/{len(run.entries)} steps of {run.project}/{run.experiment} to {where}"
              + (f"; failed: {stats.failed}" if stats.failed else ""), highlight=False, markup=False)
    return 1 if stats.failed else 0


@_guarded
def cmd_backfill(args) -> int:
    err = Console(stderr=True, soft_wrap=True)
    run = load_run(args.run, project=args.project, experiment=args.experiment)
    timeline = Timeline.of(run, args.start, args.pace)
    out = Path(args.out or f"backfill-{run.experiment}")
    out.mkdir(parents=True, exist_ok=True)
    data_dir = Path(args.prometheus_data) if args.prometheus_data else out / "data"
    if args.prometheus_data and timeline.end > time.time() - HEAD_BLOCK_SECONDS:
        err.print("[yellow]warning:[/] the run ends within the last 3 h; a running Prometheus may still hold "
                  "that range in its head block (promtool's backfilling caveat). Consider --start.")
    recordings = [] if args.no_recording_rules else load(args.rules).recordings
    with progress_for(err, args.quiet) as prog:
        bf = backfill(run, timeline, str(data_dir), scrape_interval=args.scrape_interval, tail=args.tail,
                      recordings=recordings, eval_interval=args.eval_interval,
                      om_file=str(out / f"{run.experiment}.om.txt"), job=args.job, instance=args.instance,
                      progress=prog)
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    err.print(f"{run.project}/{run.experiment}: {len(run.entries)} step lines, {bf.samples} samples from "
              f"{time.strftime(fmt, time.gmtime(bf.first))} to {time.strftime(fmt, time.gmtime(bf.last))}"
              + (f", {sum(map(len, bf.recorded_levels))} recording rules" if bf.recorded_levels else "")
              + (f"; skipped lines: {run.skipped}" if run.skipped else ""), highlight=False, markup=False)
    err.print(f"OpenMetrics: {bf.om_file}\nTSDB blocks: {data_dir}"
              + ("" if args.prometheus_data else f"  (prometheus --storage.tsdb.path={data_dir} "
                 "--storage.tsdb.retention.time=100y, or move the block directories into a Prometheus data dir)"),
              highlight=False, markup=False)
    return 0


@_guarded
def cmd_backtest(args) -> int:
    err, out = Console(stderr=True, soft_wrap=True), Console()
    run = load_run(args.run, project=args.project, experiment=args.experiment)
    from .. import trainer_config
    for reason, count in sorted(trainer_config.attach([run], args.trainer_config).items()):
        err.print(f"[yellow]trainer config skipped[/] ({reason}): {count} file(s)", highlight=False)
    with progress_for(err, args.quiet or args.json) as prog:
        res = backtest(run, rules_dir=args.rules, eval_interval=args.eval_interval,
                       scrape_interval=args.scrape_interval, start=args.start, pace=args.pace, progress=prog,
                       silence=args.silence_after or 0.0)
    assumed = trainer_config.assumptions(run.trainer_config)
    if args.json:
        sys.stdout.write(json.dumps({**res.as_json(), "trainer_config": trainer_config.describe(run.trainer_config),
                                     "assumed": assumed}) + "\n")
    else:
        print_result(res, out)
        for a in assumed:
            out.print(f"[yellow]assumed:[/] {a}", highlight=False)
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("replay", help="feed a recorded run into the live exporter at an accelerated pace",
                       description="Write a recorded run, line by line as verl's FileLogger does, into a file "
                                   "the exporter watches, or POST it step by step to the push endpoint "
                                   "(bearer token from OMNIWATCH_PUSH_TOKEN).")
    _run_args(p)
    clock = p.add_mutually_exclusive_group()
    clock.add_argument("--speed", type=_speed, default=60.0, help="time compression: step seconds / SPEED between lines (default 60)")
    clock.add_argument("--pace", type=_pace, metavar="SECONDS", help="one line every SECONDS (uniform), ignoring the timers")
    dest = p.add_mutually_exclusive_group(required=True)
    dest.add_argument("--to", metavar="PATH", help="JSONL file to write, or a VERL_FILE_LOGGER_ROOT directory")
    dest.add_argument("--push", metavar="URL", help="exporter base URL (POST URL/api/v1/push)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("backfill", help="write a finished run into Prometheus TSDB blocks (dashboards show the past)",
                       description="Rebuild each step's wall-clock time from the timers, scrape the exporter's "
                                   "registry in simulated time and turn it into TSDB blocks with promtool; "
                                   "recording rules from --rules are backfilled too.")
    _run_args(p)
    p.add_argument("--start", type=_time, help="when the run started (ISO 8601 or unix); default: file mtime minus the run's total time")
    p.add_argument("--pace", type=_pace, metavar="SECONDS", help=PACE_HELP)
    p.add_argument("--scrape-interval", type=_duration, default=DEFAULT_SCRAPE_INTERVAL, help="default 15s")
    p.add_argument("--eval-interval", type=_duration, default=DEFAULT_SCRAPE_INTERVAL, help="recording-rule evaluation interval (default 15s)")
    p.add_argument("--tail", type=_duration, default=DEFAULT_TAIL, help="keep scraping the finished run this long (default 5m)")
    p.add_argument("--out", metavar="DIR", help="where the OpenMetrics file (and blocks, without --prometheus-data) go; default backfill-<experiment>")
    p.add_argument("--prometheus-data", metavar="DIR", help="write the blocks into this Prometheus data directory")
    p.add_argument("--rules", metavar="DIR", help="rule files directory (default: the repository's alerts/)")
    p.add_argument("--no-recording-rules", action="store_true", help="do not backfill recording rules")
    p.add_argument("--job", default=DEFAULT_JOB, help=f"job label of the backfilled target (default {DEFAULT_JOB})")
    p.add_argument("--instance", default=DEFAULT_INSTANCE, help=f"instance label (default {DEFAULT_INSTANCE})")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_backfill)

    p = sub.add_parser("backtest", help="which alerts would have fired on a finished run, at which steps",
                       description="Backfill into a temporary directory, evaluate every alerting rule with a "
                                   "temporary real Prometheus at each evaluation timestamp, apply for:/"
                                   "keep_firing_for as Prometheus does and map firing intervals to steps.")
    _run_args(p)
    p.add_argument("--rules", metavar="DIR", help="rule files directory (default: the repository's alerts/)")
    p.add_argument("--eval-interval", type=_duration, default=15.0, help="default 15s")
    p.add_argument("--scrape-interval", type=_duration, default=DEFAULT_SCRAPE_INTERVAL, help="default 15s")
    p.add_argument("--start", type=_time, help="when the run started (default: file mtime minus the run's total)")
    p.add_argument("--pace", type=_pace, metavar="SECONDS", help=PACE_HELP)
    p.add_argument("--json", action="store_true", help='print one JSON object {"run", "steps", "alerts": [...]}')
    p.add_argument("--silence-after", type=_duration, metavar="DURATION",
                   help="judge TrainingStalled as if the log stayed silent this long after its last line (e.g. 3h): "
                        "a finished run must stay quiet, a hang must page (default: judged up to the last line)")
    p.add_argument("--trainer-config", action="append", default=[], metavar="FILE|GLOB|DIR",
                   help="the run's resolved trainer config (Hydra's .hydra/config.yaml, a YAML/JSON config, a console "
                        "log with VeRL-Omni's config print); matched by trainer.project_name / experiment_name, or "
                        "the only one given; repeatable")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_backtest)
