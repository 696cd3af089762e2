"""``omniwatch report`` and ``omniwatch compare``."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from .. import cliargs
from ..backtest.commands import _duration, _guarded, _time
from ..backtest.report import progress_for
from ..backtest.tsdb import ToolError
from ..promapi import PromError
from .facts import RunFacts


def alert_config(args):
    """``--config``: the YAML overrides the rules were generated with (``omniwatch rules generate --config``), so
    the ledger's stall tolerance, the verdict's windows and the charts' threshold lines match those rules."""
    from .. import config
    return config.load(getattr(args, "config", None))

DEFAULT_INDEX = "omniwatch-report/index.html"


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1 or v > 1_000_000:
        raise argparse.ArgumentTypeError(f"--gpus must be a whole number >= 1, got {text!r}")
    return v


def default_out(f: RunFacts) -> Path:
    from .index import safe
    return Path(f"omniwatch-report-{safe(f.project)}-{safe(f.experiment)}.html")


def file_facts(paths: list[str], args, progress, kind: str | None = None) -> list[RunFacts]:
    from .gather import facts_of_runs, load_runs
    runs = load_runs(paths, kind=kind, project=getattr(args, "project", None) if len(paths) == 1 else None,
                     experiment=getattr(args, "experiment", None) if len(paths) == 1 else None)
    _configs(runs, args)
    try:
        return facts_of_runs(runs, gpus=args.gpus, rules_dir=args.rules, progress=progress, alert_config=alert_config(args),
                             starts=[args.start] * len(runs) if getattr(args, "start", None) else None,
                             alerts=not args.no_alerts, until=getattr(args, "until", None))
    except (ToolError, PromError) as e:
        raise ToolError(f"{e} (--no-alerts writes the report without Prometheus: ledger and charts, no verdict)") from None


def _configs(runs: list, args) -> None:
    """--trainer-config: each run gets the config naming it; skipped files are said, not fatal."""
    from .. import trainer_config
    for reason, count in sorted(trainer_config.attach(runs, getattr(args, "trainer_config", None)).items()):
        Console(stderr=True).print(f"[yellow]trainer config skipped[/] ({reason}): {count} file(s)", highlight=False)


def live(args, project: str, experiment: str) -> RunFacts:
    from .live import live_facts
    f = live_facts(args.prometheus, project, experiment, until=args.until, since=args.since,
                   resolution=args.resolution)
    if f.gpus is None and args.gpus:
        f.gpus, f.gpus_source = args.gpus, "flag"
    return f


@_guarded
def cmd_report(args) -> int:
    err, out = Console(stderr=True, soft_wrap=True), Console(soft_wrap=True)
    from .html import run_page
    from .output import facts_json, print_facts
    from .verdict import verdict
    if args.prometheus:
        if not (args.project and args.experiment):
            raise ValueError("--prometheus needs --project and --experiment")
        facts = live(args, args.project, args.experiment)
    else:
        src = args.console or args.run
        if not src:
            raise ValueError("give a run (JSONL file or a VERL_FILE_LOGGER_ROOT directory), --console LOG, "
                             "or --prometheus URL --project P --experiment E")
        if Path(src).is_dir():
            return _index(args, Path(src), err, out)
        with progress_for(err, args.quiet or args.json) as prog:
            facts = file_facts([src], args, prog, kind="console" if args.console else None)[0]
    cfg = alert_config(args)
    bs = verdict(facts, cfg)
    dest = Path(args.out) if args.out else (None if args.json else default_out(facts))
    if dest is not None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(run_page(facts, bs, cfg=cfg), encoding="utf-8")
    if args.json:
        sys.stdout.write(json.dumps(facts_json(facts, bs)) + "\n")
    else:
        print_facts(facts, bs, out)
    if dest is not None:
        err.print(f"report: {escape(str(dest.resolve()))} ({dest.stat().st_size / 1e6:.2f} MB)", highlight=False)
    return 0


def _index(args, root: Path, err: Console, out: Console) -> int:
    from ..backtest.runfile import RunFileError, load_run
    from .index import build_index, find_runs
    from .gather import facts_of_runs
    refused: list[Path] = []
    files = find_runs(root, refused)
    for p in refused:
        err.print(f"[yellow]not followed[/] {escape(str(p))}: it resolves (symlink) outside {escape(str(root))}",
                  highlight=False)
    if not files:
        raise ValueError(f"no *.jsonl run under {root}" + (f" ({len(refused)} symlinked out of it)" if refused else ""))
    dest = Path(args.out or DEFAULT_INDEX)
    runs, skipped = [], {}
    for p in files:  # a file that is not a run (empty, not verl's) is named and left out, not fatal
        try:
            runs.append(load_run(str(p)))
        except RunFileError as e:
            skipped[str(p)] = str(e)
            err.print(f"[yellow]skipped[/] {escape(str(e))}", highlight=False)
    if not runs:
        raise ValueError(f"no readable run under {root}")
    _configs(runs, args)
    with progress_for(err, args.quiet or args.json) as prog:
        # the pages show no annotation text (the verdict renders the remedy itself): not rendered here
        facts = facts_of_runs(runs, gpus=args.gpus, rules_dir=args.rules, progress=prog, alert_config=alert_config(args),
                              starts=[args.start] * len(runs) if args.start else None, alerts=not args.no_alerts,
                              annotations=False, until=args.until)
        rows = build_index(facts, dest, str(root), prog, args.jobs, cfg=alert_config(args))
    if args.json:
        sys.stdout.write(json.dumps({"root": str(root.resolve()), "index": str(dest.resolve()), "runs": [
            {k: r[k] for k in ("name", "run", "page", "steps", "gpus", "gpu_hours", "lost", "top", "alerts")}
            for r in rows], "skipped": skipped}) + "\n")
    else:
        from rich.table import Table
        t = Table(title=f"{len(rows)} runs by GPU-hours lost to bottlenecks", title_justify="left")
        for c in ("run", "steps", "GPU-h", "lost GPU-h", "top bottleneck"):
            t.add_column(c, justify="right" if "GPU" in c or c == "steps" else "left")
        for r in rows[:20]:
            t.add_row(escape(r["name"]), str(r["steps"]), f"{r['gpu_hours']:.1f}", f"{r['lost']:.1f}", r["top"] or "-")
        out.print(t)
    err.print(f"index: {escape(str(dest.resolve()))}", highlight=False)
    return 0


@_guarded
def cmd_compare(args) -> int:
    err, out = Console(stderr=True, soft_wrap=True), Console(soft_wrap=True)
    from .compare import Comparison, print_comparison
    from .html import compare_page
    from .verdict import verdict
    if args.prometheus:
        pair = []
        for spec in (args.a, args.b):
            if "/" not in spec:
                raise ValueError(f"with --prometheus, runs are PROJECT/EXPERIMENT, got {spec!r}")
            p, e = spec.split("/", 1)
            pair.append(live(args, p, e))
    else:
        with progress_for(err, args.quiet or args.json) as prog:
            pair = file_facts([args.a, args.b], args, prog)
    cfg = alert_config(args)
    c = Comparison(pair[0], pair[1], verdict(pair[0], cfg), verdict(pair[1], cfg))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(compare_page(c), encoding="utf-8")
    if args.json:
        sys.stdout.write(json.dumps(c.as_json()) + "\n")
    else:
        print_comparison(c, out)
    if args.out:
        err.print(f"comparison: {escape(str(Path(args.out).resolve()))}", highlight=False)
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=_positive_int, help="the run's GPUs: overrides what its config or keys say (every pool)")
    p.add_argument("--trainer-config", action="append", default=[], metavar="FILE|GLOB|DIR",
                   help="the runs' resolved trainer configs (Hydra's .hydra/config.yaml, a YAML/JSON config, a console "
                        "log with VeRL-Omni's config print), matched by trainer.project_name / experiment_name (a "
                        "single run takes a single config whatever its names); repeatable")
    p.add_argument("--rules", metavar="DIR", help="rule files directory (default: the repository's alerts/)")
    p.add_argument("--config", metavar="YAML", help="the threshold overrides the rules were generated with "
                   "(`omniwatch rules generate --config`): ledger stall tolerance, verdict windows, chart thresholds")
    p.add_argument("--prometheus", metavar="URL", help="read a live run from this Prometheus instead of a file")
    p.add_argument("--until", type=_time, help="the report's end. With --prometheus: the end of the range (default now). "
                   "With a file or directory: an unfinished run's stall is priced up to this time (`now` for a run still "
                   "hung: GPUs x the time past its last step beyond the planned work); default: the file ends at its "
                   "last line")
    p.add_argument("--since", type=_duration, default=30 * 86400.0, help="with --prometheus: how far back to look (default 30d)")
    p.add_argument("--resolution", type=_duration, default=15.0, help="with --prometheus: query step (default 15s)")
    p.add_argument("--no-alerts", action="store_true", help="replay only: no Prometheus, no alert timeline or verdict")
    p.add_argument("--json", action="store_true", help="print the facts as one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def add_commands(sub) -> None:
    p = sub.add_parser("report", help="a shareable HTML report of a run (or an index of every run under a directory)",
                       description="Replay a finished run through the exporter's own RunStore, backtest the alert "
                                   "rules over it, and write one self-contained HTML page: the GPU-hours ledger, the "
                                   "verdict (bottlenecks ranked by GPU-hours, with the remedy for the run's layout), "
                                   "per-step charts with alert thresholds and the alert timeline. A directory: every "
                                   "run under it in one Prometheus pass, ranked in index.html.")
    p.add_argument("run", nargs="?", metavar="RUN", help="verl file-logger JSONL, a console log, or a VERL_FILE_LOGGER_ROOT directory")
    p.add_argument("--console", metavar="LOG", help="a console log (verl's stdout) instead of a JSONL file")
    p.add_argument("-o", "--out", metavar="HTML", help="where to write the page (default omniwatch-report-<project>-<experiment>.html; "
                                                        f"a directory's index: {DEFAULT_INDEX})")
    p.add_argument("--project", help="project label (default: the file's parent directory; with --prometheus: the run's)")
    p.add_argument("--experiment", help="experiment label (default: the file name)")
    p.add_argument("--start", type=_time, help="when the run started (default: file mtime minus the run's total)")
    p.add_argument("--jobs", type=cliargs.positive_int, help="processes writing run pages of a directory (default: one per core)")
    _common(p)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("compare", help="run vs run: phase medians, the bottleneck that moved, GPU-hours per 1,000 images",
                       description="Compare two runs (two JSONL files, or PROJECT/EXPERIMENT with --prometheus): "
                                   "median seconds per ledger bucket, GPU-hours per 1,000 images before and after, "
                                   "and which alerts were resolved or appeared.")
    p.add_argument("a", metavar="A", help="the run before (a JSONL file, or PROJECT/EXPERIMENT with --prometheus)")
    p.add_argument("b", metavar="B", help="the run after")
    p.add_argument("-o", "--out", metavar="HTML", help="also write the comparison as a self-contained HTML page")
    _common(p)
    p.set_defaults(func=cmd_compare)


__all__ = ["add_commands", "ToolError"]
