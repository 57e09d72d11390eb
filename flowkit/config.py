"""flowkit's configuration: a closed, typed OmegaConf schema built from dataclasses.

Sources, merged in this order: the schema's defaults, an optional YAML file (``-c FILE``),
then dotlist overrides (``ppo.lr=3e-4``). Each algorithm adds its own section keyed by its
name (``ppo.*``); plugins may add further sections (``multiagent.*``) through the
``flowkit_add_config_sections`` hook. ``env=ID`` is a shorthand for ``env.id=ID``.

Each field declares the values it allows where it is declared (``F(3e-4, "Adam learning
rate", gt=0)``; floats must be finite, ints fit in 64 bits) and :func:`check_values` checks
them all once the config is built; a section's ``validate`` keeps only checks that relate
several keys (:func:`validate_section`). Every problem is a :class:`ConfigError` raised before anything starts:
one line naming the key, what was expected and what was given, and for an unknown key the
closest valid one.

Here are how a field is declared (:func:`F`, :class:`Allowed`), the core section dataclasses
(gathered in :class:`Config`), the flat view of a schema's keys (:func:`schema_keys`), the checks
of what an algorithm declares against a policy's space and ``model.*`` (:func:`model_error`),
and how a config is built, merged and checked, and its help text written.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, InterpolationResolutionError, OmegaConfBaseException, ValidationError

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


ACTIVATIONS = ("tanh", "relu", "elu", "gelu", "silu")  # names of the table in flowkit.core.activations


@dataclass
class EnvConfig:
    id: Optional[str] = F(None, "Gymnasium env id (also `env=ID`), e.g. CartPole-v1 or pkg:Id-v0")
    factory: Optional[str] = F(None, "`module:callable` returning an env; gets `context=EnvContext` if it accepts it")
    kwargs: Dict[str, Any] = F(help="keyword arguments for gym.make / the factory", factory=dict)
    autoreset_mode: str = F("next_step", "vector-env autoreset: next_step (Gymnasium default) or same_step",
                             choices=("next_step", "same_step"))
    max_episode_steps: Optional[int] = F(None, "wrap each env in a TimeLimit of this many steps", ge=1)
    vectorization: str = F("auto", "auto: the env's or its preset's own vector env where there is one, else sync; "
                           "sync: a SyncVectorEnv of single envs", choices=("auto", "sync"))
    check_spaces_steps: int = F(2, "env steps per worker whose outputs are checked against the spaces (0: none)", ge=0)
    preset: Optional[str] = F(None, "wrappers of a plugin's family of envs: atari, minigrid, ... (docs/envs.md)")


@dataclass
class RuntimeConfig:
    backend: str = F("ray", "ray (actors) or local (in-process, same code path)", choices=("ray", "local"))
    num_workers: int = F(2, "rollout workers (0 counts as 1)", ge=0, le=1024)
    num_envs_per_worker: int = F(8, "sub-envs in each worker's vector env", ge=1, le=4096)
    rollout_fragment_length: int = F(64, "env steps per sub-env in each sample batch", ge=1, le=MAX_BATCH_ROWS)
    num_cpus_per_worker: float = F(1.0, "CPUs each rollout worker reserves (Ray)", ge=0)
    worker_scheduling: str = F("DEFAULT", "Ray scheduling of rollout workers (SPREAD: over nodes)",
                               choices=("DEFAULT", "SPREAD"))
    address: Optional[str] = F(None, "Ray cluster address (`auto` for an existing cluster); None starts a local one")
    async_requests_per_worker: int = F(2, "async (IMPALA) sample requests in flight per worker", ge=1, le=64)
    prefetch: Optional[bool] = F(None, "a sample request in flight while learning (null: iff off-policy)")
    restart_failed_workers: bool = F(True, "rebuild a rollout worker whose env or process failed")
    max_worker_restarts: int = F(3, "consecutive failures of one worker slot before the run stops", ge=0)
    sample_timeout_s: float = F(300.0, "seconds a worker may take per sample request, then rebuilt", gt=0)
    start_timeout_s: float = F(600.0, "seconds to wait for Ray to start every rollout worker at start-up", gt=0)
    torch_threads: int = F(1, "torch threads per rollout worker", ge=1)
    double_buffered: Optional[bool] = F(None, "step half the sub-envs in a thread while acting for the other half; "
                                              "null: on where runtime.num_cpus_per_worker >= 2")


class ModelConfig:
    hidden_sizes: List[int] = F(help="hidden layer sizes of the MLP", factory=lambda: [64, 64], ge=1)
    activation: str = F("tanh", "activation of the hidden layers", choices=ACTIVATIONS)
    shared_value_network: bool = F(False, "share the trunk between policy and value heads")
    cnn: str = F("nature", "network before model.hidden_sizes for images", choices=("nature", "impala"))
    init: str = F("auto", "weight init: auto (the algorithm's own), orthogonal or default (PyTorch's)",
                  choices=("auto", "orthogonal", "default"))
    numpy_inference: bool = F(True, "act with a numpy copy of an MLP actor-critic (false: torch)")
    normalize_obs: bool = F(False, "running mean/std normalisation of flat observations (one switch with "
                                   "<algo>.normalize_observations)")
    recurrent: Optional[str] = F(None, "recurrent layer after the encoder (null: none)", choices=("lstm", "gru"))
    recurrent_size: int = F(64, "units of the recurrent layer (model.recurrent)", ge=1, le=65536)
    max_seq_len: int = F(32, "steps per training sequence of a recurrent policy", ge=1, le=100000)


# `model.class` is a Python keyword: declared by hand, outside __init__, and the class built
# without the generated __repr__/__eq__ (which would spell `self.class`)
ModelConfig.__annotations__["class"] = Optional[str]
setattr(ModelConfig, "class", dataclasses.field(default=None, init=False, metadata={
    "help": "a custom network, `module:Class`, in place of the policy's own",
    "allowed": Allowed(pattern=r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")}))
ModelConfig = dataclass(repr=False, eq=False)(ModelConfig)  # type: ignore[misc]  # the keyword field above


@dataclass
class LearnerConfig:
    device: str = F("cpu", "learner device: cpu, cuda or cuda:N", pattern=r"cpu|cuda(:[0-9]+)?")
    num_threads: int = F(1, "torch threads of the learner (driver), and of each learner process of a group", ge=1)
    num_learners: int = F(0, "learner processes of a learner group (Ray); 0: the learner in the driver", ge=0)
    num_cpus_per_learner: float = F(1.0, "CPUs each learner process of a group reserves", ge=0)
    placement_strategy: str = F("PACK", "Ray placement-group strategy of a learner group's processes",
                                choices=("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"))
    reuse_freed_memory: bool = F(True, "keep freed memory in glibc's heap for reuse (driver and workers)")


@dataclass
class StopConfig:
    env_steps: Optional[int] = F(None, "stop after this many sampled env steps", ge=1)
    iterations: Optional[int] = F(None, "stop after this many iterations", ge=1)
    episode_return_mean: Optional[float] = F(None, "stop when episode_return_mean reaches this")
    evaluation_return_mean: Optional[float] = F(None, "stop when an evaluation's mean return reaches this")
    time_s: Optional[float] = F(None, "stop after this many seconds of training", gt=0)


@dataclass
class EvaluationConfig:
    interval: int = F(0, "greedy evaluation every N iterations (0: never, except with final=True)", ge=0)
    episodes: int = F(10, "episodes per evaluation", ge=1, le=MAX_EPISODES)
    final: Optional[bool] = F(None, "evaluate once at the end of the run (null: only a run without rollout workers)")
    explore: bool = F(False, "sample actions instead of acting greedily")
    timeout_s: Optional[float] = F(None, "seconds one evaluation may take (null: runtime.sample_timeout_s)", gt=0)


@dataclass
class CheckpointConfig:
    every_iters: int = F(0, "write a checkpoint every N iterations (0: never)", ge=0)
    at_end: bool = F(True, "write a checkpoint when the run ends")
    keep: int = F(3, "checkpoints to keep (newest; 0: all)", ge=0)
    include_replay: bool = F(True, "store replay buffers in checkpoints")


@dataclass
class RunConfig:
    dir: Optional[str] = F(None, "run folder; default runs/<algo>-<env>-<timestamp>")
    min_iter_time_s: float = F(0.0, "merge train steps into one reported iteration until this many seconds", ge=0)
    min_iter_env_steps: int = F(0, "merge train steps into one reported iteration until this many env steps", ge=0)
    reporters: List[str] = F(help="reporters of the run, in call order (`flowkit plugins` lists them)",
                             factory=lambda: ["progress", "csv", "plot", "checkpoint", "evaluation"])
    output: Optional[str] = F(None, "folder to write the sampled experience to as a Minari dataset; docs/offline.md")
    output_append: bool = F(False, "run.output: add the episodes to the dataset already there (same spaces)")


@dataclass
class LRConfig:
    """The learning-rate keys an algorithm section starts from (subclass it; redeclare ``lr``
    for another default): ``lr_schedule=linear`` takes ``lr`` to 0 at ``schedule_env_steps``,
    also the horizon of the section's other ``*_schedule`` keys (:func:`flowkit.config.schedule_keys`)."""
    lr: float = F(1e-3, "learning rate", gt=0)
    lr_schedule: str = F("constant", "constant, or linear (to 0 at schedule_env_steps)", choices=("constant", "linear"))
    schedule_env_steps: Optional[int] = F(None, "horizon of the linear schedules, env steps sampled "
                                                "(default stop.env_steps)", gt=0)


@dataclass
class RandomConfig:
    """random: uniform over the legal actions, learns nothing (baselines, opponents)."""
    report_every_env_steps: int = F(1000, "env steps per reported iteration", ge=1)


@dataclass
class Config:
    algo: str = F("ppo", "algorithm name (see `flowkit plugins`)")
    seed: int = F(0, "one seed for torch, numpy, env resets and exploration", ge=0, le=2 ** 32 - 1)
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


def _unwrap_optional(tp):
    if typing.get_origin(tp) is Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


@functools.lru_cache(maxsize=64)
def _leaves(cls: Any, prefix: str = "") -> Tuple[Tuple[str, Any, Any], ...]:
    """``(dotted key, dataclass field, type)`` of every leaf of a dataclass schema (kept per
    schema: a config build reads its schema's leaves three times, each read resolving the type
    hints of every section)."""
    hints = typing.get_type_hints(cls)
    out: List[Tuple[str, Any, Any]] = []
    for f in dataclasses.fields(cls):
        if isinstance(base := _unwrap_optional(hints[f.name])[0], type) and dataclasses.is_dataclass(base):
            out.extend(_leaves(base, f"{prefix}{f.name}."))
        else:
            out.append((prefix + f.name, f, hints[f.name]))
    return tuple(out)


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


# ---- what an algorithm declares, checked against the config (Algorithm.check_*, check_run) -----
# ``algo`` below is an algorithm's declaration: a flowkit.AlgorithmRef (before torch loads) or an
# Algorithm class (at set-up), which carry the same attributes.

def action_space_error(algo: Any, policy_id: str, action_space: Any) -> Optional[str]:
    """Why ``algo`` (its ``action_spaces``: Gymnasium space class names; empty: any) cannot act in
    ``action_space``; None if it can."""
    kinds, got = algo.action_spaces, type(action_space).__name__
    if not kinds or got in kinds:
        return None
    other = "dqn or ppo" if got == "Discrete" and "Discrete" not in kinds else "ppo"
    return (f"policy {policy_id!r}: {algo.name.upper()} needs a {' or '.join(kinds)} action space, got "
            f"{action_space} (use an algorithm for {got} actions, e.g. {other})")


def model_error(algo: Any, policy_id: str, model_config: Any, section: Any = None,
                recurrent_algos: Sequence[str] = ()) -> Optional[str]:
    """Why ``algo`` cannot train policy ``policy_id``'s network as ``model_config`` (a ``model.*``
    section) describes; None if it can:

    - ``model.recurrent`` set where ``algo.recurrent`` is false (naming ``recurrent_algos``, the
      installed algorithms that train recurrent networks);
    - ``model.normalize_obs=true`` where ``algo.normalize_obs`` is False (giving
      ``algo.normalize_obs_refusal``), or where it names a key of ``section`` (the algorithm's
      section; None: its defaults) that is the same switch (:func:`normalize_obs_on`) and that
      key, true by default, is given false (the user's off would be overridden).
    """
    if (kind := model_config.recurrent) and not algo.recurrent:
        which = f" (installed algorithms that do: {', '.join(sorted(recurrent_algos))})" if recurrent_algos else ""
        return (f"policy {policy_id!r}: model.recurrent={kind} but {algo.name.upper()} trains feed-forward networks "
                f"only{which}; set model.recurrent=null or change the algorithm")
    support = algo.normalize_obs
    if not model_config.normalize_obs or (support and not isinstance(support, str)):
        return None
    if not support:
        return (f"policy {policy_id!r}: model.normalize_obs=true is not supported by {algo.name}: "
                f"{algo.normalize_obs_refusal or 'its policies keep no running observation statistics'}, "
                "or remove model.normalize_obs")
    if section is not None and getattr(section, support) is False and getattr(algo.config_class, support) is True:
        return (f"policy {policy_id!r}: model.normalize_obs=true contradicts {algo.name}.{support}=false: the two keys "
                f"are one switch (either turns observation normalisation on); remove one of them")
    return None


def normalize_obs_on(model_config: Any, section: Any = None, own_key: str = "") -> bool:
    """Whether a policy normalises its observations: ``model.normalize_obs`` of
    ``model_config`` is true, or its algorithm has a key ``own_key`` in its section
    ``section`` that is the same switch (``ppo.normalize_observations``,
    ``es.normalize_observations``, ``ars.normalize_observations``) and that key is true.
    Either key turns normalisation on; neither alone turns it off. What the policies read;
    :func:`model_error` (at set-up and before Ray starts) refuses what they cannot honour."""
    return bool(model_config.normalize_obs) or bool(own_key and getattr(section, own_key, False))


class ConfigError(ValueError):
    """A configuration problem; the message names the key(s) and value(s) involved."""


def schedule_keys(section: Any) -> Tuple[str, ...]:
    """The schedules a config section declares: its keys named ``*_schedule`` (each
    ``constant`` or ``linear``; a linear one takes its value from the section's base key to 0
    over ``schedule_env_steps`` env steps sampled, default ``stop.env_steps``: an
    :class:`LRConfig`). ``section``: a dataclass (class or instance)."""
    return tuple(f.name for f in dataclasses.fields(section) if f.name.endswith("_schedule"))


def check_schedules(section: Any, name: str, run_config: Any) -> None:
    """A linear schedule ``<name>.<key>=linear`` (``key`` in :func:`schedule_keys`) needs a
    horizon: ``<name>.schedule_env_steps`` or ``stop.env_steps``. Run by :func:`validate_section`
    for each section a run uses, so an algorithm declares a schedule by its field alone.

    Raises:
        ConfigError: ``<name>.<key>=linear needs a horizon: ...``.
    """
    for key in schedule_keys(section):
        if getattr(section, key) == "linear" and section.schedule_env_steps is run_config.stop.env_steps is None:
            raise ConfigError(f"{name}.{key}=linear needs a horizon: set {name}.schedule_env_steps or stop.env_steps")


def schedule_horizon(section: Any, run_config: Any) -> Optional[int]:
    """Env steps sampled at which the section's linear schedules reach 0, or None when none
    of its :func:`schedule_keys` is ``linear``."""
    if section is None or "linear" not in [getattr(section, k) for k in schedule_keys(section)]:
        return None
    return int(section.schedule_env_steps or run_config.stop.env_steps)


def round_env_steps(run_config: Any) -> int:
    """Env steps of one sampling round: ``runtime.num_workers`` (0 counts as 1: the local
    worker samples) x ``num_envs_per_worker`` x ``rollout_fragment_length``."""
    rt = run_config.runtime
    return max(1, int(rt.num_workers)) * int(rt.num_envs_per_worker) * int(rt.rollout_fragment_length)


def check_values(cfg: Any, schema_cls: Any, prefix: str = "") -> None:
    """Check every value of ``cfg`` (a DictConfig shaped like the dataclass ``schema_cls``)
    against what its field allows (see :func:`F`); ``Dict[str, <dataclass>]`` fields are walked.

    Raises:
        ConfigError: one line naming the full key, the value and what is allowed, e.g.
            ``ppo.lr=inf must be finite and > 0``.
    """
    for key, f, tp in _leaves(schema_cls):
        val, base, leaf = OmegaConf.select(cfg, key), _unwrap_optional(tp)[0], _leaf_type(tp)
        origin, key = typing.get_origin(base), prefix + key
        if val is None or leaf not in (int, float, str) and not dataclasses.is_dataclass(leaf):
            continue  # e.g. Dict[str, Any]: open, checked by its reader
        if dataclasses.is_dataclass(leaf):  # Dict[str, <dataclass>]
            for k in val:
                check_values(val[k], leaf, f"{key}.{k}.")
            continue
        items = ([(f"{key}[{i}]", v) for i, v in enumerate(val)] if origin in (list, List) else
                 [(f"{key}.{k}", val[k]) for k in val] if origin in (dict, Dict) else [(key, val)])
        allowed = f.metadata.get("allowed") or Allowed()
        for k, v in items:
            if isinstance(v, (list, dict, ListConfig, DictConfig)):  # e.g. a nested list in YAML
                got = OmegaConf.to_object(v) if OmegaConf.is_config(v) else v
                raise ConfigError(f"`{k}` must be {_KINDS[leaf]}, got {_short(got)}")
            if not allowed.ok(v, leaf is float):
                what = allowed.describe(leaf is float)
                if leaf is int and ((v > INT64_MAX and allowed.le is None and allowed.lt is None)
                                    or (v < INT64_MIN and allowed.ge is None and allowed.gt is None)):
                    what = " and ".join(filter(None, (what, f"fit in 64 bits ([{INT64_MIN}, {INT64_MAX}])")))
                raise ConfigError(f"{k}={v!r} must {f'match {allowed.pattern}' if allowed.pattern else f'be {what}'}")


def make_schema_class(sections: Dict[str, type]) -> type:
    """The Config dataclass extended with one field per extra section."""
    extra = [(name, cls, F(help=(cls.__doc__ or name).strip().splitlines()[0], factory=cls))
             for name, cls in sections.items()]
    for name in set(sections) & {f.name for f in dataclasses.fields(Config)}:
        raise ConfigError(f"plugin config section {name!r} clashes with a core section")
    return dataclasses.make_dataclass("FlowkitConfig", extra, bases=(Config,))


class Sections(Dict[str, type]):
    """``{name: dataclass}`` of the sections a config may hold beside the core ones (what
    ``PluginManager.config_sections`` returns). Each of ``algorithms`` is read only by the
    algorithm of its name: a config holds it only where it is needed (:func:`held_sections`)."""

    def __init__(self, sections: Any = (), algorithms: Iterable[str] = ()):
        super().__init__(sections)
        self.algorithms = frozenset(algorithms)


_INTERPOLATED = re.compile(r"\$\{\s*(\w+)\.")


def held_sections(layers: Sequence[Dict[str, Any]], sections: Dict[str, type]) -> Dict[str, type]:
    """The sections of ``sections`` that a config built from ``layers`` (its sources as nested
    dicts, in order) holds: every plugin section, and an algorithm's section (``sections.algorithms``)
    where the run uses the algorithm (``algo``, ``multiagent.policies.<id>.algo``), a source sets
    it or an interpolation names it. What every section costs is the config's build (OmegaConf
    makes a node per key: 430 keys for the 25 sections installed on 2026-12-07), so a run builds
    only its own; a section left out reads as its defaults (:func:`section_object`)."""
    algos: Iterable[str] = getattr(sections, "algorithms", ())
    used = [layer["algo"] for layer in layers if "algo" in layer][-1:] or [Config.algo]
    used += [a for layer in layers for a in _policy_algos(layer)]
    if any(a is not None and (not isinstance(a, str) or "${" in a) for a in used):  # known once resolved
        return dict(sections)
    named = set(used) | {k for layer in layers for k in layer} | set(_INTERPOLATED.findall(str(layers)))
    return {k: v for k, v in sections.items() if k not in algos or k in named}


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
            or changed_keys(v, sections[k])))}


def changed_keys(given: Dict[str, Any], section: type) -> List[str]:
    """The keys of ``given`` (a config section as plain data, ``OmegaConf.to_container``) whose
    values differ from the defaults of ``section`` (its dataclass). A section equal to the
    dataclass's own defaults, as ``dataclasses.asdict`` gives them (the plain data OmegaConf gives:
    every section's fields have defaults)."""
    default = dataclasses.asdict(section())
    return [k for k in given if given[k] != default.get(k)]


def run_algorithms(cfg: Any) -> List[str]:
    """The algorithms a config's policies use, before any env is built: ``algo`` and each
    ``multiagent.policies.<id>.algo`` given."""
    return list(dict.fromkeys(str(a) for a in [cfg.algo, *_policy_algos(cfg)]))


def _policy_algos(src: Any) -> List[Any]:
    """Each ``multiagent.policies.<id>.algo`` given in ``src``: a config, or one of its sources as
    a dict (where a value may still be an interpolation or of a wrong type)."""
    ma = src.get("multiagent")
    pols = ma.get("policies") if isinstance(ma, (dict, DictConfig)) else None
    pols = pols if isinstance(pols, (dict, DictConfig)) else {}
    return [p.get("algo") for p in pols.values() if isinstance(p, (dict, DictConfig)) and p.get("algo") is not None]


def did_you_mean(word: Any, options: Iterable[str], prefix: str = "") -> str:
    """``"; did you mean `<prefix><closest option>`?"``, or "" when none is close (letter case
    ignored: ``PPO`` finds ``ppo``)."""
    lower = {str(o).lower(): str(o) for o in options}
    close = difflib.get_close_matches(str(word).lower(), list(lower), n=1)
    return f"; did you mean `{prefix}{lower[close[0]]}`?" if close else ""


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
    for name in [str(k) for k in cfg if k in algos and k in sections and k not in used]:  # (`in cfg`: 0.1 ms)
        given: Dict[str, Any] = OmegaConf.to_container(cfg[name], resolve=True)  # type: ignore[assignment]
        diff = changed_keys(given, sections[name])
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
    load (``flowkit train``, :func:`flowkit.train`) and again at set-up: ``algo`` installed (the
    error names the closest), no section of a variant of ``algo`` set in its place
    (:func:`check_unused_sections`), exactly one of ``env.id`` and ``env.factory``, one sampling
    round of at most :data:`MAX_BATCH_ROWS` env steps (num_workers, 0 counting as 1, x
    num_envs_per_worker x rollout_fragment_length), ``stop.evaluation_return_mean`` with
    periodic evaluation, ``run.reporters`` known and listed once, ``model.recurrent`` and
    ``model.normalize_obs`` against what ``algo`` declares (:func:`model_error`),
    ``learner.num_learners`` > 0 only on Ray, for feed-forward policies of algorithms that
    declare ``learner_group``; then each reporter's ``validate_config``, and the checks of
    ``algo``'s section and the plugins' sections (:func:`validate_section`), whose warnings are
    given at set-up.

    Raises:
        ConfigError: the first problem found.
    """
    algos, known, given = pm.algorithms(load=False), pm.reporters(), list(cfg.run.reporters)
    if cfg.algo not in algos:  # (the closest named)
        raise ConfigError(f"algo={cfg.algo!r} is not an installed algorithm ({', '.join(sorted(algos))})"
                          f"{did_you_mean(cfg.algo, algos)}")
    check_unused_sections(cfg, algos, pm.config_sections())
    a, rt, rows, n = algos[cfg.algo], cfg.runtime, round_env_steps(cfg), int(cfg.learner.num_learners)
    section = section_object(cfg, a.name, a.config_class)
    unknown, twice = [r for r in given if r not in known] + [""], sorted({r for r in given if given.count(r) > 1})
    no_group = [b for b in run_algorithms(cfg) if b in algos and not algos[b].learner_group] + [""]
    group = ", ".join(sorted(k for k, r in algos.items() if r.learner_group))
    example = ("; e.g. `flowkit train algo=ppo env=CartPole-v1` (its tuned config is used when there is one) "
               "or a config file, `flowkit train -c FILE`") if not cfg.env.factory else ""
    why = model_error(a, "default", cfg.model, section, [k for k, r in algos.items() if r.recurrent])
    config_checks([
        (bool(cfg.env.id) == bool(cfg.env.factory), "give exactly one of env.id (env=ID) and env.factory "
         f"(got env.id={cfg.env.id!r}, env.factory={cfg.env.factory!r}){example}"),
        (rows > MAX_BATCH_ROWS, f"one sampling round of runtime.num_workers={rt.num_workers} x num_envs_per_worker="
         f"{rt.num_envs_per_worker} x rollout_fragment_length={rt.rollout_fragment_length} = {rows} env steps is "
         f"over flowkit's limit of {MAX_BATCH_ROWS}; lower one of them"),
        (cfg.stop.evaluation_return_mean is not None and not cfg.evaluation.interval, "stop.evaluation_return_mean="
         f"{cfg.stop.evaluation_return_mean} needs periodic evaluation: set evaluation.interval (e.g. "
         "evaluation.interval=5)"),
        (twice, f"run.reporters: {', '.join(map(repr, twice))} listed more than once"),
        (unknown[0], f"run.reporters: unknown reporter {unknown[0]!r} (known: {', '.join(sorted(known))})"),
        (why, str(why)),
        (n and rt.backend != "ray", f"learner.num_learners={n} runs learner processes on Ray: it needs "
         f"runtime.backend=ray (got {rt.backend}); learner.num_learners=0 trains in this process"),
        (n and no_group[0], f"learner.num_learners={n}: algo {no_group[0]} does not train through a learner group "
         f"(those that do: {group}); set learner.num_learners=0"),
        (n and cfg.model.recurrent, f"learner.num_learners={n}: a learner group trains feed-forward policies only "
         f"(model.recurrent={cfg.model.recurrent})"),
    ])
    for name in given:
        if callable(check := getattr(known[name], "validate_config", None)):
            check(cfg)
    validate_section(a.name, cfg, section)
    for name, cls in pm.config_sections().items():
        if name not in algos:  # the plugins' own sections (input.*, multiagent.*)
            validate_section(name, cfg, section_object(cfg, name, cls))


def validate_section(name: str, run_config: Any, section: Any) -> List[str]:
    """The one validation of a section ``name`` (``section``: an instance of its dataclass;
    None: the run has none): the linear schedules' horizon (:func:`check_schedules`), the section's own
    ``validate(run_config, name)`` where its class has one (the checks that relate several keys,
    torch-free, written as a table: :func:`config_checks`), and a warning when its
    ``learning_starts`` is not below ``stop.env_steps`` (the run stops in the replay warm-up).
    Each key's own range or choices are declared in its field (:func:`F`), checked before.
    Run before torch and Ray load (:func:`check_run`: ``algo``'s section and the plugins' own
    sections), at set-up for each algorithm of a run, and for a multi-agent policy's own section.

    Returns:
        the warnings (one line each).
    Raises:
        ConfigError: naming the keys and values.
    """
    if section is None:
        return []
    check_schedules(section, name, run_config)
    check = getattr(section, "validate", None)
    out = list(check(run_config, name) or []) if check is not None else []
    starts, budget = getattr(section, "learning_starts", None), run_config.stop.env_steps
    if starts is not None and budget is not None and starts >= budget:
        out.append(f"{name}.learning_starts={starts} >= stop.env_steps={budget}: the run stops in the "
                   "replay warm-up and trains nothing")
    return out


def config_checks(errors: Iterable[Tuple[Any, str]], warnings: Iterable[Tuple[Any, str]] = ()) -> List[str]:
    """A section's combination checks as one table: ``errors`` and ``warnings`` are rows
    ``(condition, message)``. The first error whose condition holds is raised; otherwise the
    messages of the warnings whose condition holds are returned (what a config class's
    ``validate`` returns).

    Raises:
        ConfigError: the message of the first error that holds.
    """
    for bad, message in errors:
        if bad:
            raise ConfigError(message)
    return [message for bad, message in warnings if bad]


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
        hint = did_you_mean(key, keys)
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
        want = (f"a list, e.g. {key}={_list_example(base, tp[2])}" if origin in (list, List)
                else "a mapping" if origin in (dict, Dict) else _KINDS.get(base, _type_name(base)))
        return ConfigError(f"`{key}` must be {want}, got {'null' if v is None else repr(v)}")
    return ConfigError(f"config key `{key or '?'}`: {str(e).splitlines()[0]}")


def _list_example(tp: Any, default: Any) -> str:
    """A list value for an error's example: the key's default when it has items, else two
    items of its element type (``[1,2]``, ``[a,b]``)."""
    if isinstance(default, (list, tuple)) and default and all(isinstance(d, (str, int, float)) for d in default):
        return "[" + ",".join(map(str, default)) + "]"
    elem = (typing.get_args(tp) or (int,))[0]
    return {str: "[a,b]", float: "[0.5,1.0]"}.get(elem, "[1,2]")


def _dotlist(items: Sequence[Any]) -> Dict[str, Any]:
    """``["a.b=1", ...]`` as a nested dict, each value read as YAML by OmegaConf (text that is
    not YAML stays a string). ``env=ID`` is ``env.id=ID``; both spellings together are an error."""
    layer, seen = OmegaConf.create(), typing.cast(Dict[str, str], {})
    for item in items:
        spelling, _, raw = item.partition("=") if isinstance(item, str) else ("", "", "")
        if not (spelling := spelling.strip()) or "=" not in item:
            hint = (" (a config file goes after -c: `flowkit train -c FILE key=value ...`)"
                    if isinstance(item, str) and item.endswith((".yaml", ".yml")) else "")
            raise ConfigError(f"override {item!r} is not of the form key=value{hint}")
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


def read_yaml(path: str, error: Any = ConfigError, max_bytes: Optional[int] = None) -> Dict[str, Any]:
    """The YAML file ``path``, which holds a mapping, as plain data, read with OmegaConf's YAML
    loader (a SafeLoader: no tag runs; 1e-5 a float; duplicate keys refused); nothing resolved.
    The one reader of config files: ``-c`` files and a run folder's ``config.yaml``
    (:func:`flowkit._trust.read_run_config`).

    Raises:
        ConfigError: (of the class ``error``) one line naming the file: not a regular file (a
            pipe, a device), missing, a folder, over ``max_bytes``, unreadable, not UTF-8, not
            valid YAML (a ``!!python`` tag included; the line, column and what), keys OmegaConf
            cannot hold, or no mapping at the top.
    """
    p = f"config file {path!r}"
    try:
        if not os.path.isdir(path) and os.path.exists(path) and not os.path.isfile(path):  # open() would wait
            raise error(f"{p} is not a regular file (a pipe, a device or a socket); give a YAML file")  # (a FIFO)
        if max_bytes is not None and os.path.getsize(path) > max_bytes:
            raise error(f"{p} holds {os.path.getsize(path)} bytes, more than a config may (at most {max_bytes})")
        with open(path, encoding="utf-8") as f:
            data = OmegaConf.load(f)
    except FileNotFoundError:
        raise error(f"{p} does not exist") from None
    except IsADirectoryError:
        raise error(f"{p} is a directory; give a YAML file") from None
    except UnicodeDecodeError as e:
        raise error(f"{p} is not a UTF-8 text file (byte {e.start}: {e.object[e.start:e.start + 1]!r}); give a "
                    "YAML file") from None
    except yaml.MarkedYAMLError as e:  # one line: where, what, and in what
        def at(mark: Any) -> str:
            return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "?"
        what = " ".join(str(e.problem or e.context or "syntax error").split())
        ctx = f" ({' '.join(e.context.split())} at {at(e.context_mark)})" if e.context and e.problem else ""
        raise error(f"{p} is not valid YAML: {at(e.problem_mark)}: {what}{ctx}") from None
    except yaml.YAMLError as e:
        raise error(f"{p} is not valid YAML: {' '.join(str(e).split())}") from None
    except OmegaConfBaseException as e:  # YAML OmegaConf cannot hold: a `null:` or `[1]:` key
        raise error(f"{p} is not a config: {str(e).splitlines()[0]} (keys must be strings or ints)") from None
    except OSError as e:
        if e.strerror:
            raise error(f"{p} cannot be read: {e.strerror}") from None
        data = None  # OmegaConf's answer to a number at the top
    if not isinstance(data, DictConfig):
        raise error(f"{p} must hold a mapping at the top")
    return typing.cast(Dict[str, Any], OmegaConf.to_container(data, resolve=False))


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


def _layers(user: Any, config_file: Union[str, Sequence[str], None]) -> Tuple[List[Dict[str, Any]], List[str]]:
    """(each config file (in order), then ``user``; the overrides of ``user``)."""
    source, items = _as_source(user)
    files = [config_file] if isinstance(config_file, str) else list(config_file or [])
    return [_env_shorthand(read_yaml(f)) for f in files] + [source], items


def plugin_modules_from(user: Any, config_file: Union[str, Sequence[str], None] = None) -> List[str]:
    """The ``plugins`` list of a config source (needed before the schema can be built)."""
    mods: List[str] = []
    for src in _layers(user, config_file)[0]:
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
    layers, items = _layers(user, config_file)
    schema_cls = make_schema_class(held_sections(layers, sections or {}))
    _decimal_for_int(items, schema_keys(schema_cls))
    merged = OmegaConf.structured(schema_cls)
    for layer in layers:
        merged = merge_overrides(merged, layer, schema_cls, known=sections or {})
    OmegaConf.set_struct(merged, True)
    try:
        OmegaConf.resolve(merged)  # validates each result against its field's type
    except OmegaConfBaseException as e:
        raise _config_error(e, {}) from None
    check_values(merged, schema_cls)
    return merged


def merge_overrides(base: DictConfig, overrides: Dict[str, Any], schema: type,
                    known: Optional[Dict[str, type]] = None) -> DictConfig:
    """``base`` with the nested dict ``overrides`` merged in by OmegaConf, which checks every
    key and type against the dataclass ``schema``; an integral float (``1e4``) for an int
    field becomes an int; a section given as null (``ppo:`` in YAML) is skipped. ``known``:
    the sections whose keys an unknown key's hint may name (default: those of ``schema``).

    Raises:
        ConfigError: an unknown key (with the closest valid one) or a value of the wrong type.
    """
    keys = schema_keys(schema)
    layer = {k: v for k, v in overrides.items() if v is not None or not any(s.startswith(f"{k}.") for s in keys)}
    if err := _layer_error(layer, keys):
        raise err
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
        raise _config_error(e, keys if known is None else schema_keys(make_schema_class(known)), layer,
                            base.get("algo") if isinstance(base, DictConfig) else None) from None
    except TypeError as e:  # OmegaConf: "Cannot merge incompatible container types" (_layer_error's cases)
        raise ConfigError(f"config: {e}") from None


def _layer_error(layer: Any, keys: Dict[str, Tuple[Any, str, Any]], prefix: str = "") -> Optional[ConfigError]:
    """The first key of ``layer`` (a nested dict) that OmegaConf would refuse with a TypeError
    or take without a word: a section not given as a mapping, a list where the schema has a
    mapping or a mapping where it has a list, an int, float or bool given as text (``"64"`` in
    YAML quotes; interpolations, ``${...}``, are text by nature). None if there is none."""
    for k, v in (layer.items() if isinstance(layer, dict) else ()):
        key, tp = f"{prefix}{k}", keys.get(f"{prefix}{k}")
        origin = typing.get_origin(_unwrap_optional(tp[0])[0]) if tp else None
        if tp is None and v is not None and not isinstance(v, dict) and any(s.startswith(f"{key}.") for s in keys):
            return ConfigError(f"`{key}` is a config section: give a mapping of its keys "
                               f"(e.g. `{key}.<key>=value`), got {v!r}")
        if isinstance(v, list) and origin in (dict, Dict) or isinstance(v, dict) and origin in (list, List):
            return ConfigError(f"`{key}` must be {'a list' if isinstance(v, dict) else 'a mapping'}, got {_short(v)}")
        if isinstance(v, dict) and (err := _layer_error(v, keys, f"{key}.")):
            return err
        leaf = _leaf_type(tp[0]) if tp else None
        for name, x in [(f"{key}[{i}]", x) for i, x in enumerate(v)] if isinstance(v, list) else [(key, v)]:
            if leaf in (int, float, bool) and isinstance(x, str) and "${" not in x:
                quoted = x.lower() in ("true", "false") if leaf is bool else _NUMBER.fullmatch(x.strip())
                return ConfigError(f"`{name}` must be {_KINDS[leaf]}, got the text {x!r}"
                                   + (" (write it without quotes)" if quoted else ""))
    return None


_DECIMAL = re.compile(r"[+-]?(\d+\.\d*|\.\d+)([eE][+-]?\d+)?")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")  # a number, written as text


def _decimal_for_int(items: Sequence[Any], keys: Dict[str, Tuple[Any, str, Any]]) -> None:
    """An override giving an int key a number with a decimal point (``stop.env_steps=1.5e3``:
    a float, which OmegaConf would round to an int without a word); a count in e-notation is
    written with a whole mantissa (``1e5``, ``15e2``).

    Raises:
        ConfigError: naming the key and the text.
    """
    for item in items:
        key, _, raw = item.partition("=") if isinstance(item, str) else ("", "", "")
        key = key.strip()
        if key in keys and _leaf_type(keys[key][0]) is int and _DECIMAL.fullmatch(raw.strip()):
            raise ConfigError(f"`{key}` must be an int, got {raw.strip()} (a float; a count in e-notation has a whole "
                              "mantissa: 1e5, 15e2)")


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def section_object(cfg: DictConfig, name: str, cls: Optional[type]) -> Any:
    """Section ``name`` of ``cfg`` as an instance of its dataclass ``cls``: the one form of a
    section that algorithms, policies and validation read (None where ``cls`` is None; its
    defaults where ``cfg`` holds no such section: :func:`held_sections`)."""
    if cls is None:
        return None
    return cls(**(typing.cast(Dict[str, Any], OmegaConf.to_container(cfg[name], resolve=True)) if name in cfg else {}))


def describe_keys(sections: Optional[Dict[str, type]] = None) -> List[Tuple[str, str, str, Any, str]]:
    """Every config key of the schema with ``sections`` as ``(key, type, allowed, default,
    help)`` rows, in schema order: ``("ppo.lr", "float", "> 0", 0.0003, "Adam learning rate")``.
    ``allowed`` is "" when any value of the type goes (floats must also be finite); for a
    list or a mapping it applies to each item. The fields of a ``Dict[str, <dataclass>]``
    key follow it as ``<key>.<id>.<field>`` rows. What ``flowkit train --help`` and the docs'
    config reference show."""
    def rows(cls: Any, prefix: str) -> Iterator[Tuple[str, str, str, Any, str]]:
        allowed = schema_allowed(cls, prefix)
        for key, (tp, hlp, default) in schema_keys(cls, prefix).items():
            rng = allowed[key].describe(_leaf_type(tp) is float, say_finite=False) if key in allowed else ""
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
