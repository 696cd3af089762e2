"""A FlowGRPO-shaped training loop on verl's REAL single controller, CPU only: the Ray driver that
tests/raytasks_scenario.py watches through Ray's task events.

    python tests/raytasks_trainer.py RAY_GCS_ADDRESS TRUTH.jsonl COMMANDS_DIR

- ``RayResourcePool([4], use_gpu=False)`` + ``create_colocated_worker_cls({"actor_rollout": ...})`` +
  ``RayWorkerGroup`` + ``spawn`` — exactly how VeRL-Omni's legacy diffusion trainer builds its workers
  (ray_diffusion_trainer.py init_workers), so Ray sees ``WorkerDict.actor_rollout_<method>`` on actors
  named ``<prefix>WorkerDict_0:<rank>``;
- the worker class is named as VeRL-Omni's (``ActorRolloutRefWorker``) and its ``@register``-ed methods
  (ONE_TO_ALL and DP_COMPUTE_PROTO-free ALL_TO_ALL dispatch) sleep like a step's phases: infer_actor_batch,
  update_actor (rank 2 slower: the straggler), update_weights;
- a rollout server replica, a Ray actor named ``vllm_omni_server_0_0`` of class ``vLLMOmniHttpServer``, gets
  concurrent per-request ``generate`` calls (generation);
- every worker call returns its own (rank, start, end); the driver appends them to TRUTH.jsonl.

It obeys files dropped in COMMANDS_DIR: ``hang`` (from the next update_actor on, rank 1's sleeps 600 s),
``hold`` (the replica gets 6 requests that take 600 s), ``kill`` (kill rank 3's actor), ``stop``; a
watcher thread acts on hold / kill while the main thread may be stuck in the hung call.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time

import ray
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, create_colocated_worker_cls

GEN_S, INFER_S, UPDATE_S, SLOW_EXTRA_S, WEIGHTS_S = 2.0, 1.5, 2.5, 4.0, 1.5
SLOW_RANK, HANG_RANK = 2, 1


class ActorRolloutRefWorker(Worker):
    def __init__(self):
        super().__init__()
        self.hang = False

    def _span(self, seconds: float) -> dict:
        t0 = time.time()
        time.sleep(seconds)
        return {"rank": self.rank, "start": t0, "end": time.time(), "pid": os.getpid()}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        return self._span(0.1)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_hang(self, on: bool):
        self.hang = on
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def infer_actor_batch(self, step: int):
        return self._span(INFER_S)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_actor(self, step: int):
        if self.hang and self.rank == HANG_RANK:
            return self._span(600)
        return self._span(UPDATE_S + (SLOW_EXTRA_S if self.rank == SLOW_RANK else 0.0))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=True)
    def update_weights(self, step: int):
        return self._span(WEIGHTS_S)


@ray.remote(num_cpus=0, max_concurrency=32)
class vLLMOmniHttpServer:
    async def generate(self, prompt: int, seconds: float) -> dict:
        t0 = time.time()
        await asyncio.sleep(seconds)
        return {"start": t0, "end": time.time()}


def main(address: str, truth_path: str, cmd_dir: str) -> int:
    ray.init(address=address, namespace="verl_run", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.path.dirname(os.path.abspath(__file__))}})
    pool = RayResourcePool([4], use_gpu=False, max_colocate_count=1)
    cls = create_colocated_worker_cls({"actor_rollout": RayClassWithInitArgs(cls=ray.remote(ActorRolloutRefWorker))})
    wg_dict = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=cls, device_name="cpu", use_gpu=False)
    wg = wg_dict.spawn(prefix_set={"actor_rollout"})["actor_rollout"]
    server = vLLMOmniHttpServer.options(name="vllm_omni_server_0_0").remote()
    wg.init_model()
    out = open(truth_path, "a")

    def record(step: int, phase: str, spans: list[dict]) -> None:
        for s in spans:
            out.write(json.dumps({"step": step, "phase": phase, **s}) + "\n")
        out.flush()

    def watcher() -> None:  # acts while the main thread may be stuck in a hung call
        held = []
        while True:
            cmds = set(os.listdir(cmd_dir))
            if "stop" in cmds:
                return
            if "hold" in cmds:
                os.remove(os.path.join(cmd_dir, "hold"))
                held += [server.generate.remote(i, 600) for i in range(6)]   # the replica holds them
                print(json.dumps({"holding": len(held)}), flush=True)
            if "kill" in cmds:
                os.remove(os.path.join(cmd_dir, "kill"))
                ray.kill(wg.workers[3], no_restart=True)
                print(json.dumps({"killed": wg.worker_names[3]}), flush=True)
            time.sleep(0.2)

    threading.Thread(target=watcher, daemon=True).start()
    step = 0
    print(json.dumps({"ready": True, "workers": wg.worker_names}), flush=True)
    while "stop" not in os.listdir(cmd_dir):
        step += 1
        t0 = time.time()
        gens = ray.get([server.generate.remote(i, GEN_S) for i in range(8)])
        record(step, "generate", [{"rank": -1, **g} for g in gens])
        record(step, "infer_actor_batch", wg.infer_actor_batch(step))
        if "hang" in os.listdir(cmd_dir):
            os.remove(os.path.join(cmd_dir, "hang"))
            wg.set_hang(True)
            print(json.dumps({"hanging_step": step}), flush=True)
        record(step, "update_actor", wg.update_actor(step))
        record(step, "update_weights", wg.update_weights(step))
        print(json.dumps({"step": step, "seconds": round(time.time() - t0, 2)}), flush=True)
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
