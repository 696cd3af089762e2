"""A verl-shaped trainer for the hang scenario (tests/hang_scenario.py): a Ray driver that runs the whole training in one
``TaskRunner.run`` call, as VeRL-Omni's main_diffusion does (``ray.get(runner.run.remote(config))``), and inside it
verl's REAL single controller (RayResourcePool(use_gpu=False), create_colocated_worker_cls, RayWorkerGroup, @register)
with workers named as VeRL-Omni's, logging every step through verl's own ``Tracking`` file logger.

    python tests/hang_driver.py RAY_GCS_ADDRESS MODE PROJECT EXPERIMENT STEPS [RANKS]

(the driver, tests/hang_driver.py, does not import verl: its TaskRunner process imports this module)

MODE: ``finish`` (STEPS steps, then returns: the driver exits 0), ``fail`` (at step STEPS rank 0's update_actor
raises: TaskRunner.run fails, the driver raises), ``hang`` (at step STEPS rank 1's update_actor never returns; ``_hold``).
VERL_FILE_LOGGER_ROOT decides where the JSONL goes (<root>/<project>/<experiment>.jsonl).
"""
from __future__ import annotations

import os
import time

import ray
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, create_colocated_worker_cls

INFER_S, UPDATE_S, WEIGHTS_S = 0.8, 1.2, 0.5
HANG_RANK, FAIL_RANK = 1, 0
FAIL_TEXT = "CUDA error: an illegal memory access was encountered (simulated by tests/hang_trainer.py)"


class ActorRolloutRefWorker(Worker):
    def __init__(self):
        super().__init__()
        self.mode, self.at = "", 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, mode: str, at: int):
        self.mode, self.at = mode, at
        return os.getpid()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def infer_actor_batch(self, step: int):
        time.sleep(INFER_S)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_actor(self, step: int):
        if self.mode == "hang" and step >= self.at and self.rank == HANG_RANK:
            time.sleep(900)   # HANG_LINE: the line a stack dump of the hung rank must show
        if self.mode == "hang" and step >= self.at:
            self._hold()
        if self.mode == "fail" and step >= self.at and self.rank == FAIL_RANK:
            raise RuntimeError(FAIL_TEXT)
        time.sleep(UPDATE_S)
        return self.rank

    def _hold(self, most_s: float = 300.0) -> None:
        """The hung step's other ranks return once OMNIWATCH_HANG_RELEASE exists (the scenario creates it when the
        exporter has seen all four ranks running): a call shorter than the exporter's gap between polls is in no
        poll's answer (discovery/taskevents.py), and a loaded machine stretches that gap (taskwatch.py polls less
        often while Ray answers slowly). Bounded: at most ``most_s``."""
        release = os.environ.get("OMNIWATCH_HANG_RELEASE", "")
        deadline = time.monotonic() + most_s
        while release and not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_weights(self, step: int):
        time.sleep(WEIGHTS_S)
        return self.rank


class TaskRunner:
    """As VeRL-Omni's: the whole training runs in ``run`` (the file logger writes from this process)."""

    def run(self, mode: str, project: str, experiment: str, steps: int, ranks: int = 4) -> int:
        from verl.utils.tracking import Tracking
        pool = RayResourcePool([ranks], use_gpu=False, max_colocate_count=1)
        cls = create_colocated_worker_cls({"actor_rollout": RayClassWithInitArgs(cls=ray.remote(ActorRolloutRefWorker))})
        wg_dict = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=cls, device_name="cpu", use_gpu=False)
        wg = wg_dict.spawn(prefix_set={"actor_rollout"})["actor_rollout"]
        wg.init_model(mode, steps)
        logger = Tracking(project_name=project, experiment_name=experiment, default_backend="file")
        last = steps if mode == "finish" else 10 ** 6
        for step in range(1, last + 1):
            t0 = time.time()
            t = time.time()
            wg.infer_actor_batch(step)
            infer = time.time() - t
            t = time.time()
            wg.update_actor(step)
            update = time.time() - t
            t = time.time()
            wg.update_weights(step)
            weights = time.time() - t
            logger.log({"timing_s/step": time.time() - t0, "timing_s/old_log_prob": infer,
                        "timing_s/update_actor": update, "timing_s/update_weights": weights,
                        "perf/total_num_images": 16}, step=step)
        return last
