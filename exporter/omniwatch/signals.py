"""Every window signal, declared once (issue 34 item 1): the verl key, the exported family, the window statistics,
whether the run's reference of it is kept, the citation, and the alert that thresholds it with the config paths it
reads. Pure data on the ground floor (imports names only). Derived from SIGNALS: analytics.WINDOW_VALUE_KEYS and
WindowStats.signals / .signal_reference, exposition's OWNED and emit loop, the recording-rule names (Signal.record)
and dashboards' THRESHOLD_ALERT. A new signal's family is registered here (``help=``) rather than in names.py."""
from __future__ import annotations

from dataclasses import dataclass

from . import names as n

STATS = ("min", "median", "max")


@dataclass(frozen=True)
class Signal:
    name: str                      # WindowStats.signals key, the state file's name for it
    key: str                       # the verl key a step logs
    family: str                    # the exported min/median/max family (names.py catalogue)
    cite: str                      # where verl logs it (docs/verl-source.md)
    alert: str | None = None       # the alert that thresholds it
    thresholds: tuple[str, ...] = ()  # config paths ("section.field") the alert thresholds: dashboards draw them
    reference: str | None = None   # family of the median over the run's reference steps, when an alert judges by it
    stats: tuple[str, ...] = STATS

    def record(self, stat: str) -> str:
        """The recording rule of one window statistic: project_experiment:<family without _window>:<stat>_k."""
        base = self.family.removesuffix("_window")
        return f"project_experiment:{base}:{stat}_k"


def signal(name: str, key: str, cite: str, *, family: str | None = None, help: str = "", unit: str = "ratio",
           reference_help: str = "", **kw) -> Signal:
    """Declare a signal; with ``help`` its families join the catalogue (names._m: docs/metrics.md lists them)."""
    if family is None:
        family = n._m(f"omniwatch_{name}_window", "gauge", help, n.R + (n.L_STAT,), unit)
    ref = n._m(f"omniwatch_{name}_reference", "gauge", reference_help, n.R, unit) if reference_help else None
    return Signal(name, key, family, cite, reference=ref, **kw)


ZERO_STD = signal("zero_std", "critic/rewards/zero_std_ratio", "verl_omni_metrics.md (critic/rewards/*); tests/fixtures logs it",
                  family=n.ZERO_STD_WINDOW, alert=n.ALERT_REWARD_SATURATION,
                  thresholds=("reward_saturation.zero_std_ratio",))

SIGNALS: tuple[Signal, ...] = (ZERO_STD,)
