"""Remedies name only config keys that exist in VeRL-Omni, and give the advice that fits the run's layout.

The keys are checked against a recorded copy of VeRL-Omni's composed trainer config
(tests/fixtures/verl_omni/config_keys.txt): a key written plainly must be in it; a key written with
Hydra's '+' must not be (adding an existing key fails) and must hang under a mapping that is."""
from __future__ import annotations

import re

import pytest

from omniwatch import names as n
from omniwatch.alerting import remedies
from omniwatch.alerting import rulespec
from omniwatch.config import DEFAULT
from omniwatch.prosetext import Ctx

from conftest import REPO, fixture

pytestmark = pytest.mark.batch   # CPU-bound, no wall-clock expectation: nice 10 beside live tests (conftest)

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


def _remedy_texts() -> list[str]:  # noqa: C901
    out = []
    mode_sets = [{"trainer": t, "reward": r, "async_mode": a} for t in ("legacy", "v1", "unknown")
                 for r in ("colocated", "streamed", "unknown") for a in ("sync", "separate_async")] + [None]
    for a in rulespec.alerts(DEFAULT):
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
    veomni = {line.strip() for line in fixture("verl_omni/config_keys_veomni_only.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    for doc in ("runbooks.md", "alerts.md"):
        for m in CONFIG_PATH.finditer((REPO / "docs" / doc).read_text()):
            if m.group(2) in veomni and not m.group(1):  # a VeOmni-engine key, named for a run whose config says so
                continue
            if err := _check(m.group(2), bool(m.group(1))):
                bad.append(f"docs/{doc}: {err}")
    assert not bad, bad


def _remedy(alert: str, modes: dict | None, severity: str | None = None, **labels) -> str:
    a = next(a for a in rulespec.alerts(DEFAULT) if a.name == alert and severity in (None, a.severity))
    return a.remedy.expect(Ctx({"project": "p", "experiment": "e", **labels}, 1.0, {}, modes))


def test_reward_bound_advice_fits_the_reward_layout():
    colocated = _remedy(n.ALERT_REWARD_BOUND, {"trainer": "legacy", "reward": "colocated", "async_mode": "sync"})
    streamed = _remedy(n.ALERT_REWARD_BOUND, {"trainer": "legacy", "reward": "streamed", "async_mode": "sync"})
    v1 = _remedy(n.ALERT_REWARD_BOUND, {"trainer": "v1", "reward": "colocated", "async_mode": "sync"})
    assert "enable_resource_pool=True" in colocated and "enable_resource_pool=True" in v1
    # a run that already scores while generating is not told to turn the pool on, but how to scale it
    assert "enable_resource_pool=True" not in streamed
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
    a = next(a for a in rulespec.alerts(DEFAULT) if a.name == n.ALERT_MFU_IMPOSSIBLE)
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
    for a in rulespec.alerts(DEFAULT):
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


# --- issue 32: a one-line action per remedy; remedies from the run's own config ---------------------------------------
import itertools  # noqa: E402

from omniwatch import trainer_config as tc  # noqa: E402
from omniwatch.alerting.prose import ACTION_MAX, Remedy  # noqa: E402
from omniwatch.prosetext import setting_series  # noqa: E402


CONFIGS = {name: tc.read_file(str(fixture(f"trainer_config/{name}.pprint.log")))
           for name in ("finished_on_cadence", "mfu_sp4", "reward_server", "v1_sync_reward_pool", "v1_separate_async",
                        "veomni_offload")}
CONFIGS.update({name: tc.read_file(str(fixture(f"verl_omni/generated/{name}.yaml")))
                for name in ("_generated_diffusion_trainer", "_generated_diffusion_veomni_trainer",
                             "_generated_omni_trainer")})
MODES = [{"trainer": t, "reward": r, "async_mode": a} for t in ("legacy", "v1", "unknown")
         for r in ("colocated", "streamed", "unknown") for a in ("sync", "separate_async")] + [None]
CASES = [{}] + [{"cause": c} for c in (*remedies.STEP_CAUSES, "x")] + [
    {"role": "rollout"}, {"role": "reward"}, {"role": "rollout", "engine": "serial"}, {"mode": "bypass"},
    {"mode": "decoupled"}, {"role": "actor"}]
NONE = setting_series(None)  # the info series the exporter writes for a run without a config
EXTRAS = [{}, {n.REWARD_POOL_BREAK_EVEN: 3.0}, {n.REWARD_POOL_BREAK_EVEN: 0.0}, {n.MFU_DEVICE_PEAK: 989.0}]


def ctx_for(cfg, modes=None, extra=None, **labels) -> Ctx:
    return Ctx({"project": "p", "experiment": "e", **labels}, 1.0,
               {**(setting_series(cfg.settings, cfg.info_labels()) if cfg is not None else NONE), **(extra or {})},
               modes)


def _cases(alert: str) -> list[dict]:
    """The alert labels a remedy branches on (rulegen.BY_LABEL) and an unknown value; {} for the others."""
    from omniwatch.alerting.rulegen import BY_LABEL
    if alert not in BY_LABEL:
        return [{}]
    label, values = BY_LABEL[alert]
    return [{label: v} for v in (*values, "x")] + ([{"role": "rollout", "engine": "serial"}] if label == "role" else [])


def test_every_remedy_has_a_one_line_action_of_at_most_120_characters_in_every_branch():
    from omniwatch.alerting.rulegen import LAYOUTS
    modes_all = [m for _, m in LAYOUTS] + [{"trainer": "unknown", "reward": "unknown", "async_mode": "unknown"}]
    seen = 0
    for a in rulespec.alerts(DEFAULT):
        if a.remedy is None:
            continue
        assert isinstance(a.remedy, Remedy) and a.remedy.action.parts, a.name
        for cfg, modes, labels, extra in itertools.product([None, *CONFIGS.values()], modes_all, _cases(a.name), EXTRAS):
            act = a.remedy.action.expect(ctx_for(cfg, modes, extra, **labels))
            assert act and "\n" not in act and len(act) <= ACTION_MAX, (a.name, len(act), act)
            seen += 1
    assert seen > 5_000


OVERRIDE = re.compile(r"([a-z_]+(?:\.[\w]+)+)=([^`\s]+)")


def _config_value(raw: dict, path: str):
    node = raw
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return tc._MISSING
        node = node[part]
    return node


def _same(value: str, have) -> bool:
    if isinstance(have, bool):
        return value.lower() in ("true", "false") and (value.lower() == "true") == have
    return str(have) == value


def _already_had(cfg, raw: dict) -> set:
    """(alert, key, value) of every `key=value` a remedy (text or action, any layout and alert label this config can
    produce) proposes where the config already says value — the profile recipe aside (a separate 2-step run's
    overrides, appended to the launch command whatever the run has)."""
    recipes = {remedies.profile_line(t).strip("`") for t in remedies.PROFILE_TARGETS}
    # the layouts and alert labels this config can produce (the rest cannot fire for it: a bypass-mode label needs
    # bypass_mode on; V1 / separate_async need the trainer the config names)
    trainer = cfg.trainer or "legacy"
    async_mode = cfg.async_mode if cfg.async_mode == "separate_async" else "sync"
    rm, pool = cfg.settings.get("reward_model"), cfg.settings.get("reward_pool")
    reward = "colocated" if rm and not pool else "streamed"
    modes_ok = [{"trainer": trainer, "reward": reward, "async_mode": async_mode}, None]
    bypass = _config_value(raw, "algorithm.rollout_correction.bypass_mode") is True
    cases_ok = [c for c in CASES if c.get("mode") != "bypass" or bypass]
    bad = set()
    for a in rulespec.alerts(DEFAULT):
        if a.remedy is None:
            continue
        for modes, labels, extra in itertools.product(modes_ok, cases_ok, EXTRAS):
            ctx = ctx_for(cfg, modes, extra, **labels)
            for text in (a.remedy.expect(ctx), a.remedy.action.expect(ctx)):
                for span in re.findall(r"`([^`]+)`", text):
                    if span in recipes:
                        continue
                    for key_path, value in OVERRIDE.findall(span):
                        have = _config_value(raw, key_path.lstrip("+'"))
                        if have is not tc._MISSING and not value.startswith("<") and _same(value, have):
                            bad.add((a.name, key_path, value))
    return bad


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_no_remedy_proposes_a_setting_the_runs_config_already_has(name):
    """Issue 32 'Done when': with the trainer config read, no remedy (text or action, any layout and alert label)
    proposes `key=value` where the config already says value."""
    cfg = CONFIGS[name]
    path = (fixture(f"trainer_config/{name}.pprint.log") if not name.startswith("_")
            else fixture(f"verl_omni/generated/{name}.yaml"))
    raw = (tc.parse_yaml_text(path.read_text()) if path.suffix == ".yaml" else tc.parse_pprint_text(path.read_text()))
    assert not (bad := _already_had(cfg, raw)), sorted(bad)


@pytest.mark.parametrize("name", ["_generated_diffusion_trainer", "_generated_diffusion_veomni_trainer",
                                  "_generated_omni_trainer"])
def test_no_remedy_proposes_a_setting_of_a_config_with_every_default_turned(name):
    """The same on unseen configs: VeRL-Omni's generated config with every boolean the remedies read turned over
    (offloads on, a reward model with its pool, layered_summon, step_execution, ...), every enum another word
    (a non-naive checkpoint engine, resume_mode disable, strategy wait) and every number moved."""
    raw = tc.parse_yaml_text(fixture(f"verl_omni/generated/{name}.yaml").read_text())
    engine = tc.facts(raw, "yaml").engine
    for setting, (kind, dotted) in tc.SETTINGS.items():
        node, parts = raw, dotted.replace("{engine}", f"{engine}_config").split(".")
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if not dotted or not isinstance(node, dict) or parts[-1] not in node:
            continue
        v = node[parts[-1]]
        node[parts[-1]] = (not v if kind == "bool" else next(w for w in tc.ENUMS[setting] if w != v)
                           if kind == "enum" else (v or 0) + 3)
    cfg = tc.facts(raw, "yaml")
    assert cfg.settings["param_offload"] is True and cfg.settings["reward_pool"] is True
    assert cfg.settings["resume_mode"] != "auto" and cfg.settings["checkpoint_backend"] != "naive"
    assert not (bad := _already_had(cfg, raw)), sorted(bad)


def _r(alert: str, cfg, modes=None, severity=None, extra=None, action=False, **labels) -> str:
    a = next(a for a in rulespec.alerts(DEFAULT) if a.name == alert and severity in (None, a.severity))
    ctx = ctx_for(cfg, modes, extra, **labels)
    return a.remedy.action.expect(ctx) if action else a.remedy.expect(ctx)


def _with(name: str, **settings):
    import dataclasses
    c = CONFIGS[name]
    return dataclasses.replace(c, settings={**c.settings, **settings})


LEGACY_COLOCATED = {"trainer": "legacy", "reward": "colocated", "async_mode": "sync"}
STREAMED = {"trainer": "legacy", "reward": "streamed", "async_mode": "sync"}


def test_reward_bound_from_the_config_function_pool_colocated_and_unknown():
    function = _r(n.ALERT_REWARD_BOUND, CONFIGS["reward_server"], STREAMED)
    assert "The reward is a function" in function and "reward-model" not in function.replace("no reward-model server", "")
    assert "Profile one step" not in function and "enable_resource_pool" not in function
    assert "reward function" in _r(n.ALERT_REWARD_BOUND, CONFIGS["reward_server"], STREAMED, action=True)
    pool = _r(n.ALERT_REWARD_BOUND, CONFIGS["v1_sync_reward_pool"], STREAMED)
    assert "already has its own pool" in pool and "1 GPU(s) per node x 1 node(s)" in pool and "(now 1)" in pool
    assert "enable_resource_pool=True" not in pool
    assert "(now 1)" in _r(n.ALERT_REWARD_BOUND, CONFIGS["v1_sync_reward_pool"], STREAMED, action=True)
    colocated = _r(n.ALERT_REWARD_BOUND, CONFIGS["finished_on_cadence"], LEGACY_COLOCATED,
                   extra={n.REWARD_POOL_BREAK_EVEN: 2.0})
    assert "this run's 4 trainer GPUs" in colocated and "a pool of up to 2 GPUs pays" in colocated
    assert "reward.reward_model.enable=True" not in colocated  # it already has a reward model
    assert "(up to 2 GPUs pay)" in _r(n.ALERT_REWARD_BOUND, CONFIGS["finished_on_cadence"], LEGACY_COLOCATED,
                                      extra={n.REWARD_POOL_BREAK_EVEN: 2.0}, action=True)
    none_pays = _r(n.ALERT_REWARD_BOUND, CONFIGS["finished_on_cadence"], LEGACY_COLOCATED,
                   extra={n.REWARD_POOL_BREAK_EVEN: 0.0}, action=True)
    assert none_pays.startswith("No reward pool pays")
    unknown = _r(n.ALERT_REWARD_BOUND, None, STREAMED)
    assert "With a reward pool" in unknown and "With a reward function" in unknown
    assert "`reward.reward_model.enable`, `reward.reward_model.enable_resource_pool` would say" in unknown


def test_step_regression_reward_gives_the_reward_remedy_itself_not_a_reference():
    """Issue 32 item 4: cause=reward sent the reader to RewardBoundRollout's remedy, which is not firing."""
    text = _r(n.ALERT_STEP_REGRESSION, CONFIGS["reward_server"], STREAMED, cause="reward")
    assert "see RewardBoundRollout" not in text and "The reward is a function" in text
    assert "Profile one step" not in text  # a reward function: no reward-model servers to profile
    legacy = _r(n.ALERT_STEP_REGRESSION, None, LEGACY_COLOCATED, cause="reward")
    assert "enable_resource_pool=True" in legacy and "Profile one step of the reward-model servers" in legacy


def test_actor_offload_advice_per_config_branch():
    both = _r(n.ALERT_STEP_REGRESSION, CONFIGS["reward_server"], cause="actor")
    assert "fsdp_config.param_offload=False` (this run offloads its parameters)" in both
    assert "optimizer_offload=False` (its optimizer too)" in both
    opt_only = _r(n.ALERT_STEP_REGRESSION, _with("reward_server", param_offload=False), cause="actor")
    assert "param_offload=False" not in opt_only and "its optimizer is: `actor_rollout_ref.actor.fsdp_config." \
        "optimizer_offload=False`" in opt_only
    nothing = _r(n.ALERT_STEP_REGRESSION, CONFIGS["v1_sync_reward_pool"], cause="actor")
    assert "offload_False" not in nothing and "=False" not in nothing.split("Profile one step")[0]
    assert "nothing is offloaded" in nothing and "ppo_micro_batch_size_per_gpu` (now 8)" in nothing
    sp2 = _r(n.ALERT_STEP_REGRESSION, _with("v1_sync_reward_pool", sp=2), cause="actor")
    assert "Ulysses SP 1 (`actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size`, now 2)" in sp2
    veo = _r(n.ALERT_STEP_REGRESSION, CONFIGS["veomni_offload"], cause="actor")
    assert "veomni_config.param_offload=False" in veo and "fsdp_config" not in veo
    assert "param_offload=False` (now True)" in _r(n.ALERT_STEP_REGRESSION, CONFIGS["reward_server"], cause="actor",
                                                   action=True)
    assert _r(n.ALERT_STEP_REGRESSION, CONFIGS["v1_sync_reward_pool"], cause="actor", action=True).startswith(
        "Nothing offloaded: raise")
    unknown = _r(n.ALERT_STEP_REGRESSION, None, cause="actor")
    assert "param_offload=False` gives the largest gain, then" in unknown and "No trainer config was read" in unknown


def test_layered_summon_per_config_branch():
    """OMNI docs/perf/diffusion_mfu.md L541-546: keep layered_summon on while parameters are offloaded, off with
    nothing offloaded; never proposed when the run already has it; only for LoRA."""
    off = _r(n.ALERT_STEP_REGRESSION, _with("finished_on_cadence", layered_summon=False), cause="actor")
    assert "set `actor_rollout_ref.rollout.layered_summon=True`" in off
    assert "layered_summon" not in _r(n.ALERT_STEP_REGRESSION, CONFIGS["finished_on_cadence"], cause="actor")
    nothing_on = _r(n.ALERT_STEP_REGRESSION, _with("v1_sync_reward_pool", layered_summon=True), cause="actor")
    assert "`actor_rollout_ref.rollout.layered_summon=False` lets weight sync load the whole model" in nothing_on
    assert "layered_summon" not in _r(n.ALERT_STEP_REGRESSION, _with("reward_server", layered_summon=False),
                                      cause="actor")  # no LoRA


def test_mfu_low_per_config_branch():
    gc = _r(n.ALERT_MFU_LOW, CONFIGS["v1_sync_reward_pool"])
    assert "gradient checkpointing is counted" in gc and "param_offload=False" not in gc.split("Profile")[0]
    assert "gradient checkpointing" not in _r(n.ALERT_MFU_LOW, _with("v1_sync_reward_pool", gradient_checkpointing=False))
    assert "param_offload=False` (now True)" in _r(n.ALERT_MFU_LOW, CONFIGS["reward_server"], action=True)
    assert "(now 8)" in _r(n.ALERT_MFU_LOW, CONFIGS["v1_sync_reward_pool"], action=True)
    assert "No trainer config was read" in _r(n.ALERT_MFU_LOW, None)


def test_mfu_drop_names_the_runs_own_values():
    text = _r(n.ALERT_MFU_DROP, CONFIGS["mfu_sp4"], role="actor")
    assert "ppo_micro_batch_size_per_gpu` (now 16)" in text and "ulysses_sequence_parallel_size` (now 4)" in text
    assert "enable_gradient_checkpointing` (now true)" in text and "(now 1)" not in text
    assert "No trainer config was read" in _r(n.ALERT_MFU_DROP, None, role="actor")


def test_weight_sync_names_the_knobs_of_the_runs_sync_path():
    """Issue 32 item 4: a LoRA weight-sync slowdown named no knob (docs/verl-source.md H14)."""
    nccl = _r(n.ALERT_STEP_REGRESSION, CONFIGS["v1_separate_async"], cause="weight_sync")
    assert "`actor_rollout_ref.rollout.checkpoint_engine.backend` is nccl" in nccl
    assert "update_weights_bucket_megabytes` = 2048 MB" in nccl and "LoRA (rank 32)" in nccl
    assert "(now 2048)" in _r(n.ALERT_STEP_REGRESSION, CONFIGS["v1_separate_async"], cause="weight_sync", action=True)
    naive = _r(n.ALERT_STEP_REGRESSION, CONFIGS["finished_on_cadence"], cause="weight_sync")
    assert "syncs colocated" in naive and "layered_summon` (now true)" in naive and "free_cache_engine` (now true)" in naive
    full = _r(n.ALERT_STEP_REGRESSION, CONFIGS["reward_server"], cause="weight_sync")
    assert "Full weights are synced every step" in full
    unknown = _r(n.ALERT_STEP_REGRESSION, None, cause="weight_sync")
    assert "checkpoint_engine.backend" in unknown and "update_weights_bucket_megabytes" in unknown
    assert "No trainer config was read" in unknown


def test_rollout_knobs_quote_the_config_and_never_propose_step_execution_twice():
    sync = {"trainer": "legacy", "reward": "colocated", "async_mode": "sync"}
    text = _r(n.ALERT_ROLLOUT_SATURATED, CONFIGS["finished_on_cadence"], sync, role="rollout")
    assert "max_num_seqs` (now 1024)" in text and "step_execution=True" in text
    stepwise = _r(n.ALERT_ROLLOUT_SATURATED, _with("finished_on_cadence", step_execution=True), sync, role="rollout")
    assert "step_execution=True" not in stepwise and "already batches step-wise" in stepwise


def test_a_stall_past_warning_never_says_nothing_to_do_and_resumes_by_the_runs_resume_mode():
    for sev in ("warning", "critical"):
        for cfg in (None, *CONFIGS.values()):
            text = _r(n.ALERT_STALLED, cfg, severity=sev) + _r(n.ALERT_STALLED, cfg, severity=sev, action=True)
            assert "nothing to do" not in text.lower() and "hang" in text.lower()
    auto = _r(n.ALERT_STALLED, CONFIGS["finished_on_cadence"], severity="critical")
    assert "resume_mode=auto" not in auto and "resumes from the last checkpoint" in auto
    disable = _r(n.ALERT_STALLED, _with("finished_on_cadence", resume_mode="disable"), severity="critical")
    assert "set `trainer.resume_mode=auto` (now disable)" in disable
    path = _r(n.ALERT_STALLED, _with("finished_on_cadence", resume_mode="resume_path"), severity="critical")
    assert "point `trainer.resume_from_path`" in path
    assert "with `trainer.resume_mode=auto` after fixing it" in _r(n.ALERT_STALLED, None, severity="critical")
    assert "Usually nothing to do yet" in _r(n.ALERT_STALLED, None, severity="info")


def test_legacy_idle_places_flowgrpos_untimed_work_where_the_trainer_runs_it():
    """Issue 32 item 4 (OMNI ray_diffusion_trainer.py PolicyGradientRayTrainer.fit L1140-1214): gen_batch and its
    repeat run before the step timer; inside it only the post-gen repeat/union and the rollout-correction metrics."""
    text = _r(n.ALERT_IDLE, None, LEGACY_COLOCATED)
    assert "post-generation batch.repeat / union" in text and "rollout-correction metrics" in text
    assert "building gen_batch and its repeat happen before the step timer" in text
    sep = _r(n.ALERT_IDLE, CONFIGS["v1_separate_async"], {"trainer": "v1", "reward": "streamed",
                                                          "async_mode": "separate_async"})
    assert "parameter_sync_step` (now 4)" in sep


def _without(name: str, *drop: str, **settings):
    import dataclasses
    c = CONFIGS[name]
    kept = {k: v for k, v in c.settings.items() if k not in drop}
    return dataclasses.replace(c, settings={**kept, **settings})


def test_reward_bound_default_branches_a_config_that_states_no_reward_setting():
    """Issue 32 item 3, the branches left: a config read that states neither reward setting falls back to the
    layout's text (no config sharpening named, since a config was read); the actions per branch."""
    bare = _without("finished_on_cadence", "reward_model", "reward_pool")
    text = _r(n.ALERT_REWARD_BOUND, bare, LEGACY_COLOCATED)
    assert "enable_resource_pool=True" in text and "would say" not in text
    assert "would say" in _r(n.ALERT_REWARD_BOUND, None, LEGACY_COLOCATED)
    assert _r(n.ALERT_REWARD_BOUND, bare, STREAMED, action=True).startswith("Scale what scores while generating")
    assert _r(n.ALERT_REWARD_BOUND, None, {"trainer": "unknown", "reward": "unknown", "async_mode": "sync"},
              action=True).startswith("Colocated reward model? ")
    assert _r(n.ALERT_REWARD_BOUND, CONFIGS["v1_sync_reward_pool"], STREAMED, action=True) == \
        "Grow the reward pool: raise `reward.reward_model.n_gpus_per_node` (now 1)"
    assert _r(n.ALERT_REWARD_BOUND, CONFIGS["reward_server"], STREAMED, action=True).startswith(
        "Speed up the reward function")


def test_offload_branches_left_veomni_optimizer_only_and_a_config_without_offload_settings():
    veo_opt = _r(n.ALERT_STEP_REGRESSION, _with("veomni_offload", param_offload=False), cause="actor")
    assert "its optimizer is: `actor_rollout_ref.actor.veomni_config.optimizer_offload=False`" in veo_opt
    assert "param_offload=False" not in veo_opt and "fsdp_config.optimizer_offload" not in veo_opt
    # a config read that states no offload: both keys of its engine, not the "nothing is offloaded" branch
    bare = _r(n.ALERT_STEP_REGRESSION, _without("veomni_offload", "param_offload", "optimizer_offload"), cause="actor")
    assert "offload: `actor_rollout_ref.actor.veomni_config.param_offload=False`" in bare
    assert "nothing is offloaded" not in bare and "No trainer config was read" not in bare
    # SP 1 is named as the next lever only where the run has another SP
    assert "Ulysses SP 1" not in _r(n.ALERT_STEP_REGRESSION, CONFIGS["v1_sync_reward_pool"], cause="actor")


@pytest.mark.parametrize("alert,prefix", [(n.ALERT_STEP_REGRESSION, ""), (n.ALERT_MFU_LOW, "Check the device peak, then ")])
def test_the_actor_actions_per_config_branch(alert, prefix):
    """Every branch of the one-line actor action (StepTimeRegression cause=actor and MFUImplausiblyLow): the offload
    the run has on (parameters first, VeOmni's key for a VeOmni run), the micro batch when nothing is, a config
    without offload settings, no config."""
    act = lambda cfg: _r(alert, cfg, cause="actor", action=True)  # noqa: E731
    assert act(CONFIGS["veomni_offload"]).startswith(f"{prefix}`actor_rollout_ref.actor.veomni_config.param_offload"
                                                     "=False` (now True)")
    assert act(CONFIGS["reward_server"]).startswith(f"{prefix}`actor_rollout_ref.actor.fsdp_config.param_offload"
                                                    "=False` (now True)")
    assert act(_with("veomni_offload", param_offload=False)) == \
        f"{prefix}`actor_rollout_ref.actor.veomni_config.optimizer_offload=False` (now True)"
    assert act(_with("reward_server", param_offload=False)) == \
        f"{prefix}`actor_rollout_ref.actor.fsdp_config.optimizer_offload=False` (now True)"
    assert "`actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu` (now 8) if memory allows" in \
        act(CONFIGS["v1_sync_reward_pool"])
    bare = act(_without("reward_server", "param_offload", "optimizer_offload"))
    assert "ppo_micro_batch_size_per_gpu`" in bare and "(now" not in bare and "offload" not in bare
    assert "`actor_rollout_ref.actor.fsdp_config.param_offload=False`" in act(None) and "(now" not in act(None)


def test_mfu_low_names_the_micro_batch_value_only_with_nothing_offloaded():
    """With nothing offloaded the offload clause itself names the micro batch and its value (once); with an offload
    on, the micro batch follows the offload to turn off, with the run's value."""
    micro = "`actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu`"
    nothing = _r(n.ALERT_MFU_LOW, CONFIGS["v1_sync_reward_pool"])
    assert nothing.count(micro) == 1 and f"{micro} (now 8) amortises" in nothing
    offloaded = _r(n.ALERT_MFU_LOW, CONFIGS["reward_server"])
    assert f" and a larger {micro} (now 16)." in offloaded
    assert "fsdp_config.param_offload=False` (this run offloads its parameters)" in offloaded
    assert f" and a larger {micro}." in _r(n.ALERT_MFU_LOW, None)


def test_layered_summon_without_a_config_is_conditional_on_lora():
    unknown = _r(n.ALERT_STEP_REGRESSION, None, cause="actor")
    assert "for a LoRA run with both on keep `actor_rollout_ref.rollout.layered_summon=True`" in unknown
    assert "LoRA or not is unknown" in unknown


def test_weight_sync_action_per_sync_path():
    naive = _r(n.ALERT_STEP_REGRESSION, CONFIGS["finished_on_cadence"], cause="weight_sync", action=True)
    assert naive == "Colocated sync: check `actor_rollout_ref.rollout.layered_summon` (now true) and GPU memory"
    assert _r(n.ALERT_STEP_REGRESSION, CONFIGS["v1_separate_async"], cause="weight_sync", action=True) == (
        "Raise `actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes` (now 2048) if memory allows")
    assert _r(n.ALERT_STEP_REGRESSION, None, cause="weight_sync", action=True) == (
        "Check the sync path: `actor_rollout_ref.rollout.checkpoint_engine.backend` and its bucket size")


@pytest.mark.parametrize("severity", ["warning", "critical"])
def test_transferqueue_backlog_bounds_rollout_by_the_runs_off_policy_strategy(severity):
    """H13 (OMNI diffusion_trainer.yaml: max_off_policy_strategy drop | wait): a separate_async run that already drops
    stale trajectories is not told to drop them; one that waits is told drop with its value; no config: drop."""
    drop = _r(n.ALERT_TQ_BACKLOG, CONFIGS["v1_separate_async"], SEPARATE_ASYNC, severity=severity)
    assert "whose stale trajectories this run already drops" in drop and "max_off_policy_strategy=drop" not in drop
    assert "num_warmup_batches` (now 1)" in drop and "max_off_policy_threshold` (now 8)" in drop
    wait = _r(n.ALERT_TQ_BACKLOG, _with("v1_separate_async", off_policy_strategy="wait"), SEPARATE_ASYNC,
              severity=severity)
    assert "with `trainer.v1.sampler.max_off_policy_strategy=drop` (now wait)" in wait
    for cfg in (None, _without("v1_separate_async", "off_policy_strategy")):
        text = _r(n.ALERT_TQ_BACKLOG, cfg, SEPARATE_ASYNC, severity=severity)
        assert "with `trainer.v1.sampler.max_off_policy_strategy=drop`)" in text and "(now" not in text.split(
            "max_off_policy_strategy")[1][:12]


def _setting_switches():
    """Every SettingSwitch in every alert's remedy (text and action), with the alerts that carry it."""
    import dataclasses

    from omniwatch.alerting.prose import Prose, SettingSwitch

    def walk(x):
        if isinstance(x, SettingSwitch):
            yield x
        if isinstance(x, Prose):
            for p in x.parts:
                yield from walk(p)
            if isinstance(x, Remedy):
                yield from walk(x.action)
        elif dataclasses.is_dataclass(x):
            for f in dataclasses.fields(x):
                yield from walk(getattr(x, f.name))
        elif isinstance(x, (tuple, list)):
            for y in x:
                yield from walk(y)
    found: dict = {}
    for a in rulespec.alerts(DEFAULT):
        if a.remedy is not None:
            for node in walk(a.remedy):
                found.setdefault(node, a.name)
    return found


def test_every_config_branch_of_every_remedy_is_reachable_and_says_something_of_its_own():
    """Issue 32 item 3: each config branch (SettingSwitch case) of each remedy is chosen by a config stating its
    settings (no earlier case shadows it) and words the remedy differently from the branch a config without those
    settings gets; the tests above assert what each one says."""
    switches = _setting_switches()
    assert len(switches) >= 20

    def typed(conds):
        return {s: (v == "true") if v in ("true", "false") else (int(v) if v.isdigit() else v) for s, v in conds}
    # the settings around a branch: none, each fixture config's, and each case's conditions of any switch (a branch
    # that leaves out a nested clause differs from its default only where that clause's own settings hold)
    bases = [{}] + [dict(c.settings) for c in CONFIGS.values()] + [typed(c) for nd in switches for c, _ in nd.cases]
    layouts = [m for m in MODES if m is None or m["async_mode"] == "sync"] + [SEPARATE_ASYNC]
    labels = {"project": "p", "experiment": "e"}
    branches = 0
    for node, alert in switches.items():
        for conds, prose in node.cases:
            own = typed(conds)
            ctx = Ctx(labels, 1.0, setting_series(own), None)
            assert node.expect(ctx) == prose.expect(ctx), (alert, conds, "shadowed by an earlier case")
            assert any(prose.expect(Ctx(labels, 1.0, setting_series({**b, **own}), m))
                       != node.default.expect(Ctx(labels, 1.0, setting_series({k: v for k, v in b.items()
                                                                                if k not in own}), m))
                       for b in bases for m in layouts), (alert, conds, "says what the default says")
            branches += 1
    assert branches >= 40


def test_the_served_remedy_reads_the_config_info_as_prometheus_does():
    """The exporter's remedy texts (remedy_info, for the dashboards) and the report's verdict render a remedy with the
    run's omniwatch_trainer_config_info labels, as the alert annotation does in Prometheus: a VeOmni run is named
    VeOmni's Ulysses key (it was named FSDP's: the Ctx carried no engine), and a run without a config gets the
    LoRA-conditional layered_summon advice (info lora="unknown")."""
    from omniwatch import remedy_info
    from omniwatch.report.verdict import remedy as verdict_remedy
    veo = _with("_generated_diffusion_veomni_trainer", sp=2, micro_batch=4)
    assert veo.engine == "veomni" and veo.info_labels()["engine"] == "veomni"
    served = {ident[:3]: text for ident, _, _, text in remedy_info.rows(
        (("legacy", "colocated", "sync"), (tuple(sorted(veo.settings.items())), tuple(veo.info_labels().items())),
         None))}
    actor = served[(n.ALERT_STEP_REGRESSION, "warning", "actor")]
    assert "`actor_rollout_ref.actor.veomni_config.ulysses_parallel_size`, now 2" in actor, actor
    assert "fsdp_config.ulysses" not in actor
    assert "veomni_config.ulysses_parallel_size" in verdict_remedy(
        n.ALERT_STEP_REGRESSION, {"cause": "actor"}, LEGACY_COLOCATED, trainer_config=tc.describe(veo))
    none = {ident[:3]: text for ident, _, _, text in remedy_info.rows((("legacy", "colocated", "sync"), None, None))}
    assert "LoRA or not is unknown" in none[(n.ALERT_STEP_REGRESSION, "warning", "actor")]
    assert "LoRA or not is unknown" in verdict_remedy(n.ALERT_STEP_REGRESSION, {"cause": "actor"}, LEGACY_COLOCATED)


def test_a_serial_engine_with_step_execution_on_is_not_told_to_turn_it_on():
    """Found by the turned-defaults check: a serial replica was told `step_execution=True` where the config already
    had it. With it on VeRL-Omni does not clamp max_num_seqs (G1: `and not step_execution`), so the text names
    max_num_seqs with its value and the pipeline's step-wise hooks; off or unknown, step_execution stays the fix."""
    on = _with("finished_on_cadence", step_execution=True)
    text = _r(n.ALERT_ROLLOUT_SATURATED, on, LEGACY_COLOCATED, role="rollout", engine="serial")
    assert "step_execution=True" not in text and "step_execution` (now true)" in text
    assert "max_num_seqs` (now 1024)" in text and "denoise_step" in text
    assert _r(n.ALERT_ROLLOUT_SATURATED, on, LEGACY_COLOCATED, role="rollout", engine="serial", action=True) == \
        "Step-wise on: raise `actor_rollout_ref.rollout.max_num_seqs` (now 1024); the engine runs one request at a time"
    for cfg in (CONFIGS["finished_on_cadence"], None):
        assert "`actor_rollout_ref.rollout.step_execution=True`" in _r(
            n.ALERT_ROLLOUT_SATURATED, cfg, LEGACY_COLOCATED, role="rollout", engine="serial", action=True)
        assert "set `actor_rollout_ref.rollout.step_execution=True`" in _r(
            n.ALERT_ROLLOUT_SATURATED, cfg, LEGACY_COLOCATED, role="rollout", engine="serial")


def test_the_served_remedy_data_is_a_fresh_render():
    """remedy_texts.json, which the exporter loads instead of importing rule authoring (issue 34 item 2), is what
    `omniwatch generate` renders from alerting/remedies.py now (the drift check says the same)."""
    from omniwatch import remedy_info
    from omniwatch.alerting import rulegen
    from omniwatch.config import DEFAULT
    assert remedy_info.DATA.read_text(encoding="utf-8") == rulegen.remedy_data(DEFAULT)
