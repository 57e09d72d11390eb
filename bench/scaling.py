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

Columns: workers, env steps/s, the optimum, their ratio, and the driver's CPU seconds per 1,000
env steps (its own process: the plan, the learner thread in the async modes, reporting), the
figure that tells where the driver saturates (1,000 / that = the most env steps/s one driver
core can take). Writes the table as JSON (``--json``) and a plot (``--plot``, PNG).

    python bench/scaling.py                                       # every mode, 1..32 workers
    python bench/scaling.py --modes sample --workers 1 2 4 --time-s 10   # a quick look
    python bench/scaling.py --obs image                           # Atari-sized uint8 frames
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
MODES = {
    "sample": ["algo=random"],
    "ppo": ["algo=ppo", "ppo.num_epochs=1", "model.hidden_sizes=[8]"],
    "appo": ["algo=appo", "model.hidden_sizes=[8]"],
    "impala": ["algo=impala", "model.hidden_sizes=[8]"],
}


class DriverCpu:
    """A plugin recording after each iteration (env steps sampled, the driver's CPU seconds)."""

    def __init__(self) -> None:
        self.rows: list = []

    def flowkit_on_train_result(self, result, ctx):
        t = os.times()
        self.rows.append((result["env_steps_sampled"], t.user + t.system))


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
    import flowkit
    from flowkit.engine import read_metrics
    run_dir = tempfile.mkdtemp(prefix=f"flowkit-scaling-{mode}-{n}-")
    cpu = DriverCpu()
    flowkit.train(overrides(mode, n, a, run_dir), plugins=[cpu], verbose=False)
    rows = read_metrics(os.path.join(run_dir, "metrics.csv"))
    rows = rows[1:] if len(rows) > 2 else rows
    rate = ((rows[-1]["env_steps_sampled"] - rows[0]["env_steps_sampled"])
            / max(rows[-1]["time_total_s"] - rows[0]["time_total_s"], 1e-9)) if len(rows) >= 2 else float("nan")
    c = cpu.rows[1:] if len(cpu.rows) > 2 else cpu.rows
    per_k = 1000 * (c[-1][1] - c[0][1]) / max(c[-1][0] - c[0][0], 1) if len(c) >= 2 else float("nan")
    return {"mode": mode, "workers": n, "rate": rate, "optimum": n * a.envs / (a.step_ms / 1000),
            "driver_cpu_s_per_1k": per_k, "iterations": len(rows)}


def measure(mode: str, n: int, a: argparse.Namespace) -> dict:
    """:func:`one` in a child process (a fresh Ray session per point)."""
    cmd = [sys.executable, __file__, "--one", mode, str(n), "--step-ms", str(a.step_ms), "--envs", str(a.envs),
           "--fragment", str(a.fragment), "--time-s", str(a.time_s), "--obs", a.obs]
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, RAY_DEDUP_LOGS="0"),
                       timeout=a.time_s * 2 + 600)
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"mode": mode, "workers": n, "rate": float("nan"), "optimum": n * a.envs / (a.step_ms / 1000),
            "driver_cpu_s_per_1k": float("nan"), "error": f"exit {p.returncode}: {tail[:300]}"}


def table(results: list, a: argparse.Namespace) -> str:
    lines = [f"Sleep-v0 ({a.obs} observations), {a.step_ms:g} ms per vector step, {a.envs} sub-envs per worker, "
             f"fragments of {a.fragment}, {a.time_s:g} s per run, median of {a.repeats}; "
             f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", "",
             "| mode | workers | env steps/s | optimum | ratio | driver CPU s per 1k env steps |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        note = f" ({r['error']})" if "error" in r else ""
        lines.append(f"| {r['mode']} | {r['workers']} | {r['rate']:,.0f} | {r['optimum']:,.0f} | "
                     f"{r['rate'] / r['optimum']:.2f} | {r['driver_cpu_s_per_1k']:.3f}{note} |")
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
        ax.plot([r["workers"] for r in mine], [r["rate"] for r in mine], "o-", label=mode)
    ax.set(xscale="log", yscale="log", xlabel="rollout workers", ylabel="env steps/s",
           title=f"Sleep-v0, {a.step_ms:g} ms/step, {a.envs} sub-envs/worker, {os.cpu_count()} CPUs")
    ax.set_xticks(ns, [str(n) for n in ns])
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
    ap.add_argument("--one", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(one(a.one[0], int(a.one[1]), a)), flush=True)
        return 0
    results = []
    for mode in a.modes:
        for n in a.workers:
            runs = [measure(mode, n, a) for _ in range(a.repeats)]
            ok = [r for r in runs if "error" not in r] or runs
            r = sorted(ok, key=lambda x: x["rate"])[len(ok) // 2]
            r["each"] = [x["rate"] for x in runs]
            results.append(r)
            print(f"  {mode:>6} x {n:>2} workers: {r['rate']:,.0f} env steps/s of {r['optimum']:,.0f} "
                  f"({r['rate'] / r['optimum']:.2f}){' ' + r.get('error', '') if 'error' in r else ''}", flush=True)
    text = table(results, a)
    print("\n" + text)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"settings": vars(a), "results": results, "median_of": a.repeats,
                       "load": os.getloadavg()[0], "ratio_median": statistics.median(
                           r["rate"] / r["optimum"] for r in results)}, f, indent=1)
    if a.plot:
        plot(results, a.plot, a)
        print(f"plot: {a.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
