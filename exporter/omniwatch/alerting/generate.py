"""``omniwatch rules generate``: render ``alerts/*.rules.yml``, ``alerts/tests/*.test.yml`` and the
threshold table of ``docs/alerts.md`` from the configuration; ``--check`` reports drift (CI)."""
from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel

from .. import paths
from . import config as config_mod
from . import promtests, render, spec
from .config import Config

DOC_BEGIN = "<!-- BEGIN GENERATED: thresholds (omniwatch rules generate) -->"
DOC_END = "<!-- END GENERATED: thresholds -->"


def _fields(model: BaseModel, prefix: str = ""):
    for name, f in type(model).model_fields.items():
        v = getattr(model, name)
        label = f.alias or name
        if isinstance(v, BaseModel):
            yield from _fields(v, f"{prefix}{label}.")
        else:
            yield f"{prefix}{label}", v, f.description or ""


def thresholds_table(cfg: Config) -> str:
    rows = ["| setting | value | why |", "|---|---|---|"]
    for path, v, why in _fields(cfg):
        if path.startswith("selectors.") or path == "runbook_base":
            continue
        rows.append(f"| `{path}` | `{v}` | {why.replace('|', '/')} |")
    return "\n".join([DOC_BEGIN, "", *rows, "", DOC_END])


def outputs(cfg: Config, alerts_dir: Path, docs_file: Path | None) -> dict[Path, str]:
    out = {alerts_dir / f.name: render.render_file(f, cfg) for f in spec.rule_files(cfg)}
    out.update({alerts_dir / "tests" / name: text for name, text in promtests.test_files(cfg).items()})
    if docs_file is not None:
        text = docs_file.read_text()
        a, b = text.find(DOC_BEGIN), text.find(DOC_END)
        if a < 0 or b < 0:
            raise ValueError(f"{docs_file}: generated-section markers missing")
        out[docs_file] = text[:a] + thresholds_table(cfg) + text[b + len(DOC_END):]
    return out


def generate(cfg: Config = config_mod.DEFAULT, alerts_dir: Path | None = None, docs_file: Path | None = None,
             check: bool = False) -> list[Path]:
    """Write (or with ``check`` compare) every generated file; returns the paths that differ."""
    alerts_dir = alerts_dir or paths.alerts_dir()
    drift = []
    for path, text in outputs(cfg, alerts_dir, docs_file).items():
        have = path.read_text() if path.exists() else None
        if have == text:
            continue
        drift.append(path)
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return drift


def cmd_generate(args) -> int:
    try:
        cfg = config_mod.load(args.config)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    custom = args.config is not None or args.out is not None
    alerts_dir = Path(args.out) if args.out else None
    docs = None if custom else paths.repo_dir() / "docs" / "alerts.md"
    if docs is not None and not docs.exists():
        docs = None
    drift = generate(cfg, alerts_dir, docs, check=args.check)
    for p in drift:
        print(("out of date: " if args.check else "wrote ") + str(p))
    if args.check and drift:
        print("generated rule files differ from exporter/omniwatch/alerting/: run `omniwatch rules generate`",
              file=sys.stderr)
        return 1
    if not drift:
        print("rule files, promtool tests and the thresholds table are up to date")
    return 0


def add_arguments(p) -> None:
    p.add_argument("--check", action="store_true", help="only report drift; exit 1 if any")
    p.add_argument("--config", help="YAML overrides of the thresholds (see exporter/omniwatch/alerting/config.py)")
    p.add_argument("--out", help="directory to write the rule files and tests to (default: the repository's alerts/)")
    p.set_defaults(func=cmd_generate)
