"""One colour per phase and ledger bucket, everywhere: the Grafana dashboards (fixed colour overrides on every
panel split by phase or bucket), the PNG previews and the offline report's charts (issue 26 item 10). A phase keeps
its colour whether it is a timed phase (``phase`` label), a ledger bucket (``bucket``) or a GPU phase
(``inter_stage``): the reader learns the colours once.

Colours are hex strings (Grafana's fixed colour mode and Bokeh/matplotlib all take them); the phases come in step
order (phasetable.PHASES), the non-phase buckets after them (ledger.NON_PHASE)."""
from __future__ import annotations

from .core import ledger
from .core.phasetable import METHODS, PHASES

_BUCKET = {p.bucket: p.colour for p in PHASES if p.bucket}  # a phase's own ledger bucket takes its colour
_NON_PHASE = {ledger.VALIDATION: "#bcbd22", ledger.OUTSIDE: "#c7c7c7", ledger.STALLED: "#000000"}
# phases in step order, then the ledger's other buckets, then the GPU sampler's name for the gap between timed phases
PHASE_COLORS: dict[str, str] = {**{p.name: p.colour for p in PHASES}, **{
    b: _BUCKET.get(b) or _NON_PHASE[b] for b in ledger.NON_PHASE}, "inter_stage": _BUCKET[ledger.IDLE]}
# Ray actor methods (worker lanes) that run a step phase take that phase's colour (phasetable.METHODS; issue 32
# item 7: train_batch was drawn in reward's red); the others one neutral colour each.
RAY_METHOD_PHASE = {m.name: m.phase for m in METHODS if m.phase}
RAY_OTHER_METHODS = {m.name: m.colour for m in METHODS if not m.phase}
OTHER = "#e377c2"  # a phase no list knows (a new verl timer)


def color(name: str, default: str = OTHER) -> str:
    """The colour of a phase, ledger bucket or Ray method (the phase it runs; ``default`` for an unknown one)."""
    return PHASE_COLORS.get(RAY_METHOD_PHASE.get(name, name)) or RAY_OTHER_METHODS.get(name, default)
