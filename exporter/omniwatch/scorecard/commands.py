"""``omniwatch scorecard``: backtest the corpus in one pass, apply Alertmanager, print or write the figures."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from .. import paths
from ..backtest.commands import _guarded


def _write(card: dict, err: Console) -> None:
    from . import card as card_mod
    base = card_mod.baseline_path()
    base.parent.mkdir(parents=True, exist_ok=True)
    base.write_text(json.dumps(card, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    drift = paths.sync(card_mod.expected_doc(), False)
    err.print(f"wrote {base.relative_to(paths.repo_dir())}"
              + "".join(f", {p.relative_to(paths.repo_dir())}" for p in drift), highlight=False)


@_guarded
def cmd_scorecard(args) -> int:
    from ..backtest.report import progress_for
    from . import baseline as baseline_mod, card as card_mod
    from .scoring import run_scorecard
    err, out = Console(stderr=True, soft_wrap=True), Console(soft_wrap=True)
    with progress_for(err, args.quiet or args.json) as prog:
        card = run_scorecard(args.corpus or card_mod.corpus_dir(), rules_dir=args.rules,
                             alertmanager=args.alertmanager, progress=prog)
    if args.json:
        sys.stdout.write(json.dumps(card) + "\n")
    else:
        card_mod.print_card(card, out, faults=not args.brief)
    if args.write:
        _write(card, err)
    if args.check:
        base = Path(args.baseline) if args.baseline else card_mod.baseline_path()
        worse = baseline_mod.regressions(card, json.loads(base.read_text(encoding="utf-8")))
        for line in worse:
            err.print(f"[red]worse than the baseline:[/] {escape(line)}", highlight=False)
        if worse:
            err.print(f"{len(worse)} figure(s) worse than {base}: {baseline_mod.REBASELINE}", highlight=False)
            return 1
        err.print(f"no figure is worse than {base}", highlight=False)
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("scorecard", help="detection scorecard: backtest the public corpus, apply Alertmanager, "
                                         "count what a person receives per fault",
                       description="Backtest every run of the scorecard corpus (tests/fixtures/scorecard) in one pass "
                                   "against alerts/*.rules.yml, feed what Prometheus sends to a model of "
                                   "alerts/alertmanager.yml (routes, grouping, inhibition), and judge each injected "
                                   "fault: caught, held, steps to detect, notifications per fault, false "
                                   "notifications on healthy runs (docs/scorecard.md).")
    p.add_argument("--corpus", metavar="DIR", help="the corpus (default: the repository's tests/fixtures/scorecard)")
    p.add_argument("--rules", metavar="DIR", help="rule files directory (default: the repository's alerts/)")
    p.add_argument("--alertmanager", metavar="FILE", help="Alertmanager config (default: the rules directory's "
                                                          "alertmanager.yml)")
    p.add_argument("--json", action="store_true", help="print the whole scorecard as one JSON object")
    p.add_argument("--brief", action="store_true", help="no per-fault table")
    p.add_argument("--write", action="store_true", help="write it as the baseline (benchmarks/scorecard.json) and "
                                                        "regenerate docs/scorecard.md from it (make scorecard)")
    p.add_argument("--check", action="store_true", help="exit 1 when a figure is worse than the baseline")
    p.add_argument("--baseline", metavar="FILE", help="baseline to --check against (default: benchmarks/scorecard.json)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_scorecard)

