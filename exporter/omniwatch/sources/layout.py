"""The run a file belongs to: verl's FileLogger writes ``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl``
(verl/utils/tracking.py), so the parent directory is the project and the name (without its suffix) the
experiment. Shared by the file sources, the planned-work log-writer check, the checkpoint and the backtest.
The labels are :func:`~omniwatch.runlabel.fit_label`'s: control characters stripped, a long name shortened
to a unique 128-character label (:func:`raw_run_labels` gives the names as they are on disk)."""
from __future__ import annotations

from pathlib import Path

from ..runlabel import fit_label


def raw_run_labels(path: str) -> tuple[str, str]:
    p = Path(path)
    name = p.name
    for suffix in (".console.log", ".jsonl", ".log", ".txt"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    return (p.parent.name or "default"), name


def run_labels(path: str) -> tuple[str, str]:
    project, experiment = raw_run_labels(path)
    return fit_label(project), fit_label(experiment)
