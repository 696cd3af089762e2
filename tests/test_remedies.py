"""Remedies name only config keys that exist in VeRL-Omni, and give the advice that fits the run's layout.

The keys are checked against a recorded copy of VeRL-Omni's composed trainer config
(tests/fixtures/verl_omni/config_keys.txt): a key written plainly must be in it; a key written with
Hydra's '+' must not be (adding an existing key fails) and must hang under a mapping that is."""
from __future__ import annotations

import re

import pytest

from omniwatch import names as n
from omniwatch.alerting import remedies
from omniwatch.alerting import rulespec as spec
from omniwatch.alerting.config import DEFAULT
from omniwatch.alerting.prose import Ctx

from conftest import REPO, fixture

KEYS = {line.strip() for line in fixture("verl_omni/config_keys.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")}
TOP = sorted({k.split(".")[0] for k in KEYS})
# A config path as a user types it: `+a.b.c=value`, `a.b`, `'+a.b="989"'`.
CONFIG_PATH = re.compile(r"`'?(\+{0,2})((?:" + "|".join(TOP) + r")(?:\.[\w<>-]+)+)")


def _ancestor_exists(path: str) -> bool:
    parts = path.split(".")
    return any(".".join(parts[:i]) in KEYS for i in range(len(parts) - 1, 0, -1))


def _check(path: str, plus: bool) -> str | None:
    if plus:
        if path in KEYS:
            return f"+{path}: the key exists, Hydra refuses '+' for it"
        if not _ancestor_exists(path):
            return f"+{path}: no parent mapping of it exists in the composed config"
        return None
    return None if path in KEYS else f"{path}: not a key of VeRL-Omni's composed config"


def test_the_recorded_config_is_the_composed_trainer_config():
    assert len(KEYS) > 500
    for k in ("reward.reward_model.enable_resource_pool", "trainer.v1.trainer_mode", "transfer_queue.backend.storage_backend"):
        assert k in KEYS


@pytest.mark.parametrize("path", sorted(remedies.NAMED_KEYS))
def test_every_key_a_remedy_names_exists_in_verl_omni(path):
    assert _check(path, remedies.NAMED_KEYS[path]) is None


def _remedy_texts() -> list[str]:
    out = []
    mode_sets = [{"trainer": t, "reward": r, "async_mode": a} for t in ("legacy", "v1", "unknown")
                 for r in ("colocated", "streamed", "unknown") for a in ("sync", "separate_async")] + [None]
    for a in spec.alerts(DEFAULT):
        if a.remedy is None:
            continue
        for modes in mode_sets:
            for cause in (*remedies.STEP_CAUSES, "unknown"):
                for role in ("actor", "rollout", "reward"):
                    out.append(a.remedy.expect(Ctx({"project": "p", "experiment": "e", "role": role, "cause": cause},
                                                   1.0, {}, modes)))
    return out


def test_every_config_path_written_in_a_remedy_went_through_key():
    """Nobody writes a config key into remedy text without it being checked."""
    found = {(m.group(2), bool(m.group(1))) for text in _remedy_texts() for m in CONFIG_PATH.finditer(text)}
    assert found, "no config keys found in the remedies?"
    unchecked = sorted(p for p, _ in found if p not in remedies.NAMED_KEYS)
    assert not unchecked, unchecked
    bad = [err for p, plus in found if (err := _check(p, plus))]
    assert not bad, bad


def test_every_config_path_in_the_runbooks_and_alert_docs_exists():
    bad = []
    for doc in ("runbooks.md", "alerts.md"):
        for m in CONFIG_PATH.finditer((REPO / "docs" / doc).read_text()):
            if err := _check(m.group(2), bool(m.group(1))):
                bad.append(f"docs/{doc}: {err}")
    assert not bad, bad


def _remedy(alert: str, modes: dict | None, severity: str | None = None, **labels) -> str:
    a = next(a for a in spec.alerts(DEFAULT) if a.name == alert and severity in (None, a.severity))
    return a.remedy.expect(Ctx({"project": "p", "experiment": "e", **labels}, 1.0, {}, modes))


def test_reward_bound_advice_fits_the_reward_layout():
    colocated = _remedy(n.ALERT_REWARD_BOUND, {"trainer": "legacy", "reward": "colocated", "async_mode": "sync"})
    streamed = _remedy(n.ALERT_REWARD_BOUND, {"trainer": "legacy", "reward": "streamed", "async_mode": "sync"})
    v1 = _remedy(n.ALERT_REWARD_BOUND, {"trainer": "v1", "reward": "colocated", "async_mode": "sync"})
    assert "enable_resource_pool=True" in colocated and "enable_resource_pool=True" in v1
    # a run that already scores while generating is not told to turn the pool on, but how to scale it
    assert "enable_resource_pool" not in streamed
    assert "reward.num_workers" in streamed and "tensor_model_parallel_size" in streamed
    assert "V1" in v1 and "V1" not in colocated


def test_inter_stage_idle_advice_fits_the_trainer_and_never_prescribes_separate_async_for_transfers():
    sync = _remedy(n.ALERT_IDLE, {"trainer": "v1", "reward": "streamed", "async_mode": "sync"})
    sep = _remedy(n.ALERT_IDLE, {"trainer": "v1", "reward": "streamed", "async_mode": "separate_async"})
    legacy = _remedy(n.ALERT_IDLE, {"trainer": "legacy", "reward": "colocated", "async_mode": "sync"})
    for text in (sync, sep):
        assert "diffusion_tq_batch_to_dataproto" in text and "put_dataproto_fields_to_tq" in text
        assert "num_data_storage_units" in text
    assert "does not shrink" in sync
    assert "parameter_sync_step" in sep
    assert "TransferQueue" not in legacy and "straggler" in legacy


def test_mfu_impossible_names_the_silicon_peak_and_how_it_reaches_the_workers():
    a = next(a for a in spec.alerts(DEFAULT) if a.name == n.ALERT_MFU_IMPOSSIBLE)
    with_peak = a.remedy.expect(Ctx({"project": "p", "experiment": "e", "role": "actor"}, 2.6, {n.MFU_DEVICE_PEAK: 989}))
    assert 'VERL_OMNI_DEVICE_FLOPS_TFLOPS="989"' in with_peak and "runtime_env.env_vars" in with_peak
    other = a.remedy.expect(Ctx({"project": "p", "experiment": "e", "role": "actor"}, 2.6, {n.MFU_DEVICE_PEAK: 312}))
    assert '"312"' in other and "989" not in other.split("e.g.")[0]
    assert "allgather_diffusion_flops_meta" in with_peak and "_allgather" not in with_peak


def test_offload_advice_is_under_step_time_regression_not_mfu_drop():
    drop = _remedy(n.ALERT_MFU_DROP, None, role="actor")
    actor = _remedy(n.ALERT_STEP_REGRESSION, None, cause="actor")
    assert "offload" not in drop.replace("offload changes are outside", "")
    assert "param_offload=False" in actor


def test_a_serial_engine_is_told_step_execution_not_max_num_seqs():
    """Issue 22 item 7: VeRL-Omni clamps max_num_seqs to 1 without step_execution for a pipeline without request
    batching (vllm_omni_async_server.py L311-329): raising max_num_seqs is no remedy there."""
    text = _remedy(n.ALERT_ROLLOUT_SATURATED, {"trainer": "legacy", "reward": "colocated", "async_mode": "sync"},
                   role="rollout", engine="serial")
    assert "serial engine" in text and "`actor_rollout_ref.rollout.step_execution=True`" in text
    assert "raise `actor_rollout_ref.rollout.max_num_seqs`" not in text and "changes nothing" in text


def test_algorithm_changes_are_labelled_as_such():
    text = _remedy(n.ALERT_REWARD_SATURATION, None)
    assert "rollout.n" in text and "Algorithm change" in text


LEGACY = {"trainer": "legacy", "reward": "colocated", "async_mode": "sync"}
V1_SYNC = {"trainer": "v1", "reward": "streamed", "async_mode": "sync"}
SEPARATE_ASYNC = {"trainer": "v1", "reward": "streamed", "async_mode": "separate_async"}


def test_rollout_queue_saturated_advice_fits_the_role_and_layout_and_changes_no_algorithm():
    """Issue 13 item 10: a performance remedy does not tell people to sample fewer responses per prompt."""
    legacy = _remedy(n.ALERT_ROLLOUT_SATURATED, LEGACY, role="rollout")
    sync = _remedy(n.ALERT_ROLLOUT_SATURATED, V1_SYNC, role="rollout")
    separate = _remedy(n.ALERT_ROLLOUT_SATURATED, SEPARATE_ASYNC, role="rollout")
    reward = _remedy(n.ALERT_ROLLOUT_SATURATED, SEPARATE_ASYNC, role="reward")
    unknown = _remedy(n.ALERT_ROLLOUT_SATURATED, None, role="rollout")
    cut = lambda t: t.split(" Profile one step")[0]  # noqa: E731  (the profile line is per trainer: item 9)
    assert cut(legacy) == cut(sync) and "whole batch" in legacy and "max_num_seqs" in legacy and "step_execution" in legacy
    assert "standalone rollout" in separate and "actor_rollout_ref.rollout.nnodes" in separate
    assert "reward.reward_model." in reward and "actor_rollout_ref" not in reward
    for text in (legacy, separate, reward, unknown):
        assert "actor_rollout_ref.rollout.n`" not in text and "actor_rollout_ref.rollout.n=" not in text
        assert "Algorithm change" not in text


def test_transferqueue_advice_bounds_rollout_only_where_it_runs_ahead():
    separate = _remedy(n.ALERT_TQ_BACKLOG, SEPARATE_ASYNC, severity="warning")
    sync = _remedy(n.ALERT_TQ_BACKLOG, V1_SYNC, severity="warning")
    critical = _remedy(n.ALERT_TQ_BACKLOG, SEPARATE_ASYNC, severity="critical")
    for text in (separate, critical):
        assert "trainer.v1.sampler.max_off_policy_threshold" in text
        assert "trainer.v1.sampler.max_off_policy_strategy=drop" in text
        assert "transfer_queue.backend.SimpleStorage.total_storage_size" in text
    assert "max_off_policy" not in sync and "nobody clears" in sync
    assert "stopped clearing" in critical and "stopgap" not in critical
    assert "kv_clear" in _remedy(n.ALERT_TQ_SLOW_LEAK, None)


# --- issue 22 item 9: remedies that work when pasted -----------------------------------------------------------
PROFILED = {n.ALERT_REWARD_BOUND, n.ALERT_IDLE, n.ALERT_MFU_DROP, n.ALERT_MFU_LOW, n.ALERT_STEP_REGRESSION,
            n.ALERT_ROLLOUT_SATURATED, n.ALERT_STRAGGLER}
REQUIRED = ("trainer.total_training_steps=2", "trainer.resume_mode=disable", "trainer.save_freq=-1",
            "trainer.test_freq=-1", "global_profiler.tool=", "global_profiler.steps=[2]")


def _rendered(alert, modes) -> list[str]:
    out = []
    for cause in (*remedies.STEP_CAUSES, "unknown"):
        for role in ("rollout", "reward"):
            for engine in ("", "serial"):
                out.append(alert.remedy.expect(Ctx({"project": "p", "experiment": "e", "role": role, "cause": cause,
                                                    "engine": engine}, 1.0, {}, modes)))
    return out


@pytest.mark.parametrize("trainer", ["legacy", "v1", None])
def test_one_complete_layout_aware_profile_line_per_alert(trainer):
    """Every alert that sends the user to a profiler carries exactly one "Profile one step" line: on legacy (and an
    unknown trainer) one pasteable code span with the run-shaping overrides VeRL-Omni's profiler docs require and
    the profiled step; on V1 the statement that it has no per-step profiling lifecycle."""
    modes = {"trainer": trainer, "reward": "colocated", "async_mode": "sync"} if trainer else None
    seen = set()
    for a in spec.alerts(DEFAULT):
        if a.name not in PROFILED or a.remedy is None:
            continue
        seen.add(a.name)
        for text in _rendered(a, modes):
            assert text.count("Profile one step") == 1, (a.name, text)
            span = re.search(r"Profile one step[^`]*`([^`]+)`", text)
            assert span, (a.name, text)
            for req in REQUIRED:
                assert req in span.group(1), (a.name, req, span.group(1))
            if trainer == "v1":
                assert "V1 has no per-step profiling lifecycle" in text, text
            else:
                assert "V1 has no per-step profiling lifecycle" not in text or trainer is None
    assert seen == PROFILED


def test_every_key_of_a_profile_line_is_a_real_key():
    for target in remedies.PROFILE_TARGETS:
        for tok in remedies.profile_line(target).strip("`").split():
            path = tok.split("=", 1)[0]
            assert path in KEYS, path


def test_the_reward_pool_advice_states_the_break_even_and_the_example_settings():
    text = remedies.reward_bound().expect(Ctx({"project": "p", "experiment": "e"}, 1.0, {},
                                              {"trainer": "legacy", "reward": "colocated", "async_mode": "sync"}))
    assert "exceeds P/(N+P)" in text and remedies.POOL_EXAMPLE in text
    for setting in ("reward.reward_model.enable_resource_pool=True", "reward.reward_model.n_gpus_per_node=<P>",
                    "reward.num_workers=<P/TP>", "reward.reward_model.rollout.free_cache_engine=False"):
        assert setting in text, setting
    # The break-even against VeRL-Omni's own numbers (docs/algo/performance.md): 1 GPU on 4, step 420 s -> 360 s.
    n_gpus, pool, before, after = 4, 1, 420.0, 360.0
    share = 1 - after / before
    assert share < pool / (n_gpus + pool)                            # under the break-even ...
    assert 1 / (after * (n_gpus + pool)) < 1 / (before * n_gpus)     # ... so throughput per GPU falls (0.305 -> 0.280)
