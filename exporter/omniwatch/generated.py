"""``omniwatch generate [--check]``: every generated file of the checkout from its one source, in one pass.

==========================  ==========================================================================
generated file              source
==========================  ==========================================================================
alerts/*.rules.yml          omniwatch/alerting/ (rulespec, stalls, endpoints: the rules; ../config.py: the numbers)
docs/alerts.md (tables)     omniwatch/alerting/rulegen.py (thresholds, remedies); tests/doc_tables.py (the
                            configurations tests/test_matrix.py proves, alertmanager.yml's inhibit rules)
omniwatch/remedy_texts.json omniwatch/alerting/rulegen.py (the remedies the exporter serves, as prose data)
dashboards/*.json           omniwatch/dashboards/ (specs, one factory)
docs/metrics.md             omniwatch/names.py (the metric catalogue)
deploy/compose/*.yml        omniwatch/stack.py (the native stack's configs, relocated for containers)
deploy/k8s/*.yaml           alerts/*.rules.yml and dashboards/*.json (omniwatch/export.py)
docs/benchmarks.md,         benchmarks/results.json (benchmarks/docs.py; in a checkout only)
docs/scaling.md (figures)
docs/scorecard.md (tables)  benchmarks/scorecard.json (omniwatch/scorecard/card.py; in a checkout only;
                            ``make scorecard`` backtests the corpus and rewrites both)
==========================  ==========================================================================

The promtool tests (``alerts/tests/*.test.yml``) are not in the table: they are written by hand with literal
expected text (docs/contributing.md), so a threshold or wording change fails them until they are edited.

Without ``--check`` the files that differ are written; with it nothing is written and the exit code is 1
when any differ (``make check``, run by ``make test``). The per-area commands (``rules generate``,
``dashboards generate``, ``docs``, ``compose render``, ``export k8s``) stay for their own options.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from . import compose, docsgen, export, paths
from . import config as alert_config
from .alerting import rulegen as alerting_generate
from .scorecard import card as scorecard_card


def expected(k8s: bool = True) -> dict[Path, str]:
    """Every generated file of the package's sources -> the text it must have (order: the table above). The
    deploy/k8s/ manifests are rendered from the rule files and dashboards *on disk*: without ``k8s`` they are
    left out, so a writer can sync the rest first (:func:`k8s_expected`)."""
    from .dashboards import jsonfiles as dashboards_generate  # the grafana SDK: loaded only when generating
    doc = paths.repo_dir() / "docs" / "alerts.md"
    out = alerting_generate.outputs(alert_config.DEFAULT, paths.alerts_dir(), doc)
    out[doc] = checkout_tables(out[doc])
    out.update({dashboards_generate.default_dir() / n: t for n, t in dashboards_generate.rendered(config=alert_config.DEFAULT).items()})
    out[docsgen.docs_path()] = docsgen.render()
    out.update({compose.default_out() / n: t for n, t in compose.rendered().items()})
    out.update(scorecard_card.expected_doc())
    if k8s:
        out.update(k8s_expected())
    return out


def checkout_tables(alerts_md: str) -> str:
    """docs/alerts.md's tables of the checkout's tests and alertmanager.yml (tests/doc_tables.py; in a checkout only)."""
    script = paths.repo_dir() / "tests" / "doc_tables.py"
    if not script.is_file():
        return alerts_md
    spec = importlib.util.spec_from_file_location("omniwatch_doc_tables", script)
    spec.loader.exec_module(mod := importlib.util.module_from_spec(spec))
    return mod.alerts_md(alerts_md)


def k8s_expected() -> dict[Path, str]:
    return {export.k8s_dir() / n: t for n, t in export.k8s_manifests().items()}


STALE_GLOBS = (("alerts", "*.rules.yml"), ("alerts/tests", "*.test.yml"), ("dashboards", "omniwatch-*.json"),
               ("deploy/k8s", "*.yaml"), ("deploy/compose", "*.yml"))


def stale(files: dict[Path, str]) -> list[Path]:
    """Generated-looking files that no source produces any more (a renamed dashboard, a dropped rule file): every
    ``dashboards/omniwatch-*.json``, and the others that say they are generated (the hand-written promtool tests in
    alerts/tests/ are not)."""
    repo = paths.repo_dir()

    def generated_by_us(p: Path) -> bool:
        return p.parent.name == "dashboards" or "generated" in p.read_text(encoding="utf-8", errors="replace").lower()
    return sorted(p for d, pattern in STALE_GLOBS for p in (repo / d).glob(pattern)
                  if p not in files and generated_by_us(p))


def benchmark_docs(check: bool) -> int | None:
    """The benchmark figures of docs/ (benchmarks/docs.py renders them from results.json); None outside a checkout."""
    script = paths.repo_dir() / "benchmarks" / "docs.py"
    if not script.is_file():
        return None
    return subprocess.run([sys.executable, str(script), *(["--check"] if check else [])], timeout=300).returncode


def cmd_generate(args) -> int:
    try:
        # Writing: the rules and dashboards first, then the k8s manifests rendered from them, so one pass
        # leaves nothing stale. Checking: everything at once (a stale rule file is reported either way).
        files = expected(k8s=args.check)
        drift = paths.sync(files, args.check)
        if not args.check:
            k8s = k8s_expected()
            drift += paths.sync(k8s, False)
            files.update(k8s)
    except (OSError, ValueError) as e:
        print(f"omniwatch generate: {e}", file=sys.stderr)
        return 2
    repo = paths.repo_dir()
    for p in drift:
        print(("out of date: " if args.check else "wrote ") + str(p.relative_to(repo) if p.is_relative_to(repo) else p))
    old = stale(files)
    for p in old:
        print(f"stale: {p.relative_to(repo)} is generated by nothing (delete it)", file=sys.stderr)
    bench = benchmark_docs(args.check)
    if old:
        return 1
    if args.check and (drift or bench):
        print("generated files differ from their sources: run `omniwatch generate` (make generate)", file=sys.stderr)
        return 1
    if bench:
        return bench
    if not drift:
        print("every generated file is up to date")
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("generate", help="write every generated file (rules, dashboards, docs, "
                                        "compose, k8s); --check: exit 1 on drift")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when any generated file differs")
    p.set_defaults(func=cmd_generate)
