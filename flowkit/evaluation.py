"""``flowkit evaluate``: score a saved policy without training it, optionally on video.

Single-agent Gymnasium envs: ``episodes`` episodes spread over ``num_envs`` sub-envs stepped
together (one batched ``compute_actions(obs, explore)`` call per step); episode ``i`` starts
with ``reset(seed=seed + i)`` whichever sub-env runs it, so a greedy evaluation is the same as
a plain loop over those seeds. PettingZoo games run through the multiagent plugin's own
evaluation (its runners: ``multiagent.eval_opponents``, seat rotation, win/draw/loss rates)
with ``seed`` as the run's seed (sub-env ``j`` first resets with ``derive_seed(seed, "env",
-1, j, 0)``).

Nothing of the run changes: the weights are loaded as saved (:func:`flowkit.checkpoint.load_trained`),
the run folder is not locked, and the only files written are ``evaluation.json`` (and the
videos, ``videos/episode_NNN.mp4|gif``) in the checkpoint's folder. Beside a live run, the
checkpoint may be pruned (``checkpoint.keep``) while it loads (then the newest is loaded) or
while it is evaluated: the run leaves these outputs in place (:func:`flowkit.checkpoint.prune_checkpoint`). Videos come from the env's
``render_mode="rgb_array"`` frames, written with imageio (imageio-ffmpeg for mp4, pillow for gif).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from flowkit.config import MAX_EPISODES, ConfigError, F


@dataclass
class EvaluateArgs:
    """``flowkit evaluate``: score a saved policy (no training step; the run is not changed) and
    write evaluation.json in the checkpoint's folder. The fields are its ``key=value`` arguments."""
    episodes: int = F(10, "episodes to run", ge=1, le=MAX_EPISODES)
    seed: Optional[int] = F(None, "episode i resets with seed + i (default: the run's seed)", ge=0, le=2 ** 32 - 1)
    explore: bool = F(False, "sample actions (seeded by `seed`) instead of acting greedily")
    render: Optional[str] = F(None, "record episodes as video files", choices=("mp4", "gif"))
    render_episodes: int = F(1, "with render: record the first N episodes", ge=1, le=MAX_EPISODES)
    num_envs: int = F(8, "sub-envs stepped together", ge=1, le=4096)
    opponents: Dict[str, str] = F(help="multi-agent runs: policy id -> the fixed policy that plays its agents in "
                                       "this evaluation instead: `random` or a checkpoint path (as the run's "
                                       "multiagent.eval_opponents, which it extends), e.g. opponents.player_1=random",
                                  factory=dict)
    timeout_s: Optional[float] = F(None, "seconds the evaluation may take (a stuck env, an episode that never ends): "
                                         "then one line and exit 1 (default: the run's runtime.sample_timeout_s)", gt=0)


def _stats(xs: List[float], prefix: str) -> Dict[str, float]:
    a = np.asarray(xs, np.float64)
    return {f"{prefix}{k}": float(f(a)) for k, f in (("mean", np.mean), ("std", np.std), ("min", np.min),
                                                       ("max", np.max))}


class _Video:
    """Frames of one episode streamed to a temporary file beside ``path`` (mp4: imageio-ffmpeg,
    gif: pillow), renamed to ``path`` by :meth:`close` when the episode has ended; :meth:`abort`
    (an interrupted or failed evaluation) removes it, so ``path`` is never a partial video."""

    def __init__(self, path: str, fps: float):
        import imageio.v2 as iio
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.path = path
        folder, name = os.path.split(path)
        stem, ext = os.path.splitext(name)
        self.tmp = os.path.join(folder, f".{stem}.tmp-{os.getpid()}{ext}")  # (the extension picks the format)
        kw: Dict[str, Any] = ({"fps": fps, "macro_block_size": 1} if path.endswith(".mp4")
                              else {"duration": 1000.0 / fps, "loop": 0})
        self.writer = iio.get_writer(self.tmp, **kw)

    def add(self, frame: Any) -> None:
        if not isinstance(frame, np.ndarray) or frame.ndim != 3:
            raise ConfigError(f"render: the env's render() returned {type(frame).__name__}, not an RGB frame "
                              "(does it support render_mode='rgb_array'?)")
        self.writer.append_data(frame)

    def close(self) -> None:
        self.writer.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()
        with contextlib.suppress(OSError):
            os.remove(self.tmp)


def _check_video_deps(fmt: str) -> None:
    import importlib.util
    need = ["imageio"] + (["imageio_ffmpeg"] if fmt == "mp4" else ["PIL"])
    missing = [m for m in need if importlib.util.find_spec(m) is None]
    if missing:
        pkgs = " ".join({"imageio_ffmpeg": "imageio-ffmpeg", "PIL": "pillow"}.get(m, m) for m in missing)
        raise ConfigError(f"render={fmt} needs {pkgs} (pip install {pkgs})")


def run_gym_episodes(policy: Any, env_cfg: Dict[str, Any], episodes: int, seed: int, explore: bool = False,
                     num_envs: int = 8, render: Optional[str] = None, render_episodes: int = 1,
                     video_dir: str = ".") -> List[Dict[str, Any]]:
    """:func:`flowkit.core.run_episodes` (the one episode loop, see the module docstring), with
    the first ``render_episodes`` episodes recorded as ``video_dir/episode_NNN.<render>``.

    Returns:
        ``[{"return": float, "length": int, "seed": int, "video": path or None}]`` in episode order.
    Raises:
        ConfigError: ``render`` without its packages, or an env that cannot render.
        EnvError: the env's ``reset`` or ``step`` raised (its type and message, one line).
    """
    from flowkit.core import run_episodes
    videos: Dict[int, _Video] = {}
    paths: Dict[int, str] = {}

    def film(i: int, env: Any, ended: bool) -> None:
        if i >= render_episodes:
            return
        try:
            frame = env.render()
        except Exception as e:  # no OpenGL for MuJoCo, a renderer missing: one line, not a traceback
            first = (str(e).strip().splitlines() or [""])[0]
            raise ConfigError(f"render={render}: the env's render() raised {type(e).__name__}: {first}"
                              + ("; MuJoCo renders off-screen with MUJOCO_GL=egl (or osmesa, with libOSMesa)"
                                 if "mujoco" in type(e).__module__ or "OpenGL" in first else "")) from None
        if i not in videos:  # (after the first frame: a failed render leaves no empty video)
            fps = float((getattr(env, "metadata", None) or {}).get("render_fps") or 30)
            videos[i] = _Video(os.path.join(video_dir, f"episode_{i:03d}.{render}"), fps)
            paths[i] = videos[i].path
        videos[i].add(frame)
        if ended:
            videos.pop(i).close()

    if render:
        _check_video_deps(render)
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame renders off-screen: no display needed
        if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
            os.environ.setdefault("MUJOCO_GL", "egl")  # MuJoCo off-screen, as dm_control does headless
        env_cfg = {**env_cfg, "kwargs": {**(env_cfg.get("kwargs") or {}), "render_mode": "rgb_array"}}
    try:
        out = run_episodes(policy, env_cfg, episodes, seed, explore, num_envs, after_env=film if render else None)
    except TypeError as e:
        if not render or videos or paths:
            raise
        raise ConfigError(f"render={render}: the env cannot be built with render_mode='rgb_array' ({e})") from None
    finally:
        for v in videos.values():  # episodes not ended: an error or a signal stopped the evaluation
            v.abort()
    return [{**e, "video": paths.get(i)} for i, e in enumerate(out)]


def _multiagent_episodes(algo: Any, cfg: Any, episodes: int, seed: int, explore: bool,
                         num_envs: int, opponents: Dict[str, str]) -> List[Dict[str, Any]]:
    """Episode summaries from the env runner's own evaluation (PettingZoo games), with
    ``opponents`` (policy id -> ``random`` or a checkpoint) added to ``multiagent.eval_opponents``."""
    from omegaconf import OmegaConf

    from flowkit.core import PolicySpec, RolloutWorker
    from flowkit.hooks.manager import worker_plugin_manager
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    cfg.seed = seed
    for pid, what in opponents.items():
        if pid not in algo.policies:
            raise ConfigError(f"opponents.{pid}: no policy {pid!r} in this run (policies: {', '.join(algo.policies)})")
        cfg.multiagent.eval_opponents[pid] = str(what)
    specs = {pid: PolicySpec(type(p), p.observation_space, p.action_space, p.config,
                             algo.checkpoint_state["policy_specs"][pid]["algo"]) for pid, p in algo.policies.items()}
    worker = RolloutWorker(cfg, -1, 1, specs, num_envs=max(1, min(num_envs, episodes)), make_pm=worker_plugin_manager)
    try:
        worker.set_weights({pid: p.get_weights() for pid, p in algo.policies.items()})
        return worker.evaluate(episodes, explore)
    finally:
        worker.stop()


class EnvExit(Exception):
    """The env tried to end the process (``sys.exit``) during an evaluation."""


@contextlib.contextmanager
def _env_exits_reported(name: str) -> Iterator[None]:
    """While the env runs: an env that ends the process says so in one line naming it (exit 1),
    not a silent exit with its own status: ``os._exit(n)`` (the line, then exit 1) and
    ``sys.exit(n)`` (:class:`EnvExit`). A crash below Python (a segfault) is not covered."""
    real = os._exit

    def env_exit(code: int) -> None:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            os.write(2, f"flowkit evaluate: error: env {name!r} ended the process (os._exit({code})) "
                        "during the evaluation\n".encode())
        real(1)
    os._exit = env_exit  # type: ignore[assignment]
    try:
        yield
    except SystemExit as e:
        raise EnvExit(f"env {name!r} tried to end the process (sys.exit({e.code})) during the evaluation") from None
    finally:
        os._exit = real


def evaluate(path: str, episodes: int = 10, seed: Optional[int] = None, explore: bool = False,
             render: Optional[str] = None, render_episodes: int = 1, num_envs: int = 8,
             trust_config: bool = False, timeout_s: Optional[float] = None,
             opponents: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Evaluate the checkpoint at ``path`` (a run folder: its newest checkpoint) and write
    ``evaluation.json`` in the checkpoint's folder (a read-only one: nothing written, the report's
    ``not_written`` says so). Returns what it wrote: ``episode_return_*``
    and ``episode_len_*`` (mean, std, min, max over episodes; multi-agent: the sum over
    agents), ``policies`` (per policy: ``episode_return_*`` over its agents' returns and the
    means of what the env runner reports for it, its episodes' ``eval_metrics``: the multiagent
    plugin's ``win_rate``, ``draw_rate``, ``loss_rate`` in games with a winner), ``tables``
    (``{name: {"columns", "rows"}}``: the ``table`` of a stateful part's checkpointed state,
    e.g. the multiagent plugin's league members with their Elo ratings; absent when none), ``returns``,
    ``lengths``, ``seeds`` and ``videos`` per episode. ``trust_config``: allow the callables
    the run's config names that no installed flowkit plugin provides (``env.factory``,
    ``model.class``, ``plugins``; a run folder is data, see :mod:`flowkit._trust`).
    ``opponents``: multi-agent runs, policy id -> ``random`` or a checkpoint path that plays
    that policy's agents instead (the report's ``policies`` then score the others against it).

    The episodes have a deadline, ``timeout_s`` (default: the run's ``runtime.sample_timeout_s``;
    enforced from the main thread only), and SIGINT/SIGTERM/SIGHUP stop them
    (:class:`flowkit._guard.Interrupted`, a KeyboardInterrupt).

    Raises:
        RunFolderError: no or an unreadable checkpoint at ``path`` (one line).
        ConfigError: ``render`` or ``opponents`` where they do not apply (a multi-agent env;
            a single-agent one), a policy id ``opponents`` names that the run lacks; a callable
            named without consent (nothing imported).
        EvaluationTimeout: the episodes took longer than ``timeout_s`` (a TimeoutError).
        EnvExit: the env called ``sys.exit``.
    """
    from flowkit._outputs import write_text
    ck, algo = _load(path, render, trust_config)
    seed, opponents = int(algo.run_config.seed) if seed is None else int(seed), dict(opponents or {})
    eps, single = _run(algo, ck, episodes, seed, explore, render, render_episodes, num_envs, timeout_s, opponents)
    report = _report(algo, ck, eps, single, seed, explore, opponents)
    if os.access(ck, os.W_OK | os.X_OK) or not os.path.isdir(ck):  # (pruned meanwhile: made again)
        write_text(os.path.join(ck, "evaluation.json"), json.dumps(report, indent=2), mkdirs=True)
    else:  # a read-only run folder (shared, archived): the figures are printed, nothing written
        report["not_written"] = f"the checkpoint's folder {ck} is read-only"
    return report


def _load(path: str, render: Optional[str], trust_config: bool) -> Tuple[str, Any]:
    """``(checkpoint folder, trained algorithm)`` of ``path``; the outputs are checked first."""
    from flowkit._outputs import check_output
    from flowkit.checkpoint import STATE_FILE, RunFolderError, find_checkpoint, load_trained
    for attempt in range(3):  # beside a live run, its newest checkpoint may be pruned while it loads
        try:
            ck = find_checkpoint(path)
        except FileNotFoundError as e:
            raise RunFolderError(str(e), damaged=False) from None
        if os.access(ck, os.W_OK | os.X_OK):  # before any work (a read-only one: evaluation.json not written)
            check_output(os.path.join(ck, "evaluation.json"), "evaluate: the checkpoint's", own=True)
        if render:
            check_output(os.path.join(ck, "videos", f"episode_000.{render}"), "evaluate render=: the video", own=True)
        try:
            return ck, load_trained(ck, trust_config=trust_config)
        except (RunFolderError, OSError):
            if attempt == 2 or os.path.realpath(ck) == os.path.realpath(path) or os.path.isfile(
                    os.path.join(ck, STATE_FILE)):
                raise  # (not a checkpoint that a live run pruned: a damaged one)
    raise AssertionError  # (not reached: the third attempt returns or raises)


def _run(algo: Any, ck: str, episodes: int, seed: int, explore: bool, render: Optional[str], render_episodes: int,
         num_envs: int, timeout_s: Optional[float], opponents: Dict[str, str]) -> Tuple[List[Dict[str, Any]], bool]:
    """``(episode summaries, single-agent)``: the episodes, under the deadline and the signals."""
    import gymnasium as gym
    import torch
    from omegaconf import OmegaConf

    from flowkit._guard import GUARD, EvaluationTimeout
    from flowkit.core import EnvContext, derive_seed, env_name
    from flowkit.core._envs import probe_env
    cfg = algo.run_config
    # the run's learner threads (default 1): torch's default of one thread a core spins against
    # the env on a busy machine (a Nature CNN on one frame stack: 3 ms with 1 thread, 170 ms with 2
    # under load)
    torch.set_num_threads(max(1, int(OmegaConf.select(cfg, "learner.num_threads", default=1))))
    for pid, pol in algo.policies.items():  # sampling, when asked for, reproducible by seed
        pol.np_random = np.random.default_rng(derive_seed(seed, "evaluate", pid))
        pol.generator.manual_seed(derive_seed(seed, "evaluate", pid))
    env_cfg: Dict[str, Any] = OmegaConf.to_container(cfg.env, resolve=True)  # type: ignore[assignment]
    limit = float(timeout_s or cfg.runtime.sample_timeout_s)
    key = "timeout_s" if timeout_s else "the run's runtime.sample_timeout_s"
    name = env_name(env_cfg)
    with GUARD.running(), GUARD.interruptible(limit, lambda: EvaluationTimeout(
            f"env {name!r}: the evaluation ({episodes} episodes) did not finish within {key}={limit:g} s: a stuck env, "
            "or an episode that never ends? (timeout_s=SECONDS sets the limit)")), _env_exits_reported(name):
        probe = probe_env(env_cfg, EnvContext(-1, 0, 1, 0, seed))
        single = isinstance(probe, gym.Env) and len(algo.policies) == 1
        probe.close()
        if single and opponents:
            raise ConfigError(f"opponents.{next(iter(opponents))}: opponents apply to multi-agent runs; "
                              f"this run has one policy on the single-agent env {name!r}")
        if single:
            return run_gym_episodes(algo.get_policy(), env_cfg, episodes, seed, explore, num_envs, render,
                                    render_episodes, os.path.join(ck, "videos")), True
        if render:
            raise ConfigError(f"render={render}: video is recorded for single-agent Gymnasium envs only")
        return _multiagent_episodes(algo, cfg, episodes, seed, explore, num_envs, opponents), False


def _report(algo: Any, ck: str, eps: List[Dict[str, Any]], single: bool, seed: int, explore: bool,
            opponents: Dict[str, str]) -> Dict[str, Any]:
    """What :func:`evaluate` writes (see there)."""
    from flowkit.core import env_name
    from flowkit.core.metrics import _means, returns_by_policy
    cfg = algo.run_config
    rets, lens = [e["return"] for e in eps], [e["length"] for e in eps]
    report: Dict[str, Any] = {"checkpoint": ck, "iteration": int(algo.checkpoint_state["iteration"]),
                              "algo": "+".join(dict.fromkeys(str(d["algo"]) for d in  # ppo+dqn: mixed, as the progress bar
                                                             algo.checkpoint_state.get("policy_specs", {}).values())) or str(cfg.algo),
                              "env": env_name(cfg.env), "episodes": len(eps), "seed": seed,
                              "explore": bool(explore)}
    if opponents:
        report["opponents"] = opponents
    report.update(**_stats(rets, "episode_return_"), **_stats(lens, "episode_len_"))
    if not single:
        by_policy, reported = returns_by_policy(eps), _means(eps, "eval_metrics")  # eval_metrics: "<policy>/<name>"
        report["policies"] = {pid: {**_stats([r for r, _ in mine], "episode_return_"),
                                    **_stats([n for _, n in mine], "episode_len_"),
                                    **{k.rpartition("/")[2]: v for k, v in reported.items() if k.rpartition("/")[0] == pid}}
                              for pid in algo.policies if (mine := by_policy.get(pid)) and pid not in opponents}
    tables = {name: st["table"] for name, st in (algo.checkpoint_state.get("stateful") or {}).items()
              if isinstance(st, dict) and isinstance(st.get("table"), dict)}
    if tables:  # what the run's stateful parts show as tables (the multiagent plugin's league: its members)
        report["tables"] = tables
    report.update(returns=rets, lengths=lens)  # (an opponent's agents are played by the stand-in, not this run's policy)
    if single:
        report.update(seeds=[e["seed"] for e in eps], videos=[e["video"] for e in eps if e["video"]])
    return report


def format_table(report: Dict[str, Any]) -> str:
    """The report as a text table: one row for whole episodes, one per policy (multi-agent);
    numbers to 6 significant digits (a 27,000-step episode reads 26997, not 2.7e+04)."""
    cols = ["episodes", "return_mean", "return_std", "return_min", "return_max",
            "len_mean", "len_std", "len_min", "len_max"]
    rows = [("episode", report, report["episodes"])]
    rows += [(f"policy/{pid}", d, "") for pid, d in report.get("policies", {}).items()]
    rates = list(dict.fromkeys(c for _, d, _ in rows[1:] for c in d if not c.startswith("episode_")))  # eval_metrics
    head = f"{'':<16}" + "".join(f"{c:>13}" for c in cols + rates)

    def cell(v: Any) -> str:
        return f"{v:>13}" if isinstance(v, (str, int)) else f"{v:>13.6g}" if math.isfinite(v) else f"{'-':>13}"
    lines = [head]
    for name, d, n in rows:
        vals = [n] + [d[f"episode_{c}"] for c in cols[1:]] + [d.get(c, "") for c in rates]
        lines.append(f"{name:<16}" + "".join(cell(v) for v in vals))
    for name, t in report.get("tables", {}).items():  # e.g. a league's members (Elo, win rates)
        lines += ["", f"{name}:", "".join(f"{c:>13}" if i else f"{c:<16}" for i, c in enumerate(t["columns"]))]
        lines += ["".join(cell(v) if i else f"{v:<16}" for i, v in enumerate(row)) for row in t["rows"]]
    mode = "sampled" if report["explore"] else "greedy"
    title = (f"{report['algo']} on {report['env']}, checkpoint {report['checkpoint']} (iteration {report['iteration']}): "
             f"{report['episodes']} episode{'s' if report['episodes'] != 1 else ''}, {mode}, seed {report['seed']}")
    return title + "\n" + "\n".join(lines)
