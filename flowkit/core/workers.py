"""Rollout workers: the RolloutWorker (inference policies and one env runner) and the
WorkerSet (Ray actors or in-process objects, same code path).

(env construction, seeds and space checks are in ``_envs``; the Gymnasium runner in ``_runner``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

import gymnasium as gym
import numpy as np

from flowkit.config import round_env_steps
from flowkit.core import batch as sb
from flowkit.core._envs import (
    EnvContext,
    EnvError,
    SpaceCheck,
    derive_seed,
    env_name,
    make_env,
    mute_env_notes,
    task_env,
)
from flowkit.core.flow import LocalActor, LocalFuture, RayActor, get_result

if TYPE_CHECKING:
    from flowkit.core.policy import Policy

_log = logging.getLogger("flowkit")


# weights up to this size travel inside each call (below Ray's 100 KiB inlining bound)
INLINE_WEIGHTS_BYTES = 64 * 1024


def weights_nbytes(weights: Any) -> int:
    """Bytes of the arrays in ``weights`` (nested dicts of arrays; anything else counts 0)."""
    if isinstance(weights, dict):
        return sum(weights_nbytes(v) for v in weights.values())
    return int(getattr(weights, "nbytes", 0))


# ---- the rollout worker ----------------------------------------------------------------------
@dataclasses.dataclass
class PolicySpec:
    """How to build one policy on a worker or the learner."""
    policy_class: type
    observation_space: gym.Space
    action_space: gym.Space
    config: Any                 # the algorithm's config dataclass instance
    algo: str = ""
    model: Any = None           # this policy's model.* section (DictConfig); None: the run's

    def model_config(self, run_config: Any) -> Any:
        """The ``model.*`` section this policy is built with."""
        return self.model if self.model is not None else run_config.model


class RolloutWorker:
    """Holds inference copies of the policies and one env runner. Methods are called on the
    driver through :class:`flowkit.core.flow.LocalActor` / :class:`RayActor`.

    Args:
        config: the run config (DictConfig or container).
        index: worker index (0-based; -1 for the driver's evaluation worker).
        num_workers: workers in the run.
        policy_specs: ``{policy_id: PolicySpec}``.
        restart_count: times this slot was rebuilt.
        pm: a plugin manager (local backend); None: ``make_pm`` builds one.
        num_envs: sub-envs (default ``runtime.num_envs_per_worker``).
        make_pm: ``make_pm(plugins) -> plugin manager`` from importable plugins (``plugins``:
            the config's ``plugins`` list; a Ray actor's: a picklable function).

    Raises:
        ValueError: neither ``pm`` nor ``make_pm`` given.
    """

    def __init__(self, config: Any, index: int, num_workers: int, policy_specs: Optional[Dict[str, PolicySpec]],
                 restart_count: int = 0, pm: Any = None, num_envs: Optional[int] = None,
                 make_pm: Optional[Callable[[List[str]], Any]] = None):
        from omegaconf import DictConfig, OmegaConf
        if not isinstance(config, DictConfig):
            config = OmegaConf.create(config)
        self.config = config
        self.index, self.num_workers, self.restart_count = index, num_workers, restart_count
        if OmegaConf.select(config, "learner.reuse_freed_memory", default=True):
            reuse_freed_memory()  # (a process setting: once more is harmless)
        if pm is None:
            if make_pm is None:
                raise ValueError("a RolloutWorker needs a plugin manager (pm) or a function that builds one (make_pm)")
            pm = make_pm(list(config.plugins))
            if "torch" in sys.modules:  # policies that act in numpy leave it unloaded
                sys.modules["torch"].set_num_threads(max(1, int(config.runtime.torch_threads)))
        self.pm = pm
        self.weights_version = 0
        self.episode_ids = itertools.count(index * 10_000_000 + restart_count * 1_000_000_000)
        self.policies: Dict[str, "Policy"] = {}
        if policy_specs is not None:
            self._make_policies(policy_specs)
        n = int(num_envs or config.runtime.num_envs_per_worker)
        self.env_cfg: Dict[str, Any] = OmegaConf.to_container(config.env, resolve=True)  # type: ignore[assignment]
        env_cfg = self.env_cfg
        self.sub_env_contexts = [EnvContext(index, j, num_workers, restart_count,
                                            derive_seed(int(config.seed), "env", index, j, restart_count))
                                 for j in range(n)]
        name, steps = env_name(env_cfg), int(config.env.check_spaces_steps)
        self._envs = [SpaceCheck(e, name, ctx, steps) if isinstance(e := make_env(env_cfg, ctx), gym.Env) else e
                      for ctx in self.sub_env_contexts]
        self.env_context = self.sub_env_contexts[0]
        if policy_specs is not None:
            self._make_runner()

    def build(self, policy_specs: Dict[str, PolicySpec], config: Any) -> None:
        """The rest of a worker constructed with ``policy_specs=None`` (its plugins and envs
        built before the run's policies were known: :func:`prestart`): the policies and the
        env runner, with the run's ``config``."""
        from omegaconf import OmegaConf
        self.config = OmegaConf.create(config)
        self._make_policies(policy_specs)
        self._make_runner()

    def _make_policies(self, policy_specs: Dict[str, PolicySpec]) -> None:
        seed, i, r = int(self.config.seed), self.index, self.restart_count
        self.policies = {pid: spec.policy_class(spec.observation_space, spec.action_space, spec.config,
                                                spec.model_config(self.config), "cpu",
                                                derive_seed(seed, "policy", pid, i, r), inference_only=True)
                         for pid, spec in policy_specs.items()}

    def _make_runner(self) -> None:
        envs = self._envs
        runner_cls = self.pm.hook.flowkit_make_env_runner(env=envs[0], context=self.env_context,
                                                          config=self.config, policies=self.policies)
        if runner_cls is None:
            raise ValueError(f"no env runner accepts env {env_name(self.config.env)!r} ({type(envs[0]).__name__})")
        self.runner = runner_cls(self, envs)

    # -- remote API --
    def sample(self, weights: Optional[Dict[str, Dict[str, np.ndarray]]] = None,
               version: int = 0) -> sb.MultiAgentBatch:
        """One fragment (see the env runner); ``weights`` (with their ``version``), when
        given, are set first."""
        if weights is not None:
            self.set_weights(weights, version)
        try:
            return self._check_finite(self.runner.sample())
        except Exception as e:
            e.add_note(f"[flowkit] in rollout worker {self.index} (restart {self.restart_count}), "
                       f"env {env_name(self.config.env)!r}")
            raise

    def compute_gradients(self, policy_ids: Sequence[str], weights: Optional[Dict[str, Dict[str, np.ndarray]]] = None,
                          version: int = 0) -> sb.MultiAgentBatch:
        """Sample one fragment (as :meth:`sample`) and compute ``policy_ids``' gradients on it
        (:meth:`Policy.compute_gradients`); the rows stay here. Returns the fragment's
        MultiAgentBatch without rows (env and agent steps, episodes and ``meta`` kept) and
        ``meta["gradients"] = {policy_id: (float32[P] gradient, loss stats, rows)}`` (A3C)."""
        b = self.sample(weights, version)
        grads = {pid: (*self.policies[pid].compute_gradients(pb), len(pb))
                 for pid, pb in b.policy_batches.items() if pid in policy_ids and len(pb)}
        return sb.MultiAgentBatch({}, b.env_steps, b.agent_steps, b.episodes, b.worker_index,
                                  {**b.meta, "gradients": grads})

    def _check_finite(self, b: sb.MultiAgentBatch) -> sb.MultiAgentBatch:
        """Observations and rewards of a fragment are finite (a sum per column; the element
        is looked up only when it is not): else an :class:`EnvError`, never retried."""
        for pid, pb in b.policy_batches.items():
            for col in (sb.OBS, sb.NEXT_OBS, sb.REWARDS):
                x = pb.get(col)
                if x is None or x.dtype.kind != "f" or np.isfinite(x.sum()) or np.isfinite(x).all():
                    continue
                bad = int(np.flatnonzero(~np.isfinite(x))[0])
                row, c = divmod(bad, x.size // len(x))
                step = int(pb[sb.T][row]) + (col != sb.OBS) if sb.T in pb else "?"
                what = "reward" if col == sb.REWARDS else f"observation `{self.policies[pid].encoder.key_path(c)}`"
                raise EnvError(f"env {env_name(self.config.env)!r} (worker {self.index}, policy {pid!r}) returned a "
                               f"non-finite {what} ({x.reshape(-1)[bad]}) at step {step} of an episode (0: reset)")
        return b

    def apply_flow(self, method: str, fns: Sequence[Callable], *args) -> Any:
        x = getattr(self, method)(*args)
        for fn in fns:
            x = fn(x)
        return x

    def set_weights(self, weights: Dict[str, Dict[str, np.ndarray]], version: int = 0) -> None:
        for pid, w in weights.items():
            if pid in self.policies:
                self.policies[pid].set_weights(w)
        self.weights_version = version

    def get_weights(self) -> Dict[str, Dict[str, np.ndarray]]:
        return {pid: p.get_weights() for pid, p in self.policies.items()}

    def set_exploration_state(self, states: Dict[str, Dict[str, Any]]) -> None:
        """``{policy_id: Acting.exploration_state()}`` into this worker's policies (others ignored)."""
        for pid, st in states.items():
            if pid in self.policies:
                self.policies[pid].set_exploration_state(st)

    def set_task(self, task: Any) -> None:
        """Set ``task`` on every sub-env (:class:`~flowkit.core.TaskSettableEnv`) and start new
        episodes in all of them: the next :meth:`sample` holds only episodes of ``task``. Called
        again with the same task, it starts new episodes (the sub-envs' RNGs go on).

        Raises:
            EnvError: the env is not task-settable, or its runner cannot restart its episodes
                (a native vector env: use ``env.vectorization=sync``).
        """
        name = env_name(self.config.env)
        reset = getattr(self.runner, "reset", None)
        if reset is None or getattr(self.runner, "native", False):
            raise EnvError(f"env {name!r}: rollout worker {self.index}'s env runner ({type(self.runner).__name__}) "
                           "cannot start new episodes for a task (set env.vectorization=sync)")
        for e in self._envs:
            task_env(e, name).set_task(task)
        reset()

    def apply(self, fn: Callable[["RolloutWorker"], Any]) -> Any:
        return fn(self)

    def evaluate(self, num_episodes: int, explore: bool = False) -> List[Dict[str, Any]]:
        return self.runner.evaluate(num_episodes, explore)

    def get_pid(self) -> int:
        return os.getpid()

    def pending_env_steps(self) -> int:
        """Transitions sampled but not yet returned (carried into the next fragment); they
        are lost if this worker dies."""
        return sum(len(c) for c in getattr(self.runner, "carry", None) or [] if c is not None)

    def ping(self) -> bool:
        return True

    def stop(self) -> None:
        """Close the envs and let them go now: the runner and this worker refer to each other,
        and the CLI's exit skips the garbage collection that would free the pair (ale-py then
        reports its envs as leaked)."""
        if hasattr(self.runner, "close"):
            self.runner.close()
        self.runner, self._envs = None, []  # (the runner's envs, built before it)


# ---- the worker set ----------------------------------------------------------------------------
class StartTimeout(TimeoutError):
    """Ray did not place and start every rollout worker within ``runtime.start_timeout_s``."""


class WorkerImportError(ImportError):
    """A rollout worker cannot import flowkit or a plugin: not restarted (a new worker imports
    from the same path)."""


def reuse_freed_memory() -> bool:
    """``learner.reuse_freed_memory`` (driver and rollout workers): mallopt(3) M_MMAP_THRESHOLD 64 MiB,
    M_TRIM_THRESHOLD 1 GiB, so large freed blocks (minibatch tensors, a fragment's frames) are reused
    from the heap, not faulted in fresh each time. False, changing nothing, without glibc's mallopt."""
    import ctypes
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # (malloc.h)
    return bool(mallopt(M_MMAP_THRESHOLD, 64 << 20)) and bool(mallopt(M_TRIM_THRESHOLD, 1 << 30))


def _import_failure(exc: BaseException, plugins: Sequence[str]) -> Optional[str]:
    """The worker's own one-line message where ``exc`` (as the driver got it: Ray wraps a
    worker's error with its traceback) says the worker could not import flowkit or one of
    ``plugins`` (top-level module names), else None."""
    import re

    from flowkit.core.names import plugin_entry_points
    tops = [ep.module for ep in plugin_entry_points()] + [str(p) for p in plugins]
    names = "|".join(re.escape(p.split(".")[0]) for p in ["flowkit", *tops])
    m = re.search(rf"(?:ModuleNotFoundError|ImportError): (.*(?:'(?:{names})[.'].*|`import flowkit`.*))|"
                  rf"AttributeError: (module '(?:{names})(?:\.\w+)*' has no attribute .*)", str(exc))
    return None if m is None else (m[1] or m[2]).strip()


def _kill(actor: Any) -> None:
    if actor.is_remote:
        import ray
        with contextlib.suppress(Exception):
            ray.kill(actor.handle)


class _RayRolloutWorker(RolloutWorker):
    """The Ray actor class: an error in the constructor (or in ``build``) is kept and raised by
    ``ping`` (the first call the WorkerSet makes), so it reaches the driver with its own type,
    message and notes; Ray would turn it into a bare ActorDiedError."""

    def __init__(self, *args, **kwargs):
        self._init_error: Optional[BaseException] = None
        mute_env_notes()  # the driver said MuJoCo's notes on these envs' model files once
        try:
            super().__init__(*args, **kwargs)
        except Exception as e:
            self._init_error = e

    def build(self, policy_specs: Dict[str, PolicySpec], config: Any) -> None:
        if self._init_error is None:
            try:
                super().build(policy_specs, config)
                if "torch" in sys.modules:  # (a policy that acts with torch)
                    sys.modules["torch"].set_num_threads(max(1, int(self.config.runtime.torch_threads)))
            except Exception as e:
                self._init_error = e

    def ping(self) -> bool:
        if self._init_error is not None:
            raise self._init_error
        return True


@functools.lru_cache(maxsize=None)
def _actor_class(num_cpus: float, scheduling: str = "DEFAULT") -> Any:
    """The Ray actor class of a rollout worker: ``num_cpus`` reserved, placed by Ray's
    ``scheduling`` strategy (``DEFAULT``, or ``SPREAD``: over as many nodes as it can)."""
    import ray
    # DEFAULT given as None: an explicit strategy would place the workers outside the
    # placement group of a Tune trial that starts them (Ray captures child actors only then)
    strategy: Any = None if scheduling == "DEFAULT" else scheduling
    return ray.remote(num_cpus=num_cpus, max_restarts=0, scheduling_strategy=strategy)(_RayRolloutWorker)


def _prestart_key(c: Any) -> str:
    """What a prestarted worker was built with (see :func:`prestart`), from a config container."""
    rt = c["runtime"]
    return repr((c["env"], c["seed"], c["plugins"], rt["num_workers"], rt["num_envs_per_worker"],
                 rt["num_cpus_per_worker"], rt["worker_scheduling"]))


def prestart(config: Any, make_pm: Callable[[List[str]], Any]) -> tuple:
    """Ray actors for the rollout workers of a run about to be set up, built as far as they can
    be before its policies are known (plugins and envs; :meth:`RolloutWorker.build` adds the
    rest): ``(key, [actor handle per worker])``, for :meth:`WorkerSet.start`. Their start-up
    (imports, envs) overlaps the driver's (torch, the learner). ``make_pm``: as for
    :class:`RolloutWorker`."""
    from omegaconf import OmegaConf
    c = OmegaConf.to_container(config, resolve=True)
    n = max(1, int(config.runtime.num_workers))
    cls = _actor_class(float(config.runtime.num_cpus_per_worker), str(config.runtime.worker_scheduling))
    return _prestart_key(c), [cls.remote(c, i, n, None, 0, make_pm=make_pm) for i in range(n)]


def kill_prestarted(prestarted: Optional[tuple], wait_s: float = 60.0) -> None:
    """Kill the actors of a :func:`prestart` result (None: nothing) that no WorkerSet took,
    once each has been created (or failed; ``wait_s`` at most): Ray drops a kill that reaches
    an actor's worker process before the actor is created there ("Mismatched ActorID: ignoring
    KillActor"), and that worker then keeps the actor's CPUs, so a run that needs them waits
    forever ("cluster has 0 free")."""
    if prestarted:
        import ray
        with contextlib.suppress(Exception):
            ray.wait([h.ping.remote() for h in prestarted[1]], num_returns=len(prestarted[1]), timeout=wait_s)
        for h in prestarted[1]:
            with contextlib.suppress(Exception):
                ray.kill(h)


class _FailedActor(LocalActor):
    """A worker whose construction raised here (the local backend): every call answers with
    that error, as :class:`_RayRolloutWorker` does."""

    def __init__(self, error: BaseException, index: int):
        super().__init__(None, index)
        self.error = error

    def submit(self, method: str, *args, **kwargs) -> Any:
        return LocalFuture(error=self.error)


class WorkerSet:
    """The rollout workers of a run, started lazily (``flowkit plan`` starts none).

    ``runtime.backend=ray``: one Ray actor per worker (``runtime.num_cpus_per_worker``);
    ``local``: in-process RolloutWorkers behind the same call interface. Failed workers are
    rebuilt (``runtime.restart_failed_workers``) with the current weights and a seed that
    includes the restart count, at most ``runtime.max_worker_restarts`` consecutive times per
    slot without a successful sample in between. A sample request not answered within
    ``runtime.sample_timeout_s`` counts as a failure (start-up, the first ``ping``, excluded).

    A new worker (at start, a rebuilt one) gets, before its first sample, the weights of
    ``weights_fn()`` and the exploration state of ``exploration_fn(worker_index)``
    (``{policy_id: Acting.exploration_state()}``; DQN's epsilon): see :meth:`_sync_initial`.

    ``pm`` builds the in-process workers' runners; ``make_pm`` the Ray actors' plugin managers
    (see :class:`RolloutWorker`). ``sample_deadline``: the ``deadline`` of in-process workers
    (see :class:`~flowkit.core.flow.LocalActor`; the engine hands in its watchdog's).
    ``rollouts``: False for a run without rollout workers (one that learns from a dataset: the
    offline plugin's plan sets it); :meth:`start` then stops the prestarted ones and starts none
    (the run's evaluation builds its own env on the driver).
    """

    def __init__(self, config: Any, policy_specs: Dict[str, PolicySpec], pm: Any,
                 weights_fn: Optional[Callable[[], Dict[str, Any]]] = None,
                 remote_specs: Optional[Dict[str, PolicySpec]] = None,
                 exploration_fn: Optional[Callable[[int], Dict[str, Any]]] = None,
                 make_pm: Optional[Callable[[List[str]], Any]] = None):
        self.config, self.policy_specs, self.pm, self.make_pm = config, policy_specs, pm, make_pm
        self.sample_deadline: Optional[Callable[[float, str], Any]] = None
        self.remote_specs = remote_specs or policy_specs  # what Ray actors build (Policy.worker_policy_class)
        self.backend = config.runtime.backend
        self.num_workers = max(1, int(config.runtime.num_workers))
        self.round_env_steps = round_env_steps(config)
        """Env steps of one sampling round over all workers (:func:`flowkit.config.round_env_steps`);
        an async plan's item holds ``round_env_steps / num_workers`` of them."""
        self.sample_timeout_s = float(config.runtime.get("sample_timeout_s", 300.0))
        self.weights_fn, self.exploration_fn = weights_fn, exploration_fn
        self._actors: Optional[List[Any]] = None
        self.rollouts = True
        self.prestarted: Optional[tuple] = None  # (key, Ray actor handles) of :func:`prestart`, taken by start()
        self.restart_counts, self.consecutive_failures = [0] * self.num_workers, [0] * self.num_workers
        self.num_restarts = 0
        self.weights_version = 0
        self._last_put: Optional[tuple] = None   # (weights, version, ObjectRef) of the last ray.put
        self._next_sample_weights: Dict[int, tuple] = {}   # worker index -> (actor, weights, version)

    # -- lifecycle --
    @property
    def started(self) -> bool:
        return self._actors is not None

    @functools.cached_property
    def _container(self) -> Any:
        from omegaconf import OmegaConf
        return OmegaConf.to_container(self.config, resolve=True)

    def _make(self, index: int, handle: Any = None) -> Any:
        """A new worker in slot ``index`` (``handle``: a :func:`prestart` actor, built here);
        its construction errors are raised by its first call (``ping``) on either backend."""
        n, restarts = self.num_workers, self.restart_counts[index]
        try:
            if self.backend == "local":
                a: Any = LocalActor(RolloutWorker(self.config, index, n, self.policy_specs, restarts, pm=self.pm), index)
            elif handle is not None:
                handle.build.remote(self.remote_specs, self._container)
                a = RayActor(handle, index)
            else:
                cls = _actor_class(float(self.config.runtime.num_cpus_per_worker), str(self.config.runtime.worker_scheduling))
                a = RayActor(cls.remote(self._container, index, n, self.remote_specs, restarts,
                                        make_pm=self.make_pm), index)
        except Exception as e:
            a = _FailedActor(e, index)
        a.timeout_s, a.deadline = self.sample_timeout_s, self.sample_deadline
        return a

    def start(self) -> None:
        """Create the workers (or take :attr:`prestarted` ones, if built for a config like this
        one's) and wait until each answered."""
        if self._actors is not None:
            return
        p = self.prestarted
        handles = p[1] if self.rollouts and p and p[0] == _prestart_key(self._container) else []
        if handles:
            self.prestarted = None
        self._kill_prestarted()
        self._actors = [self._make(i, handles[i] if handles else None) for i in range(self.num_workers if self.rollouts else 0)]
        pings = self._await_pings(self._actors, float(self.config.runtime.get("start_timeout_s", 600.0)))
        # surface construction errors (bad env, bad spaces) now, with their own type; a
        # worker whose env fails at start is rebuilt like one that fails while sampling
        for a in list(self._actors):
            try:
                get_result(pings[a.index])
            except Exception as e:
                if not self.on_failure(a, e):
                    raise
        self._sync_initial(self._actors)

    def _sync_initial(self, actors: Sequence[Any]) -> None:
        """Weights (``weights_fn``) and exploration state (``exploration_fn``) to new ``actors``;
        a Ray actor runs calls in the order sent, so both are set before its first sample."""
        if self.weights_fn is not None:
            self.sync_weights(self.weights_fn(), actors)
        fn = self.exploration_fn
        for a in actors:
            if fn is not None and (states := fn(a.index)):
                fut = a.submit("set_exploration_state", states)
                if not a.is_remote:  # in-process: an error raises here
                    get_result(fut)

    def _await_pings(self, actors: Sequence[Any], bound: Optional[float]) -> Dict[int, Any]:
        """``{index: ping future}`` of ``actors``; on Ray, once each answered (or failed). While
        Ray cannot place them (a busy attached cluster, a lost node) it says now and then what
        is pending (not inside a placement group, where the CPUs are reserved and start-up is
        only slow); :class:`StartTimeout` after ``bound`` seconds (None: no bound)."""
        futs = {a.index: a.submit("ping") for a in actors}
        if self.backend != "ray":
            return futs
        import ray
        from ray.util import get_current_placement_group
        pending = [f for f in futs.values() if not isinstance(f, LocalFuture)]  # a _FailedActor has answered
        t0, say = time.monotonic(), min(10.0, bound / 2) if bound else 10.0
        if ray.is_initialized() and get_current_placement_group() is not None:  # a Tune trial's: CPUs reserved
            say = float("inf")
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
            waited = time.monotonic() - t0
            if pending and (waited >= say or bound is not None and waited >= bound):
                each = float(self.config.runtime.num_cpus_per_worker)
                total = ray.cluster_resources().get("CPU", 0.0)
                what = (f"{len(pending)} of {len(futs)} rollout workers: need {{CPU: {each:g}}} each, cluster has "
                        f"{ray.available_resources().get('CPU', 0.0):g} free")
                if total >= each * len(futs) and not (bound is not None and waited >= bound):
                    what = (f"{len(pending)} of {len(futs)} rollout workers to start: the cluster's {total:g} CPUs "
                            f"hold them ({each:g} each), so they are placed and only slow to start (a busy machine)")
                if bound is not None and waited >= bound:
                    raise StartTimeout(f"runtime.start_timeout_s={bound:g} passed waiting for {what}: add nodes, "
                                       "lower runtime.num_workers or runtime.num_cpus_per_worker, or wait longer")
                _log.warning("waiting for %s; waited %.0f s", what, waited)
                say *= 2
        return futs

    @property
    def actors(self) -> List[Any]:
        if self._actors is None:
            self.start()
        return list(self._actors or [])

    def local_worker(self) -> Optional[RolloutWorker]:
        """The first worker object (local backend only)."""
        return self.actors[0].obj if self.backend == "local" else None

    def stop(self) -> None:
        self._kill_prestarted()
        for a in self._actors or []:
            with contextlib.suppress(Exception):
                _kill(a) if a.is_remote else a.obj.stop()
        self._actors = None

    def _kill_prestarted(self) -> None:
        p, self.prestarted = self.prestarted, None
        kill_prestarted(p)

    # -- weights --
    def sync_weights(self, weights: Dict[str, Any], actors: Optional[Sequence[Any]] = None,
                     version: Optional[int] = None, with_next_sample: bool = False) -> None:
        """Send ``{policy_id: weights}`` to ``actors`` (default: all): weights of up to
        ``INLINE_WEIGHTS_BYTES`` go by value inside each call (Ray inlines small arguments: no
        object-store round trip, the driver's largest per-push cost with many workers and a
        small network); larger ones with one ``ray.put`` per weights object (pushing the same
        ``weights`` of the same ``version`` to several workers one after another, as IMPALA's
        push to each producing worker does, reuses it).

        ``with_next_sample``: no call of its own; the weights travel with the next ``sample``
        request to each of ``actors`` (see :meth:`sample_args`), which applies them before it
        samples. An async pipeline that keeps a request queued per worker gets its weights at
        the same point as with a separate call, with half the calls."""
        if version is not None:
            self.weights_version = version
        targets = self.actors if actors is None else list(actors)
        ref = weights  # the local backend passes the dict itself
        if self.backend == "ray" and weights_nbytes(weights) > INLINE_WEIGHTS_BYTES:
            import ray
            last = self._last_put
            if version is None or last is None or last[0] is not weights or last[1] != version:
                last = self._last_put = (weights, version, ray.put(weights))
            ref = last[2]
        for a in targets:
            if with_next_sample:
                self._next_sample_weights[a.index] = (a, ref, self.weights_version)
            elif a.is_remote:
                a.submit("set_weights", ref, self.weights_version)
            else:  # in-process: an error raises here
                a.obj.set_weights(ref, self.weights_version)

    def sample_args(self, actor: Any) -> tuple:
        """Arguments of the next ``sample`` request to ``actor``: ``(weights, version)`` when
        weights wait to travel with it (``sync_weights(..., with_next_sample=True)``), else ()."""
        item = self._next_sample_weights.pop(getattr(actor, "index", -1), None)
        return () if item is None or item[0] is not actor else item[1:]

    def foreach_worker(self, method: str, *args) -> List[Any]:
        futs = [a.submit(method, *args) for a in self.actors]
        return [get_result(f) for f in futs]

    # -- faults --
    def mark_success(self, actor: Any) -> None:
        self.consecutive_failures[actor.index] = 0

    def on_failure(self, actor: Any, exc: BaseException) -> bool:
        """Handle a failed call on ``actor``: rebuild it (True) or let the error stop the run
        (False). The error is annotated with the worker index either way.

        Raises :class:`WorkerImportError` (one line) where the worker could not import flowkit
        or a plugin. Not restarted: a space mismatch (:class:`EnvError` from :class:`SpaceCheck`: a bug
        in the env, the same after a restart), and any failure once
        ``runtime.max_worker_restarts`` consecutive restarts of the slot did not help. A
        failure reported by an actor that was already replaced (a stale request) is dropped.
        """
        i = actor.index
        rt = self.config.runtime
        if self._actors is not None and not any(a is actor for a in self._actors):
            return True  # stale: this actor was already rebuilt
        bad = _import_failure(exc, self.config.plugins)
        if bad is not None:
            raise WorkerImportError(f"rollout worker {i} cannot import flowkit or a plugin: {bad}") from None
        exc_note = f"[flowkit] rollout worker {i} failed"
        if exc_note not in getattr(exc, "__notes__", []):
            exc.add_note(exc_note)
        if not rt.restart_failed_workers or self._actors is None or isinstance(exc, EnvError):
            return False
        self.consecutive_failures[i] += 1
        if self.consecutive_failures[i] > int(rt.max_worker_restarts):
            exc.add_note(f"[flowkit] worker {i} failed {self.consecutive_failures[i]} times in a row "
                         f"(runtime.max_worker_restarts={rt.max_worker_restarts}); stopping")
            return False
        _kill(actor)
        self.restart_counts[i] += 1
        self.num_restarts += 1
        _log.warning("rollout worker %d failed (%s); rebuilding it (restart %d, %d/%d in a row)", i,
                     f"{type(exc).__name__}: {exc}".splitlines()[0], self.restart_counts[i],
                     self.consecutive_failures[i], int(rt.max_worker_restarts))
        new = self._make(i)
        try:
            get_result(self._await_pings([new], None)[i])  # a lost node: wait for Ray to place it
        except Exception as e2:  # the rebuild itself failed: count it and retry
            e2.add_note(f"[flowkit] while rebuilding worker {i}")
            _kill(new)  # a Ray actor holds its CPUs until killed
            if self.on_failure(actor, e2):
                return True
            raise e2 from exc  # the latest failure, chained to the one before it
        self._actors = [new if a is actor else a for a in self._actors]
        self._sync_initial([new])
        return True
