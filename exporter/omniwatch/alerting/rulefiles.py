"""Rule files as YAML text people read: comments kept, expressions as literal blocks, one line per
annotation. The text is checked to load back to exactly the data it was rendered from."""
from __future__ import annotations

import yaml

from ..config import Config
from .prose import STEP, Remedy
from .rule import AlertSpec, Record, RuleFile
from ..yamlio import load as yaml_load


def _scalar(value: str, indent: int) -> str:
    if "\n" in value:
        pad = " " * indent
        body = "\n".join((pad + line) if line else "" for line in value.rstrip("\n").split("\n"))
        return "|-\n" + body if not value.endswith("\n") else "|\n" + body
    text = yaml.safe_dump(value, width=10**9, allow_unicode=True, default_flow_style=True)
    return text[:-5] if text.endswith("\n...\n") else text.rstrip("\n")


def _comment(text: str, pad: str) -> list[str]:
    return [f"{pad}# {line}".rstrip() for line in text.split("\n")] if text else []


def annotations(alert: AlertSpec, cfg: Config) -> dict[str, str]:
    out = {"summary": alert.summary, "description": alert.description.go()}
    if alert.step:
        out["step"] = STEP.go()
    if alert.remedy is not None:
        out["remedy"] = alert.remedy.go()
        if isinstance(alert.remedy, Remedy) and alert.remedy.action.parts:
            out["action"] = alert.remedy.action.go()  # the one line shown first (issue 32 item 2)
    out["runbook_url"] = cfg.runbook_url(alert.name)
    return out


def rule_dict(rule, cfg: Config) -> dict:
    if isinstance(rule, Record):
        d = {"record": rule.record, "expr": rule.expr}
        if rule.labels:
            d["labels"] = dict(rule.labels)
        return d
    d = {"alert": rule.name, "expr": rule.expr}
    if rule.for_:
        d["for"] = rule.for_
    d["labels"] = rule.all_labels()
    d["annotations"] = annotations(rule, cfg)
    return d


def file_dict(f: RuleFile, cfg: Config) -> dict:
    return {"groups": [{"name": g.name, "rules": [rule_dict(r, cfg) for r in g.rules]} for g in f.groups]}


def _rule_lines(rule, cfg: Config) -> list[str]:
    pad = " " * 6
    d = rule_dict(rule, cfg)
    lines = _comment(rule.comment, pad)
    first = True
    for k, v in d.items():
        lead = pad + ("- " if first else "  ")
        first = False
        if isinstance(v, dict):
            lines.append(f"{lead}{k}:")
            for kk, vv in v.items():
                lines.append(f"{pad}    {kk}: {_scalar(str(vv), len(pad) + 6)}")
        else:
            lines.append(f"{lead}{k}: {_scalar(str(v), len(pad) + 4)}")
    return lines


def render_file(f: RuleFile, cfg: Config) -> str:
    lines = _comment(f.header.rstrip("\n"), "") + ["", "groups:"]
    for g in f.groups:
        lines.append("  # " + "-" * 96)
        lines += _comment(g.comment, "  ")
        lines += [f"  - name: {g.name}", "    rules:"]
        for r in g.rules:
            lines += _rule_lines(r, cfg)
        lines.append("")
    text = "\n".join(lines).rstrip("\n") + "\n"
    if yaml_load(text) != file_dict(f, cfg):
        raise AssertionError(f"{f.name}: rendered YAML does not load back to its rules")
    return text
