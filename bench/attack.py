"""Attack round (issue 28): the same fuzzing, rerunnable, with counts.

Every case is a named, explicit entry (no random generation: two runs, or two checkouts, give
comparable counts). Each runs one real ``flowkit ...`` command as a subprocess, in a fresh
temporary folder, in its own session (the whole process group is killed at the deadline),
with a data-size limit (``--mem-gb``, RLIMIT_DATA) so a case that would exhaust memory ends
as ``killed`` or a MemoryError instead of taking the machine down. Classes:

- ``ok``: exit 0 and the case's expected output exists (and, for a case whose input must be
  refused, ``must_fail``, exit 0 is never ok);
- ``clean-error``: exit 1 or 2, no ``Traceback`` in stdout/stderr, at most 3 lines on stderr
  (a progress bar's carriage-return updates count as one) and not empty;
- ``traceback``: ``Traceback`` anywhere in the output;
- ``hang``: still running at the deadline (``--timeout``, or the case's own);
- ``killed``: ended by a signal (negative exit status: the deadline's SIGKILL excepted);
- ``noisy``: exit 1 or 2 without a traceback but with more than 3 lines of stderr, or none;
- ``wrong-exit``: any other exit status, exit 0 without the expected output, exit 0 for a
  case that must fail, or a marker file created (a run folder that ran code).

Parts:

- ``config`` (~200 cases): malformed overrides and YAML files for ``flowkit train`` (local
  backend, a tiny stop budget so an accepted config ends in seconds): wrong types, sizes,
  containers, unknown keys, algorithms and envs, schedules, reporters, plugins, batch sizes,
  multi-agent mappings, interpolation, YAML files, every algorithm on an action or
  observation space it cannot take, MuJoCo env kwargs Gymnasium does not check
  (``render_mode=human``, ``reset_noise_scale=nan``, ``frame_skip=-1``, ...), counts given as
  floats and numbers given as text.
- ``tamper`` (~120 cases): one short PPO and one short DQN run (CartPole-v1, local) trained
  once; each case copies a run folder, damages it, and runs one of ``train resume=``,
  ``evaluate``, ``export``, ``plot`` on it.
- ``surfaces`` (~45 cases): output paths of export, evaluate and plot; ``flowkit tune``'s
  flags; evaluate on envs that hang, never end an episode or exit the process; unknown
  commands and options.
- ``contradict`` and ``corrupt`` (issue 48, 23 damages x 2 runs): a dataset of 3,000 sampled
  CartPole steps (``flowkit record`` of the PPO run) copied and damaged (``DAMAGE_PY``): contents
  that contradict its spaces or its own lengths, and values that are wrong (flipped bytes, NaN,
  float actions, terminal flags mid-episode, a damaged columnar copy); each trained on by
  ``algo=bc`` and by ``algo=dqn input.mix=0.5``. All must be refused but the dataset without
  flowkit's checksums (what Minari's own writers make) and the bytes flipped in the middle of
  the file (ok where they land in the unused end of a chunk: the data is intact).
- ``record`` (~30 cases): ``flowkit record``'s arguments, output folders, and SIGTERM/SIGINT
  while it records (the exit status 128 + N with a dataset of the finished episodes is ok).

Usage::

    python bench/attack.py                                    # every part, .venv/bin/flowkit
    python bench/attack.py --parts config --out /tmp/attack   # one part
    python bench/attack.py --flowkit /other/checkout/.venv/bin/flowkit --parts tamper
    python bench/attack.py --list                             # the cases, nothing run
    python bench/attack.py --only 'config/sizes.*'            # cases whose part/name matches

Prints a table per part (cases per class) and every case that is not ``ok`` or
``clean-error`` with its command and the last lines of its output; writes ``attack.json``
(every case: part, name, command, class, exit status, seconds, output tail) under ``--out``.
Stdlib only: the flowkit checkout under test does the rest (its interpreter, read from the
``flowkit`` script's first line, edits ``state.pt`` files for the tamper part).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import fnmatch
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

CLASSES = ("ok", "clean-error", "traceback", "hang", "killed", "noisy", "wrong-exit")
PARTS = ("config", "tamper", "surfaces", "contradict", "corrupt", "record")
HERE = os.path.dirname(os.path.abspath(__file__))


# ---- cases ------------------------------------------------------------------------------------
@dataclasses.dataclass
class Ctx:
    """What every case may use: the command, its interpreter, the shared folders."""
    flowkit: List[str]
    python: str
    work: str  # shared folder: base runs, the helper env module
    fx: str  # folder of the helper module `fuzzenvs` (on PYTHONPATH of every case)
    timeout: float
    mem_gb: float
    runs: Dict[str, str] = dataclasses.field(default_factory=dict)  # base run folders by name


Setup = Callable[[str, Ctx], None]
Expect = Union[None, str, Callable[[str], bool]]


@dataclasses.dataclass
class Case:
    part: str
    name: str
    argv: List[str]  # after `flowkit`; {tmp}, {fx} and {ppo}/{dqn}/... (base runs) are replaced
    setup: Optional[Setup] = None  # prepares the case's folder (a copied, damaged run ...)
    expect: Expect = None  # exit 0 is ok when this path (relative to the case folder) exists / this is true
    must_fail: bool = False  # the input must be refused (exit 0 is wrong)
    marker: Optional[str] = None  # a file (relative to the case folder) that must not appear
    env: Dict[str, str] = dataclasses.field(default_factory=dict)
    timeout: Optional[float] = None
    mem_limit: bool = True  # off for commands that start Ray (its object store maps large areas)
    signal_after: Optional[Tuple[str, float, str]] = None  # (signal name, seconds, cue): sent to the command
    # that many seconds after the file ``cue`` (relative to the case folder) appears; its exit status
    # 128 + N then counts as ok when ``expect`` holds (a clean stop that kept what it should)


def _subst(word: str, tmp: str, ctx: Ctx) -> str:
    word = word.replace("{tmp}", tmp).replace("{fx}", ctx.fx)
    for k, v in ctx.runs.items():
        word = word.replace("{" + k + "}", v)
    return word


# ---- running and classifying -------------------------------------------------------------------
@dataclasses.dataclass
class Outcome:
    part: str
    name: str
    command: str
    cls: str
    rc: Optional[int]
    seconds: float
    note: str
    tail: List[str]


def _limits(mem_gb: float, on: bool) -> Callable[[], None]:
    def pre() -> None:
        os.nice(5)
        for sig in (signal.SIGINT, signal.SIGHUP):  # as a terminal's command gets them, also when this
            signal.signal(sig, signal.SIG_DFL)      # round runs under nohup or in the background
        if on and mem_gb > 0:
            lim = int(mem_gb * 2 ** 30)
            resource.setrlimit(resource.RLIMIT_DATA, (lim, lim))
    return pre


def _stderr_lines(err: str) -> List[str]:
    """Lines of stderr; a line redrawn with carriage returns (a progress bar) counts once."""
    return [ln for ln in (seg.split("\r")[-1] for seg in err.split("\n")) if ln.strip()]


def _expected(case: Case, tmp: str) -> bool:
    if case.expect is None:
        return True
    if callable(case.expect):
        return bool(case.expect(tmp))
    return os.path.exists(os.path.join(tmp, case.expect))


def classify(case: Case, rc: Optional[int], out: str, err: str, tmp: str) -> tuple:
    """``(class, note)`` of a finished (``rc``) or timed-out (``rc`` None) case."""
    if case.marker and os.path.exists(os.path.join(tmp, case.marker)):
        return "wrong-exit", f"marker {case.marker} created: the command ran code named by its input"
    if rc is None:
        return "hang", "still running at the deadline"
    if "Traceback (most recent call last)" in out or "Traceback (most recent call last)" in err:
        return "traceback", ""
    if rc < 0:
        return "killed", f"signal {-rc}"
    lines = _stderr_lines(err)
    if case.signal_after and rc == 128 + int(getattr(signal, case.signal_after[0])):
        if not lines or len(lines) > 3:
            return "noisy", f"stopped by {case.signal_after[0]} with {len(lines)} lines on stderr"
        return ("ok", "") if _expected(case, tmp) else ("wrong-exit", "stopped without its expected output")
    if rc == 0:
        if case.must_fail:
            return "wrong-exit", "accepted an input that must be refused"
        return ("ok", "") if _expected(case, tmp) else ("wrong-exit", "exit 0 without its expected output")
    if rc in (1, 2):
        if not lines:
            return "noisy", "nothing on stderr"
        return ("clean-error", "") if len(lines) <= 3 else ("noisy", f"{len(lines)} lines on stderr")
    return "wrong-exit", f"exit {rc}"


def run_case(case: Case, ctx: Ctx) -> Outcome:
    tmp = tempfile.mkdtemp(prefix=f"{case.part}-", dir=os.path.join(ctx.work, "cases"))
    t0 = time.monotonic()
    try:
        if case.setup:
            case.setup(tmp, ctx)
    except Exception as e:  # noqa: BLE001 - a setup that fails is reported, the round goes on
        return Outcome(case.part, case.name, "", "wrong-exit", None, 0.0, f"setup failed: {type(e).__name__}: {e}", [])
    argv = [_subst(w, tmp, ctx) for w in case.argv]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ctx.fx, os.environ.get("PYTHONPATH")])),
               RAY_DEDUP_LOGS="0", PYTHONUNBUFFERED="1", **{k: _subst(v, tmp, ctx) for k, v in case.env.items()})
    timeout = case.timeout or ctx.timeout
    p = subprocess.Popen(ctx.flowkit + argv, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, start_new_session=True, env=env,
                         preexec_fn=_limits(ctx.mem_gb, case.mem_limit))
    rc: Optional[int]
    try:
        if case.signal_after:
            _signal_later(p, tmp, *case.signal_after, timeout)
        out_b, err_b = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        _killpg(p.pid)
        out_b, err_b = p.communicate()
        rc = None
    _killpg(p.pid)  # anything the command left running in its group (Ray's processes)
    out, err = out_b.decode(errors="replace"), err_b.decode(errors="replace")
    cls, note = classify(case, rc, out, err, tmp)
    tail = (out.strip().splitlines()[-4:] if cls != "clean-error" else []) + _stderr_lines(err)[-8:]
    if cls in ("ok", "clean-error"):
        shutil.rmtree(tmp, ignore_errors=True)
    return Outcome(case.part, case.name, " ".join(shlex.quote(a) for a in ["flowkit", *argv]), cls, rc,
                   round(time.monotonic() - t0, 2), note, [t[:400] for t in tail])


def _signal_later(p: subprocess.Popen, tmp: str, sig: str, after: float, cue: str, timeout: float) -> None:
    """Send ``sig`` to the process ``p`` (not its group: as `kill PID` does) ``after`` seconds
    after the file ``cue`` appears in ``tmp`` (unless it ended first)."""
    end = time.monotonic() + timeout
    while p.poll() is None and not os.path.exists(os.path.join(tmp, cue)) and time.monotonic() < end:
        time.sleep(0.1)
    time.sleep(after)
    if p.poll() is None:
        p.send_signal(getattr(signal, sig))


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ---- the helper env module ---------------------------------------------------------------------
FUZZENVS = '''"""Envs for bench/attack.py (written by it): each misbehaves as its name says."""
import os
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class Five(gym.Env):
    """Box(-1, 1, (2,)) float32 observations, Discrete(2) actions, 5 steps, reward 1."""

    def __init__(self, observation_space=None, action_space=None):
        self.observation_space = observation_space or spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = action_space or spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), 1.0, self.t >= 5, False, {}


def stuck(context=None):
    """Five, stuck as FUZZ_STUCK says (unset while training): sleep (step sleeps an hour),
    reset_sleep, endless (episodes never end), exit (os._exit(3)), raise (RuntimeError)."""
    env = Five()
    mode = os.environ.get("FUZZ_STUCK", "")
    if not mode:
        return env
    step, reset = env.step, env.reset

    def bad_step(action):
        if mode == "sleep":
            time.sleep(3600)
        if mode == "exit":
            os._exit(3)
        if mode == "raise":
            raise RuntimeError("simulator disconnected")
        obs, r, term, trunc, info = step(action)
        return obs, r, False if mode == "endless" else term, False if mode == "endless" else trunc, info

    def bad_reset(**kw):
        if mode == "reset_sleep":
            time.sleep(3600)
        return reset(**kw)
    env.step, env.reset = bad_step, bad_reset
    return env


def tuple_action():
    return Five(action_space=spaces.Tuple((spaces.Discrete(2), spaces.Discrete(3))))


def box_action():
    return Five(action_space=spaces.Box(-1.0, 1.0, (2,), np.float32))


def multibinary_action():
    return Five(action_space=spaces.MultiBinary(3))


def text_obs():
    return Five(observation_space=spaces.Text(5))


def graph_obs():
    return Five(observation_space=spaces.Graph(spaces.Box(-1, 1, (2,)), None))


def huge_obs():
    """A declared Box of 10^10 elements."""
    return Five(observation_space=spaces.Box(-1.0, 1.0, (100000, 100000), np.float32))


def not_an_env():
    return 42


def raises():
    raise RuntimeError("cannot connect to the simulator")
'''


# ---- config part -------------------------------------------------------------------------------
BASE = {"runtime.backend": "local", "env": "CartPole-v1", "runtime.num_workers": "1",
        "runtime.num_envs_per_worker": "2", "runtime.rollout_fragment_length": "32", "stop.env_steps": "128",
        "run.dir": "run", "run.reporters": "[csv,checkpoint]"}
TEXT_OPTS = ("--no-tuned",)


def train(*overrides: str, files: Sequence[str] = (), drop: Sequence[str] = ()) -> List[str]:
    """``train`` with the base overrides, those of ``overrides`` (a key given there replaces
    the base's) and ``-c FILE`` for each of ``files``; ``drop``: base keys left out."""
    keys = {o.split("=", 1)[0] for o in overrides if "=" in o}
    if "env.id" in keys or "env.factory" in keys:
        keys.add("env")
    base = [f"{k}={v}" for k, v in BASE.items() if k not in keys and k not in drop]
    argv = ["train", *TEXT_OPTS, *base, *overrides]
    for f in files:
        argv += ["-c", f]
    return argv


def _file(name: str, content: Union[str, bytes]) -> Setup:
    def setup(tmp: str, ctx: Ctx) -> None:
        with open(os.path.join(tmp, name), "wb") as f:
            f.write(content if isinstance(content, bytes) else content.replace("{tmp}", tmp).encode())
    return setup


def config_cases() -> List[Case]:
    cases: List[Case] = []

    def add(group: str, name: str, *overrides: str, must_fail: bool = False, files: Sequence[str] = (),
            setup: Optional[Setup] = None, marker: Optional[str] = None, drop: Sequence[str] = (),
            timeout: Optional[float] = None) -> None:
        cases.append(Case("config", f"{group}/{name}", train(*overrides, files=files, drop=drop), setup,
                          "run/result.json", must_fail, marker, timeout=timeout))

    add("baseline", "ppo CartPole-v1")
    add("baseline", "dqn CartPole-v1", "algo=dqn", "dqn.learning_starts=32")
    # wrong types and values
    for o in ["ppo.lr=abc", "ppo.lr=[1]", "ppo.lr={a: 1}", "ppo.lr=true", "ppo.lr=", "ppo.lr=nan", "ppo.lr=inf",
              "ppo.lr=-inf", "ppo.lr=-1", "ppo.lr=0", "ppo.gamma=1.5", "ppo.gamma=-0.1", "ppo.num_epochs=1.5",
              "ppo.num_epochs=abc", "ppo.num_epochs=0", "ppo.clip_param=0", "ppo.normalize_advantages=yes",
              "seed=-1", "seed=abc", "seed=4294967296", "seed=1e30", "seed=0x10", "stop.env_steps=abc",
              "stop.env_steps=1.5", "stop.env_steps=0", "stop.env_steps=-5", "stop.iterations=0", "stop.time_s=0",
              "stop.time_s=-1", "stop.time_s=nan", "runtime.num_workers=two", "runtime.backend=gpu",
              "runtime.backend=[local]", "runtime.backend=null", "model.activation=swish", "model.activation=1",
              "model.hidden_sizes=64", "model.hidden_sizes=[a]", "model.hidden_sizes=[0]", "model.hidden_sizes=[-1]",
              "model.hidden_sizes=[1.5]", "learner.device=tpu", "learner.device=cuda:abc", "env.autoreset_mode=never",
              "env.max_episode_steps=0", "evaluation.interval=-1", "checkpoint.keep=-1", "run.min_iter_time_s=-1",
              "runtime.sample_timeout_s=0", "runtime.torch_threads=0", "env.check_spaces_steps=-1",
              "evaluation.timeout_s=0", "checkpoint.every_iters=-1", "model.recurrent=transformer",
              "model.cnn=resnet", "model.init=xavier", "env.vectorization=async", "env.preset=mujoco",
              "runtime.num_cpus_per_worker=-1", "runtime.num_cpus_per_worker=nan"]:
        add("types", o, o)
    for o in ["ppo.lr", "=1", "ppo..lr=1", ".ppo=1", "ppo.lr=1e-5=3", "ppo.lr=[", "ppo.lr={", "ppo.lr='",
              "env.kwargs.x=[", "ppo.lr=\t", "ppo.lr=1_000"]:
        add("syntax", repr(o), o)
    # sizes: negative, zero, huge
    for o in ["runtime.num_envs_per_worker=0", "runtime.num_envs_per_worker=-1", "runtime.num_envs_per_worker=1e9",
              "runtime.num_envs_per_worker=1e5", "runtime.rollout_fragment_length=0",
              "runtime.rollout_fragment_length=-5", "runtime.rollout_fragment_length=1e12", "runtime.num_workers=-1",
              "runtime.num_workers=1e6", "runtime.num_workers=10000", "ppo.train_batch_size=0",
              "ppo.train_batch_size=-1", "ppo.train_batch_size=1e9", "ppo.minibatch_size=0",
              "runtime.torch_threads=100000", "learner.num_threads=1000000", "env.check_spaces_steps=1e9",
              "checkpoint.every_iters=1e18", "runtime.max_worker_restarts=1e18", "model.hidden_sizes=[100000,100000]",
              "model.hidden_sizes=[1e9]", "model.max_seq_len=100000", "runtime.num_cpus_per_worker=1e9",
              "stop.env_steps=1e30", "stop.iterations=1e19"]:
        add("sizes", o, o)
    add("sizes", "runtime.num_envs_per_worker=1e5 rollout=1e5 (product)", "runtime.num_envs_per_worker=4096",
        "runtime.rollout_fragment_length=16777216")
    add("sizes", "evaluation.episodes=1e9 final", "evaluation.episodes=1e9", "evaluation.final=true")
    add("sizes", "evaluation.episodes=0", "evaluation.episodes=0", "evaluation.final=true")
    add("sizes", "impala async_requests_per_worker=1e9", "algo=impala", "runtime.async_requests_per_worker=1e9")
    add("sizes", "dqn.buffer_size=1e12", "algo=dqn", "dqn.buffer_size=1e12")
    add("sizes", "dqn.buffer_size=1e9", "algo=dqn", "dqn.buffer_size=1000000000", "dqn.learning_starts=32")
    add("sizes", "dqn.train_batch_size=1e9", "algo=dqn", "dqn.train_batch_size=1e9", "dqn.learning_starts=32")
    add("sizes", "sac.buffer_size=1e12 Pendulum", "algo=sac", "env=Pendulum-v1", "sac.buffer_size=1e12")
    add("sizes", "impala.train_batch_size=1e9", "algo=impala", "impala.train_batch_size=1e9")
    add("sizes", "a2c.train_batch_size=1e9", "algo=a2c", "a2c.train_batch_size=1e9")
    add("sizes", "es.noise_size=1e12", "algo=es", "es.noise_size=1e12")
    add("sizes", "lstm recurrent_size=65536", "model.recurrent=lstm", "model.recurrent_size=65536")
    add("sizes", "r2d2.seq_len=100000", "algo=r2d2", "r2d2.seq_len=100000")
    add("sizes", "random report_every_env_steps=1e12", "algo=random", "random.report_every_env_steps=1e12")
    # containers of the wrong kind
    for o in ["model.hidden_sizes={}", "model.hidden_sizes={a: 1}", "env.kwargs=[1]", "env.kwargs=1",
              "env.kwargs=abc", "run.reporters={a: 1}", "run.reporters=csv", "plugins={a: 1}", "plugins=os",
              "ppo={}", "ppo=1", "runtime=[1]", "stop=5", "model=[64]", "multiagent.mapping=[x]",
              "multiagent.policies=[a,b]", "evaluation={interval: [1]}"]:
        add("containers", o, o)
    # unknown keys and typos
    for o in ["ppo.clip_parm=0.1", "ppo.lrr=1", "runtim.backend=local", "runtime.nm_workers=1", "nope=1",
              "env.idd=CartPole-v1", "model.hidden=1", "stop.env_step=100", "evaluation.episode=1", "x.y.z=1",
              "ENV=CartPole-v1", "ppo.lr.x=1", "Ppo.lr=1"]:
        add("unknown-keys", o, o)
    add("unknown-keys", "env and env.id both", "env.id=Acrobot-v1", "env=CartPole-v1")
    add("unknown-keys", "a key twice", "runtime.num_workers=1", "runtime.num_workers=2")
    add("unknown-keys", "dqn section with algo=ppo", "dqn.lr=0.1")
    # algorithms and envs
    for o in ["algo=nope", "algo=PPO", "algo=", "algo=[ppo]", "algo=dqn2", "algo=null"]:
        add("algo-env", o, o)
    for o in ["env=NoSuchEnv-v0", "env=CartPole-v99", "env=gymnasium:Nope-v0", "env=nope_pkg:X-v0", "env=null",
              "env.factory=nope:x", "env.factory=os:getcwd", "env.factory=math:pi", "env.factory=nomodule",
              "env.factory=fuzzenvs:nothing", "env.factory=fuzzenvs:not_an_env", "env.factory=fuzzenvs:raises",
              "env.factory=fuzzenvs:huge_obs", "env.preset=atari", "env.kwargs.nope=1", "env=CartPole-v1 "]:
        add("algo-env", o, o)
    # schedules
    for o in [("ppo.lr_schedule=cosine",), ("ppo.lr_schedule=linear", "ppo.schedule_env_steps=0"),
              ("ppo.lr_schedule=linear", "ppo.schedule_env_steps=-1"),
              ("ppo.lr_schedule=linear", "stop.iterations=2", "stop.env_steps=null"),
              ("ppo.clip_schedule=exp",), ("algo=dqn", "dqn.epsilon_timesteps=-1"),
              ("algo=dqn", "dqn.lr_schedule=linear", "dqn.schedule_env_steps=abc"),
              ("algo=dqn", "dqn.initial_epsilon=2"), ("algo=a2c", "a2c.lr_schedule=linear", "a2c.schedule_env_steps=1")]:
        add("schedules", " ".join(o), *o)
    # reporters and plugins
    for o in ["run.reporters=[csv,csv]", "run.reporters=[progress,progress]", "run.reporters=[nope]",
              "run.reporters=[]", "run.reporters=[tensorboard]", "run.reporters=[wandb]", "run.reporters=[mlflow]",
              "run.reporters=[Csv]"]:
        add("reporters", o, o, must_fail=o in ("run.reporters=[csv,csv]", "run.reporters=[progress,progress]"))
    for o, bad in [("plugins=[os]", True), ("plugins=[nope_module]", True), ("plugins=[flowkit.engine]", True),
                   ("plugins=[sys]", True), ("plugins=['']", True), ("plugins=[fuzzenvs]", True),
                   ("plugins=[flowkit_ppo]", False), ("plugins=[os.path]", True)]:
        add("plugins", o, o, must_fail=bad)
    # batch sizes that do not fit together
    add("batches", "minibatch larger than a round (warns: one step per epoch)", "ppo.minibatch_size=1000")
    add("batches", "minibatch larger than train batch", "ppo.train_batch_size=16", "ppo.minibatch_size=64",
        must_fail=True)
    add("batches", "train batch 10, rounds of 3x3", "runtime.num_envs_per_worker=3", "runtime.rollout_fragment_length=3",
        "ppo.train_batch_size=10", "ppo.minibatch_size=5")
    add("batches", "dqn batch larger than buffer", "algo=dqn", "dqn.buffer_size=16", "dqn.train_batch_size=64",
        "dqn.learning_starts=32")
    # multi-agent
    ma = ["env.factory=flowkit.testing.envs:turn_game", "algo=ppo"]
    # a mapping target that is not in multiagent.policies is a policy of its own, trained by `algo`
    # (documented); a typo leaves the declared policy without agents, which is refused
    add("multiagent", "mapping to a misspelt policy", *ma, "multiagent.policies={a: {}, b: {}}",
        "multiagent.mapping={p0: a, p1: bb}", must_fail=True)
    add("multiagent", "weighted mapping to an undeclared policy", *ma, "multiagent.policies={a: {}, b: {}}",
        "multiagent.mapping={p0: a, p1: {b: 1, ghost: 1}}")
    add("multiagent", "policies as a list", *ma, "multiagent.policies=[a,b]")
    add("multiagent", "policy algo unknown", *ma, "multiagent.policies={a: {algo: nope}}")
    add("multiagent", "policy algo sac on Discrete", *ma, "multiagent.policies={a: {algo: sac}}")
    add("multiagent", "policy checkpoint missing", *ma, "multiagent.policies={a: {checkpoint: /nonexistent}}")
    add("multiagent", "round robin weight 0", *ma, "multiagent.policies={a: {}, b: {}}",
        "multiagent.mapping={p0: a, p1: b}", "multiagent.round_robin_weights={a: 0}")
    add("multiagent", "policies on a single-agent env", "multiagent.policies={a: {}, b: {}}")
    add("multiagent", "policy config unknown key", *ma, "multiagent.policies={a: {config: {nope: 1}}}")
    add("multiagent", "policy config as list", *ma, "multiagent.policies={a: {config: [1]}}")
    add("multiagent", "mapping value a number", *ma, "multiagent.mapping={p0: 5}")
    # interpolation
    for o in ["ppo.lr=${nope}", "ppo.lr=${oc.env:HOME}", "ppo.lr=${oc.env:FLOWKIT_FUZZ_NOPE}", "seed=${seed}",
              "ppo.lr=${ppo.gamma}", "ppo.lr=${", "ppo.lr=${oc.decode:'[1]'}", "ppo.lr=${oc.create:{a: 1}}",
              "env.id=${oc.env:HOME}"]:
        add("interpolation", o, o)
    # YAML files
    yml: Dict[str, Union[str, bytes]] = {
        "non-UTF-8": b"ppo:\n  lr: \xff\xfe\x00\n",
        "empty": "",
        "a list": "- 1\n- 2\n",
        "a scalar": "42\n",
        "!!python/object/apply": "ppo: !!python/object/apply:os.system ['touch {tmp}/MARKER']\n",
        "!!python/name": "ppo:\n  lr: !!python/name:os.system\n",
        "invalid": "ppo: [\n",
        "tabs": "ppo:\n\tlr: 1\n",
        "duplicate keys": "ppo:\n  lr: 0.1\n  lr: 0.2\n",
        "nested list for int": "runtime:\n  num_workers: [[1]]\n",
        "nested list hidden sizes": "model:\n  hidden_sizes: [[64]]\n",
        "map for list": "model:\n  hidden_sizes: {a: 1}\n",
        "list for map": "env:\n  kwargs: [1, 2]\n",
        "policies a list": "multiagent:\n  policies: [a, b]\n",
        "null key": "null: 1\n",
        "int key": "1: 2\n",
        "hydra defaults": "defaults:\n  - ppo\n",
        "BOM": "\ufeffppo:\n  lr: 0.001\n",
        "binary": b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4,
        "deep nesting": "a: " + "[" * 5000 + "]" * 5000 + "\n",
        "billion laughs": "a: &a ['x','x','x','x','x','x','x','x','x']\n" + "".join(
            f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n" for p, c in zip("abcdefgh", "bcdefghi")),
        "huge": "ppo:\n  lr: 0.001\n" + "# x\n" * 3_000_000,
        "valid": "ppo:\n  lr: 0.001\nruntime:\n  num_workers: 1\n",
        "env.factory os:system": "env:\n  factory: os:system\n  kwargs: {command: 'touch {tmp}/MARKER'}\n",
        "sizes 1e9": "ppo:\n  train_batch_size: 1000000000\n",  # (a key the base overrides do not set)
        "float seed": "seed: 1.5\n",
    }
    for name, content in yml.items():
        marker = "MARKER" if "MARKER" in (content if isinstance(content, str) else "") else None
        must_fail = name == "env.factory os:system"
        add("yaml", name, files=["c.yaml"], setup=_file("c.yaml", content), marker=marker, must_fail=must_fail)
    add("yaml", "missing file", files=["nope.yaml"])
    add("yaml", "a folder", files=["."])
    add("yaml", "two files, second bad", files=["a.yaml", "b.yaml"],
        setup=lambda tmp, ctx: (_file("a.yaml", "ppo:\n  lr: 0.001\n")(tmp, ctx), _file("b.yaml", "ppo: 5\n")(tmp, ctx)))
    add("yaml", "/dev/zero", files=["/dev/zero"], timeout=60)
    # every algorithm on a space it cannot take
    algos = ["ppo", "ddppo", "a2c", "a3c", "impala", "appo", "dqn", "r2d2", "sac", "td3", "es", "ars", "maml",
             "random", "bc", "marwil", "cql_dqn", "cql_sac"]
    discrete_only = {"dqn", "r2d2", "cql_dqn"}
    box_only = {"sac", "td3", "cql_sac"}
    for a in algos:
        env = ("env=Pendulum-v1" if a in discrete_only else "env=CartPole-v1" if a in box_only
               else "env.factory=fuzzenvs:tuple_action")
        add("algo-space", f"{a} actions", f"algo={a}", env)
        add("algo-space", f"{a} Text observations", f"algo={a}", "env.factory=fuzzenvs:text_obs")
    # MuJoCo kwargs (issue 48): what Gymnasium's MuJoCo envs take without checking
    mj = ("algo=ppo", "env=Hopper-v5", "stop.env_steps=64", "ppo.train_batch_size=64", "ppo.minibatch_size=32")
    for o, bad in [("render_mode=human", True), ("render_mode=rgb_array", False), ("render_mode=depth_array", False),
                   ("reset_noise_scale=nan", True), ("reset_noise_scale=.inf", True), ("reset_noise_scale=-.inf", True),
                   ("reset_noise_scale=abc", True), ("reset_noise_scale=[1]", True), ("reset_noise_scale=0", False),
                   ("reset_noise_scale=1e6", False), ("frame_skip=-1", True), ("frame_skip=0", True),
                   ("frame_skip=1.5", True), ("frame_skip=20", False), ("xml_file=/nonexistent.xml", True),
                   ("healthy_z_range=[.nan,1]", True), ("ctrl_cost_weight=-1", False), ("bogus=1", True),
                   ("camera_id=99", False), ("width=0", False),
                   ("default_camera_config=5", False)]:  # (read only to render: training never does)
        add("mujoco-kwargs", o, *mj, f"env.kwargs.{o}", must_fail=bad, timeout=300)
    # counts and numbers (issue 48): a float for a count, numbers as text, a mapping without agents, a FIFO
    add("counts", "stop.env_steps=1.5e3", "stop.env_steps=1.5e3", must_fail=True)
    add("counts", "stop.env_steps=1500.0", "stop.env_steps=1500.0", must_fail=True)
    add("counts", "stop.env_steps=15e1", "stop.env_steps=15e1")
    add("counts", "hidden_sizes as text", files=["c.yaml"], setup=_file("c.yaml", 'model:\n  hidden_sizes: ["64", "64"]\n'),
        must_fail=True)
    add("counts", "mapping on a single-agent env", "multiagent.mapping.agent_*=x", must_fail=True)
    add("yaml", "a FIFO with no writer", files=["fifo.yaml"], setup=lambda tmp, ctx: os.mkfifo(os.path.join(tmp, "fifo.yaml")),
        must_fail=True, timeout=60)
    return cases


# ---- tamper part -------------------------------------------------------------------------------
STATE_EDIT = r'''
import math, os, sys
import torch
path, what = sys.argv[1], sys.argv[2]
st = torch.load(path, weights_only=True)
pols = st.get("policies") or {}
pid = next(iter(pols)) if pols else None


def first_2d(node, parent=None, key=None):
    """(container, key, tensor) of the first 2-D float tensor under node."""
    if isinstance(node, torch.Tensor) and node.dim() == 2 and node.is_floating_point():
        return parent, key, node
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        found = first_2d(v, node, k)
        if found:
            return found
    return None


specs = st.get("policy_specs") or {}
spec = specs.get(pid) if pid in specs else (next(iter(specs.values())) if specs else {})
if what == "iteration":
    st["iteration"] = "abc"
elif what == "iteration_negative":
    st["iteration"] = -5
elif what == "no_policies":
    st.pop("policies")
elif what == "policies_list":
    st["policies"] = [1, 2]
elif what == "no_specs":
    st.pop("policy_specs", None)
elif what == "neg_n":
    spec["action_space"] = {"type": "Discrete", "n": -3, "start": 0, "dtype": "int64"}
elif what == "huge_mask":
    spec["observation_space"] = {"type": "MultiBinary", "n": [100000, 100000]}
elif what == "huge_box":
    spec["observation_space"] = {"type": "Box", "low": -1.0, "high": 1.0, "shape": [100000, 100000], "dtype": "float32"}
elif what == "unknown_space":
    spec["observation_space"] = {"type": "Sequence"}
elif what == "algo_dqn":
    spec["algo"] = "dqn"
elif what == "algo_os":
    spec["algo"] = "os"
    spec["algo_module"] = "os"
elif what in ("wrong_shape", "nan", "huge_weights"):
    parent, key, t = first_2d(pols[pid])
    if what == "wrong_shape":
        parent[key] = torch.zeros(3, 3)
    elif what == "nan":
        t[0, 0] = math.nan
    else:
        t.mul_(1e30)
elif what == "counters":
    st["counters"] = {"env_steps_sampled": "many"}
else:
    raise SystemExit(f"unknown edit {what}")
try:  # a crafted file: its digest matches its (changed) contents
    from flowkit.checkpoint import digest
    if isinstance(st.get("digests"), dict) and isinstance(st.get("policies"), dict):
        st["digests"] = {"policies": digest(st["policies"])}
except ImportError:
    pass
torch.save(st, path)
'''

PICKLE = r'''
import os, sys, torch
class Payload:
    def __reduce__(self):
        return (os.system, ("touch " + sys.argv[2],))
torch.save({"format": 2, "iteration": 1, "policies": {"default": Payload()}}, sys.argv[1])
'''


def _ckpt(run: str) -> str:
    root = os.path.join(run, "checkpoints")
    tags = sorted(d for d in os.listdir(root) if d.startswith("iter_"))
    return os.path.join(root, tags[-1])


def _python(ctx: Ctx, code: str, *args: str) -> None:
    subprocess.run([ctx.python, "-c", code, *args], check=True, capture_output=True, timeout=120)


def _tamper(base: str, damage: Callable[[str, str, Ctx], None]) -> Setup:
    """Copy the base run ``base`` to ``{tmp}/run`` and damage the copy."""
    def setup(tmp: str, ctx: Ctx) -> None:
        run = os.path.join(tmp, "run")
        shutil.copytree(ctx.runs[base], run, symlinks=True)
        damage(run, tmp, ctx)
    return setup


def _write(rel: str, content: Union[str, bytes], ckpt: bool = False) -> Callable[[str, str, Ctx], None]:
    def damage(run: str, tmp: str, ctx: Ctx) -> None:
        path = os.path.join(_ckpt(run) if ckpt else run, rel)
        data = content if isinstance(content, bytes) else content.replace("{tmp}", tmp).encode()
        with open(path, "wb") as f:
            f.write(data)
    return damage


def _both_configs(content: str) -> Callable[[str, str, Ctx], None]:
    def damage(run: str, tmp: str, ctx: Ctx) -> None:
        _write("config.yaml", content)(run, tmp, ctx)
        _write("config.yaml", content, ckpt=True)(run, tmp, ctx)
    return damage


def _config_edit(edit: Callable[[str, str], str]) -> Callable[[str, str, Ctx], None]:
    """Both config.yaml files rewritten by ``edit(text, tmp)``."""
    def damage(run: str, tmp: str, ctx: Ctx) -> None:
        for folder in (run, _ckpt(run)):
            path = os.path.join(folder, "config.yaml")
            with open(path) as f:
                text = f.read()
            with open(path, "w") as f:
                f.write(edit(text, tmp))
    return damage


def _set_yaml_key(section: str, line: str) -> Callable[[str, str], str]:
    """Insert ``line`` (indented) as the first line of the top-level ``section:`` block (or
    append ``section:`` with it)."""
    def edit(text: str, tmp: str) -> str:
        line_ = line.replace("{tmp}", tmp)
        key = line_.split(":", 1)[0]
        lines = [ln for ln in text.splitlines() if not (ln.startswith(f"  {key}:") and _in_section(text, ln, section))]
        out, done = [], False
        for ln in lines:
            out.append(ln)
            if ln == f"{section}:" and not done:
                out.append(f"  {line_}")
                done = True
        if not done:
            out += [f"{section}:", f"  {line_}"]
        return "\n".join(out) + "\n"
    return edit


def _set_dotted(key: str, value: str) -> Callable[[str, str], str]:
    section, _, name = key.partition(".")
    return _set_yaml_key(section, f"{name}: {value}")


def _in_section(text: str, target: str, section: str) -> bool:
    current = None
    for ln in text.splitlines():
        if ln and not ln.startswith(" "):
            current = ln.rstrip(":")
        if ln is target or ln == target:
            return current == section
    return False


def _state(what: str) -> Callable[[str, str, Ctx], None]:
    return lambda run, tmp, ctx: _python(ctx, STATE_EDIT, os.path.join(_ckpt(run), "state.pt"), what)


def _flip(run: str, tmp: str, ctx: Ctx) -> None:
    path = os.path.join(_ckpt(run), "state.pt")
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        for i in range(len(data) // 2, len(data) // 2 + 64, 8):
            data[i] ^= 0xFF
        f.seek(0)
        f.write(data)


def _truncate(run: str, tmp: str, ctx: Ctx) -> None:
    path = os.path.join(_ckpt(run), "state.pt")
    os.truncate(path, os.path.getsize(path) // 2)


def _rm(rel: str, ckpt: bool = False) -> Callable[[str, str, Ctx], None]:
    def damage(run: str, tmp: str, ctx: Ctx) -> None:
        path = os.path.join(_ckpt(run) if ckpt else run, rel)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    return damage


def _rename_ckpt(new: str) -> Callable[[str, str, Ctx], None]:
    return lambda run, tmp, ctx: os.rename(_ckpt(run), os.path.join(run, "checkpoints", new))


def _dqn_inside(run: str, tmp: str, ctx: Ctx) -> None:
    """The PPO run's newest checkpoint replaced by the DQN run's."""
    dst = _ckpt(run)
    shutil.rmtree(dst)
    shutil.copytree(_ckpt(ctx.runs["dqn"]), dst)


def _stale_lock(run: str, tmp: str, ctx: Ctx) -> None:
    with open(os.path.join(run, ".lock"), "w") as f:
        f.write("999999 otherhost.example\n")


def _leftovers(run: str, tmp: str, ctx: Ctx) -> None:
    os.makedirs(os.path.join(run, "checkpoints", ".tmp-abc123"))
    with open(os.path.join(run, "checkpoints", ".tmp-abc123", "state.pt"), "wb") as f:
        f.write(b"\x00" * 100)
    with open(os.path.join(run, "metrics.csv.tmp"), "w") as f:
        f.write("iteration\n1\n")
    with open(os.path.join(run, ".result.json.tmp-12345"), "w") as f:
        f.write("{")


def _big_metrics(run: str, tmp: str, ctx: Ctx) -> None:
    with open(os.path.join(run, "metrics.csv"), "a") as f:
        row = ",".join(["1"] * 40) + "\n"
        f.write(row * 2_000_000)  # ~160 MB


def _state_is_dir(run: str, tmp: str, ctx: Ctx) -> None:
    path = os.path.join(_ckpt(run), "state.pt")
    os.remove(path)
    os.mkdir(path)


def _state_symlink(run: str, tmp: str, ctx: Ctx) -> None:
    path = os.path.join(_ckpt(run), "state.pt")
    os.remove(path)
    os.symlink("/dev/zero", path)


def _pickle(run: str, tmp: str, ctx: Ctx) -> None:
    _python(ctx, PICKLE, os.path.join(_ckpt(run), "state.pt"), os.path.join(tmp, "MARKER"))


def _run_is_file(run: str, tmp: str, ctx: Ctx) -> None:
    shutil.rmtree(run)
    with open(run, "w") as f:
        f.write("not a run\n")


SYSTEM = "factory: os:system"
DAMAGES: Dict[str, tuple] = {  # name: (damage, marker or None)
    "run config.yaml missing": (_rm("config.yaml"), None),
    "checkpoint config.yaml missing": (_rm("config.yaml", ckpt=True), None),
    "both config.yaml missing": (lambda r, t, c: (_rm("config.yaml")(r, t, c), _rm("config.yaml", True)(r, t, c)), None),
    "config.yaml invalid YAML": (_both_configs("algo: [ppo\n"), None),
    "config.yaml !!python tag": (_both_configs("algo: !!python/object/apply:os.system ['touch {tmp}/MARKER']\n"),
                                 "MARKER"),
    "config.yaml a list": (_both_configs("- 1\n- 2\n"), None),
    "config.yaml empty": (_both_configs(""), None),
    "config.yaml non-UTF-8": (lambda r, t, c: (_write("config.yaml", b"algo: \xff\xfe\n")(r, t, c),
                                               _write("config.yaml", b"algo: \xff\xfe\n", True)(r, t, c)), None),
    "config.yaml unknown key": (_config_edit(lambda s, t: s + "nope: 1\n"), None),
    "config.yaml env.factory os:system": (_config_edit(lambda s, t: _set_yaml_key(
        "env", "kwargs: {command: 'touch " + t + "/MARKER'}")(_set_yaml_key("env", SYSTEM)(s, t), t)), "MARKER"),
    "config.yaml ${oc.env:HOME}": (_config_edit(lambda s, t: _set_yaml_key("env", "id: ${oc.env:HOME}")(s, t)), None),
    "config.yaml model.class os:system": (_config_edit(lambda s, t: _set_yaml_key("model", "class: os:system")(s, t)),
                                          None),
    "config.yaml plugins [os]": (_config_edit(lambda s, t: s + "plugins: [os]\n"), None),
    # issue 48: every form of a name; importing `markmod` (written beside fuzzenvs) leaves MARKER
    **{f"config.yaml {key} {form}": (_config_edit(_set_dotted(key, f"'{form}'")), "MARKER")
       for key, form in (("env.factory", "markmod:"), ("env.factory", "markmod"), ("env.factory", "markmod.sub"),
                         ("env.factory", "markmod.sub:"), ("model.class", "markmod"), ("model.class", "markmod:"),
                         ("model.class", "markmod.sub"), ("env.id", "markmod:Evil-v0"))},
    "config.yaml algo nope": (_config_edit(lambda s, t: re.sub(r"(?m)^algo: .*$", "algo: nope", s)), None),
    "iteration folder not an int": (_rename_ckpt("iter_abc"), None),
    "checkpoints folder empty": (lambda r, t, c: (shutil.rmtree(os.path.join(r, "checkpoints")),
                                                  os.mkdir(os.path.join(r, "checkpoints"))), None),
    "checkpoints folder missing": (_rm("checkpoints"), None),
    "state.pt missing": (_rm("state.pt", ckpt=True), None),
    "state.pt iteration 'abc'": (_state("iteration"), None),
    "state.pt iteration -5": (_state("iteration_negative"), None),
    "state.pt without policies": (_state("no_policies"), None),
    "state.pt policies a list": (_state("policies_list"), None),
    "state.pt without policy_specs": (_state("no_specs"), None),
    "state.pt Discrete n -3": (_state("neg_n"), None),
    "state.pt 100000x100000 mask": (_state("huge_mask"), None),
    "state.pt 100000x100000 Box": (_state("huge_box"), None),
    "state.pt unknown space": (_state("unknown_space"), None),
    "state.pt algo dqn": (_state("algo_dqn"), None),
    "state.pt algo os": (_state("algo_os"), None),
    "state.pt weights wrong shape": (_state("wrong_shape"), None),
    "state.pt NaN weights": (_state("nan"), None),
    "state.pt weights x1e30": (_state("huge_weights"), None),
    "state.pt counters not ints": (_state("counters"), None),
    "state.pt flipped bytes": (_flip, None),
    "state.pt truncated": (_truncate, None),
    "state.pt empty": (_write("state.pt", b"", ckpt=True), None),
    "state.pt pickle payload": (_pickle, "MARKER"),
    "state.pt a folder": (_state_is_dir, None),
    "state.pt -> /dev/zero": (_state_symlink, None),
    "DQN checkpoint inside a PPO run": (_dqn_inside, None),
    "metrics.csv binary": (_write("metrics.csv", b"\x00\xff\xfe\x89PNG\x00\x00" * 64), None),
    "metrics.csv oversized": (_big_metrics, None),
    "metrics.csv one 200k-char line": (_write("metrics.csv", "iteration,x\n1," + "a" * 200000 + "\n"), None),
    "metrics.csv missing": (_rm("metrics.csv"), None),
    "metrics.csv header only": (_write("metrics.csv", "iteration,env_steps_sampled,episode_return_mean\n"), None),
    "result.json garbage": (_write("result.json", "{not json"), None),
    "stale lock of another host": (_stale_lock, None),
    "leftover temporary files": (_leftovers, None),
    "run folder is a file": (_run_is_file, None),
}
# the DQN run gets the damages that differ by algorithm
DQN_DAMAGES = ("state.pt weights wrong shape", "state.pt NaN weights", "state.pt without policies",
               "state.pt algo dqn", "state.pt flipped bytes", "state.pt truncated", "leftover temporary files",
               "config.yaml env.factory os:system")


def _resumed(base_iters: int) -> Callable[[str], bool]:
    """A resumed run wrote a checkpoint after the base run's last iteration."""
    def ok(tmp: str) -> bool:
        root = os.path.join(tmp, "run", "checkpoints")
        its = [int(m[1]) for d in (os.listdir(root) if os.path.isdir(root) else [])
               if (m := re.fullmatch(r"iter_(\d+)", d))]
        return bool(its) and max(its) > base_iters
    return ok


def _evaluated(tmp: str) -> bool:
    for _root, _, files in os.walk(os.path.join(tmp, "run")):
        if "evaluation.json" in files:
            return True
    return False


SURFACES_ON_RUN: Dict[str, Callable[[int], tuple]] = {  # command on {tmp}/run: (argv, expect)
    "resume": lambda it: (["train", "resume=run", f"stop.iterations={it + 1}", "stop.env_steps=null"], _resumed(it)),
    "evaluate": lambda it: (["evaluate", "run", "episodes=2"], _evaluated),
    "export": lambda it: (["export", "run", "format=torchscript", "out=policy.pt"], "policy.pt"),
    "plot": lambda it: (["plot", "run", "out=curve.png"], "curve.png"),
}


def base_runs(ctx: Ctx) -> None:
    """The PPO and DQN runs the tamper cases copy (and a run of the stuck env for surfaces)."""
    specs = {"ppo": ["env=CartPole-v1", "stop.env_steps=128"],
             "dqn": ["algo=dqn", "env=CartPole-v1", "dqn.learning_starts=32", "stop.env_steps=128"],
             "stuck": ["env.factory=fuzzenvs:stuck", "stop.env_steps=128", "runtime.sample_timeout_s=10"]}
    for name, ov in specs.items():
        run = os.path.join(ctx.work, "base", name)
        if os.path.exists(os.path.join(run, "result.json")):
            ctx.runs[name] = run
            continue
        shutil.rmtree(run, ignore_errors=True)
        argv = ctx.flowkit + ["train", *TEXT_OPTS, "runtime.backend=local", "runtime.num_workers=1",
                              "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=32",
                              "run.reporters=[csv,checkpoint]", f"run.dir={run}", *ov]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ctx.fx, os.environ.get("PYTHONPATH")])))
        p = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, cwd=ctx.work)
        if p.returncode != 0:
            raise SystemExit(f"base run {name} failed ({p.returncode}): {p.stderr[-2000:]}")
        ctx.runs[name] = run
    data = os.path.join(ctx.work, "base", "dataset-v0")  # the datasets parts' base: 3,000 sampled CartPole steps
    if not os.path.exists(os.path.join(data, "flowkit-columns", "index.json")):
        shutil.rmtree(data, ignore_errors=True)
        p = subprocess.run(ctx.flowkit + ["record", ctx.runs["ppo"], "steps=3000", "explore=sample", "seed=0",
                                          f"out={data}"], capture_output=True, text=True, timeout=600, cwd=ctx.work)
        if p.returncode != 0:
            raise SystemExit(f"base dataset failed ({p.returncode}): {p.stderr[-2000:]}")
        _python(ctx, "import sys\nfrom flowkit.datasets import ColumnStore\nColumnStore.open(sys.argv[1]).close()", data)
    ctx.runs["dataset"] = data


def _iterations(run: str) -> int:
    its = [int(d[5:]) for d in os.listdir(os.path.join(run, "checkpoints")) if re.fullmatch(r"iter_\d+", d)]
    return max(its)


def tamper_cases(ctx: Ctx) -> List[Case]:
    cases = []
    for base, names in (("ppo", list(DAMAGES)), ("dqn", list(DQN_DAMAGES))):
        its = _iterations(ctx.runs[base]) if base in ctx.runs else 2
        for dname in names:
            damage, marker = DAMAGES[dname]
            for sname, surface in SURFACES_ON_RUN.items():
                argv, expect = surface(its)
                cases.append(Case("tamper", f"{base}/{dname}/{sname}", argv, _tamper(base, damage), expect,
                                  marker=marker))
    return cases


# ---- surfaces part ------------------------------------------------------------------------------
def _copy(base: str) -> Setup:
    return _tamper(base, lambda run, tmp, ctx: None)


def _then(*setups: Setup) -> Setup:
    def setup(tmp: str, ctx: Ctx) -> None:
        for s in setups:
            s(tmp, ctx)
    return setup


def _mkdir(rel: str, mode: Optional[int] = None) -> Setup:
    def setup(tmp: str, ctx: Ctx) -> None:
        os.makedirs(os.path.join(tmp, rel), exist_ok=True)
        if mode is not None:
            os.chmod(os.path.join(tmp, rel), mode)
    return setup


def _unchanged(rel: str) -> Callable[[str], bool]:
    """The run's own file ``rel`` still holds what the base run wrote (compared by size > 0 and
    not being a PNG/TorchScript)."""
    def ok(tmp: str) -> bool:
        path = os.path.join(tmp, "run", rel)
        with open(path, "rb") as f:
            head = f.read(8)
        return bool(head) and not head.startswith((b"\x89PNG", b"PK"))
    return ok


def surface_cases() -> List[Case]:
    cases: List[Case] = []

    def add(name: str, argv: List[str], setup: Optional[Setup] = None, expect: Expect = None, **kw) -> None:
        cases.append(Case("surfaces", name, argv, setup, expect, **kw))

    run = _copy("ppo")
    exp = ["export", "run", "format=torchscript"]
    add("export out= an existing folder", exp + ["out=outdir"], _then(run, _mkdir("outdir")), "outdir/policy.pt")
    add("export out= a path under a file", exp + ["out=afile/p.pt"], _then(run, _file("afile", "x")))
    add("export out= into a read-only folder", exp + ["out=ro/p.pt"], _then(run, _mkdir("ro", 0o555)), "ro/p.pt")
    add("export out= onto state.pt", exp + ["out=run/checkpoints/iter_000002/state.pt"], run,
        lambda t: _unchanged("checkpoints/iter_000002/state.pt")(t), must_fail=True)
    add("export out= onto metrics.csv", exp + ["out=run/metrics.csv"], run, _unchanged("metrics.csv"), must_fail=True)
    add("export out= onto config.yaml", exp + ["out=run/config.yaml"], run, _unchanged("config.yaml"), must_fail=True)
    # a special file (never /dev/full or /dev/null: run as root, a version that renames its output
    # into place replaces the device node)
    add("export out= a FIFO", exp + ["out=fifo"], _then(run, lambda t, c: os.mkfifo(os.path.join(t, "fifo"))),
        must_fail=True)
    add("export out= /proc/nope/p.pt", exp + ["out=/proc/nope/p.pt"], run)
    add("export format=nope", ["export", "run", "format=nope"], run)
    add("export without format=", ["export", "run"], run)
    add("export format=onnx", ["export", "run", "format=onnx", "out=p.onnx"], run, "p.onnx")
    add("export policy=nope", exp + ["out=p.pt", "policy=nope"], run)
    add("export of a missing folder", exp + ["p.pt"])
    add("export of an empty folder", exp + ["p.pt"], _mkdir("run"))
    add("evaluate with evaluation.json a folder", ["evaluate", "run", "episodes=2"],
        _then(run, _mkdir("run/checkpoints/iter_000002/evaluation.json")))
    add("evaluate in a read-only run folder", ["evaluate", "run", "episodes=2"],
        _then(run, lambda t, c: os.chmod(os.path.join(t, "run", "checkpoints", "iter_000002"), 0o555)), _evaluated)
    add("evaluate --episodes 5", ["evaluate", "run", "--episodes", "5"], run)
    for o in ["episodes=0", "episodes=-1", "episodes=1e9", "episodes=abc", "num_envs=0", "num_envs=1e5",
              "seed=-1", "explore=maybe", "timeout_s=0", "timeout_s=-1", "render=avi", "nope=1", "opponents=[1]"]:
        add(f"evaluate {o}", ["evaluate", "run", o], run, _evaluated)
    add("evaluate render=gif", ["evaluate", "run", "episodes=1", "render=gif"], run, _evaluated)
    stuck = _copy("stuck")
    ev = ["evaluate", "run", "--trust-config", "episodes=2"]
    for mode in ("sleep", "reset_sleep", "endless"):
        add(f"evaluate stuck env ({mode}), timeout_s=5", ev + ["timeout_s=5"], stuck, env={"FUZZ_STUCK": mode},
            must_fail=True)
        add(f"evaluate stuck env ({mode}), the run's sample_timeout_s=10", ev, stuck, env={"FUZZ_STUCK": mode},
            must_fail=True)
    add("evaluate env that calls os._exit(3)", ev, stuck, env={"FUZZ_STUCK": "exit"}, must_fail=True)
    add("evaluate env that raises", ev, stuck, env={"FUZZ_STUCK": "raise"}, must_fail=True)
    add("evaluate without --trust-config", ["evaluate", "run", "episodes=2"], stuck, must_fail=True)
    add("plot out= a folder", ["plot", "run", "out=outdir"], _then(run, _mkdir("outdir")))
    add("plot out= under a file", ["plot", "run", "out=afile/c.png"], _then(run, _file("afile", "x")))
    add("plot out= onto metrics.csv", ["plot", "run", "out=run/metrics.csv"], run, _unchanged("metrics.csv"),
        must_fail=True)
    add("plot out= run/metrics.png (its csv: the run's metrics.csv)", ["plot", "run", "out=run/metrics.png"], run,
        _unchanged("metrics.csv"), must_fail=True)
    add("plot out= a FIFO", ["plot", "run", "out=fifo"], _then(run, lambda t, c: os.mkfifo(os.path.join(t, "fifo"))),
        must_fail=True)
    add("plot metric=nope", ["plot", "run", "metric=nope", "out=c.png"], run)
    add("plot x=nope", ["plot", "run", "x=nope"], run)
    add("plot of a missing folder", ["plot", "nope", "out=c.png"])
    add("plot of an empty folder", ["plot", "empty", "out=c.png"], _mkdir("empty"))
    add("plot of a file", ["plot", "afile", "out=c.png"], _file("afile", "x"))
    # tune flags
    tune = ["tune", *TEXT_OPTS, "env=CartPole-v1", "runtime.backend=local", "runtime.num_workers=1",
            "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=32", "stop.env_steps=64",
            "run.dir=sweep"]
    for flags, space in [(["num_samples=-1"], "ppo.lr=uniform(1e-4,1e-3)"),
                         (["num_samples=0"], "ppo.lr=uniform(1e-4,1e-3)"),
                         (["num_samples=1e9"], "ppo.lr=uniform(1e-4,1e-3)"),
                         (["grace_period=-5"], "ppo.lr=choice(1e-4,1e-3)"),
                         (["grace_period=nan"], "ppo.lr=choice(1e-4,1e-3)"),
                         (["metric=nope"], "ppo.lr=choice(1e-4,1e-3)"),
                         (["max_concurrent=0"], "ppo.lr=choice(1e-4,1e-3)"),
                         (["mode=best"], "ppo.lr=choice(1e-4,1e-3)"),
                         ([], "seed=range(1e8)"),
                         ([], "seed=range(-5)"),
                         ([], "ppo.lr=choice()"),
                         ([], "ppo.lr=uniform(1,0)"),
                         ([], "ppo.lr=loguniform(0,1)"),
                         ([], "ppo.lr=choice(abc,def)"),
                         ([], "ppo.nope=choice(1,2)"),
                         ([], "ppo.lr=range(")]:
        add(f"tune {' '.join(flags)} {space}".replace("  ", " "), tune + flags + [space], expect="sweep/tune_results.csv",
            mem_limit=False)
    add("tune rerun into a sweep folder", tune + ["seed=range(2)"],
        _then(_mkdir("sweep"), _file("sweep/tune_results.csv", "run,seed\n")), mem_limit=False, must_fail=True)
    add("tune nothing searched", tune, mem_limit=False)
    add("tune two seeds", tune + ["seed=range(2)", "max_concurrent=1"], expect="sweep/tune_results.csv",
        mem_limit=False, timeout=400)
    # the command line itself
    add("--version", ["--version"])
    add("no arguments", [])
    add("unknown subcommand", ["nope"])
    add("train --episodes 5", ["train", "--episodes", "5"])
    add("train --dry-run plugins=[os]", ["train", "--dry-run", "env=CartPole-v1", "plugins=[os]"])
    add("plan algo=nope", ["plan", "algo=nope"])
    add("plugins plugins=[os]", ["plugins", "plugins=[os]"])
    add("record out= under a file", ["record", "run", "episodes=1", "out=afile/d"], _then(run, _file("afile", "x")))
    add("train run.dir onto a file", train("run.dir=afile"), _file("afile", "x"))
    add("train run.dir=/proc/x", train("run.dir=/proc/x"))
    add("train run.dir=. holding config.yaml", train("run.dir=."), _file("config.yaml", "mine: 1\n"),
        lambda t: open(os.path.join(t, "config.yaml")).read() == "mine: 1\n")
    add("train resume=/nonexistent", ["train", "resume=/nonexistent"])
    add("train resume= a file", ["train", "resume=afile"], _file("afile", "x"))
    add("train resume= an empty folder", ["train", "resume=empty"], _mkdir("empty"))
    return cases


# ---- datasets parts: contradictory and corrupt datasets, record edges ----------------------------
DAMAGE_PY = r'''
import os, sys
import h5py
import numpy as np
path, what = sys.argv[1], sys.argv[2]
h5 = os.path.join(path, "data", "main_data.hdf5")


def put(g, key, data):  # rewritten without flowkit's checksums, as another tool would
    del g[key]
    g.create_dataset(key, data=data)
    if "flowkit_sha256" in g.attrs:
        del g.attrs["flowkit_sha256"]


if what == "flip64":  # 64 bytes in the middle of the file, inverted
    size = os.path.getsize(h5)
    with open(h5, "r+b") as f:
        f.seek(size // 2)
        b = f.read(64)
        f.seek(size // 2)
        f.write(bytes(x ^ 0xFF for x in b))
    sys.exit(0)
if what == "columns_nan":  # the columnar copy (flowkit's own, next to the dataset): a NaN observation
    cols = os.path.join(path, "flowkit-columns")
    import json
    index = json.load(open(os.path.join(cols, "index.json")))
    a = np.load(os.path.join(cols, index["columns"]["observations"]["file"]), mmap_mode="r+")
    a[10, 0] = np.nan
    a.flush()
    sys.exit(0)
with h5py.File(h5, "a") as f:
    mid = sorted(f.keys(), key=lambda k: int(k.split("_")[1]))[1:-1]  # not the first or last (read whole by the load check)
    g = f[max(mid, key=lambda k: int(f[k].attrs["total_steps"]))]  # the longest of them
    obs, act, rew = g["observations"][()], g["actions"][()], g["rewards"][()]
    i = len(rew) // 2
    if what == "flip_obs":  # 64 bytes inverted inside the episode's observations (their first chunk), in place
        d = g["observations"]
        c = d.id.get_chunk_info(0)
        mid = c.byte_offset + max(0, min(c.size, d.size * d.dtype.itemsize) // 2 - 32)
    if what == "obs_width3":
        put(g, "observations", obs[:, :3])
    elif what == "obs_one_short":
        put(g, "observations", obs[:-1])
    elif what == "obs_strings":
        put(g, "observations", obs.astype("S12"))
    elif what == "obs_nan":
        obs[i, 1] = np.nan
        put(g, "observations", obs)
    elif what == "obs_inf":
        obs[i, 1] = np.inf
        put(g, "observations", obs)
    elif what == "obs_out_of_bounds":
        obs[i, 0] = 10.0  # the cart's position: Box bounds +-4.8
        put(g, "observations", obs)
    elif what == "actions_7":
        act[i] = 7
        put(g, "actions", act)
    elif what == "actions_-1":
        act[i] = -1
        put(g, "actions", act)
    elif what == "actions_one_short":
        put(g, "actions", act[:-1])
    elif what == "actions_float":
        put(g, "actions", act.astype(np.float64) + 0.25)
    elif what == "actions_2d":
        put(g, "actions", act.reshape(-1, 1))
    elif what == "rewards_nan":
        rew[i] = np.nan
        put(g, "rewards", rew)
    elif what == "rewards_inf":
        rew[i] = -np.inf
        put(g, "rewards", rew)
    elif what == "rewards_strings":
        put(g, "rewards", rew.astype("S8"))
    elif what == "rewards_one_long":
        put(g, "rewards", np.concatenate([rew, [1.0]]))
    elif what == "terminations_one_short":
        put(g, "terminations", g["terminations"][()][:-1])
    elif what == "all_terminal":  # every step of every episode
        for k in f:
            t = f[k]["terminations"][()]
            put(f[k], "terminations", np.ones_like(t))
    elif what == "terminal_midway":
        t = g["terminations"][()]
        t[i] = True
        put(g, "terminations", t)
    elif what == "truncated_midway":
        t = g["truncations"][()]
        t[i] = True
        put(g, "truncations", t)
    elif what == "no_checksums":  # a dataset as Minari's own tools write it: no flowkit checksums
        for k in f:
            if "flowkit_sha256" in f[k].attrs:
                del f[k].attrs["flowkit_sha256"]
    elif what != "flip_obs":
        raise SystemExit(f"unknown damage {what}")
if what == "flip_obs":
    with open(h5, "r+b") as f:
        f.seek(mid)
        b = f.read(64)
        f.seek(mid)
        f.write(bytes(x ^ 0xFF for x in b))
'''

DATASET_DAMAGES = {  # name: (damage, family, must the run refuse it)
    "observations of width 3 for a (4,) space": ("obs_width3", "contradict", True),
    "observations one row short": ("obs_one_short", "contradict", True),
    "observations stored as strings": ("obs_strings", "contradict", True),
    "actions 7 for Discrete(2)": ("actions_7", "contradict", True),
    "actions -1 for Discrete(2)": ("actions_-1", "contradict", True),
    "actions one element short": ("actions_one_short", "contradict", True),
    "actions of shape (T, 1) for Discrete(2)": ("actions_2d", "contradict", True),
    "rewards one element long": ("rewards_one_long", "contradict", True),
    "rewards stored as strings": ("rewards_strings", "contradict", True),
    "terminations one element short": ("terminations_one_short", "contradict", True),
    "observation outside the Box bounds": ("obs_out_of_bounds", "contradict", True),
    "64 bytes flipped in an episode's observations": ("flip_obs", "corrupt", True),
    # the middle of the file: an episode's data (refused), the file's structure (refused) or the
    # unused end of a chunk (the data intact: ok)
    "64 bytes flipped in the middle of main_data.hdf5": ("flip64", "corrupt", False),
    "float actions for Discrete(2)": ("actions_float", "corrupt", True),
    "every step terminal": ("all_terminal", "corrupt", True),
    "terminated midway through an episode": ("terminal_midway", "corrupt", True),
    "truncated midway through an episode": ("truncated_midway", "corrupt", True),
    "NaN observation": ("obs_nan", "corrupt", True),
    "inf observation": ("obs_inf", "corrupt", True),
    "NaN reward": ("rewards_nan", "corrupt", True),
    "-inf reward": ("rewards_inf", "corrupt", True),
    "NaN in the columnar copy": ("columns_nan", "corrupt", True),
    "without flowkit's checksums (Minari's own writers)": ("no_checksums", "corrupt", False),
}
DATASET_RUNS = {  # surface: the command on {tmp}/ds
    "bc": ["algo=bc", "stop.env_steps=512"],
    "dqn input.mix=0.5": ["algo=dqn", "input.mix=0.5", "dqn.learning_starts=32", "stop.env_steps=256"],
}


def _dataset_copy(damage: Optional[str]) -> Setup:
    """The base dataset copied to ``{tmp}/ds`` (with its columnar copy, written by a first read),
    then damaged by ``DAMAGE_PY``."""
    def setup(tmp: str, ctx: Ctx) -> None:
        ds = os.path.join(tmp, "ds")
        shutil.copytree(ctx.runs["dataset"], ds, symlinks=True)
        if damage:
            _python(ctx, DAMAGE_PY, ds, damage)
    return setup


def dataset_cases() -> List[Case]:
    cases = []
    for name, (damage, family, must_fail) in DATASET_DAMAGES.items():
        for surface, ov in DATASET_RUNS.items():
            argv = train("input.dataset=ds", *ov)
            cases.append(Case(family, f"{name}/{surface}", argv, _dataset_copy(damage), "run/result.json",
                              must_fail=must_fail, timeout=240))
    return cases


def _dataset_ok(ctx: Ctx, rel: str, min_episodes: int = 1) -> Callable[[str], bool]:
    """The folder ``rel`` holds a dataset that opens and passes flowkit's checks, with at least
    ``min_episodes`` episodes."""
    code = ("import sys\nfrom flowkit.datasets import open_dataset\n"
            "ds = open_dataset(sys.argv[1])\nsys.exit(0 if ds.total_episodes >= int(sys.argv[2]) else 1)")

    def ok(tmp: str) -> bool:
        p = subprocess.run([ctx.python, "-c", code, os.path.join(tmp, rel), str(min_episodes)], capture_output=True,
                           timeout=120)
        return p.returncode == 0
    return ok


def record_cases(ctx: Ctx) -> List[Case]:
    cases: List[Case] = []

    def add(name: str, args: List[str], setup: Optional[Setup] = None, expect: Expect = None, **kw) -> None:
        cases.append(Case("record", name, ["record", "{ppo}", *args], setup, expect, **kw))

    add("steps=200", ["steps=200", "out=d-v0"], expect=_dataset_ok(ctx, "d-v0"))
    add("episodes=2", ["episodes=2", "out=d-v0"], expect=_dataset_ok(ctx, "d-v0", 2))
    for sig in ("SIGTERM", "SIGINT", "SIGHUP"):  # 3 s into the recording (the dataset folder made)
        add(f"{sig} while recording keeps the finished episodes", ["episodes=100000", "out=d-v0"],
            expect=_dataset_ok(ctx, "d-v0"), signal_after=(sig, 3.0, "d-v0/data/metadata.json"))
    add("SIGTERM while recording, then append=true", ["episodes=3", "out=d-v0", "append=true"],
        _sigterm_run(["record", "{ppo}", "episodes=100000", "out=d-v0"], 3.0, "d-v0/data/metadata.json"),
        expect=_dataset_ok(ctx, "d-v0", 4))
    for o in ["episodes=1e12", "steps=1e15", "episodes=100001", "steps=100000001", "episodes=0", "steps=0",
              "steps=-1", "episodes=abc", "num_envs=0", "num_envs=100000", "explore=maybe", "epsilon=2",
              "seed=-1", "nope=1"]:
        add(o, [o, "out=d-v0"], must_fail=True)
    add("episodes and steps", ["episodes=2", "steps=10", "out=d-v0"], must_fail=True)
    add("out=/proc/x", ["steps=10", "out=/proc/x"], must_fail=True)
    add("out=/proc/x/d-v0", ["steps=10", "out=/proc/x/d-v0"], must_fail=True)
    add("out=/dev/null", ["steps=10", "out=/dev/null"], must_fail=True)
    add("out= a dataset, no append", ["steps=10", "out=ds"], _dataset_copy(None), must_fail=True)
    add("out= a dataset, append=true", ["steps=10", "out=ds", "append=true"], _dataset_copy(None),
        _dataset_ok(ctx, "ds"))
    add("out= a damaged dataset, append=true", ["steps=10", "out=ds", "append=true"], _dataset_copy("flip_obs"),
        must_fail=True)
    add("append=true to nothing", ["steps=10", "out=d-v0", "append=true"], expect=_dataset_ok(ctx, "d-v0"))
    add("out= a folder of other files", ["steps=10", "out=other"], _then(_mkdir("other"), _file("other/x", "x")),
        must_fail=True)
    cases.append(Case("record", "of a missing folder", ["record", "nope", "steps=10"], must_fail=True))
    cases.append(Case("record", "of an empty folder", ["record", "empty", "steps=10"], _mkdir("empty"),
                      must_fail=True))
    return cases


def _sigterm_run(argv: List[str], after: float, cue: str) -> Setup:
    """Run ``flowkit argv`` in the case's folder and stop it with SIGTERM ``after`` s after the
    file ``cue`` appears."""
    def setup(tmp: str, ctx: Ctx) -> None:
        p = subprocess.Popen(ctx.flowkit + [_subst(w, tmp, ctx) for w in argv], cwd=tmp, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True, preexec_fn=_limits(0, False))
        try:
            _signal_later(p, tmp, "SIGTERM", after, cue, 120.0)
            p.wait(60)
        finally:
            _killpg(p.pid)
    return setup


# ---- the round ----------------------------------------------------------------------------------
def _python_of(cmd: List[str]) -> str:
    """The interpreter of the ``flowkit`` script (its ``#!`` line), else this one."""
    exe = shutil.which(cmd[0]) or cmd[0]
    try:
        with open(exe, "rb") as f:
            first = f.readline().decode(errors="replace")
        if first.startswith("#!"):
            return first[2:].strip().split()[0]
    except OSError:
        pass
    return sys.executable


def report(outcomes: List[Outcome], parts: Sequence[str]) -> str:
    lines = ["| part | cases | " + " | ".join(CLASSES) + " |", "|---|---:|" + "---:|" * len(CLASSES)]
    for part in parts:
        mine = [o for o in outcomes if o.part == part]
        counts = [sum(o.cls == c for o in mine) for c in CLASSES]
        lines.append(f"| {part} | {len(mine)} | " + " | ".join(map(str, counts)) + " |")
    bad = [o for o in outcomes if o.cls not in ("ok", "clean-error")]
    if bad:
        lines.append(f"\n{len(bad)} cases neither ok nor clean-error:")
    for o in bad:
        lines.append(f"\n[{o.cls}] {o.part}/{o.name}  (exit {o.rc}, {o.seconds:.1f} s{', ' + o.note if o.note else ''})")
        lines.append(f"  $ {o.command}")
        lines += [f"  | {t}" for t in o.tail]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated: {','.join(PARTS)}")
    p.add_argument("--flowkit", default=os.path.join(HERE, "..", ".venv", "bin", "flowkit"),
                   help="the flowkit command to attack (a path, or a command line)")
    p.add_argument("--out", default=None, help="folder for attack.json (default: a new temporary folder)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per case (some cases set their own)")
    p.add_argument("--jobs", type=int, default=1, help="cases run at once")
    p.add_argument("--mem-gb", type=float, default=6.0, help="RLIMIT_DATA of each case in GiB (0: none)")
    p.add_argument("--only", default=None, help="fnmatch pattern on part/name")
    p.add_argument("--list", action="store_true", help="list the cases; run nothing")
    p.add_argument("--keep", action="store_true", help="keep the shared work folder (base runs)")
    a = p.parse_args(argv)
    parts = [x.strip() for x in a.parts.split(",") if x.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        p.error(f"unknown parts {sorted(unknown)}")
    cmd = shlex.split(a.flowkit)
    out = os.path.abspath(a.out or tempfile.mkdtemp(prefix="flowkit-attack-"))
    os.makedirs(out, exist_ok=True)
    work = os.path.join(out, "work")
    os.makedirs(os.path.join(work, "cases"), exist_ok=True)
    fx = os.path.join(work, "fx")
    os.makedirs(fx, exist_ok=True)
    with open(os.path.join(fx, "fuzzenvs.py"), "w") as f:
        f.write(FUZZENVS)
    os.makedirs(os.path.join(fx, "markmod"), exist_ok=True)
    for name in ("__init__.py", "sub.py"):  # importing it is running code a run folder named
        with open(os.path.join(fx, "markmod", name), "w") as f:
            f.write("open('MARKER', 'w').close()\n")
    ctx = Ctx(cmd, _python_of(cmd), work, fx, a.timeout, a.mem_gb)
    if not a.list and ({"tamper", "surfaces", "contradict", "corrupt", "record"} & set(parts)):
        print("training the base runs ...", flush=True)
        base_runs(ctx)
    cases = ([c for c in config_cases()] if "config" in parts else []) + \
            (tamper_cases(ctx) if "tamper" in parts else []) + (surface_cases() if "surfaces" in parts else []) + \
            [c for c in dataset_cases() if c.part in parts] + (record_cases(ctx) if "record" in parts else [])
    if a.only:
        cases = [c for c in cases if fnmatch.fnmatch(f"{c.part}/{c.name}", a.only)]
    if a.list:
        try:
            for c in cases:
                print(f"{c.part}/{c.name}: flowkit {' '.join(c.argv)}")
            print(f"{len(cases)} cases", flush=True)
        except BrokenPipeError:  # `--list | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    print(f"{len(cases)} cases against {' '.join(cmd)} (timeout {a.timeout:g} s, {a.jobs} at once); "
          f"results in {out}", flush=True)
    outcomes: List[Outcome] = []
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max(1, a.jobs)) as pool:
        for i, o in enumerate(pool.map(lambda c: run_case(c, ctx), cases), 1):
            outcomes.append(o)
            print(f"[{i}/{len(cases)}] {o.cls:<11} {o.seconds:6.1f} s  {o.part}/{o.name}", flush=True)
            with open(os.path.join(out, "attack.json"), "w") as f:
                json.dump({"flowkit": cmd, "parts": parts, "seconds": round(time.monotonic() - t0, 1),
                           "cases": [dataclasses.asdict(x) for x in outcomes]}, f, indent=1)
    text = report(outcomes, [x for x in PARTS if x in parts])
    print("\n" + text)
    with open(os.path.join(out, "attack.md"), "w") as f:
        f.write(text + "\n")
    if not a.keep:
        shutil.rmtree(os.path.join(work, "base"), ignore_errors=True)
    return 0 if all(o.cls in ("ok", "clean-error") for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
