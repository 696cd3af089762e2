"""Extras a head node needs (issue 27 item 5): a GPU or a Ray cluster here without the extra that uses it
is said by `omniwatch status` (and `up`, which prints the same rows) with the exact install command, Ray
pinned to the cluster's version when the `ray` on PATH tells it."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from omniwatch import extras

REPO = Path(__file__).resolve().parents[1]


def test_the_install_commands_name_the_extras_of_pyproject():
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extra["gpu"] == [extras.GPU_REQUIREMENT] and extra["ray"] == [extras.RAY_REQUIREMENT]


def test_the_readme_names_the_extras_a_head_node_needs_beside_a_real_run():
    """Issue 35 item 16: "Beside a real run" names `[gpu]` and `[ray]` with the command that installs both, and the
    extras it names are pyproject's (a renamed extra fails here)."""
    text = (REPO / "README.md").read_text()
    start = text.index("## Beside a real run")
    section = text[start:text.index("\n## ", start + 5)]
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name in ("gpu", "ray"):
        assert f"`[{name}]`" in section and name in extra, name
    assert "pip install -e '.[gpu,ray]'" in " ".join(section.split())
    assert "nvidia-ml-py" in section and "ray[default]" in section


def _status(tmp_path, path_dirs: list[Path], **env) -> str:
    e = {**os.environ, "PATH": os.pathsep.join([*map(str, path_dirs), os.environ["PATH"]]), **env}
    r = subprocess.run([sys.executable, "-m", "omniwatch", "status", "--run-dir", str(tmp_path / "rd")],
                       capture_output=True, text=True, timeout=60, env=e)
    assert r.returncode == 3, r.stdout + r.stderr  # nothing runs: the hints are said anyway
    return r.stdout


def test_status_says_what_a_gpu_and_a_ray_cluster_need(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI 550.54'\n")
    smi.chmod(0o755)
    # the cluster's ray: a script whose interpreter's site-packages holds ray 2.49.1
    prefix = tmp_path / "clusterenv"
    (prefix / "lib" / "python3.12" / "site-packages" / "ray-2.49.1.dist-info").mkdir(parents=True)
    (prefix / "bin").mkdir()
    ray = bin_dir / "ray"
    ray.write_text(f"#!{prefix}/bin/python3\nimport sys\n")
    ray.chmod(0o755)
    out = _status(tmp_path, [bin_dir], RAY_ADDRESS="127.0.0.1:6379")
    if importlib.util.find_spec("pynvml") is None:
        assert "  gpu          nvidia-smi on PATH: GPU sampling needs nvidia-ml-py\n" in out, out
        assert f"{sys.executable} -m pip install 'nvidia-ml-py>=12.535'" in out, out
    else:
        assert "GPU sampling needs" not in out, out
    if importlib.util.find_spec("ray") is None:
        assert "  ray          RAY_ADDRESS set: discovery and node agents need ray\n" in out, out
        assert f"{sys.executable} -m pip install 'ray[default]==2.49.1'" in out, out
    else:
        assert "need ray" not in out, out


def test_no_hint_where_there_is_no_gpu_and_no_ray(tmp_path):
    if Path(extras.NVIDIA_DRIVER).exists() or Path(extras.RAY_TEMP, "ray_current_cluster").exists():
        pytest.skip("this machine has an NVIDIA driver or a Ray cluster: the hints are covered by the test above")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    path = os.pathsep.join(d for d in env["PATH"].split(os.pathsep) if not (Path(d) / "nvidia-smi").exists())
    r = subprocess.run([sys.executable, "-m", "omniwatch", "status", "--run-dir", str(tmp_path / "rd")],
                       capture_output=True, text=True, timeout=60, env={**env, "PATH": path})
    assert "install" not in r.stdout and "gpu" not in r.stdout, r.stdout
