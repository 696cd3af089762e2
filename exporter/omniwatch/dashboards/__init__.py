"""Dashboards as code: declarative panel specs, one factory (grafana-foundation-sdk), the generated
``dashboards/*.json``, a live-Prometheus checker that every panel shows data, and a PNG renderer.

CLI: ``omniwatch dashboards generate [--check] | check | verify --prometheus URL | render --prometheus URL``.
"""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from .. import cliargs

log = logging.getLogger(__name__)


def _config(args):
    """The alert configuration the dashboards are drawn with: ``--config`` (the same YAML overrides ``rules generate
    --config`` reads), else the defaults."""
    from .. import config as config_mod
    return config_mod.load(getattr(args, "config", None))


def _generate(args) -> int:
    from .jsonfiles import check, default_dir, generate
    out = Path(args.out) if args.out else default_dir()
    config = _config(args)
    if args.check:
        problems = check(out, config=config)
        for p in problems:
            print(p, file=sys.stderr)
        if not problems:
            print(f"dashboards in {out} match the specs")
        return 1 if problems else 0
    written = generate(out, config=config)
    print(f"{len(written)} dashboard file(s) written to {out}" if written else f"dashboards in {out} up to date")
    return 0


def _check(args) -> int:
    args.check = True
    return _generate(args)


def _select(uids):
    from ..config import DEFAULT
    from .catalog import by_uid, dashboards
    return tuple(by_uid(u, DEFAULT) for u in uids) if uids else dashboards(DEFAULT)


def _verify(args) -> int:
    from .verify import as_dicts, count_targets, verify
    try:
        dashboards = _select(args.dashboard)
    except KeyError as e:
        print(e.args[0], file=sys.stderr)
        return 2
    failures = verify(args.prometheus, args.project, args.experiment, args.rate_interval, dashboards=dashboards)
    if args.json:
        print(json.dumps({"targets": count_targets(dashboards), "failures": as_dicts(failures)}, indent=2))
    else:
        for f in failures:
            print(f)
        print(f"{count_targets(dashboards)} targets in {len(dashboards)} dashboards checked, "
              f"{len(failures)} without data")
    return 1 if failures else 0


PREVIEW_MISSING = ("`omniwatch dashboards render` draws with matplotlib, the `preview` extra: "
                   "pip install 'omniwatch[preview]' (make install installs it)")


def _render(args) -> int:
    try:
        import matplotlib  # noqa: F401  (the preview extra)
    except ImportError:
        print(PREVIEW_MISSING, file=sys.stderr)
        return 2
    from .preview import render_all
    try:
        dashboards = _select(args.dashboard)
    except KeyError as e:
        print(e.args[0], file=sys.stderr)
        return 2
    paths = render_all(args.prometheus, Path(args.out), minutes=args.minutes, project=args.project,
                       experiment=args.experiment, dashboards=dashboards)
    for p in paths:
        print(p)
    return 0


def _add_run_filters(p) -> None:
    p.add_argument("--prometheus", required=True, help="Prometheus base URL, e.g. http://127.0.0.1:9090")
    p.add_argument("--project", default=".*", help="regex for $project (default: all)")
    p.add_argument("--experiment", default=".*", help="regex for $experiment (default: all)")
    p.add_argument("--dashboard", action="append", metavar="UID", help="only this dashboard (repeatable)")


def add_commands(sub) -> None:
    p = sub.add_parser("dashboards", help="generate, check, verify and render the Grafana dashboards")
    dsub = p.add_subparsers(dest="dashboards_command", metavar="ACTION", required=True)

    g = dsub.add_parser("generate", help="write dashboards/<uid>.json from the panel specs")
    g.add_argument("--out", help="output directory (default: <repo>/dashboards)")
    g.add_argument("--check", action="store_true", help="do not write; exit 1 when the files drifted")
    g.add_argument("--config", help="YAML overrides of the thresholds (as `rules generate --config`): the panels "
                                    "draw that configuration's thresholds")
    g.set_defaults(func=_generate)

    c = dsub.add_parser("check", help="exit 1 when dashboards/*.json differ from the specs")
    c.add_argument("--out", help="directory to check (default: <repo>/dashboards)")
    c.add_argument("--config", help="YAML overrides of the thresholds the files were generated with")
    c.set_defaults(func=_check)

    v = dsub.add_parser("verify", help="run every panel query against a live Prometheus; exit 1 on empty panels")
    _add_run_filters(v)
    v.add_argument("--rate-interval", default="1m", help="value for $__rate_interval (>= 4 scrape intervals)")
    v.add_argument("--json", action="store_true", help="machine-readable output")
    v.set_defaults(func=_verify)

    r = dsub.add_parser("render", help="draw each dashboard as a PNG from live range queries (no Grafana needed)")
    _add_run_filters(r)
    r.add_argument("--out", default="docs/img", help="directory for <uid>.png")
    r.add_argument("--minutes", type=cliargs.positive_float, default=30.0, help="time range to draw, ending now")
    r.set_defaults(func=_render)
