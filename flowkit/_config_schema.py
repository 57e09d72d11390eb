"""The schema of flowkit's configuration: how a field is declared and what it allows, the
core sections, and the flat view of a schema's keys.

Holds :func:`F` (a dataclass field with its help text and allowed values) and
:class:`Allowed`, the hard size limits (:data:`MAX_BATCH_ROWS`, :data:`MAX_EPISODES`), the
core section dataclasses (``env``, ``runtime``, ``model``, ... gathered in :class:`Config`),
and :func:`schema_keys` / :func:`schema_allowed`, the ``{dotted key: ...}`` view of a schema
that loading, checking and help text read; and the checks of what an algorithm declares
(its action spaces, ``recurrent``, ``normalize_obs``) against a policy's space and ``model.*``
(:func:`action_space_error`, :func:`model_error`, :func:`normalize_obs_on`), which the set-up
and the check before Ray starts share. Nothing here
loads or merges a config (that is :mod:`flowkit.config`, which re-exports the names here that
others use; import them from there). Imports nothing of flowkit.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

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
    vectorization: str = F("auto", "auto: the env's own vectorized implementation when it registers one "
                           "(e.g. CartPole) and no preset is set, the preset's own on rollout workers where it "
                           "has one (atari: ale-py's), else sync; sync: always a SyncVectorEnv of single envs",
                           choices=("auto", "sync"))
    check_spaces_steps: int = F(2, "env steps per worker whose outputs are checked against the spaces (0: none)", ge=0)
    preset: Optional[str] = F(None, "wrappers for a family of envs, a preset registered by a plugin (flowkit plugins "
                              "lists them): atari (plugins/atari: DeepMind preprocessing, 30 no-ops, frame skip 4 with "
                              "max-pooling, 84x84 grayscale uint8, 4 stacked frames, FIRE on reset; for training also "
                              "life loss as terminal and rewards clipped to their sign; returns reported unclipped "
                              "per game); minigrid (plugins/minigrid: the 7x7 view); docs/envs.md")


@dataclass
class RuntimeConfig:
    backend: str = F("ray", "ray (actors) or local (in-process, same code path)", choices=("ray", "local"))
    num_workers: int = F(2, "rollout workers (0 counts as 1)", ge=0, le=1024)
    num_envs_per_worker: int = F(8, "sub-envs in each worker's vector env", ge=1, le=4096)
    rollout_fragment_length: int = F(64, "env steps per sub-env in each sample batch", ge=1, le=MAX_BATCH_ROWS)
    num_cpus_per_worker: float = F(1.0, "CPUs each rollout worker reserves (Ray)", ge=0)
    worker_scheduling: str = F("DEFAULT", "Ray scheduling strategy of the rollout workers: DEFAULT, or SPREAD over "
                                          "the cluster's nodes", choices=("DEFAULT", "SPREAD"))
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
    double_buffered: Optional[bool] = F(None, "double-buffered sampling (Sample Factory's): a worker's sub-envs in two "
                                              "halves, one stepping in its own thread while the policy acts for the "
                                              "other, for envs that step off the GIL (ale-py's vector env under "
                                              "env.preset=atari, 2+ sub-envs); it keeps a second core busy. null: on "
                                              "where each worker reserves one, runtime.num_cpus_per_worker >= 2")


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
    normalize_obs: bool = F(False, "running mean/std observation normalisation of flat observations (the Zoo's "
                                   "`normalize: true` for MuJoCo), the statistics kept with the network: updated on "
                                   "the learner from the train batches, sent to the workers with the weights, saved "
                                   "in checkpoints, applied by evaluate and export. ppo.normalize_observations, "
                                   "es.normalize_observations and ars.normalize_observations are the same switch: "
                                   "either key turns it on, neither alone turns it off (ars's is on by default). "
                                   "Algorithms that cannot keep the statistics (a3c, ddppo, r2d2, random) refuse true")
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
    num_threads: int = F(1, "torch threads of the learner (driver), and of each learner process of a group", ge=1)
    num_learners: int = F(0, "learner processes (Ray actors) that share every train batch and all-reduce gradients "
                             "(a learner group; ppo, impala, appo, dqn, sac); 0: the learner in the driver", ge=0)
    num_cpus_per_learner: float = F(1.0, "CPUs each learner process of a group reserves", ge=0)
    placement_strategy: str = F("PACK", "Ray placement-group strategy of a learner group's processes",
                                choices=("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"))
    reuse_freed_memory: bool = F(True, "glibc malloc in the driver and the rollout workers: blocks up to 64 MiB from "
                                       "the heap, up to 1 GiB of freed memory kept there for reuse (mallopt "
                                       "M_MMAP_THRESHOLD and M_TRIM_THRESHOLD), so each minibatch's tensors and each "
                                       "fragment's frames do not fault in fresh pages (PPO Pong's 1,024-row batch: "
                                       "2.1 s -> 1.8 s; Atari sampling 16% faster); no effect without glibc")


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
    final: Optional[bool] = F(None, "evaluate once at the end of the run (null: only a run without rollout workers, "
                                    "which plays no episodes of its own: an offline run from input.dataset, so that "
                                    "its summary has a return)")
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
    min_iter_time_s: float = F(0.0, "merge train steps (in the replay warm-up, before learning_starts: sampled "
                                    "rounds) into one reported iteration until this much time passed", ge=0)
    min_iter_env_steps: int = F(0, "merge train steps (in the replay warm-up, before learning_starts: sampled "
                                   "rounds) into one reported iteration until this many env steps", ge=0)
    reporters: List[str] = F(help="reporters of the run, called in this order (built-in: progress, csv, plot, "
                                  "checkpoint, evaluation, tensorboard, timing; plugins add more)",
                             factory=lambda: ["progress", "csv", "plot", "checkpoint", "evaluation"])
    output: Optional[str] = F(None, "write the experience the rollout workers sample as a Minari dataset in this "
                                    "folder (single-agent Gymnasium envs; whole episodes, the env's own observations "
                                    "and actions; docs/offline.md); an existing dataset there is refused unless "
                                    "run.output_append=true; a resumed run appends")
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


def _field(section: Any, key: str, default: Any = None) -> Any:
    """``section.key`` of a config section (a DictConfig or dict, or a dataclass instance);
    ``default`` where it has no such key or is None."""
    if section is None:
        return default
    return section.get(key, default) if isinstance(section, Mapping) else getattr(section, key, default)


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
    if (kind := _field(model_config, "recurrent")) and not algo.recurrent:
        which = f" (installed algorithms that do: {', '.join(sorted(recurrent_algos))})" if recurrent_algos else ""
        return (f"policy {policy_id!r}: model.recurrent={kind} but {algo.name.upper()} trains feed-forward networks "
                f"only{which}; set model.recurrent=null or change the algorithm")
    support = algo.normalize_obs
    if not _field(model_config, "normalize_obs", False) or (support and not isinstance(support, str)):
        return None
    if not support:
        return (f"policy {policy_id!r}: model.normalize_obs=true is not supported by {algo.name}: "
                f"{algo.normalize_obs_refusal or 'its policies keep no running observation statistics'}, "
                "or remove model.normalize_obs")
    default = {f.name: f.default for f in dataclasses.fields(algo.config_class)}.get(support)
    if section is not None and _field(section, support) is False and default is True:
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
    return bool(_field(model_config, "normalize_obs", False)) or (
        bool(_field(section, own_key, False)) if own_key else False)
