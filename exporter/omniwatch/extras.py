"""Optional extras a head node needs, said where people look (``omniwatch up`` and ``status``): a GPU here
without ``nvidia-ml-py`` means no GPU sampling, a Ray cluster here without ``ray`` means no discovery and
no node agents — each otherwise only one line in the exporter's log. Each hint is the exact command that
installs what is missing into the Python that runs omniwatch (Ray pinned to the cluster's version when it
can be read from the ``ray`` on PATH, since a Ray client must match its cluster).

Detection reads files and PATH only (no import of ray or pynvml, no subprocess): ``nvidia-smi`` on PATH
or the NVIDIA driver's ``/proc/driver/nvidia/version``; ``RAY_ADDRESS`` set or Ray's head-node files
(``/tmp/ray/ray_current_cluster``)."""
from __future__ import annotations

import glob
import shutil
import sys
from pathlib import Path

from .settings import env

# the extras of pyproject.toml ([project.optional-dependencies]; tests/test_extras.py checks they agree)
GPU_REQUIREMENT = "nvidia-ml-py>=12.535"
RAY_REQUIREMENT = "ray[default]>=2.40"
NVIDIA_DRIVER = "/proc/driver/nvidia/version"
RAY_TEMP = "/tmp/ray"


def gpu_here() -> str | None:
    """What shows an NVIDIA GPU here, or None."""
    if Path(NVIDIA_DRIVER).exists():
        return "NVIDIA driver loaded"
    if shutil.which("nvidia-smi"):
        return "nvidia-smi on PATH"
    return None


def ray_here() -> str | None:
    """What shows a Ray cluster here, or None."""
    if env("RAY_ADDRESS"):
        return "RAY_ADDRESS set"
    if Path(RAY_TEMP, "ray_current_cluster").exists():  # written by `ray start --head`, removed by `ray stop`
        return f"a Ray head runs here ({RAY_TEMP}/ray_current_cluster)"
    return None


def cluster_ray_version() -> str | None:
    """The version of the Ray that the ``ray`` on PATH runs (its interpreter's ray-*.dist-info)."""
    ray = shutil.which("ray")
    if not ray:
        return None
    try:
        first = Path(ray).read_bytes()[:300].split(b"\n", 1)[0]
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    python = first[2:].decode(errors="replace").strip().split()[0]
    prefix = Path(python).parent.parent
    found = sorted(glob.glob(str(prefix / "lib" / "python3*" / "site-packages" / "ray-*.dist-info")))
    if not found:
        return None
    return Path(found[-1]).name.removeprefix("ray-").removesuffix(".dist-info")


def _installed(module: str) -> bool:
    """Asked only when a GPU / a Ray cluster was found here (importing ray takes a second)."""
    try:
        if module == "pynvml":
            import pynvml  # noqa: F401
        else:
            import ray  # noqa: F401
    except ImportError:
        return False
    return True


def pip(requirement: str) -> str:
    return f"{sys.executable} -m pip install '{requirement}'"


def hints() -> list[tuple[str, str]]:
    """(name, text) rows: what is missing for what was found here, then the command that installs it."""
    out = []
    why = gpu_here()
    if why and not _installed("pynvml"):
        out += [("gpu", f"{why}: GPU sampling needs nvidia-ml-py"), ("install", pip(GPU_REQUIREMENT))]
    why = ray_here()
    if why and not _installed("ray"):
        version = cluster_ray_version()
        out += [("ray", f"{why}: discovery and node agents need ray"),
                ("install", pip(f"ray[default]=={version}" if version else RAY_REQUIREMENT))]
        if not version:
            out.append(("", "(pin it to the cluster's `ray --version`)"))
    return out
