"""The Ray driver of tests/hang_trainer.py's runs (tests/hang_scenario.py starts three), without verl:

    python tests/hang_driver.py RAY_GCS_ADDRESS MODE PROJECT EXPERIMENT STEPS [RANKS]

As VeRL-Omni's main_diffusion, the driver only starts a ``TaskRunner`` and waits on ``ray.get(runner.run.remote(...))``;
the whole training runs in that call. The TaskRunner process imports tests/hang_trainer.py (on the job's PYTHONPATH)
and runs its ``TaskRunner.run``: verl's single controller and the workers live there. A process that imports verl
costs ~5.8 s of a core (verl.protocol -> tensordict -> torch._dynamo, transformers; docs/benchmarks.md), and the
driver never needed it. MODE, STEPS, RANKS: tests/hang_trainer.py."""
from __future__ import annotations

import os
import sys

import ray


class TaskRunner:
    """VeRL-Omni's TaskRunner actor: ``run`` is the whole training (tests/hang_trainer.py's)."""

    def run(self, mode: str, project: str, experiment: str, steps: int, ranks: int = 4) -> int:
        import hang_trainer   # tests/ is on the job's PYTHONPATH (runtime_env below)
        return hang_trainer.TaskRunner().run(mode, project, experiment, steps, ranks)


def main(address: str, mode: str, project: str, experiment: str, steps: str, ranks: str = "4") -> int:
    tests = os.path.dirname(os.path.abspath(__file__))
    ray.init(address=address, namespace=f"verl_{experiment}", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": tests,
                                       "VERL_FILE_LOGGER_ROOT": os.environ["VERL_FILE_LOGGER_ROOT"],
                                       "OMNIWATCH_HANG_RELEASE": os.environ.get("OMNIWATCH_HANG_RELEASE", "")}})
    runner = ray.remote(num_cpus=0)(TaskRunner).remote()
    print("driver", os.getpid(), flush=True)
    ray.get(runner.run.remote(mode, project, experiment, int(steps), int(ranks)))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:7]))
