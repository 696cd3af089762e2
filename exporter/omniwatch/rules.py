"""The rule files in ``alerts/``: where they are, what they define, and the two commands that keep
them honest.

``alerts/`` is the one set of rule files every consumer reads (native stack, compose, promtool tests,
backtest, Kubernetes export). They are generated from ``omniwatch.alerting`` (``omniwatch rules
generate``; ``--check`` reports drift for CI); this module *finds* and *checks* them (``omniwatch rules
check``: promtool check + promtool test + amtool).
"""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import paths
from .settings import tool
from .alerting import rulegen as alerting_generate
from .yamlio import load as yaml_load

RULE_GLOB = "*.rules.yml"
ALERTMANAGER_FILE = "alertmanager.yml"
TESTS_GLOB = "tests/*.yml"
INSTALL_HINT = "apt-get install prometheus prometheus-alertmanager"


class RulesError(Exception):
    """A rule file cannot be read or edited, or a checker is missing or failed."""


RULES_DIR = paths.alerts_dir()  # the checkout's alerts/, else the copy packaged in the wheel


def rule_files(rules_dir: Path | None = None) -> list[Path]:
    """Every ``*.rules.yml`` in the rules directory, sorted (one area may own each file)."""
    return sorted(Path(rules_dir or RULES_DIR).glob(RULE_GLOB))


def alertmanager_config_path(rules_dir: Path | None = None) -> Path:
    return Path(rules_dir or RULES_DIR) / ALERTMANAGER_FILE


def rule_test_files(rules_dir: Path | None = None) -> list[Path]:
    return sorted(Path(rules_dir or RULES_DIR).glob(TESTS_GLOB))


@dataclass
class LoadedAlert:
    name: str
    expr: str
    file: Path
    group: str
    for_: str | None = None
    labels: dict = field(default_factory=dict)
    annotations: dict = field(default_factory=dict)
    hold: float = 0.0             # for:, seconds
    keep_firing_for: float = 0.0  # seconds
    eval_expr: str = ""           # expr as the backtest evaluates it (backtest.ruleset: same-group recordings inlined)

    def __post_init__(self) -> None:
        self.eval_expr = self.eval_expr or self.expr

    @property
    def severity(self) -> str:
        return str(self.labels.get("severity", ""))


@dataclass
class Record:
    record: str
    expr: str
    labels: dict
    group: str
    file: Path | None = None
    level: int = 1  # dependency level (backtest.ruleset.levels)


def load_rule_file(path: Path) -> dict:
    try:
        doc = yaml_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise RulesError(f"{path}: cannot read rule file: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("groups"), list):
        raise RulesError(f"{path}: not a Prometheus rule file (no top-level 'groups' list)")
    return doc


def _seconds(v, what: str, path: Path) -> float:
    from .backtest.timeline import parse_duration
    if v in (None, "", 0, "0", "0s"):
        return 0.0
    try:
        return parse_duration(str(v))
    except ValueError as e:
        raise RulesError(f"{path}: {what}: {e}") from None


def load_rules(files: list[Path]) -> list[LoadedAlert | Record]:
    """The one parsed model of rule files: every alerting and recording rule (those with an expression), in
    file and group order."""
    out: list[LoadedAlert | Record] = []
    for path in files:
        for group in load_rule_file(path)["groups"]:
            gname = str((group or {}).get("name", ""))
            for rule in (group or {}).get("rules") or []:
                if not isinstance(rule, dict) or not isinstance(rule.get("expr"), (str, int, float)):
                    continue
                labels = {str(k): str(v) for k, v in (rule.get("labels") or {}).items()}
                if "alert" in rule:
                    name = str(rule["alert"])
                    out.append(LoadedAlert(name, str(rule["expr"]), path, gname, rule.get("for"), labels,
                                     dict(rule.get("annotations") or {}), _seconds(rule.get("for"), f"{name} for", path),
                                     _seconds(rule.get("keep_firing_for"), f"{name} keep_firing_for", path)))
                elif "record" in rule:
                    out.append(Record(str(rule["record"]), str(rule["expr"]), labels, gname, path))
    return out


def load_alerts(rules_dir: Path | None = None) -> list[LoadedAlert]:
    """The alerting rules of every rule file, in file order (recording rules left out)."""
    return [r for r in load_rules(rule_files(rules_dir)) if isinstance(r, LoadedAlert)]


# --- promtool / amtool ---------------------------------------------------------------------------
def find_tool(*candidates: str) -> str:
    """Path of the first installed candidate binary, else a RulesError that says how to install it."""
    found = tool(*candidates)
    if found:
        return found
    raise RulesError(f"{' / '.join(candidates)} not found on PATH; install it: {INSTALL_HINT}")


def check_commands(rules_dir: Path | None = None) -> list[list[str]]:
    """The commands ``omniwatch rules check`` runs: rule syntax + lint, the promtool unit tests, the
    Alertmanager config."""
    files = rule_files(rules_dir)
    if not files:
        raise RulesError(f"no {RULE_GLOB} files in {rules_dir or RULES_DIR}")
    promtool = find_tool("promtool")
    amtool = find_tool("amtool")
    cmds = [[promtool, "check", "rules", *map(str, files)]]
    tests = rule_test_files(rules_dir)
    if tests:
        cmds.append([promtool, "test", "rules", *map(str, tests)])
    cmds.append([amtool, "check-config", str(alertmanager_config_path(rules_dir))])
    return cmds


def run_checks(rules_dir: Path | None = None, timeout: float = 120) -> int:
    """Run every check, print their output; 0 when all pass."""
    failed = 0
    for cmd in check_commands(rules_dir):
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"FAILED (timeout after {timeout:.0f}s): {' '.join(cmd)}", file=sys.stderr)
            failed += 1
            continue
        sys.stdout.write(res.stdout)
        sys.stderr.write(res.stderr)
        if res.returncode != 0:
            print(f"FAILED (exit {res.returncode}): {' '.join(cmd)}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


# --- CLI -----------------------------------------------------------------------------------------
def _cmd_check(args) -> int:
    try:
        return run_checks(Path(args.rules_dir) if args.rules_dir else None, timeout=args.timeout)
    except RulesError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def add_commands(sub) -> None:
    p = sub.add_parser("rules", help="alerts/: generate from the configuration, promtool/amtool checks")
    rsub = p.add_subparsers(dest="rules_command", metavar="ACTION", required=True)
    alerting_generate.add_arguments(rsub.add_parser("generate", help="render alerts/*.rules.yml and the "
                                                   "thresholds table of docs/alerts.md from exporter/omniwatch/alerting/"))
    c = rsub.add_parser("check", help="promtool check rules + promtool test rules + amtool check-config")
    c.add_argument("--rules-dir", help=f"directory holding {RULE_GLOB} (default: {RULES_DIR})")
    c.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                   help="give up on one promtool/amtool command after this long (default: 120; the whole promtool "
                        "suite is ~20 s of a core, minutes on a loaded machine)")
    c.set_defaults(func=_cmd_check)
