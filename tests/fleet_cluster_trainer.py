"""The driver of tests/fleet_cluster_scenario.py: GPU pools and workers placed as verl places them, on a CPU Ray
cluster of two nodes whose raylets declare 3 (fake) GPUs each.

    python tests/fleet_cluster_trainer.py RAY_ADDRESS TRUTH.json STEPS

Placement groups named as verl's ``RayResourcePool.get_placement_groups`` names them (docs/verl-source.md H11):
the trainer's ``global_pool`` over both nodes (2 GPU bundles per node: ``global_poolverl_group_2_2:0`` / ``:1``),
a distillation teacher pool (``teacher_poolverl_group_1:0``) and a standalone rollout replica's pool
(``rollout_pool_0verl_group_1:0``), one GPU each. verl itself cannot reserve GPU bundles on a CPU machine
(``get_placement_groups`` refuses a device the platform does not have), so the driver does what it does with
plain Ray. Four ``WorkerDict`` actors ``fcWorkerDict_<pg>:<bundle>`` (num_gpus=1) run STEPS steps of
compute_log_prob (1 s), update_actor (1.5 s) and update_weights (0.4 s) on every rank at once; each call returns
its rank's node and its own start / end: the truth.
"""
from __future__ import annotations

import json
import os
import sys
import time

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

PHASES = (("compute_log_prob", 1.0), ("update_actor", 1.5), ("update_weights", 0.4))
GAP_S = 0.3


class WorkerDict:
    def _span(self, method: str, seconds: float) -> dict:
        t0 = time.time()
        time.sleep(seconds)
        return {"method": method, "start": t0, "end": time.time(), "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id()}

    def actor_rollout_compute_log_prob(self, s):
        return self._span("compute_log_prob", s)

    def actor_rollout_update_actor(self, s):
        return self._span("update_actor", s)

    def actor_rollout_update_weights(self, s):
        return self._span("update_weights", s)


def main(address: str, truth_path: str, steps: str) -> int:
    ray.init(address=address, namespace="verl_run", log_to_driver=False)
    pgs = [placement_group([{"CPU": 1, "GPU": 1}] * 2, strategy="STRICT_PACK", name=f"global_poolverl_group_2_2:{i}")
           for i in range(2)]
    extra = [placement_group([{"CPU": 1, "GPU": 1}], strategy="STRICT_PACK", name=name)
             for name in ("teacher_poolverl_group_1:0", "rollout_pool_0verl_group_1:0")]
    ray.get([pg.ready() for pg in pgs + extra], timeout=120)
    W = ray.remote(WorkerDict)
    workers = [W.options(name=f"fcWorkerDict_{i}:{b}", num_cpus=0.5, num_gpus=1, scheduling_strategy=
                         PlacementGroupSchedulingStrategy(pgs[i], placement_group_bundle_index=b)).remote()
               for i in range(2) for b in range(2)]
    # Ray stamps an actor's first call running from before the worker runs it (a loaded 2-core host: seconds):
    # a readiness call first, so the timed calls start on a worker that is up
    ray.get([w.__ray_ready__.remote() for w in workers], timeout=120)
    time.sleep(1.0)
    print(json.dumps({"ready": True}), flush=True)
    truth = []
    for step in range(int(steps)):
        for method, sec in PHASES:
            time.sleep(GAP_S)
            for rank, r in enumerate(ray.get([getattr(w, "actor_rollout_" + method).remote(sec) for w in workers])):
                truth.append(dict(r, rank=rank, step=step))
    with open(truth_path, "w") as f:
        json.dump(truth, f)
    print(json.dumps({"done": True}), flush=True)
    time.sleep(600)   # keep the job (and its placement groups) until the scenario is done
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
