""":func:`check_algorithm`: the conformance check every algorithm plugin should pass."""
from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from flowkit.core import batch as sb
from flowkit.testing import local_overrides
from flowkit.testing.envs import BOX, DISCRETE, TinyEnv

CHECKS = ("config", "plan", "actions", "checkpoint", "backends", "learn")


class ConformanceError(AssertionError):
    """A check of :func:`check_algorithm` failed; the message names the algorithm, the check
    and what is wrong (a field, a state entry, a column)."""


def check_algorithm(algo_cls: type, overrides: Sequence[str] = (), *, env: Optional[TinyEnv] = None,
                    checks: Sequence[str] = CHECKS, learn_overrides: Sequence[str] = (),
                    learn_env_steps: int = 6000, solved: Optional[float] = None,
                    tmp_dir: Optional[str] = None) -> Dict[str, Any]:
    """Check that an Algorithm class behaves as flowkit expects of a plugin. Checks, in order
    (``checks`` picks a subset):

    - ``config``: ``name``, ``policy_class`` (a :class:`flowkit.Policy`) and ``config_class``
      set; the section is a dataclass with a docstring (the description in ``flowkit
      plugins``) and a help text for every field (``F(default, "help")``); it is closed (an
      unknown key ``<name>.no_such_key`` is a ConfigError).
    - ``plan``: the plan builds and describes itself (``flowkit plan``) without starting a
      worker.
    - ``actions``: for a batch of observations drawn from the observation space, with and
      without exploration, the policy's (and its worker copy's, ``worker_policy_class``)
      ``compute_actions_encoded`` returns one action per row of the distribution's shape and
      kind (integers in range for discrete spaces, finite floats for Box) and per-row extras,
      and ``compute_actions`` returns actions inside the action space (shape, dtype, bounds);
      a failure names the method. (Otherwise a wrong shape surfaces as an error inside the
      env on a worker, an out-of-range action as an IndexError in the loss.)
    - ``checkpoint``: after the first learner update (iteration 2 at least; at most
      ``learn_env_steps``), a checkpoint restored into a fresh run gives back
      exactly the counters, the iteration, every policy's ``get_state()`` (weights, optimizer,
      RNG states), the algorithm's and stateful objects' ``get_state()``, and every public
      attribute of the policies and the algorithm that holds state (numbers, arrays, tensors,
      modules, optimizers, RNGs): one left out of ``get_state``/``set_state`` is named.
    - ``backends``: worker 0's first sample batch is the same, column by column, on the local
      and the Ray backend for one seed (starts a local Ray session if none is running; the
      ``ray_session`` fixture gives one).
    - ``learn``: the greedy return after ``learn_env_steps`` env steps on a tiny env
      (:data:`~flowkit.testing.envs.DISCRETE`, or :data:`~flowkit.testing.envs.BOX` for an
      algorithm that refuses Discrete actions) reaches ``solved`` (default: the env's),
      measured as a user's run acts: 20 greedy episodes on rollout worker 0, with the weights
      the plan last sent the workers (a sync queued to travel with the next sample request is
      applied first). A plan that never sends the trained weights fails, even where the
      learner's own weights (the ``evaluation`` reporter's return, also given) would pass.
      Prioritized replay needs the policy's ``loss`` to set ``td_error`` (float32[B]): a run
      whose loss forgets it stops with an error naming the policy (``UpdatePriorities``).

    Args:
        algo_cls: the Algorithm class; registered for the check unless an installed plugin
            already contributes it under its name.
        overrides: config overrides for every run (e.g. smaller batches).
        env: the tiny env (default: chosen from the action spaces the algorithm accepts).
        learn_overrides: further overrides for the learning run only.
    Returns:
        ``{"plan": text, "learn_return": float (through the workers), "learner_return": float
        (the learner's weights, greedy), ...}`` what the checks measured.
    Raises:
        ConformanceError: the first failed check, named with what is wrong.
    """
    from flowkit.config import ConfigError
    from flowkit.hooks import get_plugin_manager
    name = getattr(algo_cls, "name", "") or ""
    who = f"check_algorithm({getattr(algo_cls, '__name__', algo_cls)!r})"

    def fail(check: str, msg: str) -> ConformanceError:
        return ConformanceError(f"{who}: {check}: {msg}")

    unknown = set(checks) - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown checks {sorted(unknown)} (known: {', '.join(CHECKS)})")
    if not name:
        raise fail("config", "the class has no `name` (its registry name and config section)")
    plugins: List[Any] = []
    have = get_plugin_manager().algorithms(load=False).get(name)
    if have is None:
        plugins.append(_Contributes(algo_cls))
    elif (have.load() if hasattr(have, "load") else have) is not algo_cls:
        raise fail("config", f"the name {name!r} is taken by another installed algorithm ({have!r})")
    env = env or _pick_env(algo_cls)
    work = tmp_dir or tempfile.mkdtemp(prefix=f"check-{name}-")
    base = [f"algo={name}", env.override, "seed=0", "runtime.num_workers=1", "runtime.num_envs_per_worker=2",
            "runtime.rollout_fragment_length=16", "evaluation.interval=0", "checkpoint.at_end=true", *overrides]
    out: Dict[str, Any] = {}
    from flowkit import hooks
    for p in plugins:
        hooks.register(p)
    try:
        if "config" in checks:
            _check_config(algo_cls, name, fail, ConfigError, base)
        if "plan" in checks:
            out["plan"] = _check_plan(name, fail, base)
        if "actions" in checks:
            _check_actions(fail, base)
        if "checkpoint" in checks:
            _check_checkpoint(name, fail, local_overrides(os.path.join(work, "ckpt"), *base, f"stop.env_steps={learn_env_steps}",
                                                          "run.reporters=[checkpoint]"))
        if "backends" in checks:
            _check_backends(fail, base)
        if "learn" in checks:
            out.update(_check_learn(
                fail, env, solved, local_overrides(os.path.join(work, "learn"), *base, *learn_overrides,
                                                   f"stop.env_steps={learn_env_steps}", "evaluation.final=true",
                                                   "evaluation.episodes=20", "run.reporters=[evaluation]")))
    finally:
        for p in plugins:
            hooks.unregister(p)
    return out


class _Contributes:
    def __init__(self, cls: type):
        self.cls = cls

    def flowkit_add_algorithms(self) -> List[type]:
        return [self.cls]


def _pick_env(algo_cls: Any) -> TinyEnv:
    from flowkit.config import ConfigError
    for env in (DISCRETE, BOX):
        e = env.make()
        try:
            algo_cls.check_spaces("default", e.observation_space, e.action_space)
            return env
        except ConfigError:
            continue
    return DISCRETE


def _check_config(algo_cls: type, name: str, fail: Any, config_error: Any, base: List[str]) -> None:
    from flowkit.core.policy import Policy
    from flowkit.engine import load_config
    pol = getattr(algo_cls, "policy_class", None)
    if not (isinstance(pol, type) and issubclass(pol, Policy)):
        raise fail("config", f"policy_class is {pol!r}, not a subclass of flowkit.Policy")
    sec: Any = getattr(algo_cls, "config_class", None)
    if not (isinstance(sec, type) and dataclasses.is_dataclass(sec)):
        raise fail("config", f"config_class is {sec!r}, not a dataclass (the `{name}.*` section)")
    doc, sec_name = sec.__doc__ or "", getattr(sec, "__name__", "?")
    if not doc.strip() or doc.startswith(f"{sec_name}("):  # dataclass's generated docstring
        raise fail("config", f"{sec_name} has no docstring (its first line describes the algorithm "
                             "in `flowkit plugins`)")
    bare = [f.name for f in dataclasses.fields(sec) if not str(f.metadata.get("help", "")).strip()]
    if bare:
        raise fail("config", f"{sec_name} fields without a help text: {', '.join(bare)} (declare each "
                             "with flowkit.config.F(default, \"help\", ...))")
    try:
        load_config([*base, f"{name}.no_such_key=1"])
    except config_error:
        pass
    else:
        raise fail("config", f"the section is not closed: `{name}.no_such_key=1` was accepted")


def _check_plan(name: str, fail: Any, base: List[str]) -> str:
    from flowkit.engine import describe_plan
    try:
        d = describe_plan(["runtime.backend=local", *base])
    except Exception as e:
        raise fail("plan", f"the plan does not build without workers: {type(e).__name__}: {e}") from e
    if len(d["text"].splitlines()) < 2 or not d["mermaid"].strip():  # more than the engine's wrapper
        raise fail("plan", f"the plan describes itself as {d!r}")
    return d["text"]


class _Grab:
    """Stops a run once its learner updated the policies (from iteration 2 on) and keeps its
    run context (the engine's objects after it ended)."""
    ctx: Any = None

    def flowkit_on_train_result(self, result: Dict[str, Any], ctx: Any) -> None:
        if result["iteration"] >= 2 and any(p.num_updates for p in ctx.policies.values()):
            ctx.request_stop("trained")

    def flowkit_on_train_end(self, ctx: Any) -> None:
        self.ctx = ctx


def _check_actions(fail: Any, base: List[str]) -> None:
    from flowkit.core.workers import PolicySpec
    from flowkit.engine import load_config, setup
    pm, cfg = load_config(["runtime.backend=local", *base])
    ctx = setup(cfg, pm)
    for pid, spec in ctx.policy_specs.items():
        pols = [ctx.policies[pid]] if pid in ctx.policies else []
        remote: Optional[PolicySpec] = (getattr(ctx.workers, "remote_specs", None) or {}).get(pid)
        if remote is not None and remote.policy_class is not type(pols[0] if pols else None):
            pols.append(remote.policy_class(remote.observation_space, remote.action_space, remote.config,
                                            remote.model_config(cfg), "cpu", 0, inference_only=True))
        for pol in pols:
            _check_policy_actions(fail, pid, pol, spec.observation_space, spec.action_space)


def _check_policy_actions(fail: Any, pid: str, pol: Any, obs_space: Any, act_space: Any, n: int = 5) -> None:
    """``pol``'s actions for ``n`` observations sampled from ``obs_space`` (seeded) against
    ``act_space`` and its distribution (``pol.dist``)."""
    from flowkit.core import stack_rows
    from flowkit.core.encoders import batch_len
    obs_space.seed(0)
    rows = [obs_space.sample() for _ in range(n)]
    obs = stack_rows(rows)
    who = f"policy {pid!r} ({type(pol).__name__})"
    dist = pol.dist
    state: Any = pol.initial_state(n) if callable(getattr(pol, "initial_state", None)) else None
    kw = {} if state is None else {"state": state}  # a recurrent policy acts from its initial state
    for explore in (True, False):
        enc, mask = pol.encoder(obs, batch_len(obs))
        m = f"{who}.compute_actions_encoded(explore={explore}{', state=initial_state(n)' if kw else ''})"
        got = pol.compute_actions_encoded(enc, mask, explore, **kw)
        if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], dict)):
            raise fail("actions", f"{m} returned {type(got).__name__}, not (actions, extras dict)")
        a, extras = got
        a = np.asarray(a)
        if kw:
            extras = dict(extras)
            out = np.asarray(extras.pop(sb.STATE_OUT, None))
            if out.shape != state.shape:
                raise fail("actions", f"{m}: extra {sb.STATE_OUT!r} of shape {list(out.shape)}, not the state's "
                                      f"{list(state.shape)} (a recurrent policy returns the state after the step)")
        want = (n,) if dist.kind == "cat" else (n, len(dist.nvec)) if dist.kind == "multicat" else \
            (n, int(dist.num_outputs)) if dist.kind == "bern" else None
        if want is not None and a.shape != want:
            raise fail("actions", f"{m}: actions of shape {list(a.shape)} for {n} observations; "
                                  f"{act_space} needs {list(want)}")
        if want is None and (a.ndim < 1 or a.shape[0] != n or a.size != n * int(np.prod(act_space.shape))):
            raise fail("actions", f"{m}: actions of shape {list(a.shape)} for {n} observations; "
                                  f"{act_space} needs [{n}, {', '.join(map(str, act_space.shape))}]")
        if dist.kind in ("cat", "multicat", "bern"):
            hi = np.asarray(dist.nvec if dist.kind != "bern" else [2] * int(dist.num_outputs))
            if a.dtype.kind not in "iub":
                raise fail("actions", f"{m}: actions of dtype {a.dtype} for {act_space}; need integers "
                                      "(0-based action indexes)")
            if (a < 0).any() or (a >= hi).any():
                raise fail("actions", f"{m}: action indexes {a.reshape(n, -1)[:, 0].tolist()} outside "
                                      f"[0, {hi.tolist()}) for {act_space} (0-based, before the space's start)")
        elif a.dtype.kind != "f" or not np.isfinite(a).all():
            raise fail("actions", f"{m}: actions of dtype {a.dtype} with values {a.reshape(-1)[:4].tolist()}; "
                                  f"{act_space} needs finite floats")
        for k, v in extras.items():
            if len(np.asarray(v)) != n:
                raise fail("actions", f"{m}: extra {k!r} has {len(np.asarray(v))} rows for {n} observations")
        m = f"{who}.compute_actions(explore={explore})"
        env_a = pol.compute_actions(obs, explore=explore, **kw)
        env_a = np.asarray(env_a[0] if kw else env_a)
        if env_a.shape[:1] != (n,):
            raise fail("actions", f"{m}: actions of shape {list(env_a.shape)} for {n} observations; {act_space} "
                                  f"needs [{', '.join(map(str, (n, *act_space.shape)))}]")
        bad = [i for i in range(n) if not act_space.contains(env_a[i])]
        if bad:
            row = np.asarray(env_a[bad[0]])
            raise fail("actions", f"{m}: action {_short(row)} (dtype {row.dtype}, shape {list(row.shape)}) of row "
                                  f"{bad[0]} is not in {act_space}")


def _check_checkpoint(name: str, fail: Any, ov: List[str]) -> None:
    import flowkit
    from flowkit.checkpoint import STATE_FILE, checkpoint_state, load_state, restore
    from flowkit.engine import build_plan, load_config, setup
    grab = _Grab()
    res = flowkit.train(ov, plugins=[grab], verbose=False)
    if not res.checkpoint:
        raise fail("checkpoint", f"no checkpoint written (stop reason: {res.stop_reason})")
    a = grab.ctx
    if not any(p.num_updates for p in a.policies.values()):
        raise fail("checkpoint", f"no learner update in {a.counters.get('env_steps_sampled')} env steps: make "
                                 "batches or warm-up smaller in `overrides` so the check covers a trained state")
    pm, cfg = load_config(ov)
    b = setup(cfg, pm)
    build_plan(b)  # stateful parts are created with the plan
    restore(b, res.checkpoint)
    diffs: List[str] = []
    _diff("counters", dict(a.counters), dict(b.counters), diffs)
    _diff("iteration", a.iteration, b.iteration, diffs)
    for pid in a.policies:
        _diff(f"policy {pid!r} get_state()", a.policies[pid].get_state(), b.policies[pid].get_state(), diffs)
        _diff_attrs(f"policy {pid!r}", a.policies[pid], b.policies[pid], diffs)
    for n in a.algorithms:
        _diff_attrs(f"algorithm {n!r}", a.algorithms[n], b.algorithms[n], diffs, skip={"policies"})
    # what was saved (the live run's shard actors are gone) against what the restore gives back
    saved = load_state(os.path.join(res.checkpoint, STATE_FILE))
    now = checkpoint_state(b)
    for key in ("algorithms", "stateful"):
        _diff(f"{key[:-1] if key == 'algorithms' else key}", saved[key], now[key], diffs, ("saved", "restored"))
    b.shutdown()
    if diffs:
        raise fail("checkpoint", "a checkpoint round trip does not give back the trained state (save it in "
                                 "get_state() and restore it in set_state()):\n  " + "\n  ".join(diffs[:8]))


def _state(v: Any) -> Any:
    """A comparable form of a stateful value, or ``_SKIP``."""
    import torch
    if isinstance(v, (bool, int, float, np.number)):
        return v
    if isinstance(v, torch.Generator):
        return v.get_state().numpy()
    if isinstance(v, np.random.Generator):
        return v.bit_generator.state
    if callable(getattr(v, "state_dict", None)):  # modules, optimizers
        return v.state_dict()
    return _SKIP  # arrays, tensors and containers may be per-batch scratch (e.g. the last TD errors)


_SKIP = object()
_NOT_STATE = {"config", "run_config", "model_config", "observation_space", "action_space", "encoder", "dist",
              "device", "inference_only"}


def _diff_attrs(where: str, a: Any, b: Any, diffs: List[str], skip: Any = ()) -> None:
    for k, v in vars(a).items():
        if k.startswith("_") or k in _NOT_STATE or k in skip:
            continue
        sa = _state(v)
        if sa is _SKIP:
            continue
        if not hasattr(b, k):
            diffs.append(f"{where}: `{k}` is missing after restore")
            continue
        _diff(f"{where}: `{k}`", sa, _state(getattr(b, k)), diffs)


def _diff(where: str, a: Any, b: Any, diffs: List[str], labels: Any = ("after training", "after restore")) -> None:
    """Append where ``a`` and ``b`` differ (recursively; arrays and tensors exactly)."""
    import torch
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        a = a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else a
        b = b.detach().cpu().numpy() if isinstance(b, torch.Tensor) else b
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            miss, extra = sorted(map(str, set(a) - set(b))), sorted(map(str, set(b) - set(a)))
            diffs.append(f"{where}: keys differ (only {labels[0]}: {miss}, only {labels[1]}: {extra})")
        for k in a:
            if k in b:
                _diff(f"{where}[{k!r}]", a[k], b[k], diffs, labels)
        return
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(f"{where}[{i}]", x, y, diffs, labels)
        return
    if isinstance(a, (np.ndarray, np.generic)) or isinstance(b, (np.ndarray, np.generic)):
        xa, xb = np.asarray(a), np.asarray(b)
        if xa.shape != xb.shape or not np.array_equal(xa, xb, equal_nan=xa.dtype.kind == "f"):
            diffs.append(f"{where}: {_short(xa)} {labels[0]}, {_short(xb)} {labels[1]}")
        return
    if a != b and not (isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b)):
        diffs.append(f"{where}: {_short(a)} {labels[0]}, {_short(b)} {labels[1]}")


def _short(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"array{list(v.shape)} sum={float(v.sum()) if v.dtype.kind in 'fiub' else '?'}"
    s = repr(v)
    return s if len(s) < 60 else s[:57] + "..."


def _check_backends(fail: Any, base: List[str]) -> None:
    from flowkit import _ray
    from flowkit.core import batch as sb
    from flowkit.engine import load_config, setup
    firsts = {}
    for backend in ("local", "ray"):
        pm, cfg = load_config([*base, f"runtime.backend={backend}"])
        if backend == "ray":
            _ray.start(cfg)
            _ray.wait()
        ws = setup(cfg, pm).workers
        try:
            ws.start()
            mb = ws.foreach_worker("sample")[0]
        finally:
            ws.stop()
        firsts[backend] = mb.policy_batches if isinstance(mb, sb.MultiAgentBatch) else {"default": mb}
    a, b = firsts["local"], firsts["ray"]
    diffs: List[str] = []
    _diff("worker 0's first batch", {p: dict(x) for p, x in a.items()}, {p: dict(x) for p, x in b.items()}, diffs,
          ("on the local backend", "on Ray"))
    if diffs:
        raise fail("backends", "the local and Ray backends sample differently for one seed:\n  " + "\n  ".join(diffs[:8]))


class _ActAsWorkers:
    """At the end of a run, before its workers stop: 20 greedy episodes on rollout worker 0 with
    the weights it holds (a sync queued for the next sample request applied first)."""
    episodes: Optional[List[Dict[str, Any]]] = None
    no_workers = False  # a run without rollout workers (input.dataset): the learner's evaluation counts

    def flowkit_on_train_end(self, ctx: Any) -> None:
        ws = ctx.workers
        if not ws.actors:
            self.no_workers = True
            return
        for a, ref, version in list(getattr(ws, "_next_sample_weights", {}).values()):
            a.obj.set_weights(ref, version) if not a.is_remote else a.submit("set_weights", ref, version)
        self.episodes = ws.actors[0].obj.evaluate(20, False) if not ws.actors[0].is_remote else \
            ws.foreach_worker("evaluate", 20, False)[0]


def _check_learn(fail: Any, env: TinyEnv, solved: Optional[float], ov: List[str]) -> Dict[str, float]:
    import flowkit
    probe = _ActAsWorkers()
    res = flowkit.train(ov, plugins=[probe], verbose=False)
    learner = res.metrics.get("evaluation_return_mean")
    got = float(np.mean([e["return"] for e in probe.episodes])) if probe.episodes else None
    if probe.no_workers and learner is not None:
        got = float(learner)
    want = env.solved if solved is None else solved
    steps = res.metrics.get("env_steps_sampled")
    if got is None or not got >= want:
        why = (f"the learner's own weights reach {learner:.4g}: the rollout workers act with other weights (a plan "
               "that does not send the trained weights to the workers: BroadcastWeights / workers.sync_weights)"
               if learner is not None and learner >= want else
               "the algorithm does not learn, or needs other settings (overrides)")
        raise fail("learn", f"greedy return {got} on rollout worker 0 on {env.factory} after {steps} env steps, below "
                            f"{want} (the env is solved at {env.solved}; random play is far below): {why}")
    return {"learn_return": got, "learner_return": float(learner) if learner is not None else float("nan")}
