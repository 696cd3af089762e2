"""The run's GPU pools from Ray's placement groups, for a run whose trainer config was not read (issue 33 item 4).

verl reserves every GPU pool as placement groups with GPU bundles, named after the pool
(docs/verl-source.md H11): ``RayResourcePool.get_placement_groups`` names them
``<pool name>verl_group_<process counts>:<index>`` where the pool name is the ``resource_pool_spec`` key --
``global_pool`` (the trainer's: actor, rollout, ref, critic), ``reward_pool``, ``teacher_pool`` -- and a standalone
rollout / reward / teacher replica (``RolloutReplica.init_standalone``) makes its own pool
``rollout_pool_<rank>``, ``rollout_pool_reward_<rank>``, ``rollout_pool_teacher_<rank>``. Each bundle reserves
one GPU (``{"CPU": max_colocate_count, "GPU": 1}``).

``pools(rows)`` sums the GPUs of the alive (``CREATED``) placement groups of ``GET /api/v0/placement_groups``
(detail) by pool: ``trainer``, ``reward``, ``rollout``, ``teacher``, ``other`` (GPU bundles of a placement group
verl did not name). The poller reads the table at most every ``REFRESH_S`` (taskwatch.py).
"""
from __future__ import annotations

import re

REFRESH_S = 60.0
OWED_S = 5.0      # after new worker actors appeared: their pools were just reserved (at most this often)
MAX_GROUPS = 4096
_RULES = ((re.compile(r"^rollout_pool_reward_"), "reward"), (re.compile(r"^rollout_pool_teacher_"), "teacher"),
          (re.compile(r"^rollout_pool_"), "rollout"), (re.compile(r"^global_pool"), "trainer"),
          (re.compile(r"^reward_pool"), "reward"), (re.compile(r"^teacher_pool"), "teacher"))


def pool_of(name: str) -> str:
    for rx, pool in _RULES:
        if rx.match(name or ""):
            return pool
    return "other"


def _gpus(bundle) -> float:
    if not isinstance(bundle, dict):
        return 0.0
    res = bundle.get("unit_resources") or bundle.get("resources") or {}
    v = res.get("GPU") if isinstance(res, dict) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 64 else 0.0


def pools(rows: list[dict]) -> dict[str, int]:
    """Placement-group rows (Ray's state API, detail) -> GPUs per pool (pools without GPUs left out)."""
    out: dict[str, float] = {}
    for r in rows[:MAX_GROUPS]:
        if not isinstance(r, dict) or str(r.get("state") or "") not in ("CREATED", "RESCHEDULING"):
            continue
        bundles = r.get("bundles") or []
        g = sum(_gpus(b) for b in bundles) if isinstance(bundles, list) else 0.0
        if g > 0:
            p = pool_of(str(r.get("name") or ""))
            out[p] = out.get(p, 0.0) + g
    return {p: int(round(v)) for p, v in out.items() if round(v) > 0}
