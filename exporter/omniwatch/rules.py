"""The rule files in ``alerts/``: where they are, what they define, and the two commands that keep
them honest.

``alerts/`` is the one set of rule files every consumer reads (native stack, compose, promtool tests,
backtest, Kubernetes export), so this module only *finds* and *checks* them. ``runbook_url`` is never
hand-written: ``omniwatch rules sync`` writes ``names.RUNBOOK_URL`` (anchor = lower-cased alert name)
into every alert, editing the text in place so comments and layout survive, and ``--check`` reports
drift for CI.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import names, paths

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


def runbook_url(alertname: str) -> str:
    return names.RUNBOOK_URL.format(anchor=alertname.lower())


@dataclass
class Alert:
    name: str
    expr: str
    file: Path
    group: str
    for_: str | None = None
    labels: dict = field(default_factory=dict)
    annotations: dict = field(default_factory=dict)


def load_rule_file(path: Path) -> dict:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise RulesError(f"{path}: cannot read rule file: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("groups"), list):
        raise RulesError(f"{path}: not a Prometheus rule file (no top-level 'groups' list)")
    return doc


def load_alerts(rules_dir: Path | None = None) -> list[Alert]:
    """The alerting rules of every rule file, in file order (recording rules left out)."""
    out = []
    for path in rule_files(rules_dir):
        for group in load_rule_file(path)["groups"]:
            for rule in (group or {}).get("rules") or []:
                if isinstance(rule, dict) and "alert" in rule:
                    out.append(Alert(str(rule["alert"]), str(rule.get("expr", "")), path, str(group.get("name")),
                                     rule.get("for"), dict(rule.get("labels") or {}),
                                     dict(rule.get("annotations") or {})))
    return out


# --- runbook_url sync ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Drift:
    file: Path
    alert: str
    line: int  # 1-based line of the alert's rule
    have: str | None
    want: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.alert}: runbook_url {self.have!r} -> {self.want!r}"


def _mapping_get(node: yaml.MappingNode, key: str):
    for k, v in node.value:
        if isinstance(k, yaml.ScalarNode) and k.value == key:
            return k, v
    return None, None


def _line_start(text: str, index: int) -> int:
    return text.rfind("\n", 0, index) + 1


def _plan(path: Path, text: str) -> list[tuple[int, int, str, Drift]]:
    """Text edits (start, end, replacement, drift) that make every alert's runbook_url right.

    Positions come from PyYAML's composer, so only the runbook_url value (or one inserted line) is
    touched and everything else in the file, comments included, stays byte-for-byte."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as e:
        raise RulesError(f"{path}: cannot parse: {e}") from None
    groups = _mapping_get(root, "groups")[1] if isinstance(root, yaml.MappingNode) else None
    if not isinstance(groups, yaml.SequenceNode):
        raise RulesError(f"{path}: not a Prometheus rule file (no top-level 'groups' list)")
    edits = []
    for group in groups.value:
        rules = _mapping_get(group, "rules")[1] if isinstance(group, yaml.MappingNode) else None
        for rule in rules.value if isinstance(rules, yaml.SequenceNode) else ():
            if not isinstance(rule, yaml.MappingNode):
                continue
            akey, aval = _mapping_get(rule, "alert")
            if aval is None:
                continue
            want = runbook_url(aval.value)
            where = f"{path}:{akey.start_mark.line + 1}"
            _, ann = _mapping_get(rule, "annotations")
            if ann is None:  # add an annotations block on the line after `alert:`
                nl = text.find("\n", aval.end_mark.index)
                at, lead = (len(text), "\n") if nl < 0 else (nl + 1, "")
                pad = " " * akey.start_mark.column
                edits.append((at, at, f"{lead}{pad}annotations:\n{pad}  runbook_url: {want}\n",
                              Drift(path, aval.value, akey.start_mark.line + 1, None, want)))
                continue
            if not isinstance(ann, yaml.MappingNode) or ann.flow_style or not ann.value:
                raise RulesError(f"{where}: {aval.value}: annotations must be a non-empty block mapping to sync runbook_url")
            _, rval = _mapping_get(ann, "runbook_url")
            if rval is not None:
                have = rval.value if isinstance(rval, yaml.ScalarNode) else None
                if have != want:  # quoting of an equal value is the author's choice
                    end = rval.end_mark.index  # a block scalar's span ends after its newline
                    edits.append((rval.start_mark.index, end, want + ("\n" if text[end - 1:end] == "\n" else ""),
                                  Drift(path, aval.value, akey.start_mark.line + 1, have, want)))
                continue
            first_key = ann.value[0][0]
            at = _line_start(text, first_key.start_mark.index)
            pad = " " * first_key.start_mark.column
            edits.append((at, at, f"{pad}runbook_url: {want}\n",
                          Drift(path, aval.value, akey.start_mark.line + 1, None, want)))
    return edits


def sync_runbooks(check: bool = False, rules_dir: Path | None = None) -> list[Drift]:
    """Make ``runbook_url`` of every alert in every rule file equal ``names.RUNBOOK_URL``.

    Returns what differed (empty = in sync). With ``check=True`` nothing is written. Idempotent: a
    second run finds nothing. Every rewritten file is re-read to prove the edit did what it meant."""
    drift: list[Drift] = []
    for path in rule_files(rules_dir):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise RulesError(f"{path}: cannot read rule file: {e}") from None
        edits = _plan(path, text)
        drift += [d for *_, d in edits]
        if check or not edits:
            continue
        for start, end, new, _ in sorted(edits, key=lambda e: e[0], reverse=True):
            text = text[:start] + new + text[end:]
        if _plan(path, text):
            raise RulesError(f"{path}: runbook_url edit did not converge; file left unchanged")
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return drift


# --- promtool / amtool ---------------------------------------------------------------------------
def find_tool(*candidates: str) -> str:
    """Path of the first installed candidate binary, else a RulesError that says how to install it."""
    for name in candidates:
        found = shutil.which(name)
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
def _cmd_sync(args) -> int:
    rules_dir = Path(args.rules_dir) if args.rules_dir else None
    try:
        drift = sync_runbooks(check=args.check, rules_dir=rules_dir)
    except RulesError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for d in drift:
        print(("drift: " if args.check else "fixed: ") + str(d))
    if args.check and drift:
        print("runbook_url out of sync; run `omniwatch rules sync`", file=sys.stderr)
        return 1
    if not drift:
        print(f"runbook_url in sync in {len(rule_files(rules_dir))} rule file(s)")
    return 0


def _cmd_check(args) -> int:
    try:
        return run_checks(Path(args.rules_dir) if args.rules_dir else None)
    except RulesError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def add_commands(sub) -> None:
    p = sub.add_parser("rules", help="keep alerts/ in shape: runbook links, promtool/amtool checks")
    rsub = p.add_subparsers(dest="rules_command", metavar="ACTION", required=True)
    s = rsub.add_parser("sync", help="write runbook_url into every alert (names.RUNBOOK_URL)")
    s.add_argument("--check", action="store_true", help="only report drift; exit 1 if any")
    s.add_argument("--rules-dir", help=f"directory holding {RULE_GLOB} (default: {RULES_DIR})")
    s.set_defaults(func=_cmd_sync)
    c = rsub.add_parser("check", help="promtool check rules + promtool test rules + amtool check-config")
    c.add_argument("--rules-dir", help=f"directory holding {RULE_GLOB} (default: {RULES_DIR})")
    c.set_defaults(func=_cmd_check)
