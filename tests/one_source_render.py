"""Render every artefact generated from the alert configuration (rule files, dashboards, the remedies
table) from a config in which every number, the exporter's job name and the runbook base differ from their
defaults. Run as a child process by tests/test_one_source.py: by default the sentinel replaces the default
configuration before anything is imported; with ``--explicit`` the defaults stay and the config is only passed
(dashboards are functions of the config: ``dashboard(cfg)``, issue 32 item 5); prints one JSON object.
"""
from __future__ import annotations

import json
import re
import sys

from pydantic import BaseModel

from omniwatch import config as C

DUR = re.compile(r"^(\d+)([smhd])$")
SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def fields(m: BaseModel, pre: str = ""):
    for k in type(m).model_fields:
        v = getattr(m, k)
        if isinstance(v, BaseModel):
            yield from fields(v, pre + k + ".")
        else:
            yield pre + k, v


def sentinel(default: C.Config) -> tuple[C.Config, dict]:
    """Every number (ints, floats, durations) moved to a value no default has: ratios stay in (0, 1)."""
    data = default.model_dump(by_alias=True)
    changed = {}
    defaults = {v for _, v in fields(default) if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
    for i, (path, v) in enumerate(fields(default), start=1):
        if isinstance(v, bool) or path.startswith("selectors.") or path == "runbook_base":
            continue
        if isinstance(v, int):
            new = 40 + 3 * i
        elif isinstance(v, float):
            new = round(v + (1 - v) * 0.0917 + 0.0007 * i, 4) if v < 1 else round(v * 1.0931 + 0.011 * i, 3)
        elif isinstance(v, str) and DUR.match(v):
            num, unit = DUR.match(v).groups()
            new = f"{int(num) * SECONDS[unit] + 7 * i + 3}s"
        else:
            continue
        while isinstance(new, float) and new in defaults | {n for _, n in changed.values()}:
            new = round(new + 0.0003, 4)  # a sentinel equal to another field's default would hide that field
        changed[path] = (v, new)
        d = data
        *head, last = path.split(".")
        for h in head:
            d = d[h]
        d[last if last in d else last.rstrip("_")] = new
    data["selectors"]["job"] = SENTINEL_JOB
    data["runbook_base"] = SENTINEL_RUNBOOKS
    return C.Config.model_validate(data), changed


SENTINEL_JOB = "sentinel-exporter-job"
SENTINEL_RUNBOOKS = "https://runbooks.example/omniwatch"


def main() -> None:
    cfg, changed = sentinel(C.DEFAULT)
    if "--explicit" not in sys.argv:  # else: the defaults stay, and the config is only passed where it is read
        C.DEFAULT = cfg  # before anything that reads the default configuration is imported
    from omniwatch.alerting import rulegen as generate
    from omniwatch.alerting import rulefiles as render
    from omniwatch.alerting import rulespec
    from omniwatch.dashboards.catalog import dashboards
    from omniwatch.dashboards.jsonfiles import rendered
    panels = [{"dashboard": d.uid, "title": p.title, "description": p.full_description(cfg),
               "exprs": [t.expr for t in p.targets], "legends": [t.legend for t in p.targets]}
              for d in dashboards(cfg) for p in d.panels()]
    json.dump({"changed": changed, "job": [C.DEFAULT.selectors.job, SENTINEL_JOB],
               "runbook_base": [C.DEFAULT.runbook_base, SENTINEL_RUNBOOKS],
               "rules": {f.name: render.render_file(f, cfg) for f in rulespec.rule_files(cfg)},
               "dashboards": rendered(config=cfg), "panels": panels,
               "remedies": generate.remedies_table(cfg)}, sys.stdout)


if __name__ == "__main__":
    main()
