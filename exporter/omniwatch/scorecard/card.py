"""The scorecard shown: a rich table on the terminal, and the generated blocks of ``docs/scorecard.md`` rendered
from the committed baseline (``benchmarks/scorecard.json``) alone, so ``omniwatch generate`` needs no backtest and
``generate --check`` fails when the page and the baseline disagree. Every block sits between

    <!-- BEGIN GENERATED: scorecard-NAME (omniwatch scorecard --write) -->
    <!-- END GENERATED: scorecard-NAME -->

and the prose around the blocks is written by hand. Rounding is fixed: the same JSON gives the same bytes."""
from __future__ import annotations

import re
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .. import paths

BEGIN = "<!-- BEGIN GENERATED: scorecard-{name} (omniwatch scorecard --write) -->"
END = "<!-- END GENERATED: scorecard-{name} -->"
BLOCK_RE = re.compile(r"<!-- BEGIN GENERATED: scorecard-(?P<name>[\w-]+) \(omniwatch scorecard --write\) -->\n"
                      r"(?P<body>.*?)<!-- END GENERATED: scorecard-(?P=name) -->", re.S)


def baseline_path() -> Path:
    return paths.repo_dir() / "benchmarks" / "scorecard.json"


def doc_path() -> Path:
    return paths.repo_dir() / "docs" / "scorecard.md"


def corpus_dir() -> Path:
    return paths.repo_dir() / "tests" / "fixtures" / "scorecard"


# --- formatting ----------------------------------------------------------------------------------------------
def _n(x, nd: int = 2) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "**no**"
    if isinstance(x, int):
        return str(x)
    return f"{x:.{nd}f}"


def _med(x) -> str:
    return "–" if x is None else (str(int(x)) if x == int(x) else f"{x:.1f}")


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.0f} %"


def _steps(f: dict, short: bool = False) -> str:
    if "detect_s" in f:
        if f.get("detect_s") is None:
            return "–"
        if short:
            return f"{f['detect_s'] / 60:.0f}m {f['detect_x_step']:.1f}x"
        return f"{f['detect_s'] / 60:.0f} min ({f['detect_x_step']:.1f}x its step)"
    return _n(f.get("detect_steps"))


def _md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    esc = [[c.replace("|", "\\|") for c in r] for r in rows]
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in esc)]


# --- blocks --------------------------------------------------------------------------------------------------
def _bar(card: dict) -> list[str]:
    rows = [[b["criterion"], _n(b["value"]), b["target"], "met" if b["met"] else "**missed**"] for b in card["bar"]]
    t = card["totals"]
    out = _md_table(["issue 30's bar", "now", "target", ""], rows)
    out += ["", f"{t['runs']} runs ({t['lines']} step lines): {t['faults']} injected faults in "
                f"{t['runs'] - t['healthy_runs'] - t['change_runs']} runs, {t['healthy_runs']} healthy runs, "
                f"{t['change_runs']} with a workload change only. Faults caught: {t['caught']} of {t['faults']}; "
                f"held (share of a fault's steps with an alert naming its cause firing): mean {_pct(t['held_mean'])}, "
                f"lowest {_pct(t['held_min'])}; steps to detect: median {_med(t['detect_steps_median'])}, "
                f"max {_n(t['detect_steps_max'])}. Firing notifications (warning/critical) inside fault windows: "
                f"{t['notifications']} ({_n(t['notifications_per_fault'])} per fault), info notices there: "
                f"{t['info_notifications']}; on healthy runs: {t['false_healthy']} (info: {t['info_healthy']}); on "
                f"faulty runs outside every fault's window: {t['false_faulty_runs']}."]
    return out


def _alerts(card: dict) -> list[str]:
    rows = [[f"`{a['alertname']}`", _n(a["faults_named"]), _n(a["caught"]), _pct(a["held"]),
             f"{_med(a['detect_steps_median'])} / {_n(a['detect_steps_max'])}", _n(a["notifications_in_faults"]),
             _n(a["notifications_per_fault"]), _n(a["false_healthy"]), _n(a["info_healthy"])]
            for a in card["alerts"]]
    return _md_table(["alert", "faults it names", "caught", "held", "steps to detect (median / max)",
                      "notifications in fault windows", "per fault (all faults)", "false on healthy runs",
                      "info on healthy runs"], rows)


def _faults(card: dict) -> list[str]:
    rows = []
    for f in card["faults"]:
        extra = f" (after the resume: {_n(f.get('redetect_steps'))})" if "redetect_steps" in f else ""
        rows.append([f"`{f['run']}`", f["kind"], f["shape"], f"{f['first_step']}–{f['last_step']}",
                     ", ".join(f"`{m}`" for m in f["named_by"]), _n(f["caught"]),
                     ", ".join(f["caught_by"]) or "–", _steps(f) + extra, _pct(f["held"]),
                     _pct(f["held_after_detect"]), _n(f["notifications"])
                     + (f" (+{f['info_notifications']} info)" if f["info_notifications"] else "")])
    return _md_table(["run", "fault", "shape", "steps", "named by", "caught", "by", "steps to detect", "held",
                      "held after detection", "notifications"], rows)


def _runs(card: dict) -> list[str]:
    rows = []
    for r in card["runs"]:
        fired = sorted({h["alertname"] + (f"/{h['severity']}" if h["severity"] != "warning" else "")
                        for h in r["fired"]})
        rows.append([f"`{r['run']}`", r["class"], str(r["lines"]), r["note"] or "–", _n(r["notifications"]),
                     _n(r["false_notifications"]), _n(r["info_notifications"]), ", ".join(fired) or "–"])
    return _md_table(["run", "class", "lines", "what it is", "notifications (warning/critical)", "of which false",
                      "info", "alerts that fired"], rows)


def _inputs(card: dict) -> list[str]:
    i = card.get("inputs", {})
    return [f"Corpus `tests/fixtures/scorecard/` (SHA-256 of its files, as read: `{card['corpus']['digest'][:16]}…`), "
            f"rule files {', '.join('`alerts/' + r + '`' for r in i.get('rules', []))}, Alertmanager "
            f"`alerts/{i.get('alertmanager', '?')}`; scrape and evaluation every {_n(i.get('scrape_interval_s'), 0)} s / "
            f"{_n(i.get('eval_interval_s'), 0)} s; a run's notifications counted up to "
            f"{_n(i.get('horizon_s'), 0)} s after its last evaluation. Not evaluated by a backtest: "
            + (", ".join(f"`{x}`" for x in i.get("not_evaluated", [])) or "none") + "."]


BLOCKS = {"inputs": _inputs, "bar": _bar, "alerts": _alerts, "faults": _faults, "runs": _runs}


def render_doc(text: str, card: dict) -> str:
    """``text`` with every generated block replaced from ``card``; a block the page lacks is an error."""
    seen = set()

    def repl(m: re.Match) -> str:
        name = m["name"]
        if name not in BLOCKS:
            raise ValueError(f"docs/scorecard.md: unknown generated block {name!r}")
        seen.add(name)
        return BEGIN.format(name=name) + "\n" + "\n".join(BLOCKS[name](card)) + "\n" + END.format(name=name)
    out = BLOCK_RE.sub(repl, text)
    missing = set(BLOCKS) - seen
    if missing:
        raise ValueError(f"docs/scorecard.md lacks the generated block(s) {sorted(missing)}")
    return out


def expected_doc() -> dict[Path, str]:
    """docs/scorecard.md as the committed baseline renders it ({} outside a checkout)."""
    import json
    base, doc = baseline_path(), doc_path()
    if not base.is_file() or not doc.is_file():
        return {}
    return {doc: render_doc(doc.read_text(encoding="utf-8"), json.loads(base.read_text(encoding="utf-8")))}


# --- terminal ------------------------------------------------------------------------------------------------
def print_card(card: dict, console: Console, faults: bool = True) -> None:
    t = Table(title="Issue 30's bar", title_justify="left")
    for col in ("criterion", "now", "target", ""):
        t.add_column(col)
    for b in card["bar"]:
        t.add_row(Text(b["criterion"]), _n(b["value"]), b["target"],
                  Text("met", style="green") if b["met"] else Text("missed", style="red"))
    console.print(t)
    t = Table(title="Per alert", title_justify="left")
    for col in ("alert", "names", "caught", "held", "detect", "in faults", "/fault", "false", "info"):
        t.add_column(col, justify="left" if col == "alert" else "right")
    for a in card["alerts"]:
        t.add_row(Text(a["alertname"]), str(a["faults_named"]), str(a["caught"]), _pct(a["held"]),
                  f"{_med(a['detect_steps_median'])}/{_n(a['detect_steps_max'])}", str(a["notifications_in_faults"]),
                  _n(a["notifications_per_fault"]), str(a["false_healthy"]), str(a["info_healthy"]))
    console.print(t)
    if faults:
        t = Table(title="Per fault", title_justify="left")
        for col in ("run", "fault", "shape", "steps", "caught by", "detect", "held", "notif."):
            t.add_column(col, justify="right" if col in ("detect", "held", "notif.") else "left")
        for f in card["faults"]:
            t.add_row(Text(f["run"]), f["kind"], f["shape"], f"{f['first_step']}-{f['last_step']}",
                      Text(", ".join(f["caught_by"]) or "missed", style="" if f["caught"] else "red"),
                      _steps(f, short=True), _pct(f["held"]), str(f["notifications"]))
        console.print(t)
    tot = card["totals"]
    console.print(f"{tot['faults']} faults in {tot['runs']} runs; {tot['notifications']} notifications in fault "
                  f"windows ({_n(tot['notifications_per_fault'])} per fault); {tot['false_healthy']} on healthy runs "
                  f"(+{tot['info_healthy']} info)", highlight=False)
