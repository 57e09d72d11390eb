"""Run guards on the driver: signals, the watchdog and the run-folder lock.

- SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` in the main thread (the current
  iteration is abandoned; while the engine builds the config, reports a row or writes a
  checkpoint the signal is held until that is done). The engine then writes the final checkpoint and result.json with
  ``stop_reason="interrupted (SIGTERM)"``; the CLI exits with 128 + the signal number.
- A watchdog thread enforces deadlines the main thread cannot check itself because it is
  blocked: a sample on the local backend (``runtime.sample_timeout_s``; the env is
  interrupted with :class:`SampleTimeout`, an ordinary worker failure) and the hard end of
  ``stop.time_s``. It delivers them as SIGALRM to the main thread, which interrupts a
  sleeping or looping env as well as ``ray.get``.
- :func:`check_cpus`: a local Ray cluster too small for the workers is a config error.
- :func:`lock_run_dir`: one live run per ``run.dir``.
"""
from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import threading
import time
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

from flowkit.core.flow import SampleTimeout

SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
# signals this process inherited as ignored (``nohup``: SIGHUP; a background job: SIGINT) stay
# ignored: a run never takes them over (read when this module is first imported, before any
# handler of ours or Ray's is set)
INHERITED_IGNORED = frozenset(n for n in SIGNALS if signal.getsignal(getattr(signal, n)) == signal.SIG_IGN)


class Interrupted(KeyboardInterrupt):
    """The run was told to stop now; ``reason`` becomes its ``stop_reason``."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class EvaluationTimeout(TimeoutError):
    """An evaluation (periodic or final) did not finish within ``evaluation.timeout_s`` (default
    ``runtime.sample_timeout_s``): a stuck env or an episode that never ends."""


class Guard:
    """Signal handlers and the watchdog of the run in progress (one per process: ``GUARD``)."""

    def __init__(self) -> None:
        self._prev: Dict[int, Any] = {}
        self._shield = 0
        self.pending: Optional[BaseException] = None    # the first signal (also one raised at once), or a held error
        self._deadlines: Dict[str, tuple] = {}          # name -> (monotonic time, make exception)
        self._fired: Optional[tuple] = None             # (name, exception) for the SIGALRM handler
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._second: Optional[Callable[[int, Any], None]] = None  # held(second=): a second signal's handler

    @property
    def active(self) -> bool:
        return bool(self._prev)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """:meth:`install` for a run, :meth:`restore` after it (nested runs keep the outer's)."""
        owner = not self.active
        self.install()  # also in a nested run: a library (Ray) may have taken a signal since
        try:
            yield
        finally:
            if owner:
                self.restore()

    def install(self) -> None:
        """Take SIGINT/SIGTERM/SIGHUP/SIGALRM (again after ``ray.init``, which sets its own)
        and start the watchdog. A no-op outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in [getattr(signal, n) for n in SIGNALS + ("SIGALRM",) if n not in INHERITED_IGNORED]:
            if (cur := signal.getsignal(sig)) != self._handle:
                self._prev.setdefault(sig, cur)
                signal.signal(sig, self._handle)
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._watch, name="flowkit-watchdog", daemon=True)
            self._thread.start()

    def restore(self) -> None:
        """Put back the handlers found by the first :meth:`install`; stop the watchdog."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._thread, self._deadlines, self.pending, self._fired = None, {}, None, None
        for sig, h in self._prev.items():
            signal.signal(sig, h if h is not None else signal.SIG_DFL)
        self._prev = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGALRM:
            fired, self._fired = self._fired, None
            if fired is None:  # not the watchdog's: whoever set it before us (pytest-timeout, a user's alarm)
                prev = self._prev.get(signal.SIGALRM)
                if callable(prev):
                    prev(signum, frame)
                return
            if fired[0] in ("sample", "evaluate") and fired[0] not in self._deadlines:
                return  # the sample or the evaluation answered meanwhile
            self._deadlines.pop(fired[0], None)
            exc = fired[1]
        else:
            if self._second is not None and self.pending is not None:
                self._second(signum, frame)  # a second signal while one is held (a hung env constructor)
            exc = Interrupted(f"interrupted ({signal.Signals(signum).name})")
            # kept even when raised: one raised in a weakref callback or a __del__ is lost (only
            # printed as ignored); the engine raises it again at the end of the iteration
            self.pending = self.pending or exc
        if isinstance(exc, (SampleTimeout, EvaluationTimeout)) or not self._shield:
            raise exc
        self.pending = self.pending or exc

    @contextlib.contextmanager
    def shielded(self) -> Iterator[None]:
        """Hold signals (not sample timeouts) until the block ends: reporting a row, writing a
        checkpoint. The caller raises :attr:`pending` at the next safe point."""
        self._shield += 1
        try:
            yield
        finally:
            self._shield -= 1

    @contextlib.contextmanager
    def held(self, second: Optional[Callable[[int, Any], None]] = None) -> Iterator[None]:
        """:meth:`shielded`, then the signal that came meanwhile (also one that came before it and
        was lost, raised in a weakref callback) is raised as the block ends: for library code that
        a KeyboardInterrupt must not land in (OmegaConf turns one raised while it builds a config
        into an unrelated error, or loses it; torch's extension modules end the process with a C++
        ``terminate``). ``second(signum, frame)``: called for a second signal within the block
        (the CLI's start-up ends the process at once, where nothing needs saving yet)."""
        prev, self._second = self._second, second or self._second
        try:
            with self.shielded():
                yield
        finally:
            self._second = prev
        if self.pending is not None and not self._shield:
            raise self.pending

    def set_deadline(self, name: str, seconds: Optional[float],
                     make: Optional[Callable[[], BaseException]] = None) -> None:
        """Raise ``make()`` in the main thread in ``seconds`` (None: cancel)."""
        if seconds is None or make is None:
            self._deadlines.pop(name, None)
        elif self._thread is not None:
            self._deadlines[name] = (time.monotonic() + seconds, make)

    @contextlib.contextmanager
    def _deadline(self, name: str, seconds: Optional[float], make: Callable[[], BaseException]) -> Iterator[None]:
        """``make()`` raised in the main thread after ``seconds`` unless the block ends first."""
        self.set_deadline(name, seconds, make)
        try:
            yield
        finally:
            self._deadlines.pop(name, None)

    def sample_deadline(self, seconds: Optional[float], what: str) -> Any:
        """A local sample call: interrupted with :class:`SampleTimeout` after ``seconds``."""
        return self._deadline("sample", seconds, lambda: SampleTimeout(
            f"{what} did not answer a sample request within runtime.sample_timeout_s={seconds} s"))

    @contextlib.contextmanager
    def interruptible(self, seconds: Optional[float], make: Callable[[], BaseException]) -> Iterator[None]:
        """A step that may hang inside a shielded block (an evaluation while a row is reported or
        the run ends): signals and the ``stop.time_s`` deadline are let through (a signal held
        before it is raised at once), and ``make()`` is raised after ``seconds`` (None: no bound;
        without the watchdog, outside a run, neither applies)."""
        if self.pending is not None and self._shield:
            exc, self.pending = self.pending, None
            raise exc
        shield, self._shield = self._shield, 0
        try:
            with self._deadline("evaluate", seconds, make):
                yield
        finally:
            self._shield = shield

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            now = time.monotonic()
            for name, (t, make) in list(self._deadlines.items()):
                if now >= t and self._fired is None:
                    self._fired = (name, make())
                    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGALRM)


GUARD = Guard()


WORKER_MEMORY_MB = 300  # private memory of one rollout worker process (torch, a CartPole env): 270 MB measured


def available_memory_mb() -> float:
    """This machine's MemAvailable (/proc/meminfo) in MB; inf where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
        return kb / 1024.0
    except (OSError, StopIteration, ValueError, IndexError):
        return float("inf")


def check_cpus(cfg: Any) -> None:
    """A local Ray cluster that cannot place every worker would wait forever: refuse it; and
    more rollout worker processes than the available memory holds at ``WORKER_MEMORY_MB`` each
    (possible with ``runtime.num_cpus_per_worker=0`` or a fraction: each is a Python process
    with torch) would swamp the machine: refuse them too, before any is spawned. Workers whose
    envs wait rather than compute (a remote simulator, bench/scaling.py's sleeping env) may
    share a CPU many to one."""
    from flowkit import _ray
    from flowkit.config import config_checks
    rt = cfg.runtime
    if rt.backend != "ray" or rt.address or _ray.external():
        return  # the local backend, an attached cluster, or the caller's own Ray session
    have = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    n, per = max(1, int(rt.num_workers)), float(rt.num_cpus_per_worker)
    nl, lper, room = int(cfg.learner.num_learners), float(cfg.learner.num_cpus_per_learner), available_memory_mb()
    config_checks([
        (n * per > have + 1e-9, f"runtime.num_workers={rt.num_workers} x runtime.num_cpus_per_worker={per:g} needs "
         f"{n * per:g} CPUs, this machine has {have}: lower runtime.num_workers or share CPUs "
         f"(runtime.num_cpus_per_worker={have / n:g})"),
        (nl and n * per + nl * lper > have + 1e-9, f"learner.num_learners={nl} x learner.num_cpus_per_learner={lper:g} "
         f"and runtime.num_workers={rt.num_workers} x runtime.num_cpus_per_worker={per:g} need "
         f"{n * per + nl * lper:g} CPUs, this machine has {have}: lower them or share CPUs "
         f"(learner.num_cpus_per_learner={max(have - n * per, 0) / max(nl, 1):g})"),
        (n * WORKER_MEMORY_MB > room, f"runtime.num_workers={rt.num_workers}: {n} rollout worker processes need about "
         f"{n * WORKER_MEMORY_MB / 1024:.1f} GB ({WORKER_MEMORY_MB} MB each), this machine has "
         f"{room / 1024:.1f} GB available: lower runtime.num_workers; more sub-envs per worker "
         "(runtime.num_envs_per_worker) sample more at once"),
    ])


def check_env_kwargs(cfg: Any) -> None:
    """``env.kwargs`` values that no env can mean for training, refused before anything starts
    (Gymnasium's envs do not check them: MuJoCo's ``reset_noise_scale=nan`` gives NaN states,
    ``render_mode=human`` opens a window per sub-env, or aborts the process in GLFW where there is
    no display): a number that is not finite (``nan``, ``inf``, also written as text), and
    ``render_mode='human'``. The env's own parameters are checked when it is built
    (:func:`flowkit.core._envs.probe_env`).

    Raises:
        ConfigError: naming the key and the value.
    """
    from omegaconf import DictConfig, OmegaConf

    from flowkit.config import ConfigError
    from flowkit.core.names import leaves
    kwargs = cfg.env.kwargs
    for key, v in leaves(OmegaConf.to_container(kwargs) if isinstance(kwargs, DictConfig) else dict(kwargs or {}),
                         "env.kwargs."):
        if isinstance(v, (int, float, str)) and not isinstance(v, bool):
            try:  # (YAML's spellings too: `.nan`, `-.inf` in a list stay text)
                bad = not math.isfinite(float(v.replace(".", "", 1) if isinstance(v, str) and "." in v[:2] else v))
            except (ValueError, OverflowError):
                bad = False  # text that is not a number
            if bad:
                raise ConfigError(f"{key}={v!r} is not a finite number")
    if kwargs and kwargs.get("render_mode") == "human":
        display = bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
        raise ConfigError("env.kwargs.render_mode='human': training renders nothing (each rollout worker's sub-envs "
                          f"would open windows{'' if display else ', and this machine has no display'}); film the "
                          "trained policy with `flowkit evaluate RUN render=mp4`")


def check_env_id(cfg: Any, pm: Any = None) -> None:
    """An ``env.id`` Gymnasium does not know, found without building the env (before Ray
    starts): the env probe's one-line ConfigError. With ``pm``, a single-agent run of an
    algorithm whose :class:`flowkit.AlgorithmRef` declares ``action_spaces`` also builds the
    env once to check its action space (DQN on Pendulum: the message in ~1 s instead of after
    Ray's start-up). With ``env.preset``: the preset's own checks first (they register its ids,
    e.g. ale-py's)."""
    from omegaconf import OmegaConf

    from flowkit.config import ConfigError, action_space_error
    from flowkit.core._envs import EnvContext, build_error, probe_env
    from flowkit.core.presets import env_preset
    env_cfg: Dict[str, Any] = OmegaConf.to_container(cfg.env, resolve=True)  # type: ignore[assignment]
    if cfg.env.preset:
        env_preset(cfg.env.preset).check(env_cfg)
    eid = cfg.env.id
    if not eid or cfg.env.factory:
        return  # a factory: the env probe checks it
    import gymnasium as gym
    if ":" not in str(eid):  # (`pkg:Id`: importing pkg registers it)
        try:
            gym.spec(str(eid))
        except Exception as e:
            raise build_error(env_cfg, e) from None
    ref = pm.algorithms(load=False).get(cfg.algo) if pm is not None else None
    if ref is None or not ref.action_spaces or (cfg.get("multiagent") and cfg.multiagent.get("policies")):
        return
    env = probe_env(env_cfg, EnvContext(-1, 0, 1, 0, int(cfg.seed)))
    try:
        why = action_space_error(ref, "default", env.action_space)
    finally:
        env.close()
    if why:
        raise ConfigError(why)


PROJECT_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")  # a folder holding one is a project's


def check_new_run_dir(run_dir: Optional[str]) -> None:
    """A new (not resumed) run's folder (``run.dir``; None: a new timestamped folder, nothing to
    check) must hold no earlier run's results: its rows and
    checkpoints would be mixed with the new run's, and ``evaluate`` and ``resume`` take the
    newest checkpoint, which could be the earlier run's.

    Raises:
        ConfigError: ``run_dir`` holds ``metrics.csv`` or a checkpoint (the message says how to
            continue that run or start elsewhere), other runs' folders or a sweep's
            ``tune_results.csv``, or a ``config.yaml`` (``run.dir=.`` in a project: the run
            would overwrite the project's config), or one of :data:`PROJECT_MARKERS` (a project's
            root).
    """
    from flowkit.config import config_checks
    if not run_dir:
        return
    ckpts = os.path.join(run_dir, "checkpoints")
    found = [f for f in ("metrics.csv", "result.json") if os.path.exists(os.path.join(run_dir, f))]
    if os.path.isdir(ckpts) and any(not n.startswith(".") for n in os.listdir(ckpts)):
        found.append("checkpoints/")
    project = [n for n in PROJECT_MARKERS if os.path.exists(os.path.join(run_dir, n))]
    # a sweep's folder: a run in it would hide the trials from `flowkit plot`
    below = [n for n in sorted(os.listdir(run_dir)) if os.path.isfile(os.path.join(run_dir, n, "metrics.csv"))] \
        if os.path.isdir(run_dir) else []
    sweep = (f"run folders ({', '.join(below[:3])}{', ...' if len(below) > 3 else ''})" if below else
             "tune_results.csv" if os.path.exists(os.path.join(run_dir, "tune_results.csv")) else "")
    config_checks([
        (found, f"run.dir={run_dir!r} holds an earlier run ({', '.join(found)}): resume={run_dir} continues it; "
         "another run.dir (or removing this one) starts a new run"),
        (os.path.isfile(os.path.join(run_dir, "config.yaml")), f"run.dir={run_dir!r} holds a config.yaml that is not "
         "a run's (no metrics.csv or checkpoints): the run would overwrite it; give the run a folder of its own (or "
         "remove that file)"),  # (run.dir=. in a project: its own config)
        (project, f"run.dir={run_dir!r} is a project folder (it holds {', '.join(project)}): the run's config.yaml, "
         "metrics.csv and checkpoints would land among its files; give the run a folder of its own (e.g. "
         "run.dir=runs/NAME)"),
        (sweep, f"run.dir={run_dir!r} holds {sweep}: it is a sweep's or a parent folder, and a run in it would hide "
         "them from `flowkit plot`; give the run a folder of its own"),
    ])


def _holder(fd: int) -> Tuple[Optional[int], str]:
    """``(pid, host)`` written in an open lock file (``(None, "")`` when empty or not ours)."""
    try:
        pid_s, _, owner = os.pread(fd, 256, 0).decode("utf-8", "replace").strip().partition(" ")
        return int(pid_s), owner.strip()
    except (OSError, ValueError):
        return None, ""


def lock_run_dir(run_dir: str, take_over: bool = False) -> Callable[[], None]:
    """Create ``run_dir`` and take ``run_dir/.lock`` atomically: an exclusive ``flock`` on it
    (held until release or until the process ends, so a killed run's lock is free at once),
    then ``pid host`` written in it. Returns the release function (removes the file, then
    drops the lock). A lock whose file names a live process of this host is refused too; one
    naming a process that is gone is taken over; one naming another host (whose process cannot
    be checked from here) only with ``take_over`` (``--take-over-lock``: that run must be gone,
    e.g. preempted). Of any number of simultaneous takers exactly one wins.

    Raises:
        ConfigError: ``run_dir`` cannot be created or written (the reason named).
        ConfigError: a live run holds it (the pid and host named), or a run on another host
            and not ``take_over`` (the message names the option).
    """
    import errno
    import fcntl

    from flowkit.config import ConfigError
    path = os.path.join(run_dir, ".lock")
    me, host = os.getpid(), socket.gethostname()
    try:
        os.makedirs(run_dir, exist_ok=True)
        writable = os.access(run_dir, os.W_OK)  # False on a read-only filesystem
    except OSError as e:  # under a file, no permission
        raise ConfigError(f"run.dir={run_dir!r} cannot be created: {e.strerror or e}") from None
    if not writable:
        raise ConfigError(f"run.dir={run_dir!r} is not writable")

    def refuse(fd: int, why: str) -> ConfigError:
        os.close(fd)
        return ConfigError(f"run.dir={run_dir!r} {why}")
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(f"run.dir={run_dir!r}: cannot create its lock {path}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                break  # no flock on this filesystem: the pid and host in the file decide alone
            pid, owner = _holder(fd)
            where = "" if owner in ("", host) else f" on host {owner!r}"
            raise refuse(fd, f"is in use by a live run (pid {pid if pid is not None else '?'}{where}); choose "
                             "another run.dir or stop that run") from None
        with contextlib.suppress(FileNotFoundError):  # released (removed) between our open and our flock: the
            if os.stat(path).st_ino == os.fstat(fd).st_ino:  # new file is taken instead
                break
        os.close(fd)
    pid, owner = _holder(fd)
    if pid is not None and pid != me:
        if owner != host and not take_over:
            raise refuse(fd, f"is locked by a run on host {owner!r} (pid {pid}), which cannot be checked from "
                             f"here: if that run is gone, resume with --take-over-lock (flowkit.train(..., "
                             f"take_over_lock=True)) or remove {path}")
        if owner == host:
            try:
                os.kill(pid, 0)
                raise refuse(fd, f"is in use by a live run (pid {pid}); choose another run.dir or stop that run")
            except ProcessLookupError:
                pass  # gone: taken over
            except PermissionError:
                raise refuse(fd, f"is in use by a live run (pid {pid}, another user)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{me} {host}\n".encode(), 0)

    def release() -> None:
        with contextlib.suppress(OSError):
            if _holder(fd)[0] == me and os.stat(path).st_ino == os.fstat(fd).st_ino:
                os.remove(path)  # before the lock is dropped: a waiter then sees the file gone
        with contextlib.suppress(OSError):
            os.close(fd)
    return release
