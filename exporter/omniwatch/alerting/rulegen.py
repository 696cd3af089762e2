"""``omniwatch rules generate``: render ``alerts/*.rules.yml`` and the threshold and remedy tables of
``docs/alerts.md`` from the configuration; ``--check`` reports drift (CI). The promtool tests in
``alerts/tests/`` are written by hand (literal expected text) and are not rendered here."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import BaseModel

from .. import names as n, paths, remedy_info
from .. import config as config_mod
from . import rulefiles as render
from . import rulespec
from ..prosetext import Ctx
from .prose import data
from .remedies import STEP_CAUSES
from ..config import Config
from .rule import AlertSpec

DOC_BEGIN = "<!-- BEGIN GENERATED: thresholds (omniwatch rules generate) -->"
DOC_END = "<!-- END GENERATED: thresholds -->"
INDEX_BEGIN = "<!-- BEGIN GENERATED: alert index (omniwatch rules generate) -->"
INDEX_END = "<!-- END GENERATED: alert index -->"
REMEDY_BEGIN = "<!-- BEGIN GENERATED: remedies (omniwatch rules generate) -->"
REMEDY_END = "<!-- END GENERATED: remedies -->"
CONFIG_BEGIN = "<!-- BEGIN GENERATED: remedies from the run's config (omniwatch rules generate) -->"
CONFIG_END = "<!-- END GENERATED: remedies from the run's config -->"
# Trainer configs a real Hydra app rendered from VeRL-Omni's example scripts (tests/fixtures/trainer_config/README):
# what each remedy's one-line action says for them (issue 32 item 3), with the layout each example runs.
CONFIG_EXAMPLES = [  # (fixture, what it is, omniwatch_run_info labels)
    ("finished_on_cadence.pprint.log", "legacy LoRA 64, both offloads on, colocated reward model",
     {"trainer": "legacy", "reward": "colocated", "async_mode": "sync"}),
    ("reward_server.pprint.log", "legacy full weights, both offloads on, a reward function (HTTP scorer)",
     {"trainer": "legacy", "reward": "streamed", "async_mode": "sync"}),
    ("veomni_offload.pprint.log", "legacy VeOmni engine, both offloads on, colocated reward model",
     {"trainer": "legacy", "reward": "colocated", "async_mode": "sync"}),
    ("v1_sync_reward_pool.pprint.log", "V1 sync LoRA 32, nothing offloaded, reward-model pool",
     {"trainer": "v1", "reward": "streamed", "async_mode": "sync"}),
    ("v1_separate_async.pprint.log", "V1 separate_async LoRA 32, nothing offloaded, nccl checkpoint engine",
     {"trainer": "v1", "reward": "streamed", "async_mode": "separate_async"}),
]
LAYOUTS = [  # (label, omniwatch_run_info labels); None = the run has no info series yet
    ("legacy, colocated reward model", {"trainer": "legacy", "reward": "colocated", "async_mode": "sync"}),
    ("legacy, streamed reward (pool or function)", {"trainer": "legacy", "reward": "streamed", "async_mode": "sync"}),
    ("V1 sync, colocated reward model", {"trainer": "v1", "reward": "colocated", "async_mode": "sync"}),
    ("V1 sync, streamed reward", {"trainer": "v1", "reward": "streamed", "async_mode": "sync"}),
    ("V1 separate_async", {"trainer": "v1", "reward": "streamed", "async_mode": "separate_async"}),
    ("layout not known yet", None),
]


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


def index_table(cfg: Config) -> str:
    """One row per alerting rule, from the rules themselves: a new alert is listed (with its rule file, severity,
    ``for:``, summary and runbook) without a hand-written row; why its numbers are what they are is the config
    field's description (the thresholds table below)."""
    rows = ["| Alert | Severity | `for:` | Rule file | Summary |", "|---|---|---|---|---|"]
    for f in rulespec.rule_files(cfg):
        for g in f.groups:
            for a in g.rules:
                if isinstance(a, AlertSpec):
                    summary = a.summary.replace("|", "/")
                    row = (f"| [`{a.name}`](runbooks.md#{a.name.lower()}) | {a.severity} | {a.for_ or '—'} | "
                           f"`{f.name}` ({g.name}) | {summary} |")
                    if row not in rows:  # one row per alert and text (InterStageIdleGPU's evidence rules)
                        rows.append(row)
    return "\n".join([INDEX_BEGIN, "", *rows, "", INDEX_END])


# Alerts whose remedy branches on one of their own labels: (label, its values).
BY_LABEL = {n.ALERT_STEP_REGRESSION: ("cause", tuple(STEP_CAUSES)),
            n.ALERT_RS_REJECTION: ("mode", ("bypass", "decoupled")),
            n.ALERT_ROLLOUT_SATURATED: ("role", ("rollout", "reward"))}


def _action(a, ctx: Ctx) -> str:
    act = getattr(a.remedy, "action", None)
    return act.expect(ctx) if act is not None else ""


def remedies_table(cfg: Config) -> str:
    """Each alert's remedy and its one-line action as they render for each layout with no trainer config read
    (identical texts merged), from remedies.py. An alert whose severities carry different remedies (TrainingStalled,
    TransferQueueBacklog) gets one entry per remedy."""
    out = [REMEDY_BEGIN, ""]
    remedies: dict[str, dict[str, list[str]]] = {}  # alert -> remedy template -> severities
    first: dict[tuple[str, str], object] = {}
    for a in rulespec.alerts(cfg):
        if a.remedy is not None:
            remedies.setdefault(a.name, {}).setdefault(a.remedy.go(), []).append(a.severity)
            first.setdefault((a.name, a.remedy.go()), a)
    for name, by_template in remedies.items():
        for template, severities in by_template.items():
            a = first[(name, template)]
            label_name, label_values = BY_LABEL.get(name, ("cause", ("other",)))
            by_text: dict[str, list[str]] = {}
            for value in label_values:
                labels = {"project": "<project>", "experiment": "<experiment>", "role": "actor", "cause": "other",
                          label_name: value}
                texts = []
                for label, modes in LAYOUTS:
                    ctx = Ctx(labels, 1.0, {}, modes)
                    texts.append((label, f"**Do:** {_action(a, ctx)}. {a.remedy.expect(ctx)}"))
                layout_free = len({t for _, t in texts}) == 1
                for label, text in texts:
                    if name in BY_LABEL:
                        key = f"{label_name}={value}" if layout_free else f"{label_name}={value}, {label}"
                    else:
                        key = label
                    if key not in by_text.setdefault(text, []):
                        by_text[text].append(key)
            out.append(f"**{name}**" + (f" ({', '.join(severities)})" if len(by_template) > 1 else ""))
            out.append("")
            if len(by_text) == 1:
                out.append(f"- any layout: {next(iter(by_text))}")
            else:
                for text, layouts in by_text.items():
                    out.append(f"- {'; '.join(layouts)}: {text}")
            out.append("")
    out.append(REMEDY_END)
    return "\n".join(out)


def config_table(cfg: Config, fixtures: Path) -> str:
    """What each alert's one-line action says for trainer configs rendered from VeRL-Omni's examples (and with none):
    a config-aware action never proposes a setting the config already has and quotes the run's own values."""
    from .. import trainer_config as tc
    from ..prosetext import setting_series
    examples = [(what, tc.read_file(str(fixtures / f)).settings, modes) for f, what, modes in CONFIG_EXAMPLES]
    head = "| alert | " + " | ".join(["no config read (legacy, colocated)"] + [w for w, _, _ in examples]) + " |"
    rows = [CONFIG_BEGIN, "", head, "|" + "---|" * (2 + len(examples))]
    seen = set()
    for a in rulespec.alerts(cfg):
        if a.remedy is None or (a.name, a.severity) in seen:
            continue
        seen.add((a.name, a.severity))
        label_name, label_values = BY_LABEL.get(a.name, ("cause", ("other",)))
        for value in label_values:
            labels = {"project": "p", "experiment": "e", "role": "actor", "cause": "other", label_name: value}
            cells = [_action(a, Ctx(labels, 1.0, {}, examples[0][2]))]
            cells += [_action(a, Ctx(labels, 1.0, setting_series(st), modes)) for _, st, modes in examples]
            bare = [_action(a, Ctx(labels, 1.0, {}, modes)) for _, _, modes in examples]
            if bare == cells[1:]:
                continue  # the config changes nothing for this alert (only the layout does: the table above)
            what = a.name + (f" ({label_name}={value})" if a.name in BY_LABEL else "") + \
                (f" ({a.severity})" if a.name == n.ALERT_STALLED else "")
            rows.append(f"| {what} | " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join([*rows, "", CONFIG_END])


def _replace_section(text: str, begin: str, end: str, body: str, where: Path) -> str:
    a, b = text.find(begin), text.find(end)
    if a < 0 or b < 0:
        raise ValueError(f"{where}: generated-section markers {begin!r} missing")
    return text[:a] + body + text[b + len(end):]


def outputs(cfg: Config, alerts_dir: Path, docs_file: Path | None) -> dict[Path, str]:
    out = {alerts_dir / f.name: render.render_file(f, cfg) for f in rulespec.rule_files(cfg)}
    if docs_file is not None:
        text = _replace_section(docs_file.read_text(), DOC_BEGIN, DOC_END, thresholds_table(cfg), docs_file)
        text = _replace_section(text, INDEX_BEGIN, INDEX_END, index_table(cfg), docs_file)
        text = _replace_section(text, REMEDY_BEGIN, REMEDY_END, remedies_table(cfg), docs_file)
        fixtures = paths.repo_dir() / "tests" / "fixtures" / "trainer_config"
        if CONFIG_BEGIN in text and fixtures.is_dir():
            text = _replace_section(text, CONFIG_BEGIN, CONFIG_END, config_table(cfg, fixtures), docs_file)
        out[docs_file] = text
        out[remedy_info.DATA] = remedy_data(cfg)  # the repository's generation (not a --config/--out render)
    return out


def remedy_data(cfg: Config) -> str:
    """remedy_texts.json, the remedies the exporter serves (remedy_info.py): ``rows`` [alert, severity, label case,
    index], one per alert, severity and case, and ``remedies``, each [text, action] once as prose data."""
    from .remedies import LABEL_CASES
    rows, remedies, seen = [], {}, set()
    for a in (a for a in rulespec.alerts(cfg) if a.remedy is not None):
        act = getattr(a.remedy, "action", None)
        pair = json.dumps([data(a.remedy), None if act is None else data(act)], sort_keys=True)
        for case in ({},) + LABEL_CASES.get(a.name, ()):
            ident = (a.name, a.severity, *(case.get(k, "") for k in remedy_info.CASE_LABELS))
            if ident not in seen:
                seen.add(ident)
                rows.append(json.dumps([a.name, a.severity, dict(case), remedies.setdefault(pair, len(remedies))]))
    return "{\"rows\": [\n" + ",\n".join(rows) + "\n],\n\"remedies\": [\n" + ",\n".join(remedies) + "\n]}\n"


def generate(cfg: Config = config_mod.DEFAULT, alerts_dir: Path | None = None, docs_file: Path | None = None,
             check: bool = False) -> list[Path]:
    """Write (or with ``check`` compare) every generated file; returns the paths that differ."""
    return paths.sync(outputs(cfg, alerts_dir or paths.alerts_dir(), docs_file), check)


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
        print("rule files and the thresholds table are up to date")
    return 0


def add_arguments(p) -> None:
    p.add_argument("--check", action="store_true", help="only report drift; exit 1 if any")
    p.add_argument("--config", help="YAML overrides of the thresholds (see exporter/omniwatch/config.py)")
    p.add_argument("--out", help="directory to write the rule files to (default: the repository's alerts/)")
    p.set_defaults(func=cmd_generate)
