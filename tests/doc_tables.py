"""docs/alerts.md's tables that mirror the checkout's tests and Alertmanager configuration, rendered by
``omniwatch generate`` in a checkout (omniwatch/generated.py loads this file; drift-checked by ``--check``):

- tested configurations: which alert tests/test_matrix.py proves on which layout (tests/matrix_cases.py);
- inhibit rules: ``inhibit_rules`` of alerts/alertmanager.yml rule by rule, in order; the "why" of a rule is the
  comment block right above it there ("(same)" for a rule without one)."""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MATRIX = ("<!-- BEGIN GENERATED: tested configurations (tests/matrix_cases.py) -->",
          "<!-- END GENERATED: tested configurations -->")
INHIBIT = ("<!-- BEGIN GENERATED: inhibit rules (alerts/alertmanager.yml) -->", "<!-- END GENERATED: inhibit rules -->")


def inhibition_whys(text: str) -> list[str]:
    """The comment block right above each rule of ``inhibit_rules`` (a blank line ends a block), in order."""
    lines = text[text.index("\ninhibit_rules:"):].splitlines()[2:]
    whys, block = [], []
    for line in lines:
        s = line.strip()
        if line and not line.startswith(" "):
            break
        if s.startswith("#"):
            block.append(s.lstrip("#").strip())
        elif s.startswith("- "):
            whys.append(" ".join(block) or "(same)")
            block = []
        elif not s:
            block = []
    return whys


def inhibition_table(alertmanager_yml: Path) -> str:
    from omniwatch.yamlio import load
    text = alertmanager_yml.read_text()
    rules = load(text)["inhibit_rules"]

    def cell(matchers):
        return "<br>".join(f"`{m}`" for m in matchers).replace("|", "\\|")
    out = ["", "| # | source (inhibits) | target (inhibited) | equal labels | why |", "|---|---|---|---|---|"]
    for i, (r, why) in enumerate(zip(rules, inhibition_whys(text), strict=True), 1):
        equal = ", ".join(f"`{e}`" for e in r["equal"])
        out.append(f"| {i} | {cell(r['source_matchers'])} | {cell(r['target_matchers'])} | {equal} | {why.replace('|', '/')} |")
    return "\n".join(out + [""])


def section(text: str, marks: tuple[str, str], body: str) -> str:
    a, b = text.find(marks[0]), text.find(marks[1])
    if a < 0 or b < 0:
        raise ValueError(f"docs/alerts.md: generated-section markers {marks[0]!r} missing")
    return text[:a + len(marks[0])] + "\n" + body + "\n" + text[b:]


def alerts_md(text: str) -> str:
    """docs/alerts.md ``text`` with both tables rendered."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    from matrix_cases import matrix_table
    text = section(text, MATRIX, matrix_table())
    return section(text, INHIBIT, inhibition_table(HERE.parent / "alerts" / "alertmanager.yml"))
