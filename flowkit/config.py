"""flowkit's configuration: a closed, typed OmegaConf schema built from dataclasses.

Sources, merged in this order: the schema's defaults, an optional YAML file (``-c FILE``),
then dotlist overrides (``ppo.lr=3e-4``). Each algorithm adds its own section keyed by its
name (``ppo.*``); plugins may add further sections (``multiagent.*``) through the
``flowkit_add_config_sections`` hook. ``env=ID`` is a shorthand for ``env.id=ID``.

Each field declares the values it allows where it is declared (``F(3e-4, "Adam learning
rate", gt=0)``; floats must be finite, ints fit in 64 bits) and :func:`check_values` checks
them all once the config is built; an algorithm's ``validate_config`` keeps only checks that
relate several keys. Every problem is a :class:`ConfigError` raised before anything starts:
one line naming the key, what was expected and what was given, and for an unknown key the
closest valid one.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, InterpolationResolutionError, OmegaConfBaseException, ValidationError


class ConfigError(ValueError):
    """A configuration problem; the message names the key(s) and value(s) involved."""


def schedule_keys(section: Any) -> Tuple[str, ...]:
    """The schedules a config section declares: its keys named ``*_schedule`` (each
    ``constant`` or ``linear``; a linear one takes its value from the section's base key to 0
    over ``schedule_env_steps`` env steps sampled, default ``stop.env_steps``). ``section``: a
    DictConfig or a dataclass (class or instance)."""
    names = [f.name for f in dataclasses.fields(section)] if dataclasses.is_dataclass(section) else list(section)
    return tuple(str(k) for k in names if str(k).endswith("_schedule"))


def check_schedules(section: Any, name: str, run_config: Any) -> None:
    """A linear schedule ``<name>.<key>=linear`` (``key`` in :func:`schedule_keys`) needs a
    horizon: ``<name>.schedule_env_steps`` or ``stop.env_steps``. Run by :func:`build_config`
    for every section and by ``Algorithm.validate_config`` (a multi-agent policy's own
    section), so an algorithm declares a schedule by its field alone.

    Raises:
        ConfigError: ``<name>.<key>=linear needs a horizon: ...``.
    """
    for key in schedule_keys(section):
        if _field(section, key) == "linear" and _field(section, "schedule_env_steps") is None \
                and run_config.stop.env_steps is None:
            raise ConfigError(f"{name}.{key}=linear needs a horizon: set {name}.schedule_env_steps or stop.env_steps")


def schedule_horizon(section: Any, run_config: Any) -> Optional[int]:
    """Env steps sampled at which the section's linear schedules reach 0, or None when none
    of its :func:`schedule_keys` is ``linear``."""
    if section is None or "linear" not in [_field(section, k) for k in schedule_keys(section)]:
        return None
    return int(_field(section, "schedule_env_steps") or run_config.stop.env_steps)


def _field(section: Any, key: str) -> Any:
    """``section.key`` of a DictConfig or a dataclass instance; None where it has no such key."""
    return section.get(key) if isinstance(section, DictConfig) else getattr(section, key, None)


def round_env_steps(run_config: Any) -> int:
    """Env steps of one sampling round: ``runtime.num_workers`` (0 counts as 1: the local
    worker samples) x ``num_envs_per_worker`` x ``rollout_fragment_length``."""
    rt = run_config.runtime
    return max(1, int(rt.num_workers)) * int(rt.num_envs_per_worker) * int(rt.rollout_fragment_length)


INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1
# Hard limits of the size keys (far above any real run on one machine; a value past them is a
# typo or a unit mix-up that would otherwise hang or exhaust memory before any message):
MAX_BATCH_ROWS = 2 ** 24  # env steps in one sample batch, one sampling round or one train batch
MAX_EPISODES = 100_000  # episodes of one evaluation


@dataclass(frozen=True)
class Allowed:
    """The values a field allows: bounds (``gt``/``ge``/``lt``/``le``), ``choices``, a
    ``pattern`` (regular expression a string must match in full), and for floats whether
    they must be ``finite``. Ints always fit in 64 bits. For a list or a mapping, every
    item must be allowed."""
    gt: Optional[float] = None
    ge: Optional[float] = None
    lt: Optional[float] = None
    le: Optional[float] = None
    choices: Optional[Tuple[Any, ...]] = None
    pattern: Optional[str] = None
    finite: bool = True

    def describe(self, is_float: bool = False, say_finite: bool = True) -> str:
        """``> 0``, ``in [0, 1]``, ``'a' or 'b'``, ``finite and >= 0`` (``say_finite``: name
        the finiteness of a float); "" when anything goes."""
        if self.choices is not None:
            c = [repr(x) for x in self.choices]
            return c[0] if len(c) == 1 else f"{', '.join(c[:-1])} or {c[-1]}"
        lo = (">", self.gt) if self.gt is not None else (">=", self.ge) if self.ge is not None else None
        hi = ("<", self.lt) if self.lt is not None else ("<=", self.le) if self.le is not None else None
        if lo and hi:
            text = f"in {'(' if lo[0] == '>' else '['}{_num(lo[1])}, {_num(hi[1])}{')' if hi[0] == '<' else ']'}"
        else:
            one = lo or hi
            text = f"{one[0]} {_num(one[1])}" if one else ""
        if self.pattern is not None:
            return f"matching {self.pattern}"
        if is_float and self.finite and say_finite and not (lo and hi):
            text = f"finite and {text}" if text else "finite"
        return text

    def ok(self, v: Any, is_float: bool) -> bool:
        """Whether ``v`` is allowed (``is_float``: the field is a float field)."""
        if self.choices is not None and v not in self.choices:
            return False
        if self.pattern is not None and not (isinstance(v, str) and re.fullmatch(self.pattern, v)):
            return False
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if isinstance(v, float) and math.isnan(v):
                return not self.finite and self.gt is self.ge is self.lt is self.le is None
            if ((is_float and self.finite and not math.isfinite(v))
                    or (not is_float and not INT64_MIN <= v <= INT64_MAX)):
                return False
            return ((self.gt is None or v > self.gt) and (self.ge is None or v >= self.ge)
                    and (self.lt is None or v < self.lt) and (self.le is None or v <= self.le))
        return True


def _num(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def F(default: Any = None, help: str = "", factory: Any = None, *,  # noqa: A002
      gt: Optional[float] = None, ge: Optional[float] = None, lt: Optional[float] = None,
      le: Optional[float] = None, choices: Optional[Sequence[Any]] = None, pattern: Optional[str] = None,
      finite: bool = True) -> Any:
    """A dataclass field with a help text and the values it allows (both shown by
    ``flowkit train --help``), e.g. ``F(3e-4, "Adam learning rate", gt=0)``,
    ``F("auto", "...", choices=("auto", "sync"))``.

    A float must be finite unless ``finite=False``; an int must fit in 64 bits; the bounds
    and choices of a list or mapping field apply to each item. :func:`check_values` enforces
    all of it once the config is built, before anything starts.
    """
    allowed = Allowed(gt, ge, lt, le, tuple(choices) if choices is not None else None, pattern, finite)
    meta = {"help": help, "allowed": allowed}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _leaf_type(tp: Any) -> Any:
    """The item type a field's allowed values apply to (``List[int]`` -> int)."""
    base, _ = _unwrap_optional(tp)
    if typing.get_origin(base) in (list, List):
        return (typing.get_args(base) or (Any,))[0]
    if typing.get_origin(base) in (dict, Dict):
        return (typing.get_args(base) or (Any, Any))[-1]
    return base


def check_values(cfg: Any, schema_cls: Any, prefix: str = "") -> None:
    """Check every value of ``cfg`` (a DictConfig or dict shaped like the dataclass
    ``schema_cls``) against what its field allows (see :func:`F`); nested sections and
    ``Dict[str, <dataclass>]`` fields are walked.

    Raises:
        ConfigError: one line naming the full key, the value and what is allowed, e.g.
            ``ppo.lr=inf must be finite and > 0``.
    """
    hints = typing.get_type_hints(schema_cls)
    for f in dataclasses.fields(schema_cls):
        if f.name not in cfg or cfg[f.name] is None:
            continue
        key, tp, val = prefix + f.name, hints[f.name], cfg[f.name]
        base: Any = _unwrap_optional(tp)[0]
        if dataclasses.is_dataclass(base):
            check_values(val, base, key + ".")
            continue
        leaf: Any = _leaf_type(tp)
        if typing.get_origin(base) in (dict, Dict) and dataclasses.is_dataclass(leaf):
            for k in val:
                check_values(val[k], leaf, f"{key}.{k}.")
            continue
        allowed = f.metadata.get("allowed") or Allowed()
        if leaf not in (int, float, str):  # e.g. Dict[str, Any]: open, checked by its reader
            continue
        if typing.get_origin(base) in (list, List):
            items = [(f"{key}[{i}]", v) for i, v in enumerate(val)]
        elif typing.get_origin(base) in (dict, Dict):
            items = [(f"{key}.{k}", val[k]) for k in val]
        else:
            items = [(key, val)]
        for k, v in items:
            if isinstance(v, (list, dict, ListConfig, DictConfig)):  # e.g. a nested list in YAML
                raise ConfigError(f"`{k}` must be {_KINDS[leaf]}, got {_short(OmegaConf.to_object(v) if isinstance(v, (ListConfig, DictConfig)) else v)}")
            if not allowed.ok(v, leaf is float):
                what = allowed.describe(leaf is float)
                if leaf is int and ((v > INT64_MAX and allowed.le is None and allowed.lt is None)
                                    or (v < INT64_MIN and allowed.ge is None and allowed.gt is None)):
                    what = f"{what} and " if what else ""
                    what += f"fit in 64 bits ([{INT64_MIN}, {INT64_MAX}])"
                need = f"match {allowed.pattern}" if allowed.pattern is not None else f"be {what}"
                raise ConfigError(f"{k}={v!r} must {need}")


ACTIVATIONS = ("tanh", "relu", "elu", "gelu", "silu")  # names of the table in flowkit.core.activations


@dataclass
class EnvConfig:
    id: Optional[str] = F(None, "Gymnasium env id (also `env=ID`), e.g. CartPole-v1 or pkg:Id-v0")
    factory: Optional[str] = F(None, "`module:callable` returning an env; gets `context=EnvContext` if it accepts it")
    kwargs: Dict[str, Any] = F(help="keyword arguments for gym.make / the factory", factory=dict)
    autoreset_mode: str = F("next_step", "vector-env autoreset: next_step (Gymnasium default) or same_step",
                             choices=("next_step", "same_step"))
    max_episode_steps: Optional[int] = F(None, "wrap each env in a TimeLimit of this many steps", ge=1)
    vectorization: str = F("auto", "auto: the env's own vectorized implementation when it registers one "
                           "(e.g. CartPole), else sync; sync: always a SyncVectorEnv of single envs",
                           choices=("auto", "sync"))
    check_spaces_steps: int = F(2, "env steps per worker whose outputs are checked against the spaces (0: none)", ge=0)
    preset: Optional[str] = F(None, "wrappers for a family of envs: atari (DeepMind preprocessing: 30 no-ops, frame skip 4 "
                              "with max-pooling, 84x84 grayscale uint8, 4 stacked frames, FIRE on reset; for training "
                              "also life loss as terminal and rewards clipped to their sign; returns reported "
                              "unclipped per game; docs/envs.md)", choices=("atari",))


@dataclass
class RuntimeConfig:
    backend: str = F("ray", "ray (actors) or local (in-process, same code path)", choices=("ray", "local"))
    num_workers: int = F(2, "rollout workers (0 counts as 1)", ge=0, le=1024)
    num_envs_per_worker: int = F(8, "sub-envs in each worker's vector env", ge=1, le=4096)
    rollout_fragment_length: int = F(64, "env steps per sub-env in each sample batch", ge=1, le=MAX_BATCH_ROWS)
    num_cpus_per_worker: float = F(1.0, "CPUs each rollout worker reserves (Ray)", ge=0)
    address: Optional[str] = F(None, "Ray cluster address (`auto` for an existing cluster); None starts a local one")
    async_requests_per_worker: int = F(2, "async rollout mode (IMPALA): sample requests in flight per "
                                          "worker, so a worker starts its next fragment while the driver "
                                          "takes the last one (RLlib: max_requests_in_flight_per_env_runner)", ge=1, le=64)
    prefetch: Optional[bool] = F(None, "keep one sample request in flight while learning; None: on iff every algorithm is off-policy")
    restart_failed_workers: bool = F(True, "rebuild a rollout worker whose env or process failed")
    max_worker_restarts: int = F(3, "consecutive failures of one worker slot before the run stops", ge=0)
    sample_timeout_s: float = F(300.0, "seconds a rollout worker may take to answer a sample request "
                                       "(start-up excluded); then it counts as failed and is rebuilt", gt=0)
    start_timeout_s: float = F(600.0, "seconds to wait at start-up for Ray to place and start every rollout worker "
                                      "(an attached cluster may be busy); a worker rebuilt later waits without a bound", gt=0)
    torch_threads: int = F(1, "torch threads per rollout worker", ge=1)


class ModelConfig:
    hidden_sizes: List[int] = F(help="hidden layer sizes of the MLP", factory=lambda: [64, 64], ge=1)
    activation: str = F("tanh", "activation of the hidden layers", choices=ACTIVATIONS)
    shared_value_network: bool = F(False, "share the trunk between policy and value heads")
    cnn: str = F("nature", "the network in front of model.hidden_sizes for image observations (flat ones have "
                           "none): nature (Mnih et al. 2015: 3 convolutions, 3,136 features of 84x84; with "
                           "hidden_sizes=[512]) or impala (Espeholt et al. 2018's deep residual network: 3 stacks "
                           "of conv, max-pool and 2 residual blocks, 16/32/32 channels, 3,872 features of 84x84; "
                           "with hidden_sizes=[256]); uint8 frames are scaled to [0, 1] inside either",
                 choices=("nature", "impala"))
    init: str = F("auto", "weight init of the networks: auto (each algorithm's own: orthogonal for the "
                          "actor-critics, SAC and TD3, PyTorch's for DQN's Q-network), orthogonal (gain sqrt(2) "
                          "hidden, each head's own gain, zero biases; SB3's ortho_init=True) or default (PyTorch's: "
                          "U(+-1/sqrt(fan_in)); SB3's ortho_init=False, and SB3's SAC, TD3 and DQN)",
                  choices=("auto", "orthogonal", "default"))
    numpy_inference: bool = F(True, "act with a numpy copy of the network on CPU (MLP actor-critics: "
                                    "same math, less per-call overhead); false: torch")
    normalize_obs: bool = F(False, "running mean/std observation normalisation inside the network, for every "
                                   "algorithm (flat observations; the Zoo's `normalize: true` for MuJoCo): updated "
                                   "on the learner from each train batch, sent to the workers with the weights, "
                                   "saved in checkpoints, applied by evaluate and export; PPO's "
                                   "ppo.normalize_observations is the same")
    recurrent: Optional[str] = F(None, "a recurrent layer on the encoded observation (after the CNN for images), "
                                       "then the MLP hidden_sizes: lstm or gru (null: feed-forward); the workers keep "
                                       "one state per sub-env, the learner trains on whole sequences (actor-critics)",
                                 choices=("lstm", "gru"))
    recurrent_size: int = F(64, "units of the recurrent layer (model.recurrent)", ge=1, le=65536)
    max_seq_len: int = F(32, "rows per training sequence of a recurrent policy: trajectory pieces are cut into "
                             "sequences of at most this many steps (backpropagation through time spans one)",
                         ge=1, le=100000)


# `model.class` is a Python keyword: declared by hand, outside __init__, and the class built
# without the generated __repr__/__eq__ (which would spell `self.class`)
ModelConfig.__annotations__["class"] = Optional[str]
setattr(ModelConfig, "class", dataclasses.field(default=None, init=False, metadata={
    "help": "a custom network, `module:Class`, built as Class(encoder, num_outputs, model_config) in place of "
            "the policy's own (contract: flowkit.core.policy.Policy.build_model)",
    "allowed": Allowed(pattern=r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")}))
ModelConfig = dataclass(repr=False, eq=False)(ModelConfig)  # type: ignore[misc]  # the keyword field above


@dataclass
class LearnerConfig:
    device: str = F("cpu", "learner device: cpu, cuda or cuda:N", pattern=r"cpu|cuda(:[0-9]+)?")
    num_threads: int = F(1, "torch threads of the learner (driver)", ge=1)


@dataclass
class StopConfig:
    env_steps: Optional[int] = F(None, "stop after this many sampled env steps", ge=1)
    iterations: Optional[int] = F(None, "stop after this many iterations", ge=1)
    episode_return_mean: Optional[float] = F(None, "stop when episode_return_mean reaches this")
    evaluation_return_mean: Optional[float] = F(None, "stop when a greedy evaluation's mean return reaches this "
                                                      "(needs evaluation.interval >= 1)")
    time_s: Optional[float] = F(None, "stop after this many seconds of training (checked at each iteration's "
                                      "end; an iteration still running at 1.1 x time_s is abandoned)", gt=0)


@dataclass
class EvaluationConfig:
    interval: int = F(0, "greedy evaluation every N iterations (0: never, except with final=True)", ge=0)
    episodes: int = F(10, "episodes per evaluation", ge=1, le=MAX_EPISODES)
    final: bool = F(False, "evaluate once at the end of the run")
    explore: bool = F(False, "sample actions instead of acting greedily")
    timeout_s: Optional[float] = F(None, "seconds one evaluation (periodic or final) may take; then it is abandoned "
                                         "with a warning and the run goes on (None: runtime.sample_timeout_s)", gt=0)


@dataclass
class CheckpointConfig:
    every_iters: int = F(0, "write a checkpoint every N iterations (0: never)", ge=0)
    at_end: bool = F(True, "write a checkpoint when the run ends")
    keep: int = F(3, "checkpoints to keep (newest; 0: all)", ge=0)
    include_replay: bool = F(True, "store replay buffers in checkpoints")


@dataclass
class RunConfig:
    dir: Optional[str] = F(None, "run folder; default runs/<algo>-<env>-<timestamp>")
    min_iter_time_s: float = F(0.0, "merge train steps into one reported iteration until this much time passed", ge=0)
    min_iter_env_steps: int = F(0, "merge train steps into one reported iteration until this many env steps", ge=0)
    reporters: List[str] = F(help="reporters of the run, called in this order (built-in: progress, csv, plot, "
                                  "checkpoint, evaluation, tensorboard, timing; plugins add more)",
                             factory=lambda: ["progress", "csv", "plot", "checkpoint", "evaluation"])


@dataclass
class RandomConfig:
    """random: uniform over the legal actions, learns nothing (baselines, opponents)."""
    report_every_env_steps: int = F(1000, "env steps per reported iteration", ge=1)


@dataclass
class Config:
    algo: str = F("ppo", "algorithm name (see `flowkit plugins`)")
    seed: int = F(0, "one seed for torch, numpy, env resets and exploration (32 bits: every derived seed "
                     "uses only these)", ge=0, le=2 ** 32 - 1)
    env: EnvConfig = F(help="environment", factory=EnvConfig)
    runtime: RuntimeConfig = F(help="rollout workers and backend", factory=RuntimeConfig)
    model: ModelConfig = F(help="networks", factory=ModelConfig)
    learner: LearnerConfig = F(help="learner", factory=LearnerConfig)
    stop: StopConfig = F(help="stop conditions (first reached wins)", factory=StopConfig)
    evaluation: EvaluationConfig = F(help="greedy evaluation", factory=EvaluationConfig)
    checkpoint: CheckpointConfig = F(help="checkpoints", factory=CheckpointConfig)
    run: RunConfig = F(help="output", factory=RunConfig)
    plugins: List[str] = F(help="extra plugin modules to load (importable paths)", factory=list)
    resume: Optional[str] = F(None, "run folder or checkpoint to continue from")


def make_schema_class(sections: Dict[str, type]) -> type:
    """The Config dataclass extended with one field per extra section."""
    extra = [(name, cls, F(help=(cls.__doc__ or name).strip().splitlines()[0], factory=cls))
             for name, cls in sections.items()]
    for name in set(sections) & {f.name for f in dataclasses.fields(Config)}:
        raise ConfigError(f"plugin config section {name!r} clashes with a core section")
    return dataclasses.make_dataclass("FlowkitConfig", extra, bases=(Config,))


def _unwrap_optional(tp):
    if typing.get_origin(tp) is Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _leaves(cls: Any, prefix: str = "") -> Iterator[Tuple[str, Any, Any]]:
    """``(dotted key, dataclass field, type)`` of every leaf of a dataclass schema."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(base := _unwrap_optional(hints[f.name])[0]):
            yield from _leaves(base, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, f, hints[f.name]


def schema_keys(cls: Any, prefix: str = "") -> Dict[str, Tuple[Any, str, Any]]:
    """Flat ``{dotted key: (type, help, default)}`` of a dataclass schema; ``Dict`` fields are
    open (any sub-key)."""
    return {key: (tp, f.metadata.get("help", ""), f.default if f.default is not dataclasses.MISSING else (
        f.default_factory() if f.default_factory is not dataclasses.MISSING else None))
        for key, f, tp in _leaves(cls, prefix)}


def schema_allowed(cls: Any, prefix: str = "") -> Dict[str, Allowed]:
    """Flat ``{dotted key: Allowed}`` of a dataclass schema (the keys of :func:`schema_keys`
    whose field declares anything)."""
    return {key: f.metadata["allowed"] for key, f, _ in _leaves(cls, prefix) if "allowed" in f.metadata}


def _type_name(tp) -> str:
    base, opt = _unwrap_optional(tp)
    args = typing.get_args(base)  # List[int], Dict[str, PolicyConfig]
    name = (f"{getattr(base, '__name__', base)}[{', '.join(_type_name(a) for a in args)}]" if args
            else getattr(base, "__name__", None) or str(base).replace("typing.", ""))
    return f"{name} or null" if opt else name


def used_sections(cfg: Any, algos: Any, pm: Any, keep_packages: Any = ()) -> Dict[str, Any]:
    """``cfg`` as a plain dict with the core sections, the sections of the algorithms named in
    ``algos`` (those that train or act for a policy), and the plugin sections that differ from
    their defaults or belong to a package in ``keep_packages`` (the plugin that made the policy
    specs, e.g. ``flowkit_multiagent``); other algorithms' sections are left out. What a run's
    ``config.yaml`` and ``flowkit train --print-config`` show."""
    data: Any = OmegaConf.to_container(cfg, resolve=True)
    base = {f.name for f in dataclasses.fields(Config)} | set(algos)
    registered, sections = pm.algorithms(load=False), pm.config_sections()
    return {k: v for k, v in data.items() if k in base or (k in sections and k not in registered and (
            sections[k].__module__.split(".")[0] in keep_packages
            or v != OmegaConf.to_container(OmegaConf.structured(sections[k]), resolve=True)))}


def run_algorithms(cfg: Any) -> List[str]:
    """The algorithms a config's policies use, before any env is built: ``algo`` and each
    ``multiagent.policies.<id>.algo`` given."""
    names = [str(cfg.algo)]
    pols = OmegaConf.select(cfg, "multiagent.policies", default=None)
    if isinstance(pols, DictConfig):
        names += [str(p.algo) for p in pols.values() if isinstance(p, DictConfig) and p.get("algo")]
    return list(dict.fromkeys(names))


def action_space_error(algo: str, kinds: Sequence[str], policy_id: str, action_space: Any) -> Optional[str]:
    """Why algorithm ``algo``, which accepts the action spaces named in ``kinds`` (Gymnasium
    space class names; empty: any), cannot act in ``action_space``; None if it can. Shared by
    :meth:`flowkit.core.Algorithm.check_spaces` (at set-up) and the CLI's check before Ray starts."""
    got = type(action_space).__name__
    if not kinds or got in kinds:
        return None
    other = "dqn or ppo" if got == "Discrete" and "Discrete" not in kinds else "ppo"
    return (f"policy {policy_id!r}: {algo.upper()} needs a {' or '.join(kinds)} action space, got {action_space} "
            f"(use an algorithm for {got} actions, e.g. {other})")


def recurrent_error(algo: str, recurrent: bool, policy_id: str, model_config: Any) -> Optional[str]:
    """Why algorithm ``algo`` (``recurrent``: whether it trains recurrent networks) cannot
    train the network of ``model_config`` (a ``model.*`` section); None if it can. Shared by
    :meth:`flowkit.core.Algorithm.check_model` (at set-up) and :func:`check_run`."""
    kind = model_config.get("recurrent") if hasattr(model_config, "get") else getattr(model_config, "recurrent", None)
    if not kind or recurrent:
        return None
    return (f"policy {policy_id!r}: model.recurrent={kind} but {algo.upper()} trains feed-forward networks only "
            "(recurrent policies: ppo, a2c, a3c, impala, appo, r2d2); set model.recurrent=null or change the algorithm")


def check_algo(cfg: Any, algos: Any) -> None:
    """``algo`` is one of ``algos`` (names), else a ConfigError naming the closest."""
    if cfg.algo not in algos:
        close = difflib.get_close_matches(cfg.algo, list(algos), n=1)
        hint = f"; did you mean `{close[0]}`?" if close else ""
        raise ConfigError(f"algo={cfg.algo!r} is not an installed algorithm ({', '.join(sorted(algos))}){hint}")


def check_unused_sections(cfg: Any, algos: Any, sections: Dict[str, type]) -> List[str]:
    """Sections set (differing from their defaults) for algorithms that no policy of the run
    uses (:func:`run_algorithms`). A section is read only by the algorithm of its name; a
    registered subclass does not read its parent's section. Where the run's ``algo`` takes the
    same settings class as the unused section (or a subclass of it: a variant such as
    ``ppo_l2``, registered from PPO, under a tuned file's ``ppo:``) the user meant them for this
    run: a config error. Other algorithms' sections (a base file shared by several runs) give a
    warning each.

    Returns:
        the warnings (one line each).
    Raises:
        ConfigError: naming the section, a key it sets, and the algorithms the run uses.
    """
    used, out = run_algorithms(cfg), []
    mine = sections.get(str(cfg.algo))
    for name in algos:
        if name in used or name not in sections or name not in cfg:
            continue
        given: Dict[str, Any] = OmegaConf.to_container(cfg[name], resolve=True)  # type: ignore[assignment]
        default: Dict[str, Any] = OmegaConf.to_container(OmegaConf.structured(sections[name]), resolve=True)  # type: ignore[assignment]
        diff = [k for k in given if given[k] != default.get(k)]
        if not diff:
            continue
        what = (f"config section `{name}` ({name}.{diff[0]}={given[diff[0]]!r}) is not used by this run, which trains "
                f"with {', '.join(f'algo={a}' for a in used)}")
        if mine is not None and issubclass(mine, sections[name]):
            raise ConfigError(f"{what}; `{cfg.algo}` takes the same settings: give them as `{cfg.algo}.*` (rename "
                              f"`{name}:` to `{cfg.algo}:` in the file)")
        out.append(f"{what}: it has no effect")
    return out


def check_run(cfg: Any, pm: Any) -> None:
    """The checks of a run's config that need neither torch, Ray nor the env, made before those
    load (``flowkit train``, :func:`flowkit.train`) and again at set-up: ``algo`` installed,
    no section of a variant of ``algo`` set in its place (:func:`check_unused_sections`), exactly one of ``env.id`` and ``env.factory``, ``run.reporters`` known (and each one's
    ``validate_config``), and the cross-field checks of ``algo``'s section where its plugin
    gives them torch-free (``AlgorithmRef.validate``; otherwise they run at set-up, when the
    class is imported). Their warnings are given at set-up.

    Raises:
        ConfigError: the first problem found.
    """
    algos = pm.algorithms(load=False)
    check_algo(cfg, algos)
    check_unused_sections(cfg, algos, pm.config_sections())
    if bool(cfg.env.id) == bool(cfg.env.factory):
        raise ConfigError("give exactly one of env.id (env=ID) and env.factory "
                          f"(got env.id={cfg.env.id!r}, env.factory={cfg.env.factory!r})")
    check_sizes(cfg)
    if cfg.stop.evaluation_return_mean is not None and not cfg.evaluation.interval:
        raise ConfigError(f"stop.evaluation_return_mean={cfg.stop.evaluation_return_mean} needs periodic evaluation: "
                          "set evaluation.interval (e.g. evaluation.interval=5)")
    known = pm.reporters()
    twice = sorted({r for r in cfg.run.reporters if list(cfg.run.reporters).count(r) > 1})
    if twice:
        raise ConfigError(f"run.reporters: {', '.join(map(repr, twice))} listed more than once")
    for name in cfg.run.reporters:
        if name not in known:
            raise ConfigError(f"run.reporters: unknown reporter {name!r} (known: {', '.join(sorted(known))})")
        check = getattr(known[name], "validate_config", None)
        if callable(check):
            check(cfg)
    a, section = algos[cfg.algo], cfg[cfg.algo] if cfg.algo in cfg else None
    if why := recurrent_error(cfg.algo, bool(getattr(a, "recurrent", False)), "default", cfg.model):
        raise ConfigError(why)
    if not hasattr(a, "target"):  # a class registered as it is (loaded)
        a.validate_config(cfg, section)
    elif getattr(a.config_class, "validate", None) is not None and section is not None:
        a.config_class.validate(section, cfg, a.name)
    elif a.validate is not None:
        a.validate(cfg, section, a.name)


def check_sizes(cfg: Any) -> None:
    """The sizes that multiply: one sampling round holds num_workers (0 counts as 1) x
    num_envs_per_worker x rollout_fragment_length env steps, at most :data:`MAX_BATCH_ROWS`
    (each key's own bound is declared in its field).

    Raises:
        ConfigError: naming the product and its factors.
    """
    rt, rows = cfg.runtime, round_env_steps(cfg)
    if rows > MAX_BATCH_ROWS:
        raise ConfigError(f"one sampling round of runtime.num_workers={rt.num_workers} x num_envs_per_worker="
                          f"{rt.num_envs_per_worker} x rollout_fragment_length={rt.rollout_fragment_length} = "
                          f"{rows} env steps is over flowkit's limit of {MAX_BATCH_ROWS}; lower one of them")


_KINDS = {int: "an int", float: "a float", bool: "true or false", str: "a string"}


def _config_error(e: Exception, keys: Dict[str, Tuple[Any, str, Any]], layer: Any = None,
                  algo: Optional[str] = None) -> ConfigError:
    """An OmegaConf error as one line: an unknown key with the closest valid one (an unknown
    section of ``layer`` named with the first key given under it: `xppo.lr`), a value of the
    wrong type naming the key, the value and the expected type, else OmegaConf's words. A
    section's key given bare (`lr`) is pointed to ``algo``'s section (the run's algorithm)."""
    key = str(getattr(e, "full_key", None) or "")
    if isinstance(e, ConfigKeyError):
        node = layer
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        while isinstance(node, dict) and node and isinstance(first := next(iter(node)), str):
            key, node = f"{key}.{first}", node[first]
        close = difflib.get_close_matches(key, list(keys), n=1, cutoff=0.6)
        hint = f"; did you mean `{close[0]}`?" if close else ""
        if "." not in key:  # a section's key given bare (`lr=1e-3`): name the sections that have it
            algo = (layer.get("algo") if isinstance(layer, dict) else None) or algo
            owners = sorted((k for k in keys if k.endswith(f".{key}") and k.count(".") == 1),
                            key=lambda k: (k.split(".")[0] != algo, k))
            if owners:
                hint = (f"; did you mean `{owners[0]}`?" if owners[0].split(".")[0] == algo or len(owners) == 1 else
                        f"; it is a key of a section: {', '.join(f'`{k}`' for k in owners[:4])}"
                        f"{', ...' if len(owners) > 4 else ''}")
        shown = key if key.isprintable() and key.strip() == key else repr(key)  # e.g. a stray '\xa0'
        return ConfigError(f"unknown config key `{shown}`{hint}")
    k = re.sub(r"\[\d+\]$", "", key)
    item = k != key or (k not in keys and k.rpartition(".")[0] in keys)  # a list or a mapping item
    tp = keys.get(k) or keys.get(k.rpartition(".")[0])
    if tp is not None and isinstance(e, ValidationError) and not isinstance(e, InterpolationResolutionError):
        base = _leaf_type(tp[0]) if item else _unwrap_optional(tp[0])[0]
        origin, v = typing.get_origin(base), getattr(e, "value", None)
        want = (f"a list, e.g. {key}=[1,2]" if origin in (list, List) else "a mapping" if origin in (dict, Dict)
                else _KINDS.get(base, _type_name(base)))
        return ConfigError(f"`{key}` must be {want}, got {'null' if v is None else repr(v)}")
    return ConfigError(f"config key `{key or '?'}`: {str(e).splitlines()[0]}")


def _dotlist(items: Sequence[Any]) -> Dict[str, Any]:
    """``["a.b=1", ...]`` as a nested dict, each value read as YAML by OmegaConf (text that is
    not YAML stays a string). ``env=ID`` is ``env.id=ID``; both spellings together are an error."""
    layer, seen = OmegaConf.create(), typing.cast(Dict[str, str], {})
    for item in items:
        spelling, _, raw = item.partition("=") if isinstance(item, str) else ("", "", "")
        if not (spelling := spelling.strip()) or "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        key = "env.id" if spelling == "env" and not raw.lstrip().startswith("{") else spelling
        if seen.setdefault(key, item).split("=", 1)[0].strip() != spelling:  # no silent winner
            raise ConfigError(f"`{key}` is given twice: `{seen[key]}` and `{item}`")
        try:  # the same key repeated: the last one wins
            try:
                layer.merge_with_dotlist([f"{key}={raw}"])
            except yaml.YAMLError:
                OmegaConf.update(layer, key, raw)
        except Exception as e:
            raise ConfigError(f"override {item!r}: {str(e).splitlines()[0]}") from None
    return typing.cast(Dict[str, Any], OmegaConf.to_container(layer))


def _load_yaml(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = OmegaConf.load(f)  # its YAML reads 1e-5 as a float and refuses duplicate keys
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path!r} is a directory; give a YAML file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path!r} is not a UTF-8 text file (byte {e.start}: "
                          f"{e.object[e.start:e.start + 1]!r}); give a YAML file") from None
    except yaml.MarkedYAMLError as e:  # one line: where, what, and in what
        def at(mark: Any) -> str:
            return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "?"
        what = " ".join(str(e.problem or e.context or "syntax error").split())
        ctx = f" ({' '.join(e.context.split())} at {at(e.context_mark)})" if e.context and e.problem else ""
        raise ConfigError(f"config file {path!r} is not valid YAML: {at(e.problem_mark)}: {what}{ctx}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path!r} is not valid YAML: {' '.join(str(e).split())}") from None
    except OSError as e:
        if e.strerror:
            raise ConfigError(f"config file {path!r} cannot be read: {e.strerror}") from None
        data = None  # OmegaConf's answer to a number at the top
    if not isinstance(data, DictConfig):
        raise ConfigError(f"config file {path!r} must hold a mapping at the top")
    return _env_shorthand(typing.cast(Dict[str, Any], OmegaConf.to_container(data)))


def _env_shorthand(data: Dict[str, Any]) -> Dict[str, Any]:
    """``env: ID`` -> ``env: {id: ID}`` (a copy)."""
    return {**data, "env": {"id": data["env"]}} if isinstance(data.get("env"), str) else data


def _as_source(user: Any) -> Tuple[Dict[str, Any], List[str]]:
    """``(nested dict, overrides)`` of a config given as overrides (a list or a string), a dict
    or a DictConfig; interpolations stay as they are (resolved in the merged config)."""
    if isinstance(user, str):
        user = user.split()
    if isinstance(user, (DictConfig, ListConfig)):
        user = OmegaConf.to_container(user)
    if user is None or isinstance(user, dict):
        return dict(_env_shorthand(user or {})), []
    if isinstance(user, (list, tuple)):
        return _dotlist(user), list(user)
    raise ConfigError(f"config must be a dict, a DictConfig or a list of overrides, got {type(user).__name__}")


def _layers(user: Any, config_file: Union[str, Sequence[str], None]) -> List[Dict[str, Any]]:
    """Each config file (in order), then ``user``."""
    files = [config_file] if isinstance(config_file, str) else list(config_file or [])
    return [_load_yaml(f) for f in files] + [_as_source(user)[0]]


def plugin_modules_from(user: Any, config_file: Union[str, Sequence[str], None] = None) -> List[str]:
    """The ``plugins`` list of a config source (needed before the schema can be built)."""
    mods: List[str] = []
    for src in _layers(user, config_file):
        given = src.get("plugins")
        if given is not None and (not isinstance(given, (list, tuple)) or not all(isinstance(m, str) for m in given)):
            raise ConfigError(f"`plugins` must be a list of module paths, e.g. plugins=[my_pkg.plugin], got {given!r}")
        mods += list(given or [])
    return mods


def build_config(user: Any = None, config_file: Union[str, Sequence[str], None] = None,
                 sections: Optional[Dict[str, type]] = None) -> DictConfig:
    """Merge defaults, YAML files and overrides into a typed DictConfig (struct mode), with
    every ``${...}`` interpolation resolved and every value checked.

    Args:
        user: dotlist overrides (list of ``key=value``), a dict, or a DictConfig.
        config_file: YAML file(s), merged in order before ``user``.
        sections: extra sections ``{name: dataclass}`` (algorithm and plugin sections).
    Raises:
        ConfigError: unknown key (with the closest valid one), wrong type, a value outside
            what its field allows (:func:`check_values`), an interpolation that does not
            resolve, ``env=`` and ``env.id=`` given together, or a config file that is
            missing, unreadable or not YAML.
    """
    schema_cls = make_schema_class(sections or {})
    merged = OmegaConf.structured(schema_cls)
    for layer in _layers(user, config_file):
        merged = merge_overrides(merged, layer, schema_cls)
    OmegaConf.set_struct(merged, True)
    try:
        OmegaConf.resolve(merged)  # validates each result against its field's type
    except OmegaConfBaseException as e:
        raise _config_error(e, {}) from None
    check_values(merged, schema_cls)
    for name in sections or {}:
        if isinstance(merged.get(name), DictConfig):
            check_schedules(merged[name], name, merged)
    return merged


def merge_overrides(base: DictConfig, overrides: Dict[str, Any], schema: type) -> DictConfig:
    """``base`` with the nested dict ``overrides`` merged in by OmegaConf, which checks every
    key and type against the dataclass ``schema``; an integral float (``1e4``) for an int
    field becomes an int; a section given as null (``ppo:`` in YAML) is skipped.

    Raises:
        ConfigError: an unknown key (with the closest valid one) or a value of the wrong type.
    """
    keys = schema_keys(schema)
    layer = dict(overrides)
    for name in [k for k in layer if any(s.startswith(f"{k}.") for s in keys)]:  # whole sections
        if layer[name] is None:
            del layer[name]
        elif not isinstance(layer[name], dict):
            raise ConfigError(f"`{name}` is a config section: give a mapping of its keys "
                              f"(e.g. `{name}.<key>=value`), got {layer[name]!r}")
    try:
        node = OmegaConf.create(layer)
        while True:
            try:
                return typing.cast(DictConfig, OmegaConf.merge(base, node))
            except ValidationError as e:
                v = getattr(e, "value", None)
                if not (isinstance(v, float) and v.is_integer() and "to Integer" in str(e)):
                    raise
                OmegaConf.update(node, str(e.full_key), int(v), merge=False)
    except OmegaConfBaseException as e:
        raise _config_error(e, keys, layer, base.get("algo") if isinstance(base, DictConfig) else None) from None
    except TypeError as e:  # OmegaConf: "Cannot merge incompatible container types"
        raise _container_error(layer, keys) or ConfigError(f"config: {e}") from None


def _container_error(layer: Any, keys: Dict[str, Tuple[Any, str, Any]], prefix: str = "") -> Optional[ConfigError]:
    """The first key of ``layer`` (a nested dict) given a list where the schema has a mapping
    (or a section), or a mapping where it has a list; None if there is none."""
    items = layer.items() if isinstance(layer, dict) else ()
    for k, v in items:
        key = f"{prefix}{k}"
        tp = keys.get(key)
        origin = typing.get_origin(_unwrap_optional(tp[0])[0]) if tp else None
        section = tp is None and any(s.startswith(f"{key}.") for s in keys)
        want = ("a mapping" if origin in (dict, Dict) or (section and isinstance(v, list))
                else "a list" if origin in (list, List) and isinstance(v, dict) else None)
        if want and (isinstance(v, list) or want == "a list"):
            return ConfigError(f"`{key}` must be {want}, got {_short(v)}")
        if isinstance(v, dict) and (section or origin in (dict, Dict)):
            sub = {f"{key}.{s[len(key) + 1:]}": t for s, t in keys.items() if s.startswith(f"{key}.")}
            if (err := _container_error(v, {**keys, **sub}, f"{key}.")) is not None:
                return err
    return None


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def section_view(cfg: DictConfig, name: str) -> DictConfig:
    """A read-only, struct-mode copy of section ``name``: reading an undeclared key raises."""
    sec = typing.cast(DictConfig, OmegaConf.create(OmegaConf.to_container(cfg[name], resolve=True)))
    OmegaConf.set_struct(sec, True)
    OmegaConf.set_readonly(sec, True)
    return sec


def section_object(cfg: DictConfig, name: str, cls: type) -> Any:
    """Section ``name`` as an instance of its dataclass ``cls`` (fast attribute access)."""
    return cls(**typing.cast(Dict[str, Any], OmegaConf.to_container(cfg[name], resolve=True)))


def describe_keys(sections: Optional[Dict[str, type]] = None) -> List[Tuple[str, str, str, Any, str]]:
    """Every config key of the schema with ``sections`` as ``(key, type, allowed, default,
    help)`` rows, in schema order: ``("ppo.lr", "float", "> 0", 0.0003, "Adam learning rate")``.
    ``allowed`` is "" when any value of the type goes (floats must also be finite); for a
    list or a mapping it applies to each item. The fields of a ``Dict[str, <dataclass>]``
    key follow it as ``<key>.<id>.<field>`` rows. What ``flowkit train --help`` and the docs'
    config reference show."""
    def rows(cls: Any, prefix: str) -> Iterator[Tuple[str, str, str, Any, str]]:
        allowed_values = schema_allowed(cls, prefix)
        for key, (tp, hlp, default) in schema_keys(cls, prefix).items():
            allowed = allowed_values.get(key)
            rng = allowed.describe(_leaf_type(tp) is float, say_finite=False) if allowed else ""
            if rng and typing.get_origin(_unwrap_optional(tp)[0]) in (list, List, dict, Dict):
                rng = f"each {rng}"
            yield key, _type_name(tp), rng, default, hlp
            if typing.get_origin(_unwrap_optional(tp)[0]) in (dict, Dict) and dataclasses.is_dataclass(_leaf_type(tp)):
                yield from rows(_leaf_type(tp), f"{key}.<id>.")
    return list(rows(make_schema_class(sections or {}), ""))


def help_text(sections: Optional[Dict[str, type]] = None) -> str:
    """Every config key with its type, allowed values, default and help, grouped by section
    (floats must also be finite)."""
    lines, last = [], None
    for key, tp, rng, default, hlp in describe_keys(sections):
        sec = key.split(".")[0] if "." in key else ""
        if sec != last:
            lines.append(f"\n[{sec or 'top level'}]")
            last = sec
        lines.append(f"  {key} ({tp}{', ' + rng if rng else ''}, default {default!r}): {hlp}")
    return "\n".join(lines)
