"""The trainer's resolved configuration: what the step log cannot say (docs/sources.md#trainer-configuration).

VeRL-Omni prints its resolved config at start (``TaskRunner.run``: ``pprint(OmegaConf.to_container(config,
resolve=True))``, ``main_diffusion.py:236`` / ``main_diffusion_v1.py:114``; on the Ray driver's console each
line carries Ray's ``(TaskRunner pid=N)`` prefix), Hydra writes the composed config to
``<run dir>/.hydra/config.yaml`` (unresolved: ``${...}`` interpolations kept), and anything else may be
given with ``--trainer-config FILE|GLOB|DIR``. Three readers, one result: :class:`TrainerConfig`, the few
facts omniwatch uses, associated with a run by ``trainer.project_name`` / ``trainer.experiment_name``
(verl's file logger writes ``<root>/<project_name>/<experiment_name>.jsonl``, so those are the run's labels).

Every reader is bounded (bytes, lines, nesting, interpolation depth) and never raises on bad input:
:class:`ConfigError` carries a counted reason (``omniwatch_ingest_errors_total{source="trainer_config"}``).

Cheap before it is read (issue 35 items 4 and 7): a file is chosen by its name and size before anything parses
it -- a directory walk takes Hydra's ``.hydra/config.yaml``, YAML / JSON files named ``*config*`` and console
logs (``*.log``, ``*.out``, ``*.txt``); a YAML / JSON file over :data:`MAX_CONFIG_BYTES` is not read; a console
log is read only in its first :data:`CONSOLE_HEAD_BYTES` (the config print comes at the trainer's start) and
only again when that head changed. YAML is read with libyaml's loader (``CSafeLoader``) and JSON with orjson.
The walk goes newest first (directories by modification time: Hydra's ``outputs/<date>/<time>/``) and says,
once, where it stopped; of several configs naming one run the newest file wins.
"""
from __future__ import annotations

import ast
import glob
import io
import logging
import os
import re
import tokenize
from dataclasses import asdict, dataclass, field

from .periodic import Periodic

log = logging.getLogger(__name__)

SOURCE = "trainer_config"       # the ingest-error / source_up label
MAX_BYTES = 8 << 20              # a pprint block larger than this is not read
MAX_CONFIG_BYTES = 1 << 20       # a YAML / JSON config file larger than this is not read (VeRL-Omni's: ~20 KiB)
CONSOLE_HEAD_BYTES = 1 << 20     # the head of a console log searched for the config print
MAX_NAME_CHARS = 1024            # trainer.project_name / experiment_name kept whole up to this (labels hash them)
MAX_POOL_GPUS = 100_000          # nnodes x n_gpus_per_node beyond this is not a GPU count (unknown)
MAX_LINES = 40_000               # pprint block lines (VeRL-Omni's whole config is ~600 at width 80)
MAX_FILES = 4096                 # files looked at per --trainer-config spec
MAX_DEPTH = 64                   # nesting of the parsed mapping
MAX_INTERP = 8                   # ${...} hops followed when resolving a key of an unresolved Hydra config
CONFIG_SUFFIXES = (".yaml", ".yml", ".json", ".log", ".txt", ".out")
MAX_DIRS = 2000                  # directories walked per --trainer-config DIR and scan (the newest first)
MAX_SUBDIRS = 256                # subdirectories of one directory walked (the newest)
SKIP_DIRS = {"checkpoints", "wandb", "tensorboard_log", "__pycache__", "node_modules"}

# Ray prefixes an actor's stdout on the driver with "(ActorName pid=N)" or "(ActorName pid=N, ip=A)"
# (docs.ray.io, "Logging": "(MyActor pid=480956) actor log message"); colour codes when a terminal.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RAY_PREFIX = re.compile(r"^\((?:[A-Za-z_][\w.:-]* )?pid=\d+(?:, ip=[0-9A-Fa-f.:]+)?\) ?")


class ConfigError(Exception):
    def __init__(self, reason: str, text: str = ""):
        super().__init__(text or reason)
        self.reason = reason


@dataclass(frozen=True)
class TrainerConfig:
    """What omniwatch reads from a trainer config (None: the config does not say)."""
    project: str | None
    experiment: str | None
    source: str                       # console (pprint in a followed log) | pprint | yaml (a file)
    total_steps: int | None = None    # trainer.total_training_steps (> 0; null: derived from epochs, unknown)
    save_freq: int | None = None      # trainer.save_freq (<= 0: never)
    test_freq: int | None = None      # trainer.test_freq (<= 0: never)
    sp: int | None = None             # Ulysses sequence parallel size of the actor engine
    engine: str | None = None         # fsdp | veomni (actor_rollout_ref.actor.strategy)
    lora: bool | None = None          # actor_rollout_ref.model.lora_rank > 0
    trainer: str | None = None        # legacy | v1
    async_mode: str | None = None     # V1 trainer_mode: sync | colocate_async | separate_async
    gpus_trainer: int | None = None   # trainer.nnodes x trainer.n_gpus_per_node
    gpus_reward_pool: int = 0         # reward.reward_model pool (enable_resource_pool)
    gpus_rollout_pool: int = 0        # standalone rollout (V1 separate_async, or fully async: pool_gpus)
    gpus_teacher_pool: int = 0        # distillation teacher pool (distillation.enabled: pool_gpus)
    path: str = field(default="", compare=False)  # where it was read (logs only; never a label)
    # the settings the remedies branch on (remedy_settings: closed names, closed values); issue 32
    settings: dict = field(default_factory=dict, compare=False, hash=False)
    mtime: float = field(default=0.0, compare=False)   # the file's modification time: the newest config of a run wins

    @property
    def gpus(self) -> int | None:
        if self.gpus_trainer is None:
            return None
        return self.gpus_trainer + self.gpus_reward_pool + self.gpus_rollout_pool + self.gpus_teacher_pool

    @property
    def key(self) -> tuple[str, str] | None:
        return (self.project, self.experiment) if self.project and self.experiment else None

    def pools(self) -> dict[str, int]:
        out = {}
        if self.gpus_trainer is not None:
            out["trainer"] = self.gpus_trainer
        if self.gpus_reward_pool:
            out["reward"] = self.gpus_reward_pool
        if self.gpus_rollout_pool:
            out["rollout"] = self.gpus_rollout_pool
        if self.gpus_teacher_pool:
            out["teacher"] = self.gpus_teacher_pool
        return out

    def to_json(self) -> dict:
        return asdict(self)

    def info_labels(self) -> dict[str, str]:
        """omniwatch_trainer_config_info's labels for this config (the exporter's series and the remedies' Ctx)."""
        return info_labels(asdict(self))

    @classmethod
    def from_json(cls, d: dict) -> "TrainerConfig":
        names = cls.__dataclass_fields__
        out = {k: v for k, v in d.items() if k in names}
        out["settings"] = clean_settings(out.get("settings"))  # a state file is input too
        return cls(**out)


# --- reading values out of a (possibly unresolved) mapping ----------------------------------------------
_INTERP = re.compile(r"^\$\{(?:oc\.select:)?([A-Za-z_][\w.]*)(?:,([^}]*))?\}$")
_MISSING = object()


def _lookup(root: dict, dotted: str, hops: int = 0):
    node = root
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    if isinstance(node, str) and node.startswith("${") and hops < MAX_INTERP:
        m = _INTERP.match(node.strip())
        if m is None:
            return _MISSING  # ${oc.env:...}, relative or nested interpolation: unknown here
        got = _lookup(root, m.group(1), hops + 1)
        if got is _MISSING and m.group(2) is not None:
            return _scalar(m.group(2).strip())
        return got
    return node


def _scalar(text: str):
    low = text.lower()
    if low in ("null", "none", "~"):
        return None
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def _int(root: dict, dotted: str) -> int | None:
    v = _lookup(root, dotted)
    if v is _MISSING or v is None or isinstance(v, bool):
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, str):
        try:
            v = int(v.strip())
        except ValueError:
            return None
    if not isinstance(v, int) or abs(v) > 10**9:
        return None
    return v


def _str(root: dict, dotted: str, limit: int = 128) -> str | None:
    v = _lookup(root, dotted)
    if not isinstance(v, str) or not v or v.startswith("${") or v == "???" or len(v) > limit:
        return None
    return v


def _bool(root: dict, dotted: str) -> bool | None:
    v = _lookup(root, dotted)
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    return None


def _depth_ok(obj, limit: int = MAX_DEPTH) -> bool:
    """Nesting within ``limit`` and a bounded number of containers; a container reached twice (a YAML
    alias) is looked at once, so an alias bomb costs its distinct nodes, not its expansion."""
    stack, seen = [(obj, 0)], set()
    while stack:
        node, d = stack.pop()
        if d > limit:
            return False
        if isinstance(node, (dict, list)):
            if id(node) in seen:
                continue
            seen.add(id(node))
            if len(seen) > 200_000:
                return False
            stack.extend((v, d + 1) for v in (node.values() if isinstance(node, dict) else node))
    return True


def facts(d: dict, source: str, path: str = "") -> TrainerConfig:
    """The facts of one resolved or unresolved VeRL-Omni config mapping (docs/verl-source.md C1-C6)."""
    if not isinstance(d, dict) or not isinstance(d.get("trainer"), dict):
        raise ConfigError("not_a_trainer_config", "no `trainer` section")
    if not _depth_ok(d):
        raise ConfigError("too_deep")
    strategy = _str(d, "actor_rollout_ref.actor.strategy")
    engine = None
    if strategy:
        # labels are a closed set: a config never puts its own strings into a series
        engine = "veomni" if strategy == "veomni" else ("fsdp" if strategy.startswith("fsdp") else "other")
    sp = sequence_parallel(d, engine)
    lora = uses_lora(d)
    use_v1 = _bool(d, "trainer.use_v1")
    trainer = None if use_v1 is None else ("v1" if use_v1 else "legacy")
    mode = _str(d, "trainer.v1.trainer_mode") if use_v1 else None
    if mode is not None and mode not in ("sync", "colocate_async", "separate_async"):
        mode = "other"
    nn, per = _int(d, "trainer.nnodes"), _int(d, "trainer.n_gpus_per_node")
    gpus_trainer = nn * per if nn and per and nn > 0 and per > 0 and nn * per <= MAX_POOL_GPUS else None
    reward_pool, rollout_pool, teacher_pool = pool_gpus(d, mode)
    total = _int(d, "trainer.total_training_steps")
    return TrainerConfig(
        # whole names: a run's label is made from its whole name (a long one hashed, runlabel.py), so must the key
        project=_str(d, "trainer.project_name", MAX_NAME_CHARS),
        experiment=_str(d, "trainer.experiment_name", MAX_NAME_CHARS), source=source,
        total_steps=total if total is not None and total > 0 else None,
        save_freq=_int(d, "trainer.save_freq"), test_freq=_int(d, "trainer.test_freq"), sp=sp, engine=engine,
        lora=lora, trainer=trainer, async_mode=mode, gpus_trainer=gpus_trainer,
        gpus_reward_pool=reward_pool, gpus_rollout_pool=rollout_pool, gpus_teacher_pool=teacher_pool, path=path,
        settings=remedy_settings(d, engine))


def _pool(d: dict, nodes: str, per: str) -> int:
    nn, pp = _int(d, nodes), _int(d, per)
    return nn * pp if nn and pp and nn > 0 and pp > 0 and nn * pp <= MAX_POOL_GPUS else 0


def pool_gpus(d: dict, mode: str | None) -> tuple[int, int, int]:
    """GPUs of the pools beside the trainer's global pool (docs/verl-source.md H9, H11): (reward, standalone
    rollout, distillation teacher).

    - reward: ``reward.reward_model.{nnodes,n_gpus_per_node}`` when ``reward.reward_model.enable_resource_pool``
      (VeRL-Omni ``main_diffusion.py`` / ``main_omni.py`` ``init_resource_pool_mgr``);
    - standalone rollout: ``actor_rollout_ref.rollout.{nnodes,n_gpus_per_node}`` in a V1 ``separate_async`` run
      (``trainer_separate_async.py``), or the top-level ``rollout.{nnodes,n_gpus_per_node}`` of a fully async run
      (``actor_rollout_ref.hybrid_engine: false``: VeRL-Omni's ``omni_megatron_trainer.yaml``, verl's
      ``fully_async_trainer.py`` counts them as its standalone GPUs);
    - teacher: ``distillation.{nnodes,n_gpus_per_node}`` when ``distillation.enabled`` (verl's V1
      ``trainer_base.py``: ``resource_pool_spec["teacher_pool"]``; VeRL-Omni's omni trainers run it). VeRL-Omni's
      diffusion distillation config has no pool keys: its teacher runs in the actor's workers."""
    reward = _pool(d, "reward.reward_model.nnodes", "reward.reward_model.n_gpus_per_node") \
        if _bool(d, "reward.reward_model.enable_resource_pool") else 0
    rollout = 0
    if mode == "separate_async":
        rollout = _pool(d, "actor_rollout_ref.rollout.nnodes", "actor_rollout_ref.rollout.n_gpus_per_node")
    elif _bool(d, "actor_rollout_ref.hybrid_engine") is False:
        rollout = _pool(d, "rollout.nnodes", "rollout.n_gpus_per_node")
    teacher = _pool(d, "distillation.nnodes", "distillation.n_gpus_per_node") \
        if _bool(d, "distillation.enabled") else 0
    return reward, rollout, teacher


def sequence_parallel(d: dict, engine: str | None) -> int | None:
    """The actor's Ulysses SP size (docs/verl-source.md H6, H11). VeOmni: ``veomni_config.ulysses_parallel_size``.
    FSDP: ``fsdp_config.ulysses_sequence_parallel_size``, unless the deprecated actor-level
    ``actor.ulysses_sequence_parallel_size`` is above 1: verl's ``FSDPActorConfig.__post_init__`` then copies it
    over the engine's (the omni trainer's config still carries that key)."""
    if engine == "veomni":
        sp = _int(d, "actor_rollout_ref.actor.veomni_config.ulysses_parallel_size")
    else:
        sp = _int(d, "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size")
        old = _int(d, "actor_rollout_ref.actor.ulysses_sequence_parallel_size")
        if old is not None and (old > 1 or sp is None):
            sp = old
    return sp if sp is not None and sp >= 1 else None


def lora_rank(d: dict) -> int | None:
    """The LoRA rank as verl reads it (``RayPPOTrainer.__init__``, docs/verl-source.md H8): ``model.lora.rank`` when
    above 0 (the omni trainer's LoRA section), else ``model.lora_rank``. None: the config states neither."""
    nested = _int(d, "actor_rollout_ref.model.lora.rank")
    flat = _int(d, "actor_rollout_ref.model.lora_rank")
    if nested is not None and nested > 0:
        return nested
    return flat if flat is not None else nested


def uses_lora(d: dict) -> bool | None:
    """LoRA as verl decides it (``ref_in_actor``): a rank above 0 or a ``model.lora_adapter_path``."""
    rank = lora_rank(d)
    adapter = _lookup(d, "actor_rollout_ref.model.lora_adapter_path")
    if isinstance(adapter, str) and adapter and not adapter.startswith("${"):
        return True
    return None if rank is None else rank > 0


# --- the settings remedies branch on (issue 32 item 5) ---------------------------------------------------
# canonical name -> (kind, config path; "{engine}" = the actor engine's section: fsdp_config | veomni_config).
# Every path is a key of VeRL-Omni's composed config (tests/fixtures/verl_omni/config_keys*.txt), cited in
# docs/verl-source.md section H. Values are a closed set: booleans, bounded integers, or one of ENUMS' words.
SETTINGS: dict[str, tuple[str, str]] = {
    "engine": ("enum", ""),  # the actor engine (actor_rollout_ref.actor.strategy: fsdp | fsdp2 -> fsdp, veomni)
    "sp": ("int", ""),  # sequence_parallel(): the actor's Ulysses SP size
    "param_offload": ("bool", "actor_rollout_ref.actor.{engine}.param_offload"),
    "optimizer_offload": ("bool", "actor_rollout_ref.actor.{engine}.optimizer_offload"),
    "micro_batch": ("int", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
    "gradient_checkpointing": ("bool", "actor_rollout_ref.model.enable_gradient_checkpointing"),
    "lora_rank": ("int", ""),  # lora_rank(): model.lora.rank or model.lora_rank
    "layered_summon": ("bool", "actor_rollout_ref.rollout.layered_summon"),
    "free_cache_engine": ("bool", "actor_rollout_ref.rollout.free_cache_engine"),
    "checkpoint_backend": ("enum", "actor_rollout_ref.rollout.checkpoint_engine.backend"),
    "bucket_megabytes": ("int", "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"),
    "max_num_seqs": ("int", "actor_rollout_ref.rollout.max_num_seqs"),
    "step_execution": ("bool", "actor_rollout_ref.rollout.step_execution"),
    "rollout_tp": ("int", "actor_rollout_ref.rollout.tensor_model_parallel_size"),
    "reward_model": ("bool", "reward.reward_model.enable"),
    "reward_pool": ("bool", "reward.reward_model.enable_resource_pool"),
    "reward_pool_gpus_per_node": ("int", "reward.reward_model.n_gpus_per_node"),
    "reward_pool_nodes": ("int", "reward.reward_model.nnodes"),
    "reward_tp": ("int", "reward.reward_model.rollout.tensor_model_parallel_size"),
    "reward_workers": ("int", "reward.num_workers"),
    "parameter_sync_step": ("int", "trainer.v1.separate_async.parameter_sync_step"),
    "warmup_batches": ("int", "trainer.v1.separate_async.num_warmup_batches"),
    "off_policy_threshold": ("int", "trainer.v1.sampler.max_off_policy_threshold"),
    "off_policy_strategy": ("enum", "trainer.v1.sampler.max_off_policy_strategy"),
    "resume_mode": ("enum", "trainer.resume_mode"),
    "trainer_gpus": ("int", ""),  # trainer.nnodes x trainer.n_gpus_per_node
}
# The words an enum setting may take (anything else reads "other"): verl's registered checkpoint engines
# (verl/checkpoint_engine/*.py, CheckpointEngineRegistry.register) and trainer.resume_mode's values.
ENUMS: dict[str, tuple[str, ...]] = {
    "engine": ("fsdp", "veomni"),
    "checkpoint_backend": ("naive", "nccl", "hccl", "nixl", "mooncake", "kimi_ckpt_engine", "delta_sharded"),
    "resume_mode": ("auto", "disable", "resume_path"),
    "off_policy_strategy": ("drop", "wait"),  # diffusion_trainer.yaml L257-260
}
MAX_SETTING = 10**7  # an integer setting beyond this is not a config omniwatch understands


def _setting_ok(name: str, v) -> bool:
    kind = SETTINGS.get(name, ("", ""))[0]
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_SETTING
    if kind == "enum":
        return isinstance(v, str) and (v in ENUMS[name] or v == "other")
    return False


def clean_settings(raw) -> dict:
    """Only known settings with values of their kind (a restored state file is input like any other)."""
    if not isinstance(raw, dict):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and _setting_ok(k, v)}


def remedy_settings(d: dict, engine: str | None) -> dict:
    """The settings of ``SETTINGS`` this config states (a key it does not state is left out, never guessed)."""
    section = "veomni_config" if engine == "veomni" else "fsdp_config"
    out: dict = {}
    for name, (kind, path) in SETTINGS.items():
        if name == "engine":
            v = engine
        elif name == "sp":
            v = sequence_parallel(d, engine)
        elif name == "lora_rank":
            v = lora_rank(d)
        elif name == "trainer_gpus":
            nn, per = _int(d, "trainer.nnodes"), _int(d, "trainer.n_gpus_per_node")
            v = nn * per if nn and per and nn > 0 and per > 0 else None
        elif kind == "bool":
            v = _bool(d, path.format(engine=section))
        elif kind == "int":
            v = _int(d, path.format(engine=section))
        else:
            v = _str(d, path)
            if v is not None and v not in ENUMS[name]:
                v = "other"
        if v is not None and _setting_ok(name, v):
            out[name] = v
    return out


def setting_word(v) -> str:
    """A setting's value as the ``value`` label says it: true / false, the integer, the enum word."""
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


# --- pprint (console) ----------------------------------------------------------------------------------
def _literal(text: str):
    """``ast.literal_eval`` of pprint's output; ``inf`` / ``nan`` (floats pprint writes bare) become None."""
    if "inf" in text or "nan" in text:
        try:
            toks = []
            for tok in tokenize.generate_tokens(io.StringIO(text).readline):
                if tok.type == tokenize.NAME and tok.string in ("inf", "nan"):
                    tok = tok._replace(string="None")
                toks.append((tok.type, tok.string))
            text = tokenize.untokenize(toks)
        except (tokenize.TokenError, IndentationError, SyntaxError):
            raise ConfigError("malformed_pprint") from None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise ConfigError("malformed_pprint") from None


class PprintBlock:
    """Collects a pprinted config from console lines, one at a time: a block starts at a line that opens
    with ``{'`` (after Ray's prefix) and ends where its brackets balance. ``feed`` returns the parsed
    mapping at the block's last line, else None; raises :class:`ConfigError` for a block that is not one.

    Only the block's own lines count: every line pprint writes after the first starts with a space and, on a Ray
    driver's console, carries the same ``(TaskRunner pid=N)`` prefix; a line of another process (or any line that
    does not start with a space) printed in between is left out, so an unclosed ``[`` in it cannot hold the block
    open (issue 35 item 7). A new ``{'`` line while a block is open starts the block again from it."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.size = 0
        self.depth = 0
        self.prefix = ""

    @staticmethod
    def _depth(line: str) -> int:
        d, quote, i, n = 0, "", 0, len(line)
        while i < n:
            c = line[i]
            if quote:
                if c == "\\":
                    i += 1
                elif c == quote:
                    quote = ""
            elif c in "'\"":
                quote = c
            elif c in "([{":
                d += 1
            elif c in ")]}":
                d -= 1
            i += 1
        return d

    def feed(self, raw: str | bytes) -> dict | None:
        line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        line = line.rstrip("\r\n")
        if "\x1b" in line:
            line = _ANSI.sub("", line)
        m = _RAY_PREFIX.match(line)
        prefix = m.group(0).strip() if m else ""
        line = line[m.end():] if m else line
        if line.startswith("{'"):
            self.reset()    # a (new) print starts here
            self.prefix = prefix
        elif not self.lines:
            return None
        elif prefix != self.prefix or not line[:1].isspace():
            return None     # another process's line, or not pprint's continuation: not part of the block
        self.lines.append(line)
        self.size += len(line) + 1
        self.depth += self._depth(line)
        if len(self.lines) > MAX_LINES or self.size > MAX_BYTES:
            self.reset()
            raise ConfigError("config_too_large")
        if self.depth > 0:
            return None
        text = "\n".join(self.lines)
        self.reset()
        obj = _literal(text)
        if not isinstance(obj, dict):
            raise ConfigError("not_a_trainer_config")
        if not isinstance(obj.get("trainer"), dict):
            return None  # some other dict printed on the console: not ours, not an error
        return obj

    def reset(self) -> None:
        self.lines, self.size, self.depth, self.prefix = [], 0, 0, ""


def parse_pprint_text(text: str) -> dict:
    """The first trainer config pprinted in ``text`` (a console log)."""
    block = PprintBlock()
    for line in text.splitlines():
        got = block.feed(line)
        if got is not None:
            return got
    raise ConfigError("no_config_found")


_FLOW_NEST = re.compile(r"[\[{]{%d,}" % (MAX_DEPTH + 1))


def parse_yaml_text(text: str) -> dict:
    import yaml

    from . import yamlio
    if _FLOW_NEST.search(re.sub(r"[ \t\r\n]+", "", text[:MAX_BYTES])):
        raise ConfigError("too_deep")  # PyYAML composes recursively: refuse before it recurses
    try:
        obj = yamlio.load(text)   # libyaml's safe loader when the wheel has it (~10x faster)
    except (yaml.YAMLError, RecursionError, ValueError) as e:
        raise ConfigError("malformed_yaml", str(e)[:120]) from None
    if not isinstance(obj, dict):
        raise ConfigError("not_a_trainer_config")
    return obj


def parse_json_bytes(data: bytes) -> dict:
    import orjson
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise ConfigError("malformed_json", str(e)[:120]) from None
    if not isinstance(obj, dict):
        raise ConfigError("not_a_trainer_config")
    return obj


STRUCTURED = (".yaml", ".yml", ".json")
CONSOLE = (".log", ".out", ".txt")


def read_file(path: str, source: str | None = None) -> TrainerConfig:
    """One config file: YAML / JSON (Hydra's ``.hydra/config.yaml``, a saved config; at most MAX_CONFIG_BYTES)
    or a console log with VeRL-Omni's pprint (its first CONSOLE_HEAD_BYTES)."""
    structured = path.endswith(STRUCTURED)
    try:
        st = os.stat(path)
        if not os.path.isfile(path):
            raise ConfigError("not_regular_file")
        if structured and st.st_size > MAX_CONFIG_BYTES:
            raise ConfigError("config_too_large")
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1 if structured else CONSOLE_HEAD_BYTES)
    except ConfigError:
        raise
    except OSError as e:
        raise ConfigError("unreadable_file", e.strerror or str(e)) from None
    if b"\x00" in data:
        raise ConfigError("not_a_trainer_config", "binary file")
    if path.endswith(".json"):
        return _dated(facts(parse_json_bytes(data), source or "yaml", path), st)
    text = data.decode("utf-8", "replace")
    if structured:
        return _dated(facts(parse_yaml_text(text), source or "yaml", path), st)
    return _dated(facts(parse_pprint_text(text), source or "pprint", path), st)


def _dated(cfg: TrainerConfig, st: os.stat_result) -> TrainerConfig:
    from dataclasses import replace
    return replace(cfg, mtime=st.st_mtime)


def wanted(name: str, parent: str) -> bool:
    """A file a directory walk reads (by its name alone): Hydra's ``.hydra/config.yaml``, a YAML / JSON file with
    ``config`` in its name, a console log."""
    low = name.lower()
    if parent == ".hydra":
        return low == "config.yaml"
    if low.endswith(STRUCTURED):
        return "config" in low
    return low.endswith(CONSOLE)


def _newest_first(top: str, names: list[str]) -> list[str]:
    def mtime(d: str) -> float:
        try:
            return os.stat(os.path.join(top, d)).st_mtime
        except OSError:
            return 0.0
    return sorted(names, key=lambda d: (-mtime(d), d))


def expand(spec: str, said: dict | None = None) -> list[str]:
    """The config files of one ``--trainer-config`` spec: a file, a glob, or a directory (searched for
    ``.hydra/config.yaml`` and config files by name, the newest directories first, bounded). ``said``: where the
    walk stopped is logged once per spec and kind of stop (``said`` remembers)."""
    if os.path.isdir(spec):
        out: list[str] = []
        visited = 0
        stops: list[str] = []
        for top, dirs, files in os.walk(spec):
            visited += 1
            if visited > MAX_DIRS:  # bounded: a DIR with checkpoint trees under it is not walked whole
                stops.append(f"{MAX_DIRS} directories walked (the newest first); older ones not read")
                break
            keep = [d for d in dirs if d == ".hydra" or not (d.startswith(".") or d.startswith("global_step_")
                                                              or d in SKIP_DIRS)]
            if len(keep) > MAX_SUBDIRS:
                stops.append(f"{os.path.relpath(top, spec)}: the {MAX_SUBDIRS} newest of {len(keep)} subdirectories "
                             "walked")
            dirs[:] = _newest_first(top, keep)[:MAX_SUBDIRS]
            base = os.path.basename(top)
            if base == ".hydra":
                if "config.yaml" in files:
                    out.append(os.path.join(top, "config.yaml"))
                continue
            out += [os.path.join(top, f) for f in sorted(files) if wanted(f, base)]
            if len(out) >= MAX_FILES:
                stops.append(f"{MAX_FILES} files found; the rest not read")
                break
        for why in stops:
            if said is not None and said.get((spec, why[:40])) is None:
                said[(spec, why[:40])] = why
                log.warning("trainer config %s: %s", spec, why)
        return out[:MAX_FILES]
    if glob.has_magic(spec):
        return sorted(p for p in glob.glob(spec, recursive=True) if os.path.isfile(p))[:MAX_FILES]
    return [spec]


class ConfigWatch(Periodic):
    """``--trainer-config``: (re)reads every spec's files when they change (every ``interval`` s) and
    hands each config to the store. A file that is no trainer config is skipped; one that should be
    (a YAML or JSON file, a named file) and cannot be read is a counted skip, once per change."""

    thread_name, what, join_timeout = "omniwatch-trainer-config", "trainer config scan", 2.0

    def __init__(self, store, specs: list[str], interval: float = 10.0):
        super().__init__(interval)
        self.store, self.specs = store, list(specs)
        self._seen: dict[str, tuple] = {}
        self._said: dict = {}
        for spec in self.specs:  # a spec whose files do not exist yet (a run not started) is not down
            if hasattr(store, "set_source_up"):
                from .redact import redact
                store.set_source_up(SOURCE, redact(spec), True)

    def scan_once(self) -> int:
        applied = 0
        for spec in self.specs:
            named = not os.path.isdir(spec) and not glob.has_magic(spec)
            try:
                files = expand(spec, self._said)
            except OSError:
                continue
            for path in files:
                try:
                    st = os.stat(path)
                    # a console log is read in its head only: it is read again when the head changed (a new file
                    # at the path, a truncation, a head not complete yet), not at every step it logs
                    sig = (st.st_mtime, st.st_size) if path.endswith(STRUCTURED) or st.st_size < CONSOLE_HEAD_BYTES \
                        else ("head", st.st_dev, st.st_ino)
                except OSError:
                    if named and self._seen.get(path) != (0.0, -1):
                        self._seen[path] = (0.0, -1)
                        self.store.count_error(SOURCE, "unreadable_file")
                    continue
                if self._seen.get(path) == sig:
                    continue
                self._seen[path] = sig
                try:
                    cfg = read_file(path)
                except ConfigError as e:
                    structured = path.endswith(STRUCTURED)
                    if named or structured or e.reason not in ("no_config_found", "not_a_trainer_config"):
                        self.store.count_error(SOURCE, e.reason)
                        log.warning("trainer config %s skipped: %s", os.path.basename(path), e)
                    continue
                except Exception:  # never let one file stop the watch
                    log.exception("trainer config %s: unexpected failure", os.path.basename(path))
                    self.store.count_error(SOURCE, "parser_bug")
                    continue
                if cfg.key is None:
                    self.store.count_error(SOURCE, "no_run_name")
                    continue
                self.store.set_trainer_config(cfg)
                applied += 1
        return applied



def load_all(specs: list[str], errors: dict[str, int] | None = None) -> dict[tuple[str, str], TrainerConfig]:
    """Every config of ``specs`` once (offline: backtest, report), by run; skips counted in ``errors``."""
    class _Sink:
        def __init__(self):
            self.configs: dict[tuple[str, str], TrainerConfig] = {}

        def count_error(self, source, reason, n=1):
            if errors is not None:
                errors[reason] = errors.get(reason, 0) + n

        def set_trainer_config(self, cfg):
            self.configs[cfg.key] = cfg
    sink = _Sink()
    ConfigWatch(sink, specs).scan_once()
    return sink.configs


# --- exposition ---------------------------------------------------------------------------------------
def owned() -> tuple[str, ...]:
    from . import names as n
    return (n.TRAINER_CONFIG_INFO, n.TRAINER_CONFIG_TOTAL_STEPS, n.TRAINER_CONFIG_EVERY, n.TRAINER_CONFIG_SP,
            n.TRAINER_CONFIG_GPUS, n.TRAINER_CONFIG_SETTING)


def info_labels(d: dict) -> dict[str, str]:
    """omniwatch_trainer_config_info's labels from a config's fields (``TrainerConfig.to_json`` / ``describe``)."""
    return {"source": str(d.get("source") or "unknown"), **{k: _word(d.get(k)) for k in
                                                            ("engine", "trainer", "async_mode", "lora")}}


def _word(v) -> str:
    if v is None:
        return "unknown"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


class ConfigCollector:
    """What was read of each exported run's trainer config (``source="none"``: nothing; omniwatch assumes)."""

    def __init__(self, store):
        self.store = store

    def describe(self):
        from . import names as n
        return n.describe(owned())

    def collect(self):
        from . import names as n
        fams = {name: n.family(name) for name in owned()}
        s = self.store
        with s.lock:
            now = s.clock()
            for (project, experiment), run in s.runs.items():
                if s.hidden(run, now) or run.last is None:
                    continue
                rl, c = [project, experiment], run.config
                if c is None:
                    fams[n.TRAINER_CONFIG_INFO].add_metric(rl + ["none"] + ["unknown"] * 4, 1)
                    continue
                fams[n.TRAINER_CONFIG_INFO].add_metric(rl + list(c.info_labels().values()), 1)
                if c.total_steps is not None:
                    fams[n.TRAINER_CONFIG_TOTAL_STEPS].add_metric(rl, c.total_steps)
                for kind, v in (("checkpoint", c.save_freq), ("validation", c.test_freq)):
                    if v is not None:
                        fams[n.TRAINER_CONFIG_EVERY].add_metric(rl + [kind], v)
                if c.sp is not None:
                    fams[n.TRAINER_CONFIG_SP].add_metric(rl, c.sp)
                for pool, v in c.pools().items():
                    fams[n.TRAINER_CONFIG_GPUS].add_metric(rl + [pool], v)
                for name, v in setting_series(c.settings):
                    fams[n.TRAINER_CONFIG_SETTING].add_metric(rl + [name, setting_word(c.settings[name])], v)
        yield from fams.values()


def setting_series(settings: dict) -> list[tuple[str, float]]:
    """(setting, sample) of each stated setting, in SETTINGS' order: booleans 1 / 0, integers as they are, enums 1."""
    out = []
    for name in SETTINGS:
        if name in settings:
            v = settings[name]
            out.append((name, 1.0 if isinstance(v, str) else float(v)))
    return out


# --- what was assumed (alert annotations say it in PromQL; the report and `backtest` in words) -----------
def assumptions(cfg: TrainerConfig | None) -> list[str]:
    """What omniwatch assumed for a run because its config did not say (empty: nothing)."""
    if cfg is None:
        return ["no trainer configuration read: the end of the run (trainer.total_training_steps) is unknown, so "
                "a finish on the checkpoint/validation cadence cannot be told from a hang",
                "checkpoint/validation cadence (save_freq/test_freq) inferred from the steps that carried them; a kind "
                "not seen yet keeps a reserve in TrainingStalled",
                "Ulysses SP=1 (MFU judged as reported)",
                "GPUs from the log (perf/total_num_images / (throughput x time_per_step): the resource pools only, "
                "not a standalone rollout), from Ray's placement groups (--ray-tasks: every pool) or --gpus"]
    out = []
    if cfg.total_steps is None:
        out.append("trainer.total_training_steps is null (derived from the epochs): the end of the run is unknown "
                   "unless the console's \"Total training steps\" line is read")
    if cfg.save_freq is None or cfg.test_freq is None:
        out.append("save_freq/test_freq not in the config: inferred from the steps")
    if cfg.sp is None:
        out.append("Ulysses SP not in the config: SP=1 assumed")
    if cfg.gpus is None:
        out.append("trainer.nnodes x n_gpus_per_node not in the config: GPUs from the log or --gpus")
    return out


def describe(cfg: TrainerConfig | None) -> dict | None:
    """What was read, for JSON output (no path: it may name a home directory)."""
    if cfg is None:
        return None
    d = cfg.to_json()
    d.pop("path", None)
    d["gpus"] = cfg.gpus
    return d


def attach(runs: list, specs: list[str] | None) -> dict[str, int]:
    """``--trainer-config`` for offline commands: each recorded run gets the config that names it
    (``trainer.project_name`` / ``trainer.experiment_name``); a single run given a single config gets it
    whatever its names. Returns the counted skips (reason -> files)."""
    errors: dict[str, int] = {}
    if not specs:
        return errors
    configs = load_all(specs, errors)
    only = next(iter(configs.values())) if len(configs) == 1 and len(runs) == 1 else None
    for r in runs:
        cfg = configs.get((r.project, r.experiment)) or only
        if cfg is not None:
            r.trainer_config = cfg
    return errors
