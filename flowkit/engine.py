"""The engine: set-up, the run loop, reporting, evaluation and checkpoints.

The run loop, with every hook in order::

    pm = plugin manager (built-ins, entry points, plugins=[...], registered objects)
    cfg = config (schema from flowkit_add_algorithms + flowkit_add_config_sections)
    specs = flowkit_make_policy_specs(config, env, algorithms)     # driver, probe env
    ctx = make_context(...)                                        # driver policies
    plan = flowkit_build_plan(ctx)                                 # driver
    workers start (actors ready: start-up ends here)
    flowkit_on_run_start(ctx)
    for each iteration (StandardMetricsReporting(plan)):
        # on workers, while sampling:
        #   flowkit_on_trajectory(policy_id, batch, episode)  before postprocess (GAE)
        #   flowkit_on_episode_end(episode, worker)
        evaluation (every evaluation.interval iterations)
        flowkit_on_train_result(result, ctx)
        metrics.csv row, progress bar
        checkpoint (every checkpoint.every_iters) -> flowkit_on_checkpoint(path, ctx)
        stop conditions (stop.*, ctx.request_stop)
    final evaluation (evaluation.final), checkpoint (checkpoint.at_end) -> flowkit_on_checkpoint
    result.json, learning_curve.png
    flowkit_on_run_end(result, ctx)
"""
from __future__ import annotations

import contextlib
import csv
import datetime
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
import warnings
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from flowkit.config import ConfigError, build_config, plugin_modules_from, section_view
from flowkit.core.context import RunContext, make_context
from flowkit.core.flow import NOT_READY
from flowkit.core.ops import StandardMetricsReporting
from flowkit.core.workers import EnvContext, EnvError, derive_seed, env_name, make_env
from flowkit.hooks import get_plugin_manager


class Result:
    """What :func:`train` returns.

    Attributes:
        metrics: the last result row (dict). history: every row.
        run_dir: the run folder. checkpoint: the last checkpoint folder (or None).
        stop_reason: why the run stopped. config: the resolved config.
    """

    def __init__(self, metrics, history, run_dir, checkpoint, stop_reason, config):
        self.metrics, self.history, self.run_dir = metrics, history, run_dir
        self.checkpoint, self.stop_reason, self.config = checkpoint, stop_reason, config

    def __repr__(self) -> str:
        r = self.metrics.get("episode_return_mean")
        return (f"Result(stop_reason={self.stop_reason!r}, env_steps={self.metrics.get('env_steps_sampled')}, "
                f"episode_return_mean={r}, run_dir={self.run_dir!r})")


# ---- set-up ----------------------------------------------------------------------------------
def load_config(user: Any = None, config_file: Optional[str] = None, pm: Any = None):
    """Plugin manager and validated config (the ``flowkit train --dry-run`` path).

    Raises:
        ConfigError: any config problem (also an unknown algorithm or unusable env).
    """
    if pm is None:
        pm = get_plugin_manager(plugin_modules_from(user, config_file))
    cfg = build_config(user, config_file, pm.config_sections())
    return pm, cfg


def _validate(cfg: DictConfig, pm: Any) -> Dict[str, type]:
    import difflib
    algos = pm.algorithms()
    if cfg.algo not in algos:
        close = difflib.get_close_matches(cfg.algo, list(algos), n=1)
        hint = f"; did you mean `{close[0]}`?" if close else ""
        raise ConfigError(f"algo={cfg.algo!r} is not an installed algorithm ({', '.join(sorted(algos))}){hint}")
    rt = cfg.runtime
    if rt.backend not in ("ray", "local"):
        raise ConfigError(f"runtime.backend={rt.backend!r} must be ray or local")
    for key in ("num_envs_per_worker", "rollout_fragment_length", "async_requests_per_worker"):
        if int(rt[key]) < 1:
            raise ConfigError(f"runtime.{key}={rt[key]} must be >= 1")
    if int(rt.num_workers) < 0:
        raise ConfigError(f"runtime.num_workers={rt.num_workers} must be >= 0")
    if int(rt.max_worker_restarts) < 0:
        raise ConfigError(f"runtime.max_worker_restarts={rt.max_worker_restarts} must be >= 0")
    if float(rt.num_cpus_per_worker) < 0:
        raise ConfigError(f"runtime.num_cpus_per_worker={rt.num_cpus_per_worker} must be >= 0")
    if cfg.env.autoreset_mode not in ("next_step", "same_step"):
        raise ConfigError(f"env.autoreset_mode={cfg.env.autoreset_mode!r} is not supported; "
                          "use next_step or same_step")
    if bool(cfg.env.id) == bool(cfg.env.factory):
        raise ConfigError("give exactly one of env.id (env=ID) and env.factory "
                          f"(got env.id={cfg.env.id!r}, env.factory={cfg.env.factory!r})")
    if cfg.evaluation.episodes < 1:
        raise ConfigError(f"evaluation.episodes={cfg.evaluation.episodes} must be >= 1")
    if cfg.learner.device not in ("cpu",) and not str(cfg.learner.device).startswith("cuda"):
        raise ConfigError(f"learner.device={cfg.learner.device!r} must be cpu or cuda[:N]")
    from flowkit.core.policy import _ACT_FN
    if cfg.model.activation not in _ACT_FN:
        raise ConfigError(f"model.activation={cfg.model.activation!r} must be one of {sorted(_ACT_FN)}")
    if any(int(h) < 1 for h in cfg.model.hidden_sizes):
        raise ConfigError(f"model.hidden_sizes={list(cfg.model.hidden_sizes)} must hold sizes >= 1")
    for key, v in (("learner.num_threads", cfg.learner.num_threads), ("runtime.torch_threads", rt.torch_threads)):
        if int(v) < 1:
            raise ConfigError(f"{key}={v} must be >= 1")
    return algos


def _probe_env(cfg: DictConfig) -> Any:
    env_cfg = OmegaConf.to_container(cfg.env, resolve=True)
    ctx = EnvContext(-1, 0, max(1, int(cfg.runtime.num_workers)), 0, derive_seed(int(cfg.seed), "probe"))
    try:
        return make_env(env_cfg, ctx)
    except Exception as e:
        key = "env.factory" if cfg.env.factory else "env.id"
        raise ConfigError(f"{key}={env_name(env_cfg)!r}: cannot build the env: {type(e).__name__}: {e}") from None


def setup(cfg: DictConfig, pm: Any, run_dir: Optional[str] = None) -> RunContext:
    """Validate, decide policies, build the learner and the (unstarted) WorkerSet."""
    algos = _validate(cfg, pm)
    env = _probe_env(cfg)
    try:
        specs = pm.hook.flowkit_make_policy_specs(config=cfg, env=env, algorithms=algos)
    finally:
        with contextlib.suppress(Exception):
            env.close()
    if not specs:
        raise ConfigError(f"no plugin knows how to map the agents of env {env_name(cfg.env)!r} to policies")
    instances: Dict[str, Any] = {}
    warns: List[str] = []
    for pid, spec in specs.items():
        cls = algos.get(spec.algo)
        if cls is None:
            raise ConfigError(f"policy {pid!r}: algorithm {spec.algo!r} is not installed")
        cls.check_spaces(pid, spec.observation_space, spec.action_space)
        if spec.algo not in instances:
            warns += cls.validate_config(cfg, cfg[spec.algo] if spec.algo in cfg else None) or []
            instances[spec.algo] = cls(cfg)
    for w in warns:
        warnings.warn(w, stacklevel=2)
    ctx = make_context(cfg, pm, instances, specs, run_dir)
    ctx.config_warnings = warns
    return ctx


def build_plan(ctx: RunContext) -> Any:
    """The plan, with reads of undeclared config keys turned into ConfigErrors (C10)."""
    try:
        plan = ctx.pm.hook.flowkit_build_plan(ctx=ctx)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        raise ConfigError(f"a plugin read config key `{key}`, which its config schema does not "
                          f"declare ({str(e).splitlines()[0]})") from None
    if plan is None:
        raise ConfigError("no plugin built a plan for this run")
    return plan


def describe_plan(user: Any = None, config_file: Optional[str] = None) -> Dict[str, str]:
    """``{"text": ..., "mermaid": ...}`` of the plan of a config; starts no actor."""
    pm, cfg = load_config(user, config_file)
    ctx = setup(cfg, pm)
    plan = StandardMetricsReporting(build_plan(ctx), ctx)
    assert not ctx.workers.started
    return {"text": plan.to_text(), "mermaid": plan.to_mermaid()}


# ---- output ---------------------------------------------------------------------------------
class MetricsWriter:
    """metrics.csv (one row per iteration; rewritten when new columns appear) and optionally
    TensorBoard event files."""

    def __init__(self, run_dir: str, append_rows: Optional[List[Dict[str, Any]]] = None,
                 tensorboard: bool = False):
        self.path = os.path.join(run_dir, "metrics.csv")
        self.rows: List[Dict[str, Any]] = list(append_rows or [])
        self.columns: List[str] = []
        for r in self.rows:
            self.columns += [k for k in r if k not in self.columns]
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self.tb = SummaryWriter(os.path.join(run_dir, "tb"))
        if append_rows is not None:  # resume: drop rows after the checkpoint, torn rows
            self._rewrite()

    def _rewrite(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, self.columns)
            w.writeheader()
            for r in self.rows:
                w.writerow(r)
        os.replace(tmp, self.path)

    def write(self, row: Dict[str, Any]) -> None:
        self.rows.append(row)
        new = [k for k in row if k not in self.columns]
        if new or not os.path.exists(self.path):
            self.columns += new
            self._rewrite()
        else:
            with open(self.path, "a", newline="") as f:
                csv.DictWriter(f, self.columns).writerow(row)
        if self.tb is not None:
            step = int(row.get("env_steps_sampled", 0))
            for k, v in row.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)

    def close(self):
        if self.tb is not None:
            self.tb.close()


def read_metrics(path: str) -> List[Dict[str, Any]]:
    """Rows of a metrics.csv with numbers parsed; a torn row (too few or too many fields,
    as a killed process may leave at the end) is skipped."""
    out = []
    with open(path) as f:
        for r in csv.DictReader(f):
            if None in r or None in r.values():
                continue
            row = {}
            for k, v in r.items():
                if v in ("", None):
                    continue
                try:
                    fv = float(v)
                    row[k] = int(fv) if fv.is_integer() and "." not in v and "e" not in v.lower() else fv
                except ValueError:
                    row[k] = v
            out.append(row)
    return out


def plot_learning_curve(rows: List[Dict[str, Any]], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [r["env_steps_sampled"] for r in rows]
    ax.plot(xs, [r.get("episode_return_mean", float("nan")) for r in rows], label="episode_return_mean (last 20)")
    ev = [(r["env_steps_sampled"], r["evaluation_return_mean"]) for r in rows if "evaluation_return_mean" in r]
    if ev:
        ax.plot(*zip(*ev), "o-", label="evaluation_return_mean")
    for key in sorted({k for r in rows for k in r if k.startswith("policy/") and k.endswith("episode_return_mean")}):
        ax.plot(xs, [r.get(key, float("nan")) for r in rows], label=key)
    ax.set_xlabel("env steps sampled")
    ax.set_ylabel("return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)


# ---- checkpoints ------------------------------------------------------------------------------
def _rng_state() -> Dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(st: Dict[str, Any]) -> None:
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])


def save_checkpoint(ctx: RunContext, run_dir: str, tag: Optional[str] = None) -> str:
    """Write ``checkpoints/<tag>/{state.pt,config.yaml}`` atomically (temp folder, fsync,
    rename) and keep the newest ``checkpoint.keep``. Returns the folder."""
    ck_root = os.path.join(run_dir, "checkpoints")
    os.makedirs(ck_root, exist_ok=True)
    tag = tag or f"iter_{ctx.iteration:06d}"
    final = os.path.join(ck_root, tag)
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=ck_root)
    include_replay = bool(ctx.config.checkpoint.include_replay)
    state = {
        "format": 1,
        "iteration": ctx.iteration,
        "time_total_s": ctx.time_total_s,
        "counters": dict(ctx.counters),
        "policies": ctx.policy_states(),
        "algorithms": {n: a.get_state() for n, a in ctx.algorithms.items()},
        "stateful": {n: (o.get_state(include_replay=include_replay) if _takes_kw(o.get_state, "include_replay")
                         else o.get_state()) for n, o in ctx.stateful.items() if hasattr(o, "get_state")},
        "plugins": ctx.pm.state_dict(),
        "rng": _rng_state(),
        "learner_rng": ctx.rng.bit_generator.state,
        "windows": {"episode": list(ctx.episode_window), "len": list(ctx.len_window),
                    "policy": {k: list(v) for k, v in ctx.policy_windows.items()}},
        "restart_counts": list(ctx.workers.restart_counts),
        "num_restarts": ctx.workers.num_restarts,
        "policy_specs": ctx.policy_specs,
    }
    torch.save(state, os.path.join(tmp, "state.pt"))
    with open(os.path.join(tmp, "config.yaml"), "w") as f:
        f.write(OmegaConf.to_yaml(ctx.config))
    for name in os.listdir(tmp):
        with open(os.path.join(tmp, name), "rb") as f:
            os.fsync(f.fileno())
    if os.path.exists(final):
        shutil.rmtree(final)
    os.replace(tmp, final)
    for stale in os.listdir(ck_root):  # left by a process killed while saving
        if stale.startswith(".tmp-"):
            shutil.rmtree(os.path.join(ck_root, stale), ignore_errors=True)
    keep = int(ctx.config.checkpoint.keep)
    existing = sorted(d for d in os.listdir(ck_root) if d.startswith("iter_"))
    for old in existing[:-keep] if keep > 0 else []:
        if os.path.join(ck_root, old) != final:
            shutil.rmtree(os.path.join(ck_root, old), ignore_errors=True)
    ctx.pm.hook.flowkit_on_checkpoint(path=final, ctx=ctx)
    return final


def _takes_kw(fn, name: str) -> bool:
    import inspect
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def find_checkpoint(path: str) -> str:
    """A checkpoint folder from a run folder (its newest), a checkpoint folder or state.pt."""
    if os.path.isfile(path) and path.endswith("state.pt"):
        return os.path.dirname(path)
    if os.path.isfile(os.path.join(path, "state.pt")):
        return path
    ck_root = os.path.join(path, "checkpoints")
    if os.path.isdir(ck_root):
        cands = sorted(d for d in os.listdir(ck_root)
                       if not d.startswith(".") and os.path.isfile(os.path.join(ck_root, d, "state.pt")))
        if cands:
            # "final" and iter_* both count; the newest by iteration inside wins
            best = max(cands, key=lambda d: (torch.load(os.path.join(ck_root, d, "state.pt"),
                                                        weights_only=False, map_location="cpu")["iteration"],
                                             d == "final"))
            return os.path.join(ck_root, best)
    raise FileNotFoundError(f"no checkpoint at {path!r} (expected a run folder with checkpoints/, "
                            "a checkpoint folder or a state.pt)")


def restore(ctx: RunContext, ck_dir: str) -> None:
    """Load a checkpoint into a freshly set-up context (before the workers start)."""
    st = torch.load(os.path.join(ck_dir, "state.pt"), weights_only=False, map_location="cpu")
    for pid, ps in st["policies"].items():
        if pid in ctx.policies:
            ctx.policies[pid].set_state(ps)
    for n, s in st.get("algorithms", {}).items():
        if n in ctx.algorithms:
            ctx.algorithms[n].set_state(s)
    for n, s in st.get("stateful", {}).items():
        if n in ctx.stateful:
            ctx.stateful[n].set_state(s)
    ctx.pm.load_state_dict(st.get("plugins", {}))
    ctx.counters.update(st["counters"])
    ctx.iteration = int(st["iteration"])
    ctx._time_offset = float(st.get("time_total_s", 0.0))
    _set_rng_state(st["rng"])
    ctx.rng.bit_generator.state = st["learner_rng"]
    w = st.get("windows", {})
    ctx.episode_window.extend(w.get("episode", []))
    ctx.len_window.extend(w.get("len", []))
    for k, v in w.get("policy", {}).items():
        ctx.policy_windows[k].extend(v)
    ctx.workers.restart_counts = [rc + 1 for rc in st.get("restart_counts", ctx.workers.restart_counts)][:ctx.workers.num_workers] \
        + [0] * max(0, ctx.workers.num_workers - len(st.get("restart_counts", [])))
    ctx.workers.num_restarts = int(st.get("num_restarts", 0))


def load_trained(path: str, expected_cls: Optional[type] = None) -> Any:
    """See :meth:`Algorithm.from_checkpoint`."""
    ck = find_checkpoint(path)
    cfg_yaml = OmegaConf.load(os.path.join(ck, "config.yaml"))
    pm = get_plugin_manager(list(cfg_yaml.get("plugins") or []))
    algos = pm.algorithms()
    st = torch.load(os.path.join(ck, "state.pt"), weights_only=False, map_location="cpu")
    name = cfg_yaml.algo
    cls = expected_cls or algos[name]
    cfg = build_config(OmegaConf.to_container(cfg_yaml, resolve=True), None, pm.config_sections())
    algo = cls(cfg)
    seed = int(cfg.seed)
    for pid, spec in st["policy_specs"].items():
        pol = spec.policy_class(spec.observation_space, spec.action_space, spec.config, cfg.model, "cpu",
                                derive_seed(seed, "learner", pid))
        pol.set_state(st["policies"][pid])
        algo.policies[pid] = pol
    algo.checkpoint_state = st
    return algo


# ---- train -------------------------------------------------------------------------------------
def _default_run_dir(cfg: DictConfig) -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    env = str(cfg.env.id or cfg.env.factory or "env").replace("/", "_").replace(":", "_")
    return os.path.join("runs", f"{cfg.algo}-{env}-{stamp}")


@contextlib.contextmanager
def _ray_session(cfg: DictConfig):
    if cfg.runtime.backend != "ray":
        yield
        return
    import ray
    started = False
    if not ray.is_initialized():
        kw: Dict[str, Any] = {"include_dashboard": False, "log_to_driver": True,
                              "configure_logging": True, "logging_level": "warning"}
        if cfg.runtime.address:
            kw["address"] = cfg.runtime.address
            kw["runtime_env"] = _runtime_env(cfg)
        ray.init(**kw)
        started = True
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def _runtime_env(cfg: DictConfig) -> Dict[str, Any]:
    """Ship flowkit and the plugins in use to a cluster's workers (py_modules)."""
    import importlib
    mods = []
    import flowkit
    mods.append(os.path.dirname(flowkit.__file__))
    import importlib.metadata as md
    for ep in md.entry_points(group="flowkit"):
        top = ep.value.split(":")[0].split(".")[0]
        with contextlib.suppress(Exception):
            m = importlib.import_module(top)
            mods.append(os.path.dirname(m.__file__))
    for p in cfg.plugins:
        with contextlib.suppress(Exception):
            m = importlib.import_module(p.split(".")[0])
            mods.append(os.path.dirname(m.__file__) if m.__file__.endswith("__init__.py") else m.__file__)
    return {"py_modules": sorted(set(mods))}


def _stop_reason(cfg: DictConfig, r: Dict[str, Any]) -> Optional[str]:
    s = cfg.stop
    if s.env_steps is not None and r["env_steps_sampled"] >= s.env_steps:
        return f"stop.env_steps={s.env_steps} reached"
    if s.iterations is not None and r["iteration"] >= s.iterations:
        return f"stop.iterations={s.iterations} reached"
    if s.episode_return_mean is not None and r["episode_return_mean"] >= s.episode_return_mean:
        return f"stop.episode_return_mean={s.episode_return_mean} reached"
    if s.time_s is not None and r["time_total_s"] >= s.time_s:
        return f"stop.time_s={s.time_s} reached"
    return None


class _Progress:
    def __init__(self, enabled: bool, total: Optional[int], desc: str):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True,
                            mininterval=0.5 if sys.stderr.isatty() else 5.0, file=sys.stderr)

    def update(self, r: Dict[str, Any]) -> None:
        if self.bar is None:
            return
        self.bar.n = r["env_steps_sampled"]
        post = {"return": f"{r['episode_return_mean']:.1f}", "steps/s": f"{r['env_steps_per_s']:.0f}"}
        if "evaluation_return_mean" in r:
            post["eval"] = f"{r['evaluation_return_mean']:.1f}"
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(0)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def train(config: Any = None, config_file: Optional[str] = None, plugins: Sequence[Any] = ()) -> Result:
    """Train from a config (dotlist list, dict or DictConfig) and return a :class:`Result`.

    Raises:
        ConfigError: a config problem, before anything starts.
        Exception: the original exception of a failed env/worker (with notes naming the
            worker and operator), after a best-effort checkpoint of what was learned.
    """
    t_entry = time.perf_counter()
    pm = get_plugin_manager(plugin_modules_from(config, config_file), extra=plugins)
    user = config
    resume_from = None
    pre = build_config(user, config_file, pm.config_sections())
    run_rows: List[Dict[str, Any]] = []
    if pre.resume:
        resume_from = find_checkpoint(pre.resume)
        saved = OmegaConf.load(os.path.join(resume_from, "config.yaml"))
        src, _ = (user, None)
        from flowkit.config import _as_source
        over, _ = _as_source(user)
        over.pop("resume", None)
        merged = OmegaConf.merge(OmegaConf.create(OmegaConf.to_container(saved, resolve=True)),
                                 OmegaConf.create(over))
        cfg = build_config(OmegaConf.to_container(merged, resolve=True), None, pm.config_sections())
        run_dir = os.path.dirname(os.path.dirname(resume_from))
        mpath = os.path.join(run_dir, "metrics.csv")
        st_iter = torch.load(os.path.join(resume_from, "state.pt"), weights_only=False,
                             map_location="cpu")["iteration"]
        if os.path.exists(mpath):  # rows up to the checkpoint, each iteration once
            by_iter = {int(r["iteration"]): r for r in read_metrics(mpath)
                       if isinstance(r.get("iteration"), int) and 1 <= r["iteration"] <= st_iter}
            run_rows = [by_iter[k] for k in sorted(by_iter)]
    else:
        cfg = pre
        run_dir = cfg.run.dir or _default_run_dir(cfg)
    cfg.run.dir = run_dir
    torch.manual_seed(derive_seed(int(cfg.seed), "torch"))
    np.random.seed(derive_seed(int(cfg.seed), "numpy"))
    random.seed(derive_seed(int(cfg.seed), "python"))
    torch.set_num_threads(max(1, int(cfg.learner.num_threads)))
    ctx = setup(cfg, pm, run_dir)
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "config.yaml"), "w") as f:
        f.write(OmegaConf.to_yaml(cfg))
    with _ray_session(cfg):
        return _run(ctx, cfg, pm, run_dir, resume_from, run_rows, t_entry)


def _run(ctx: RunContext, cfg: DictConfig, pm: Any, run_dir: str, resume_from: Optional[str],
         run_rows: List[Dict[str, Any]], t_entry: float) -> Result:
    plan = build_plan(ctx)
    if resume_from:
        restore(ctx, resume_from)
    reporting = StandardMetricsReporting(plan, ctx)
    writer = MetricsWriter(run_dir, run_rows, bool(cfg.run.tensorboard))
    t0 = time.perf_counter()
    ctx.workers.start()
    ctx.extra_metrics["time_setup_s"] = time.perf_counter() - t0
    pm.hook.flowkit_on_run_start(ctx=ctx)
    progress = _Progress(bool(cfg.run.progress), cfg.stop.env_steps,
                         f"{cfg.algo} {env_name(cfg.env)}")
    last: Dict[str, Any] = dict(run_rows[-1]) if run_rows else {}
    ckpt: Optional[str] = None
    reason: Optional[str] = None
    ev = cfg.evaluation
    ctx.start_clock()
    # start-up: from train() to the first sample request (config, Ray, actors ready)
    ctx.extra_metrics["time_startup_s"] = ctx._t_start - t_entry
    try:
        for r in reporting:
            if r is NOT_READY:
                if cfg.stop.time_s is not None and ctx._time_offset + time.perf_counter() - ctx._t_start >= cfg.stop.time_s:
                    reason = f"stop.time_s={cfg.stop.time_s} reached"
                    break
                continue
            if int(ev.interval) > 0 and r["iteration"] % int(ev.interval) == 0:
                r.update(ctx.evaluate())
            pm.hook.flowkit_on_train_result(result=r, ctx=ctx)
            writer.write(r)
            last = r
            progress.update(r)
            if int(cfg.checkpoint.every_iters) > 0 and r["iteration"] % int(cfg.checkpoint.every_iters) == 0:
                ckpt = save_checkpoint(ctx, run_dir)
            reason = ctx.stop_reason or _stop_reason(cfg, r)
            if reason:
                break
    except KeyboardInterrupt:
        reason = "interrupted"
    except BaseException:
        progress.close()
        with contextlib.suppress(Exception):
            save_checkpoint(ctx, run_dir, "crash")
        ctx.shutdown()
        writer.close()
        raise
    progress.close()
    try:
        if bool(ev.final) and last:
            last = dict(last)
            last.update(ctx.evaluate())
            last["final_evaluation"] = True
        if bool(cfg.checkpoint.at_end) and ctx.iteration > 0:
            ckpt = save_checkpoint(ctx, run_dir, f"iter_{ctx.iteration:06d}")
    finally:
        ctx.shutdown()
        writer.close()
    summary = dict(last)
    summary["stop_reason"] = reason or "plan ended"
    with open(os.path.join(run_dir, "result.json"), "w") as f:
        json.dump(summary, f, indent=2, default=float)
    if bool(cfg.run.plot) and writer.rows:
        with contextlib.suppress(Exception):
            plot_learning_curve(writer.rows, os.path.join(run_dir, "learning_curve.png"),
                                f"{cfg.algo} on {env_name(cfg.env)} (seed {cfg.seed})")
    result = Result(summary, writer.rows, run_dir, ckpt, summary["stop_reason"], cfg)
    pm.hook.flowkit_on_run_end(result=result, ctx=ctx)
    return result
