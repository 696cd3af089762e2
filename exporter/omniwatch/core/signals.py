"""Every window signal declared once (issue 34 item 1: key, families, reference, citation, its alert); pure data
(imports names only). Derived from SIGNALS: analytics.WINDOW_VALUE_KEYS, WindowStats.signals/.signal_reference,
exposition's OWNED and emit loop, the rules (rulespec.signal_rules), record names, dashboards' THRESHOLD_ALERT."""
from __future__ import annotations

from dataclasses import dataclass

from .. import names as n

@dataclass(frozen=True)
class SignalAlert:
    """Fires when window stat ``fire[0]`` compares ``fire[1]`` with config path ``fire[2]`` (x the run's reference
    when ``of_reference``); held while the window median compares ``hold[0]`` with ``hold[1]``. ``description``
    slots: {run} {value} {k} {threshold} {at_step}; ``remedy``: a remedies.py function's name or (text, action)."""
    name: str
    severity: str
    summary: str
    description: str
    fire: tuple[str, str, str]     # (stat, op, config path)
    hold: tuple[str, str]          # (op, config path): the window median's
    remedy: str | tuple[str, str]
    of_reference: bool = False
    fmt: str = "pct"               # {value}'s prose.FORMATS (and {threshold}'s, as a percentage, when "pct")
    for_: str = "step_for"         # config path of `for:`
    record_comment: str = ""


@dataclass(frozen=True)
class Signal:
    name: str                      # WindowStats.signals key, the state file's name for it
    key: str                       # the verl key a step logs
    family: str                    # the exported min/median/max family (names.py catalogue)
    cite: str                      # where verl logs it
    rule: SignalAlert | None = None  # the alert that thresholds it
    reference: str | None = None   # family of the median over the run's reference steps, when an alert judges by it

    def record(self, stat: str) -> str:
        """The recording rule of one window statistic: project_experiment:<family without _window>:<stat>_k."""
        return f"project_experiment:{self.family.removesuffix('_window')}:{stat}_k"


def signal(name: str, key: str, cite: str, *, family: str | None = None, help: str = "", unit: str = "ratio",
           reference_help: str = "", **kw) -> Signal:
    """Declare a signal; with ``help`` its families join the catalogue (names._m: docs/metrics.md lists them)."""
    if family is None:
        family = n._m(f"omniwatch_{name}_window", "gauge", help, n.R + (n.L_STAT,), unit)
    ref = n._m(f"omniwatch_{name}_reference", "gauge", reference_help, n.R, unit) if reference_help else None
    return Signal(name, key, family, cite, reference=ref, **kw)


ZERO_STD = signal(
    "zero_std", "critic/rewards/zero_std_ratio", "verl_omni_metrics.md (critic/rewards/*); tests/fixtures logs it",
    family=n.ZERO_STD_WINDOW, rule=SignalAlert(
        n.ALERT_REWARD_SATURATION, "warning", "Most GRPO groups get identical rewards; the learning signal is vanishing.",
        "{run}: critic/rewards/zero_std_ratio was at least {value} in every one of the last {k} normal steps "
        "(threshold {threshold}){at_step}. Those groups have zero advantage and do not train the policy.",
        ("min", ">", "reward_saturation.zero_std_ratio"), (">", "reward_saturation.resolve"), "reward_saturation",
        record_comment="Share of GRPO groups whose samples all got the same reward, lowest over the window."))

SIGNALS: tuple[Signal, ...] = (ZERO_STD,)
