"""Where the repository's rule files, Alertmanager config and dashboards are: the checkout next to
this package (editable install, the normal case) or the copy packaged into the wheel."""
from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def repo_dir() -> Path:
    """The source checkout this package lives in (editable install); the home of docs/ and deploy/."""
    return _PKG.parents[1]


def _data_dir(name: str) -> Path:
    repo = repo_dir() / name
    if repo.is_dir():
        return repo
    return _PKG / "_data" / name


def alerts_dir() -> Path:
    return _data_dir("alerts")


def dashboards_dir() -> Path:
    return _data_dir("dashboards")


def docs_file(name: str) -> Path:
    """A page of docs/ (the runbooks the exporter serves): the checkout's, else the packaged copy."""
    repo = repo_dir() / "docs" / name
    return repo if repo.is_file() else _PKG / "_data" / "docs" / name


def sync(files: dict[Path, str], check: bool) -> list[Path]:
    """Write (or with ``check`` only compare) ``files``; returns the paths whose text differs."""
    drift = []
    for path, text in files.items():
        have = path.read_text(encoding="utf-8") if path.is_file() else None
        if have == text:
            continue
        drift.append(path)
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    return drift
