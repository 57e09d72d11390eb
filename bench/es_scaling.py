"""ES throughput against its worker count: env steps/s with 2 Ray rollout workers against 1, on
the same config (ES's workers are independent: each evaluates its own antithetic pairs for a
round; the driver only ranks the returns and takes an Adam step).

Setting: CartPole-v1, ES with 8 pairs per worker per round and 1 unperturbed episode per worker
(configs/es/CartPole-v1.yaml's) and the default 64 x 64 MLP, on ``runtime.backend=ray``, one CPU
per worker; each run trains
from scratch for ``--time-s`` seconds; its rate is the steady state (env steps sampled per
second of training between the first and the last reported iteration, one iteration per second
at least: start-up left out). The worker counts alternate (1, 2, 1, 2, ...) ``--repeats`` times
in one process (one Ray session) and the median is shown.

Columns: workers, env steps/s (median and each repeat), the ratio to 1 worker; env steps per
CPU second of the rollout worker processes (together; read from /proc between the same two
iterations), a figure the machine's other load does not change: equal for 1 and 2 workers
means the workers do no extra work together, so on free cores 2 workers give 2x; the last
episode_return_mean of the median run.

    python bench/es_scaling.py                 # 3 x 30 s per worker count
    python bench/es_scaling.py --time-s 10 --repeats 1
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile

os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def steady_rate(rows) -> float:
    rows = rows[1:] if len(rows) > 2 else rows
    if len(rows) < 2:
        return float("nan")
    return (rows[-1]["env_steps_sampled"] - rows[0]["env_steps_sampled"]) / max(
        rows[-1]["time_total_s"] - rows[0]["time_total_s"], 1e-9)


class WorkerCpu:
    """A plugin recording, after each iteration, the CPU seconds of the rollout worker processes."""

    def __init__(self):
        self.pids, self.rows = None, []

    def flowkit_on_train_result(self, result, ctx):
        from flowkit.core.ops import process_cpu_s
        if self.pids is None:
            self.pids = ctx.workers.foreach_worker("get_pid")
        self.rows.append((result["env_steps_sampled"], sum(process_cpu_s(p) or 0.0 for p in self.pids)))


def run_es(workers: int, time_s: float, seed: int) -> dict:
    import flowkit
    from flowkit.engine import read_metrics
    run_dir = tempfile.mkdtemp(prefix="flowkit-bench-es-")
    cpu = WorkerCpu()
    flowkit.train(["algo=es", "env=CartPole-v1", f"seed={seed}", "runtime.backend=ray",
                   f"runtime.num_workers={workers}", "runtime.num_cpus_per_worker=1", "es.pairs_per_worker=8",
                   "es.eval_episodes=1", f"stop.time_s={time_s}", "run.min_iter_time_s=1", f"run.dir={run_dir}",
                   "run.reporters=[csv]"], plugins=[cpu], verbose=False)
    rows = read_metrics(os.path.join(run_dir, "metrics.csv"))
    c = cpu.rows[1:] if len(cpu.rows) > 2 else cpu.rows
    per_cpu = (c[-1][0] - c[0][0]) / max(c[-1][1] - c[0][1], 1e-9) if len(c) >= 2 else float("nan")
    return {"rate": steady_rate(rows), "per_cpu_s": per_cpu,
            "return": rows[-1]["episode_return_mean"] if rows else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-s", type=float, default=30.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    results: dict = {1: [], 2: []}
    for rep in range(args.repeats):
        for w in (1, 2):
            r = run_es(w, args.time_s, args.seed)
            results[w].append(r)
            print(f"  repeat {rep + 1}, {w} worker(s): {r['rate']:.0f} env steps/s, "
                  f"{r['per_cpu_s']:.0f} per worker CPU second", flush=True)
    med = {w: statistics.median(r["rate"] for r in rs) for w, rs in results.items()}
    print(f"\nES on CartPole-v1, Ray backend, {args.time_s:g} s per run, median of {args.repeats} (alternating)\n")
    print("| workers | env steps/s (median) | each repeat | vs 1 worker | env steps per worker CPU s (median) "
          "| last episode_return_mean |")
    print("|---|---|---|---|---|---|")
    for w, rs in results.items():
        mid = sorted(rs, key=lambda r: r["rate"])[len(rs) // 2]
        each = ", ".join(f"{r['rate']:.0f}" for r in rs)
        per_cpu = statistics.median(r["per_cpu_s"] for r in rs)
        print(f"| {w} | {med[w]:.0f} | {each} | {med[w] / med[1]:.2f}x | {per_cpu:.0f} | {mid['return']:.1f} |")
    print(f"\nload average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
