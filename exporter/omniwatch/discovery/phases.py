"""Ray task name + actor name -> (role, phase, rank / replica): what a verl / VeRL-Omni worker call *is*.

Pure (no Ray import); every rule below is checked in verl / VeRL-Omni source (docs/verl-source.md §R):

- Colocated roles (``create_colocated_worker_cls``, the legacy diffusion trainer and V1 both use it) live in
  one actor class ``WorkerDict``; ``_bind_workers_method_to_parent`` binds each role's ``@register``-ed
  method as ``<role>_<method>`` (``actor_rollout_update_actor``), except ``DIRECT_ROLLOUT_METHOD``s of a
  role containing "rollout", bound without prefix. Ray names the task ``WorkerDict.<bound name>``.
- Role keys are ``str(Role.X)``: actor, rollout, actor_rollout, critic, ref, rm, actor_rollout_ref
  (verl ``trainer/ppo/utils.py``); the longest matching prefix wins (``actor_rollout_ref_`` before
  ``actor_rollout_``).
- A worker group that is not colocated keeps its class name (``ActorRolloutRefWorker.update_actor``).
- Fused workers (``create_colocated_worker_cls_fused``) are one class ``FusedWorker_<role>_<role>…`` and
  every non-own method goes through ``_fuw_execute("<role>_fwmn_<method>", …)``: the method name is an
  *argument*, which Ray's task events do not record, so those calls map to (the fused roles, ``other``).
- Worker actors are named ``<name_prefix><Class>_<pg_idx>:<local_rank>``, created in rank order over the
  placement groups (sorted by node IP): rank = the worker's position in that (pg_idx, local_rank) order
  within its name prefix — computed by :func:`ranks`.
- Rollout / reward-model servers are actors ``<engine>_server_[reward_|teacher_]<replica>_<node_rank>``
  (verl ``vllm_``, ``sglang_``; VeRL-Omni ``vllm_omni_``); the per-request method is ``generate``.
- Agent-loop workers (``AgentLoopWorker`` / VeRL-Omni's ``DiffusionAgentLoopWorker[TQ]``) run
  ``generate_sequences``; reward-loop workers (``RewardLoopWorker``) ``compute_score[_batch|_disrm]``.

Anything else keeps role / phase ``other`` (bounded cardinality: both come from the fixed sets below).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..core.phasetable import METHODS

# str(Role.X) for every verl Role (verl/trainer/ppo/utils.py Role._get_role_string)
ROLES = ("actor_rollout_ref", "actor_rollout", "actor", "rollout", "critic", "ref", "rm", "env")
# Exported roles: the worker-group roles above plus the fleets outside the worker groups.
FLEET_ROLES = ("rollout_server", "reward_server", "teacher_server", "agent_loop", "reward_loop", "fused", "driver")
ALL_ROLES = ROLES + FLEET_ROLES + ("other",)

# Method names seen in verl / VeRL-Omni workers (phasetable.METHODS, each cited in docs/verl-source.md §R); the
# phase label is the method name itself when it is one of these, else "other".
PHASES = (*(m.name for m in METHODS), "other")
_PHASE_SET = frozenset(PHASES)

WORKER_NAME = re.compile(r"^(?P<prefix>.*?)(?P<cls>[A-Za-z_][A-Za-z0-9_]*)_(?P<pg>\d+):(?P<local>\d+)$")
# verl names its agent-loop and reward-loop workers by index (AgentLoopManager._init_agent_loop_workers:
# f"agent_loop_worker_{i}_{uuid4().hex[:8]}"; RewardLoopManager._init_reward_loop_workers: f"reward_loop_worker_{i}";
# VeRL-Omni reuses both): the index is the worker's lane (docs/verl-source.md R16)
LOOP_NAME = re.compile(r"^(?P<kind>agent_loop|reward_loop)_worker_(?P<i>\d+)(?:_[0-9a-f]+)?$")

# Actor names are the trainer's (or anyone's on the cluster): WORKER_NAME backtracks from every position of a
# long name while holding the GIL (a 64k-character name froze every scrape, issue 35 item 2), so a name is
# length-checked first. verl's worker names are ``<name_prefix><Class>_<pg>:<rank>``: tens of characters.
MAX_WORKER_NAME = 256


def worker_name(name: str | None) -> re.Match | None:
    """WORKER_NAME's match of an actor name, or None (a name longer than MAX_WORKER_NAME is no verl worker)."""
    if not name or len(name) > MAX_WORKER_NAME:
        return None
    return WORKER_NAME.match(name)


SERVER_NAME = re.compile(r"^(?P<engine>vllm_omni|vllm|sglang|trtllm)_server_(?P<kind>reward_|teacher_)?"
                         r"(?P<replica>\d+)(?:_(?P<node>\d+))?(?:_.*)?$")
AGENT_LOOP_CLASSES = ("AgentLoopWorker", "DiffusionAgentLoopWorker", "DiffusionAgentLoopWorkerTQ",
                      "CompositeAgentLoopWorker")
REWARD_LOOP_CLASSES = ("RewardLoopWorker",)
SERVER_CLASSES = ("vLLMHttpServer", "vLLMOmniHttpServer", "SGLangHttpServer")
# The actor the whole training runs in: ``ray.get(runner.run.remote(config))`` (verl main_ppo TaskRunner /
# TaskRunnerV1, VeRL-Omni main_diffusion TaskRunner, DiffusionTaskRunnerV1; docs/verl-source.md R13). Its ``run``
# call lasts the whole run, so it never holds a step: role ``driver``, left out of dispatches and the holder.
DRIVER_CLASSES = ("TaskRunner", "TaskRunnerV1", "DiffusionTaskRunnerV1")


@dataclass(frozen=True)
class Call:
    role: str
    phase: str
    method: str          # the raw method name (not exported as a label; shown by `omniwatch ps`)
    group: str = ""      # worker group key (name prefix + class) or server name; not a label
    replica: str = ""    # rollout / reward server replica


def _phase(method: str) -> str:
    return method if method in _PHASE_SET else "other"


def split_task_name(name: str) -> tuple[str, str]:
    """``WorkerDict.actor_rollout_update_actor`` -> (``WorkerDict``, ``actor_rollout_update_actor``)."""
    cls, _, method = (name or "").rpartition(".")
    return cls, method


def classify(task_name: str, actor_name: str = "", actor_class: str = "") -> Call:
    """One task (an actor method call) -> its role and phase; never raises."""
    cls, method = split_task_name(task_name)
    cls = cls or actor_class or ""
    group = ""
    m = worker_name(actor_name)
    if m:
        group = m["prefix"] + m["cls"]
    s = SERVER_NAME.match(actor_name or "") if len(actor_name or "") <= MAX_WORKER_NAME else None
    if s:
        role = {"reward_": "reward_server", "teacher_": "teacher_server"}.get(s["kind"] or "", "rollout_server")
        return Call(role, _phase(method), method, actor_name, s["replica"])
    if cls in DRIVER_CLASSES:
        return Call("driver", "other", method, actor_name)
    if cls in SERVER_CLASSES:
        return Call("rollout_server", _phase(method), method, actor_name)
    if cls in AGENT_LOOP_CLASSES:
        return Call("agent_loop", _phase(method), method, actor_name)
    if cls in REWARD_LOOP_CLASSES:
        return Call("reward_loop", _phase(method), method, actor_name)
    if cls.startswith("FusedWorker"):
        if method == "_fuw_execute":   # the real method is an argument Ray does not record
            return Call("fused", "other", method, group)
    if cls == "WorkerDict" or cls.startswith("FusedWorker"):
        for role in ROLES:
            if method.startswith(role + "_"):
                return Call(role, _phase(method[len(role) + 1:]), method[len(role) + 1:], group)
        # DIRECT_ROLLOUT_METHOD: bound without prefix (only for a role containing "rollout")
        return Call("rollout" if method in _PHASE_SET else "other", _phase(method), method, group)
    if cls.endswith("Worker") and method in _PHASE_SET:  # a worker group that is not colocated
        role = {"ActorRolloutRefWorker": "actor_rollout_ref", "ActorRolloutWorker": "actor_rollout",
                "CriticWorker": "critic", "RewardModelWorker": "rm", "TrainingWorker": "actor"}.get(cls, "other")
        return Call(role, method, method, group)
    return Call("other", "other", method, group)


def ranks(actor_names: list[str]) -> dict[str, int]:
    """Worker actor name -> rank within its worker group: verl creates the workers of a group in
    (pg_idx, local_rank) order and counts rank up by one for each (RayWorkerGroup._init_with_resource_pool)."""
    groups: dict[str, list[tuple[int, int, str]]] = {}
    for name in actor_names:
        m = worker_name(name)
        if m:
            groups.setdefault(m["prefix"] + m["cls"], []).append((int(m["pg"]), int(m["local"]), name))
    out: dict[str, int] = {}
    for members in groups.values():
        for rank, (_, _, name) in enumerate(sorted(members)):
            out[name] = rank
    for name in actor_names:  # agent-loop and reward-loop workers: their index
        m = LOOP_NAME.match(name or "")
        if m:
            out[name] = int(m["i"])
    return out
