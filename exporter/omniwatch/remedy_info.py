"""Every alert's remedy as each exported run needs it, as series Grafana can read (issue 26 item 1, issue 32):

- ``omniwatch_run_remedy{project, experiment, alertname, severity, cause, role, engine, mode, variant} 1``: for each
  run, each alert (and severity, and the alert label its remedy branches on) the variant of the text it renders for
  that run's layout (``omniwatch_run_info``), trainer config (``omniwatch_trainer_config_setting``) and reward-pool
  break-even;
- ``omniwatch_remedy_info{variant, action, remedy} 1``: each distinct text once (its one-line action and its full
  text, one line), so runs that render the same text share one series;
- ``omniwatch_reward_pool_break_even_gpus{project, experiment}``: the largest dedicated reward pool that still pays
  for the run (:func:`break_even`), which RewardBoundRollout's remedy quotes.

Prometheus keeps an alert's annotations out of PromQL (ALERTS has no annotations), so the overview's "Why slow" row
joins a firing alert to its action through these. The text is rendered as Prometheus renders the annotation
(``Prose.expect`` over the run's modes, its config settings and break-even) from remedy_texts.json, which ``omniwatch
generate`` writes (the exporter imports no rule authoring: docs/architecture.md, Floors); values a remedy
quotes from other live series (the device peak, reward-server latency) are left at the layout default here — the
alert notification carries the run's full text. Rendering is cached per distinct input, so a scrape of many runs of
a few layouts and configs renders each text once.
"""
from __future__ import annotations

import hashlib
import json
import math
from functools import lru_cache
from pathlib import Path

LAYOUT = ("trainer", "reward", "async_mode")
CASE_LABELS = ("cause", "role", "engine", "mode")  # the alert labels a remedy may branch on (remedies.LABEL_CASES)


def break_even(share: float | None, gpus: int | None) -> int | None:
    """The largest P (GPUs) for which a dedicated reward pool next to ``gpus`` trainer GPUs still pays: throughput per
    GPU improves only if reward's share of the step's critical path ``share`` exceeds P / (N + P) (remedies.py, the
    pool break-even), i.e. P < share * N / (1 - share); at most N. None when either is unknown."""
    if share is None or gpus is None or gpus <= 0 or share != share or share < 0:
        return None
    if share >= 1:
        return gpus
    limit = share * gpus / (1 - share)
    return max(0, min(gpus, math.ceil(limit) - 1))


def _run_ctx_key(run) -> tuple:
    modes = tuple(run.modes.get(k, "unknown") for k in LAYOUT)
    cfg = run.config
    settings = None if cfg is None else (tuple(sorted(cfg.settings.items())), tuple(cfg.info_labels().items()))
    return modes, settings, run_break_even(run)


def run_break_even(run) -> int | None:
    st = run.stats
    share = (st.reward_step_share or {}).get("min") if st is not None else None
    gpus = None
    if run.config is not None and run.config.gpus_trainer:
        gpus = run.config.gpus_trainer
    elif run.gpus is not None:
        gpus = run.gpus.count
    return break_even(share, gpus)


def variant(action: str, text: str) -> str:
    return hashlib.blake2b(f"{action}\0{text}".encode(), digest_size=4).hexdigest()


DATA = Path(__file__).with_name("remedy_texts.json")  # written by `omniwatch generate` (alerting/rulegen.py)


@lru_cache(maxsize=1)
def _remedies() -> dict:
    return json.loads(DATA.read_text(encoding="utf-8"))


@lru_cache(maxsize=256)
def rows(key: tuple) -> tuple[tuple[tuple[str, ...], str, str, str], ...]:
    """((alertname, severity, cause, role, engine, mode), variant, action, remedy) of every alert's remedy for one
    run input (layout, config settings, break-even): one row per alert, severity and label case."""
    from . import names as n
    from .prosetext import Ctx, render, setting_series
    modes_t, settings, be = key
    modes = {k: v for k, v in zip(LAYOUT, modes_t) if v != "unknown"} or None
    # the config's settings and its info series as the exporter writes them (a VeOmni run's keys, LoRA unknown
    # without a config), so that the served text is the annotation Prometheus renders
    series = setting_series(dict(settings[0]), dict(settings[1])) if settings is not None else setting_series(None)
    if be is not None:
        series[n.REWARD_POOL_BREAK_EVEN] = float(be)
    out, data = [], _remedies()
    for alert, severity, case, k in data["rows"]:
        ctx = Ctx({"project": "", "experiment": "", **case}, None, series, modes)
        text, act = data["remedies"][k]
        text = " ".join(render(text, ctx).split())
        action = " ".join(render(act, ctx).split()) if act is not None else ""
        out.append(((alert, severity, *(case.get(c, "") for c in CASE_LABELS)), variant(action, text), action, text))
    return tuple(out)


class RemedyCollector:
    def __init__(self, store):
        self.store = store

    def describe(self):
        from . import names as n
        return n.describe((n.REMEDY_INFO, n.RUN_REMEDY, n.REWARD_POOL_BREAK_EVEN))

    def collect(self):
        from . import names as n
        info, per_run, be_fam = n.family(n.REMEDY_INFO), n.family(n.RUN_REMEDY), n.family(n.REWARD_POOL_BREAK_EVEN)
        s = self.store
        with s.lock:
            now = s.clock()
            runs = [((project, experiment), _run_ctx_key(run)) for (project, experiment), run in s.runs.items()
                    if not s.hidden(run, now) and run.last is not None]
        texts: dict[str, tuple[str, str]] = {}
        for (project, experiment), key in runs:
            if key[2] is not None:
                be_fam.add_metric([project, experiment], key[2])
            for ident, var, action, text in rows(key):
                per_run.add_metric([project, experiment, *ident, var], 1)
                texts[var] = (action, text)
        for var, (action, text) in sorted(texts.items()):
            info.add_metric([var, action, text], 1)
        yield info
        yield per_run
        yield be_fam
