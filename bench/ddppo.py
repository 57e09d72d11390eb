"""DD-PPO's learner throughput against its worker count, and against PPO's central learner.

DD-PPO has no central learner: each worker learns on its own batch and the gradients are
all-reduced, so the learning capacity grows with the workers. Three runs, alternating
(``--repeats`` times, one Ray session, one torch thread per process):

- ``ddppo x1``: DD-PPO, 1 Ray worker (a world of 1: no all-reduce);
- ``ddppo x2``: DD-PPO, 2 Ray workers (gloo all-reduce before every Adam step);
- ``ppo x2``: PPO, 2 Ray workers sampling for one learner on the driver (``runtime.prefetch=false``:
  strictly on-policy as DD-PPO is).

Same config (CartPole-v1, 4 sub-envs x 64 steps per fragment, 64 x 64 MLP, 10 epochs): a DD-PPO
worker learns on 2 fragments (512 rows) in 4 minibatches of 128; PPO's learner on 1,024 rows
(both workers' 2 rounds) in 4 minibatches of 256, the rows of one all-reduced DD-PPO step. So
every run takes 40 gradient steps per round and ``ddppo x2`` and ``ppo x2`` train the same rows
per step.

Columns: learner throughput (env steps trained per second of learning: DD-PPO, a round's rows
over its slowest worker's learning time, all-reduce waits included; PPO, the learner's own
figure, ``perf/learner_throughput_env_steps_per_s``), median over a run's iterations after the
first, median over repeats; the ratio to ``ddppo x1``; env steps/s of the whole run (steady
state: between the first and the last iteration); the share of DD-PPO's learning time spent in
the all-reduce; the last episode_return_mean. On a 2-core machine 2 workers plus the driver
share 2 cores, and other jobs' load shows in every figure: the load average is printed.

    python bench/ddppo.py                          # 3 x 30 s per run
    python bench/ddppo.py --time-s 10 --repeats 1
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

os.environ.setdefault("RAY_DEDUP_LOGS", "0")

COMMON = ["env=CartPole-v1", "runtime.backend=ray", "runtime.num_cpus_per_worker=0.5", "runtime.torch_threads=1",
          "learner.num_threads=1", "runtime.num_envs_per_worker=4", "runtime.rollout_fragment_length=64",
          "run.reporters=[csv]", "run.min_iter_env_steps=0", "evaluation.interval=0"]
RUNS = {
    "ddppo x1": ["algo=ddppo", "runtime.num_workers=1", "ddppo.fragments_per_round=2", "ddppo.minibatch_size=128",
                 "ddppo.num_epochs=10"],
    "ddppo x2": ["algo=ddppo", "runtime.num_workers=2", "ddppo.fragments_per_round=2", "ddppo.minibatch_size=128",
                 "ddppo.num_epochs=10"],
    "ppo x2": ["algo=ppo", "runtime.num_workers=2", "runtime.prefetch=false", "ppo.train_batch_size=1024",
               "ppo.minibatch_size=256", "ppo.num_epochs=10"],
}


def run(name: str, time_s: float, seed: int) -> dict:
    import flowkit
    from flowkit.engine import read_metrics
    run_dir = tempfile.mkdtemp(prefix="flowkit-bench-ddppo-")
    flowkit.train([*COMMON, *RUNS[name], f"seed={seed}", f"stop.time_s={time_s}", f"run.dir={run_dir}"],
                  verbose=False)
    rows = read_metrics(os.path.join(run_dir, "metrics.csv"))
    later = rows[1:] if len(rows) > 2 else rows
    thr = [r["perf/learner_throughput_env_steps_per_s"] for r in later
           if r.get("perf/learner_throughput_env_steps_per_s") not in (None, "")]
    rate = float("nan")
    if len(later) >= 2:
        rate = (later[-1]["env_steps_sampled"] - later[0]["env_steps_sampled"]) / max(
            later[-1]["time_total_s"] - later[0]["time_total_s"], 1e-9)
    ar = [r["learner/default/allreduce_time_s"] / r["learner/default/learn_time_s"] for r in later
          if r.get("learner/default/learn_time_s")]
    return {"learner": statistics.median(thr) if thr else float("nan"), "rate": rate,
            "allreduce_frac": statistics.median(ar) if ar else float("nan"), "iterations": len(rows),
            "return": rows[-1]["episode_return_mean"] if rows else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-s", type=float, default=30.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    results: dict = {n: [] for n in RUNS}
    loads = []
    for rep in range(args.repeats):
        for name in RUNS:
            r = run(name, args.time_s, args.seed)
            loads.append(os.getloadavg()[0])
            results[name].append(r)
            print(f"  repeat {rep + 1}, {name}: learner {r['learner']:.0f} env steps/s, run {r['rate']:.0f} env "
                  f"steps/s, {r['iterations']} iterations, load {loads[-1]:.1f}", flush=True)
    med = {n: statistics.median(r["learner"] for r in rs) for n, rs in results.items()}
    print(f"\nCartPole-v1, Ray backend, {args.time_s:g} s per run, median of {args.repeats} (alternating)\n")
    print("| run | learner env steps/s (median) | each repeat | vs ddppo x1 | run env steps/s (median) "
          "| all-reduce share of learning | last episode_return_mean |")
    print("|---|---|---|---|---|---|---|")
    table = []
    for n, rs in results.items():
        each = ", ".join(f"{r['learner']:.0f}" for r in rs)
        rate = statistics.median(r["rate"] for r in rs)
        ar = statistics.median(r["allreduce_frac"] for r in rs)
        ret = statistics.median(r["return"] for r in rs)
        table.append({"run": n, "learner": med[n], "each": [r["learner"] for r in rs], "rate": rate,
                      "allreduce_frac": ar, "return": ret})
        ar_s = "-" if ar != ar else f"{100 * ar:.0f}%"
        print(f"| {n} | {med[n]:.0f} | {each} | {med[n] / med['ddppo x1']:.2f}x | {rate:.0f} | {ar_s} | {ret:.1f} |")
    print(f"\nload average during the runs: {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"time_s": args.time_s, "repeats": args.repeats, "loads": loads, "table": table}, f, indent=2)


if __name__ == "__main__":
    main()
