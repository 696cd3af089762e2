"""What the commands print: a rich progress bar while working (stderr, only on a terminal), and the
backtest's table and per-step timeline (or one JSON object with ``--json``)."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .backtest import BacktestResult
from .backfill import NullProgress

TIMELINE_WIDTH = 80


class RichProgress:
    """The NullProgress hooks drawn as one rich bar per phase."""

    def __init__(self, console: Console):
        self.p = Progress(TextColumn("{task.description:<42}"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), console=console, transient=False)
        self.task = None

    def __enter__(self):
        self.p.__enter__()
        return self

    def __exit__(self, *exc):
        self._finish()
        self.p.__exit__(*exc)

    def _finish(self):
        if self.task is not None:
            t = self.p.tasks[self.task]
            self.p.update(self.task, total=t.total or 1, completed=t.total or 1)

    def phase(self, name: str, total: int | None = None) -> None:
        self._finish()
        self.task = self.p.add_task(name, total=total if total else 1)

    def advance(self, n: int = 1) -> None:
        if self.task is not None:
            self.p.advance(self.task, n)


def progress_for(console: Console, quiet: bool):
    if quiet or not console.is_terminal:
        return NullProgress()
    return RichProgress(console)


def _label_text(labels: dict[str, str]) -> str:
    """Labels beyond the run's own (shown in the header) and the rule's static ones."""
    return ", ".join(f"{k}={v}" for k, v in labels.items()
                     if k not in ("severity", "persistence", "project", "experiment"))


def print_result(res: BacktestResult, console: Console) -> None:
    run = res.run
    console.print(f"[bold]{escape(f'{run.project}/{run.experiment}')}[/]  {escape(run.path)}")
    console.print(f"{res.steps} steps, {len(run.entries)} step lines"
                  + (f", skipped lines: {run.skipped}" if run.skipped else "")
                  + f"; {len(res.evaluated)} alerting rules evaluated at {res.eval_points} timestamps", markup=False)
    if res.alerts:
        table = Table(title="Alerts that would have fired", title_justify="left")
        for col in ("alert", "severity", "first step", "last step", "labels"):
            table.add_column(col, justify="right" if "step" in col else "left")
        for a in res.alerts:
            table.add_row(Text(a.alertname), Text(a.severity), str(a.first_step), str(a.last_step),
                          Text(_label_text(a.labels) or "-"))
        console.print(table)
        print_timeline(res, console)
    else:
        console.print("[green]No alert would have fired.[/]")
    for name, why in sorted(res.as_json()["gaps_only"].items()):
        console.print(f"{name}: {why}", markup=False)
    for name, why in sorted(res.not_evaluated.items()):
        console.print(f"[yellow]not evaluated[/] {escape(name)}: {escape(str(why))}")


def print_timeline(res: BacktestResult, console: Console) -> None:
    """One row per firing label set; columns are steps (bucketed when the run has more than 80)."""
    n = len(res.timeline.steps)
    width = min(TIMELINE_WIDTH, n)
    per = n / width
    steps = res.timeline.steps
    console.print(f"\nTimeline: step {steps[0]} .. {steps[-1]}" + (f" ({per:.1f} step lines per column)" if per > 1 else ""))
    rows: dict[tuple, list[bool]] = {}
    staged = {a.alertname for a in res.alerts if len({b.severity for b in res.alerts if b.alertname == a.alertname}) > 1}
    for a in res.alerts:
        extra = _label_text(a.labels)
        if a.alertname in staged:  # one row per stage (TrainingStalled: info, warning, critical)
            extra = ", ".join(x for x in (a.severity, extra) if x)
        key = (a.alertname, extra)
        cols = rows.setdefault(key, [False] * width)
        for c in range(int(a.first_index / per), min(width - 1, int(a.last_index / per)) + 1):
            cols[c] = True
    name_w = max(len(f"{k[0]} {k[1]}".strip()) for k in rows)
    for (name, extra), cols in rows.items():
        line = Text(f"{(name + ' ' + extra).strip():<{name_w}} ")
        line.append("".join("█" if c else "·" for c in cols), style="red")
        console.print(line)
