"""``omniwatch docs``: generate ``docs/metrics.md`` from the metric catalogue (drift-checked in tests)."""
from __future__ import annotations

import sys
from pathlib import Path

from . import names, paths
from .core.analytics import CONTRACT_KEYS

HEADER = """# Metrics

Generated from `exporter/omniwatch/names.py` by `omniwatch docs` (`make docs`); `make test` fails when
this file is out of date. Every run series carries `project` and `experiment` (verl's
`trainer.project_name` / `trainer.experiment_name`, from the file logger's `<root>/<project>/<experiment>.jsonl`
layout or the push body). Units are base units (seconds, bytes, ratios 0-1); counters end in `_total`; no
sample carries a timestamp.

"""

PASSTHROUGH = """
## verl passthrough (`verl_*`)

Every other numeric key of the step dict is exported as a gauge named `verl_` + the key with `@` replaced
by `_at_` and every character outside `[a-zA-Z0-9_]` replaced by `_` (e.g. `critic/rewards/zero_std_ratio` ->
`verl_critic_rewards_zero_std_ratio`, `val-core/ocr/reward/mean@1` -> `verl_val_core_ocr_reward_mean_at_1`).
The original key is the `key` label, so two keys that map to one name (`a/b_c`, `a_b/c`) stay two series:
the mapping cannot merge keys. Keys already represented by the series above are not repeated:
{contract}. Values hold the last step that carried the key (sparse keys such as `val-*` keep their
last value; absent is not zero). Per run at most `--max-keys` (default 512) keys are exported; keys beyond
the cap are counted in `omniwatch_ingest_errors_total{{reason="cardinality_cap"}}`, never exported.
Likewise at most 64 distinct phases (`timing_s/<name>`, the `phase` label) per run: a timer beyond them is
dropped from its step (its time stays in the untracked rest) and counted (`reason="phase_cap"`).
NaN/Inf (written as `null` by verl's orjson), strings and lists are skipped and counted
(`reason="non_finite"`, `"non_numeric"`).
"""


def render() -> str:
    out = [HEADER, "| metric | type | labels | unit | meaning |", "|---|---|---|---|---|"]
    for m in names.CATALOGUE.values():
        labels = ", ".join(f"`{lab}`" for lab in m.labels) or "-"
        out.append(f"| `{m.name}` | {m.type} | {labels} | {m.unit or '-'} | {m.help.replace('|', '/')} |")
    out.append(PASSTHROUGH.format(contract=", ".join(f"`{k}`" for k in sorted(CONTRACT_KEYS))))
    return "\n".join(out) + "\n"


def docs_path() -> Path:
    return paths.repo_dir() / "docs" / "metrics.md"


def cmd_docs(args) -> int:
    path = docs_path()
    text = render()
    if args.check:
        if not path.exists() or path.read_text() != text:
            print(f"{path} is out of date: run `omniwatch docs` (make docs)", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {path}")
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("docs", help="generate docs/metrics.md from the metric catalogue")
    p.add_argument("--check", action="store_true", help="fail if docs/metrics.md is out of date")
    p.set_defaults(func=cmd_docs)
