"""Throughput against the optimum as rollout workers grow, on an env whose cost is waiting.

The env is ``flowkit.testing.envs:Sleep-v0`` made as a native vector env: each worker's ``k``
sub-envs step together in one sleep of ``--step-ms`` (a batched simulator that computes
nothing here), so ``N`` workers can at best sample ``N k / step`` env steps per second: the
optimum. With the env's cost being waiting, 32 workers fit on 2 cores and what is left between
the measured rate and the optimum is flowkit's own overhead (sampling loop, policy inference,
object store, the driver's concatenation and metrics), the way systems papers measure on small
hardware (RLlib Flow, Liang et al. 2021, fig. 9).

Modes: ``sample`` (``algo=random``: sampling only), ``ppo`` (bulk-synchronous, a tiny learner:
an 8-unit MLP, one epoch over each round as one minibatch), ``appo`` and ``impala``
(asynchronous: a learner thread, weights pushed to the producing worker). Every run is a fresh
process with its own local Ray session (``num_cpus`` = this machine's), the workers sharing the
CPUs (``runtime.num_cpus_per_worker`` = min(1, CPUs / N)); it trains ``--time-s`` seconds and its
rate is the steady state between its second and its last row (start-up left out).

RLlib (``--rllib``: RLlib 2.60's own PPO and APPO / IMPALA, new API stack, on the same env
registered in RLlib, the same worker and sub-env counts, fragment lengths, train batch sizes,
CPU fractions and an 8-unit MLP; its learner in the driver, ``num_learners=0``) runs in its own
virtualenv (RLlib pins another Gymnasium); each point runs flowkit, then RLlib, ``--repeats``
times, alternating. RLlib builds its sub-envs through the env's ``vector_entry_point``
(``gym_env_vectorize_mode="vector_entry_point"``), one sleep per step of all of them as in
flowkit. Its APPO / IMPALA run with ``use_env_runner_state_server=False``: with the global
state-server actor (their 2.60 default) the env runners' first pull never returned here and
nothing was sampled. The virtualenv (``/work/venvs/rllib``; RLlib ships inside the ray wheel,
so only its extras are installed, ray and torch come from flowkit's ``.venv`` through a path
appended last, after the venv's own gymnasium 1.2.2)::

    python3.11 -m venv /work/venvs/rllib
    echo "import sys; sys.path.append('/work/main/.venv/lib/python3.11/site-packages')" \
        > /work/venvs/rllib/lib/python3.11/site-packages/zz_main_venv.pth
    /work/venvs/rllib/bin/pip install "gymnasium==1.2.2" pandas "pyarrow>=17" dm_tree lz4 \
        "ormsgpack>=1.7" scipy "tensorboardX>=1.9" "pydantic>=2.5,<3" fsspec

Columns: workers, env steps/s, the optimum, their ratio, and the driver's CPU seconds per 1,000
env steps (its own process: the plan, the learner thread in the async modes, reporting), the
figure that tells where the driver saturates (1,000 / that = the most env steps/s one driver
core can take). Writes the table as JSON (``--json``) and a plot (``--plot``, PNG).

    python bench/scaling.py                                       # every mode, 1..32 workers
    python bench/scaling.py --modes sample --workers 1 2 4 --time-s 10   # a quick look
    python bench/scaling.py --obs image                           # Atari-sized uint8 frames
    python bench/scaling.py --modes ppo appo --rllib              # flowkit and RLlib, alternating
    python bench/scaling.py --worker-cpu --step-ms 0 --repeats 100   # one worker's CPU per vector step
    python bench/scaling.py --ray-call-cpu --repeats 100          # Ray's CPU per sample call in a worker
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ENVS_PY = os.path.join(HERE, "..", "flowkit", "testing", "envs.py")
RLLIB_PYTHON = "/work/venvs/rllib/bin/python"
MODES = {
    "sample": ["algo=random"],
    "ppo": ["algo=ppo", "ppo.num_epochs=1", "model.hidden_sizes=[8]"],
    "appo": ["algo=appo", "model.hidden_sizes=[8]"],
    "impala": ["algo=impala", "model.hidden_sizes=[8]"],
}


class DriverCpu:
    """A plugin recording after each iteration (env steps sampled, wall s, the driver's CPU s)."""

    def __init__(self) -> None:
        self.rows: list = []

    def flowkit_on_train_result(self, result, ctx):
        t = os.times()
        self.rows.append((result["env_steps_sampled"], result["time_total_s"], t.user + t.system))


def overrides(mode: str, n: int, a: argparse.Namespace, run_dir: str) -> list:
    cpus = os.cpu_count() or 1
    per_round = n * a.envs * a.fragment
    batch = {"ppo": [f"ppo.train_batch_size={per_round}", f"ppo.minibatch_size={per_round}"],
             "appo": [f"appo.train_batch_size={a.envs * a.fragment}"],
             "impala": [f"impala.train_batch_size={a.envs * a.fragment}"]}.get(mode, [])
    return [*MODES[mode], *batch, "env=flowkit.testing.envs:Sleep-v0", f"env.kwargs.step_s={a.step_ms / 1000}",
            f"env.kwargs.obs={a.obs}", "runtime.backend=ray", f"runtime.num_workers={n}",
            f"runtime.num_cpus_per_worker={min(1.0, cpus / n):g}", f"runtime.num_envs_per_worker={a.envs}",
            f"runtime.rollout_fragment_length={a.fragment}", f"stop.time_s={a.time_s}", "run.min_iter_time_s=1",
            f"run.dir={run_dir}", "run.reporters=[csv]", "seed=0"]


def one(mode: str, n: int, a: argparse.Namespace) -> dict:
    """One run in this process: the steady rate and the driver's CPU per 1,000 env steps."""
    import shutil

    import flowkit
    run_dir = tempfile.mkdtemp(prefix=f"flowkit-scaling-{mode}-{n}-")
    cpu = DriverCpu()
    try:
        flowkit.train(overrides(mode, n, a, run_dir), plugins=[cpu], verbose=False)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return {"mode": mode, "workers": n, "optimum": n * a.envs / (a.step_ms / 1000), "iterations": len(cpu.rows),
            **steady(cpu.rows)}


def worker_cpu(mode: str, a: argparse.Namespace) -> dict:
    """CPU per vector step of one rollout worker in this process (``time.process_time``): the
    worker a Ray actor would build (the remote policy specs: numpy acting), on the local backend,
    ``sample()`` called ``--repeats`` times after 20 warm-up calls; the median call's CPU
    divided by the fragment length, in us (with ``--step-ms 0``, the sleep's system call aside)."""
    import dataclasses
    import time

    from flowkit.core.workers import RolloutWorker
    from flowkit.engine import load_config, setup
    pm, cfg = load_config([o for o in overrides(mode, 1, a, tempfile.gettempdir())
                           if not o.startswith(("runtime.backend", "run."))] + ["runtime.backend=local"])
    ctx = setup(cfg, pm)
    specs = {pid: dataclasses.replace(s, policy_class=c) if (c := ctx.policies[pid].worker_policy_class()) else s
             for pid, s in ctx.policy_specs.items()}  # as a Ray worker's (setup's remote specs)
    w = RolloutWorker(cfg, 0, 1, specs, pm=pm)
    w.set_weights(ctx.get_weights(None), 1)
    cpu = []
    for _ in range(20 + a.repeats):
        t0 = time.process_time()
        w.sample()
        cpu.append(time.process_time() - t0)
    return {"mode": mode, "us_per_vector_step": 1e6 * statistics.median(cpu[20:]) / a.fragment,
            "q1_q3": [1e6 * q / a.fragment for q in statistics.quantiles(cpu[20:], n=4)[::2]]}


def ray_call_cpu(a: argparse.Namespace) -> dict:
    """Ray's own CPU per sample call in a worker, measured alone: one actor (0.1 CPU) answers
    ``--repeats`` x 15 calls one after another that return nothing, then as many that return a
    PPO fragment of the ``--envs`` x ``--fragment`` Sleep-v0 rows (sampled once, here); the
    actor process's CPU (``/proc``) per call, in us."""
    import ray

    from flowkit.core.workers import RolloutWorker
    from flowkit.engine import load_config, setup
    pm, cfg = load_config([o for o in overrides("ppo", 1, a, tempfile.gettempdir())
                           if not o.startswith(("runtime.backend", "run."))] + ["runtime.backend=local"])
    frag = RolloutWorker(cfg, 0, 1, setup(cfg, pm).policy_specs, pm=pm).sample()

    @ray.remote(num_cpus=0.1)
    class Answer:
        def pid(self):
            return os.getpid()

        def none(self):
            return None

        def fragment(self, b=frag):
            return b

    def cpu(pid: int) -> float:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    actor, out, n = Answer.remote(), {}, 15 * a.repeats
    pid = ray.get(actor.pid.remote())
    for name in ("none", "fragment"):
        ray.get([getattr(actor, name).remote() for _ in range(50)])
        c0 = cpu(pid)
        for _ in range(n):
            ray.get(getattr(actor, name).remote())
        out[f"{name}_us_per_call"] = 1e6 * (cpu(pid) - c0) / n
    ray.shutdown()
    return out


def sleep_env_creator(ctx):
    """RLlib's env creator: flowkit's Sleep-v0 (its module loaded from this checkout by path:
    RLlib's virtualenv does not install flowkit), a :class:`SleepVectorEnv` when RLlib asks for
    ``num_envs`` (its vector entry point), else one :class:`SleepEnv`."""
    import importlib.util
    mod = sys.modules.get("flowkit_sleep_envs")
    if mod is None:
        spec = importlib.util.spec_from_file_location("flowkit_sleep_envs", ENVS_PY)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["flowkit_sleep_envs"] = mod  # (its dataclasses look their module up)
        spec.loader.exec_module(mod)
    kw = {"step_s": ctx["step_s"], "obs": ctx["obs"]}
    return mod.SleepVectorEnv(num_envs=ctx["num_envs"], **kw) if "num_envs" in ctx else mod.SleepEnv(**kw)


def rllib_one(mode: str, n: int, a: argparse.Namespace) -> dict:
    """One RLlib run in this process (RLlib's virtualenv), as :func:`one` measures flowkit's."""
    import time

    import ray
    from ray.tune.registry import register_env
    # address="local": a session of its own, even where another one's address is on record
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             logging_level="error")
    register_env("flowkit-sleep", sleep_env_creator)
    from ray.rllib.algorithms.appo import APPOConfig
    from ray.rllib.algorithms.impala import IMPALAConfig
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    cpus = os.cpu_count() or 1
    per_round = n * a.envs * a.fragment
    cfg = ({"ppo": PPOConfig, "appo": APPOConfig, "impala": IMPALAConfig}[mode]()
           .environment("flowkit-sleep", env_config={"step_s": a.step_ms / 1000, "obs": a.obs})
           .env_runners(num_env_runners=n, num_envs_per_env_runner=a.envs, rollout_fragment_length=a.fragment,
                        num_cpus_per_env_runner=min(1.0, cpus / n), gym_env_vectorize_mode="vector_entry_point",
                        **({} if mode == "ppo" else {"use_env_runner_state_server": False}))
           .learners(num_learners=0).rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[8]))
           .reporting(min_time_s_per_iteration=1).debugging(seed=0))
    cfg = (cfg.training(train_batch_size_per_learner=per_round, minibatch_size=per_round, num_epochs=1)
           if mode == "ppo" else cfg.training(train_batch_size_per_learner=a.envs * a.fragment))
    algo = cfg.build_algo()
    rows, t0 = [], time.perf_counter()
    # --time-s, and at least 3 iterations (the rate is taken from the second on): an RLlib PPO
    # round of 16-32 workers can take longer than a short window on a loaded machine
    while time.perf_counter() - t0 < a.time_s or (len(rows) < 3 and time.perf_counter() - t0 < 10 * a.time_s):
        r = algo.train()
        c = os.times()
        rows.append((r.get("num_env_steps_sampled_lifetime") or 0, time.perf_counter() - t0, c.user + c.system))
    algo.stop()
    ray.shutdown()
    return {"mode": f"rllib-{mode}", "workers": n, "optimum": n * a.envs / (a.step_ms / 1000), "iterations": len(rows),
            **steady(rows)}


def steady(rows: list) -> dict:
    """The rate (env steps/s) and the driver's CPU s per 1,000 env steps between the second and
    the last of ``rows`` = [(env steps, wall s, driver CPU s)] (start-up left out)."""
    rows = rows[1:] if len(rows) > 2 else rows
    if len(rows) < 2 or rows[-1][0] <= rows[0][0]:
        return {"rate": float("nan") if len(rows) < 2 else 0.0, "driver_cpu_s_per_1k": float("nan")}
    steps = rows[-1][0] - rows[0][0]
    return {"rate": steps / max(rows[-1][1] - rows[0][1], 1e-9),
            "driver_cpu_s_per_1k": 1000 * (rows[-1][2] - rows[0][2]) / steps}


def measure(mode: str, n: int, a: argparse.Namespace, rllib: bool = False) -> dict:
    """:func:`one` (``rllib``: :func:`rllib_one` with RLlib's python) in a child process: a
    fresh Ray session per point."""
    python, flag = (a.rllib_python, "--rllib-one") if rllib else (sys.executable, "--one")
    cmd = [python, os.path.abspath(__file__), flag, mode, str(n), "--step-ms", str(a.step_ms), "--envs", str(a.envs),
           "--fragment", str(a.fragment), "--time-s", str(a.time_s), "--obs", a.obs]
    name = f"rllib-{mode}" if rllib else mode
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, RAY_DEDUP_LOGS="0"),
                           timeout=a.time_s * 2 + 600)
    except subprocess.TimeoutExpired:
        p = subprocess.CompletedProcess(cmd, -9, "", "timed out")
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"mode": name, "workers": n, "rate": float("nan"), "optimum": n * a.envs / (a.step_ms / 1000),
            "driver_cpu_s_per_1k": float("nan"), "error": f"exit {p.returncode}: {tail[:300]}"}


def median_run(runs: list) -> dict:
    """The run of median rate among ``runs`` (failed ones only when all failed), with every
    run's rate (``each``)."""
    ok = [r for r in runs if "error" not in r] or runs
    r = dict(sorted(ok, key=lambda x: x["rate"])[len(ok) // 2])
    r["each"] = [x["rate"] for x in runs]
    return r


def table(results: list, a: argparse.Namespace) -> str:
    rllib = {(r["mode"], r["workers"]): r["rate"] for r in results if r["mode"].startswith("rllib-")}
    lines = [f"Sleep-v0 ({a.obs} observations), {a.step_ms:g} ms per vector step, {a.envs} sub-envs per worker, "
             f"fragments of {a.fragment}, {a.time_s:g} s per run, median of {a.repeats}; "
             f"{os.cpu_count()} CPUs (load: the 1-minute load average after the point's last run)", "",
             "| mode | workers | env steps/s | optimum | ratio | driver CPU s per 1k env steps | vs RLlib | load |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        note = f" ({r['error']})" if "error" in r else ""
        theirs = rllib.get((f"rllib-{r['mode']}", r["workers"]))
        vs = ("-" if theirs is None or theirs != theirs else  # no RLlib point, or it failed (nan)
              f"{r['rate'] / theirs:.2f}x" if theirs > 0 else "RLlib sampled 0")
        lines.append(f"| {r['mode']} | {r['workers']} | {r['rate']:,.0f} | {r['optimum']:,.0f} | "
                     f"{r['rate'] / r['optimum']:.2f} | {r['driver_cpu_s_per_1k']:.3f}{note} | {vs} "
                     f"| {r.get('load', float('nan')):.1f} |")
    return "\n".join(lines)


def plot(results: list, path: str, a: argparse.Namespace) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    ns = sorted({r["workers"] for r in results})
    ax.plot(ns, [n * a.envs / (a.step_ms / 1000) for n in ns], "k--", label="optimum")
    for mode in dict.fromkeys(r["mode"] for r in results):
        mine = [r for r in results if r["mode"] == mode]
        ax.plot([r["workers"] for r in mine], [r["rate"] for r in mine], "s--" if mode.startswith("rllib-") else "o-",
                label=mode)
    ax.set(xscale="log", yscale="log", xlabel="rollout workers", ylabel="env steps/s",
           title=f"Sleep-v0, {a.step_ms:g} ms/step, {a.envs} sub-envs/worker, {os.cpu_count()} CPUs")
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.minorticks_off()
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--workers", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--step-ms", type=float, default=2.0, help="sleep per vector step (ms)")
    ap.add_argument("--envs", type=int, default=8, help="sub-envs per worker (one sleep for all)")
    ap.add_argument("--fragment", type=int, default=50, help="rollout_fragment_length (env steps per sub-env)")
    ap.add_argument("--obs", default="vector", choices=("vector", "image"))
    ap.add_argument("--time-s", type=float, default=20.0)
    ap.add_argument("--repeats", type=int, default=1, help="runs per point (the median is shown)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=os.path.join(HERE, "results", "scaling.png"))
    ap.add_argument("--rllib", action="store_true", help="also RLlib's PPO / APPO / IMPALA, alternating")
    ap.add_argument("--rllib-python", default=RLLIB_PYTHON, help="the python of RLlib's virtualenv")
    ap.add_argument("--one", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)
    ap.add_argument("--rllib-one", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)
    ap.add_argument("--worker-cpu", action="store_true", help="CPU per vector step of one in-process worker per mode")
    ap.add_argument("--ray-call-cpu", action="store_true", help="Ray's CPU per sample call in a worker, alone")
    a = ap.parse_args(argv)
    if a.ray_call_cpu:
        print(json.dumps(ray_call_cpu(a)), flush=True)
        return 0
    if a.worker_cpu:
        for mode in a.modes:
            print(json.dumps(worker_cpu(mode, a)), flush=True)
        return 0
    if a.one:
        print(json.dumps(one(a.one[0], int(a.one[1]), a)), flush=True)
        return 0
    if a.rllib_one:
        print(json.dumps(rllib_one(a.rllib_one[0], int(a.rllib_one[1]), a)), flush=True)
        return 0
    if a.rllib and not os.path.exists(a.rllib_python):
        ap.error(f"--rllib: no python at --rllib-python={a.rllib_python} (the recipe is in this script's docstring)")
    results = []
    for mode in a.modes:
        for n in a.workers:
            sides = [False] + ([True] if a.rllib and mode != "sample" else [])
            runs: dict = {side: [] for side in sides}
            for _ in range(a.repeats):  # alternating: flowkit, RLlib, flowkit, RLlib, ...
                for side in sides:
                    runs[side].append(dict(measure(mode, n, a, side), load=os.getloadavg()[0]))
            for side in sides:
                r = median_run(runs[side])
                results.append(r)
                print(f"  {r['mode']:>12} x {n:>2} workers: {r['rate']:,.0f} env steps/s of {r['optimum']:,.0f} "
                      f"({r['rate'] / r['optimum']:.2f}), driver {r['driver_cpu_s_per_1k']:.3f} CPU s per 1k, "
                      f"load {r['load']:.1f}{' ' + r.get('error', '') if 'error' in r else ''}", flush=True)
            save(results, a)
    print("\n" + table(results, a))
    if a.plot:
        print(f"plot: {a.plot}")
    return 0


def save(results: list, a: argparse.Namespace) -> None:
    """The JSON (``--json``) and the plot (``--plot``) of the points so far (written after each
    point: a sweep stopped early keeps what it measured)."""
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"settings": vars(a), "results": results, "median_of": a.repeats,
                       "ratio_median": statistics.median(r["rate"] / r["optimum"] for r in results)}, f, indent=1)
    if a.plot:
        plot(results, a.plot, a)


if __name__ == "__main__":
    sys.exit(main())
