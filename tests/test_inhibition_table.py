"""docs/alerts.md's inhibition table is rendered from alerts/alertmanager.yml's `inhibit_rules` by `omniwatch
generate` (tests/doc_tables.py; `generate --check` fails on drift, issue 34 item 4): what is tested here is the
renderer, that the table it writes is the rules, rule by rule and in order, with the comment above each as its why."""
from __future__ import annotations

from omniwatch.yamlio import load as yaml_load

from .conftest import REPO
from .doc_tables import inhibition_table, inhibition_whys

AM = REPO / "alerts" / "alertmanager.yml"


def test_every_inhibit_rule_is_one_row_in_order_with_its_matchers_and_why():
    text = AM.read_text()
    rules = yaml_load(text)["inhibit_rules"]
    rows = [r for r in inhibition_table(AM).splitlines() if r.startswith("| ") and r[2].isdigit()]
    assert [int(r.split("|")[1]) for r in rows] == list(range(1, len(rules) + 1))
    for row, rule, why in zip(rows, rules, inhibition_whys(text), strict=True):
        for m in rule["source_matchers"] + rule["target_matchers"]:
            assert f"`{m.replace('|', chr(92) + '|')}`" in row, (m, row)  # the pipe of `warning|critical` escaped
        assert row.endswith(f"| {why} |") and why, row
    assert inhibition_whys(text)[4] == "(same)"  # a rule without a comment of its own


def test_a_changed_or_added_rule_changes_the_table(tmp_path):
    text = AM.read_text()
    changed = tmp_path / "alertmanager.yml"
    changed.write_text(text.replace("""cause = "inter_stage_idle\"""", """cause = "other\""""))
    assert 'cause = "other"' in inhibition_table(changed) and inhibition_table(changed) != inhibition_table(AM)
    # a rule inserted with its comment is a row with that why
    added = text.replace("inhibit_rules:\n", "inhibit_rules:\n  # Why this one.\n  - source_matchers: ['a = \"b\"']\n"
                                             "    target_matchers: ['c = \"d\"']\n    equal: [project]\n", 1)
    changed.write_text(added)
    assert "| 1 | `a = \"b\"` | `c = \"d\"` | `project` | Why this one. |" in inhibition_table(changed)

