"""Device bf16 dense peaks and the MFU cause check.

``VERL_PEAKS_TFLOPS`` mirrors verl's ``verl/utils/flops_counter.py::get_device_flops`` (reference
verl_omni_metrics.md section 5.2), including its match rule: the first key, in *reverse-sorted key
order*, that is a substring of the device name. That rule is why an H200 whose VBIOS reports
``"NVIDIA L20X"`` is divided by the L20's 119.5 TFLOP/s and reports MFU ~8.3x too high.

To tell what the silicon really is when the name lies, the check also looks at the memory NVML
reports: an "L20"-named card with 141 GB is not an L20 (48 GB). ``VERL_OMNI_DEVICE_FLOPS_TFLOPS``
(the trainer's override) wins over both on the trainer side; the exporter can be told the same value.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

# verl get_device_flops, bf16 dense, in TFLOP/s.
VERL_PEAKS_TFLOPS: dict[str, float] = {
    "CPU": 0.448, "GB200": 2500.0, "B200": 2250.0, "MI300X": 1336.0,
    "H100": 989.0, "H800": 989.0, "H200": 989.0, "H20": 148.0,
    "A100": 312.0, "A800": 312.0, "L40S": 362.05, "L40": 181.05, "L20": 119.5, "A40": 149.7,
    "910B": 354.0, "Ascend910": 354.0, "Ascend950DT": 432.0, "RTX 3070 Ti": 21.75,
}
VERL_MATCH_ORDER = tuple(sorted(VERL_PEAKS_TFLOPS, reverse=True))

# Nominal memory (GiB) of the parts each verl key names, for the "does the name fit the card" test.
# Several sizes where a product ships with several.
NOMINAL_MEMORY_GIB: dict[str, tuple[float, ...]] = {
    "H100": (80, 94, 96), "H800": (80,), "H200": (141, 144), "H20": (96, 141), "A100": (40, 80), "A800": (40, 80),
    "L40S": (48,), "L40": (48,), "L20": (48,), "A40": (48,), "B200": (180, 192), "GB200": (186, 192),
}
# Silicon guessed from memory alone, only where the size is unambiguous among data-centre parts.
SILICON_BY_MEMORY: tuple[tuple[float, float, str], ...] = (
    (130.0, 150.0, "H200"),   # H200 SXM/NVL: 141 GB (NVML reports ~140-143 GiB)
    (175.0, 200.0, "B200"),
)
# Names seen on relabeled SKUs (verl docs: "H200 cards reporting as NVIDIA L20X via VBIOS").
RELABELED_NAME = re.compile(r"\bL20X\b|\bL20\s*X\b", re.IGNORECASE)
H200_PEAK = VERL_PEAKS_TFLOPS["H200"]
DEVICE_FLOPS_ENV = "VERL_OMNI_DEVICE_FLOPS_TFLOPS"


def verl_match(name: str) -> tuple[str, float] | None:
    """(key, TFLOP/s) verl's substring match picks for ``name``; None = unknown (verl reports MFU 0)."""
    for key in VERL_MATCH_ORDER:
        if key in name:
            return key, VERL_PEAKS_TFLOPS[key]
    return None


def parse_override(value: str | None) -> float | None:
    """``VERL_OMNI_DEVICE_FLOPS_TFLOPS`` as verl reads it: used only if it parses to a float > 0."""
    try:
        v = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return v if math.isfinite(v) and v > 0 else None


@dataclass(frozen=True)
class Silicon:
    name: str            # NVML device name
    verl_key: str | None  # what verl's substring match hits
    verl_peak: float | None
    silicon: str | None  # what the card really is, as far as name + memory tell
    peak: float | None   # its bf16 dense peak
    relabeled: bool      # name and memory disagree (or a known relabel pattern)


def identify(name: str, memory_total_bytes: int | None = None) -> Silicon:
    m = verl_match(name)
    key, vpeak = m if m else (None, None)
    gib = memory_total_bytes / 2**30 if memory_total_bytes else None
    by_mem = None
    if gib is not None:
        by_mem = next((s for lo, hi, s in SILICON_BY_MEMORY if lo <= gib <= hi), None)
    fits = True
    if key in NOMINAL_MEMORY_GIB and gib is not None:
        fits = any(abs(gib - g) <= 0.08 * g + 2 for g in NOMINAL_MEMORY_GIB[key])
    relabeled = bool(RELABELED_NAME.search(name)) or not fits
    if relabeled and by_mem:
        return Silicon(name, key, vpeak, by_mem, VERL_PEAKS_TFLOPS[by_mem], True)
    if relabeled and RELABELED_NAME.search(name):
        # The documented case; without a memory reading assume the documented silicon.
        return Silicon(name, key, vpeak, "H200", H200_PEAK, True)
    return Silicon(name, key, vpeak, key, vpeak, relabeled)


@dataclass(frozen=True)
class MfuCheck:
    mfu: float
    implied_peak: float | None  # the largest peak the trainer can have divided by (TFLOP/s)
    code: str | None            # relabeled_sku | peak_mismatch | flops_overcount | None (MFU plausible)
    cause: str | None           # one sentence for the MFUImpossible annotation / API


def implied_peak(mfu: float, real_peak: float | None) -> float | None:
    """MFU = achieved / peak_used and achieved <= real_peak, so peak_used <= real_peak / MFU.
    An MFU of 8.3 on an H200 (989) says the trainer divided by at most ~119 TFLOP/s: the L20's peak."""
    if real_peak is None or not mfu or mfu <= 0 or not math.isfinite(mfu):
        return None
    return real_peak / mfu


def check_mfu(mfu: float, sil: Silicon | None, override_tflops: float | None = None) -> MfuCheck:
    """Explain a wrong MFU from what the exporter sees (device name, memory, override). A relabeled card
    or a peak that does not match the silicon is reported whatever the MFU value: an H200 divided by
    the L20's peak reports 8.3x too much even when that is still below 1.0."""
    real = sil.peak if sil else None
    imp = implied_peak(mfu, real)
    if sil is None or not mfu > 0:
        return MfuCheck(mfu, imp, None, None)
    used = override_tflops if override_tflops else sil.verl_peak
    if not mfu > 1.0 and not (used and real and real / used > 1.5):
        return MfuCheck(mfu, imp, None, None)
    if used and real and real / used > 1.5:
        how = (f"{DEVICE_FLOPS_ENV}={used:g}" if override_tflops else
               f"verl's substring match of '{sil.name}' hits '{sil.verl_key}' ({used:g} TFLOP/s)")
        code = "relabeled_sku" if sil.relabeled else "peak_mismatch"
        what = f"the silicon looks like {sil.silicon}" if sil.relabeled else f"the device is a {sil.silicon}"
        return MfuCheck(mfu, imp, code,
                        f"{how}, but {what} ({real:g} TFLOP/s): reported MFU is inflated ~{real / used:.1f}x; "
                        f"set {DEVICE_FLOPS_ENV}={real:g} on the trainer.")
    if imp is not None and real is not None and imp < real / 2:
        return MfuCheck(mfu, imp, "peak_mismatch",
                        f"MFU {mfu:.2f} means the trainer divided by at most {imp:.0f} TFLOP/s, far below the "
                        f"{sil.silicon or sil.name} peak ({real:g}): check {DEVICE_FLOPS_ENV} and the device name the trainer saw.")
    return MfuCheck(mfu, imp, "flops_overcount",
                    f"MFU {mfu:.2f} > 1 with a correct device peak ({real if real else '?'} TFLOP/s): the FLOPs are over-counted "
                    "(seqlens not gathered over DP for a new metadata field, or a forward-pass count that is too high).")
