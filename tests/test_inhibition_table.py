"""docs/alerts.md's inhibition table is alerts/alertmanager.yml's `inhibit_rules`, rule by rule and in order
(issue 22 item 9): source and target matchers, equal labels. A rule added, dropped or changed on one side fails."""
from __future__ import annotations

import re


from .conftest import REPO
from omniwatch.yamlio import load as yaml_load

HEADER = "| # | source (inhibits) | target (inhibited) | equal labels | why |"


def _cells(row: str) -> list[str]:
    inner = row.strip()[1:-1]
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def _matchers(cell: str) -> list[str]:
    return [m.strip().strip("`") for m in cell.split("<br>") if m.strip()]


def doc_table() -> list[dict]:
    lines = (REPO / "docs" / "alerts.md").read_text().splitlines()
    start = lines.index(HEADER)
    rows = []
    for row in lines[start + 2:]:
        if not row.startswith("|"):
            break
        num, src, tgt, equal, _why = _cells(row)
        rows.append({"n": int(num), "source_matchers": _matchers(src), "target_matchers": _matchers(tgt),
                     "equal": [e.strip().strip("`") for e in equal.split(",")]})
    return rows


def differences(table: list[dict], rules: list[dict]) -> list[str]:
    out = [f"{len(table)} table rows, {len(rules)} inhibit_rules"] if len(table) != len(rules) else []
    for row, rule in zip(table, rules):
        for k in ("source_matchers", "target_matchers", "equal"):
            if row[k] != rule[k]:
                out.append(f"rule {row['n']} {k}: docs {row[k]} != alertmanager.yml {rule[k]}")
    return out


def _rules() -> list[dict]:
    return yaml_load((REPO / "alerts" / "alertmanager.yml").read_text())["inhibit_rules"]


def test_the_inhibition_table_matches_alertmanager_yml():
    table = doc_table()
    assert [r["n"] for r in table] == list(range(1, len(table) + 1))
    assert not differences(table, _rules())


def test_a_changed_or_dropped_rule_is_a_difference():
    """The comparison bites: alertmanager.yml with one target matcher changed, or one rule dropped, differs from
    the docs (and the escaped pipe of `warning\\|critical` is read back as one matcher)."""
    table, rules = doc_table(), _rules()
    assert any(m == 'severity =~ "warning|critical"' for r in table for m in r["source_matchers"])
    changed = [dict(r) for r in rules]
    changed[5] = {**changed[5], "target_matchers": ['alertname = "StepTimeRegression"']}
    assert differences(table, changed) == [f"rule 6 target_matchers: docs {table[5]['target_matchers']} != "
                                           f"alertmanager.yml ['alertname = \"StepTimeRegression\"']"]
    assert differences(table, rules[:-1])
