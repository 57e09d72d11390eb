"""Online and offline together (issue 26): the loop "train, record with run.output, train with the
dataset mixed in", not run in CI.

1. DQN with the tuned configs/dqn/CartPole-v1.yaml, seed 0, ``run.output=DIR/dqn-seed0-v0``:
   the dataset is that run's whole training experience (epsilon-greedy, from random play to
   greedy 450), written while it trains;
2. DQN with the same config on other seeds, with ``input.dataset`` = that dataset and
   ``input.mix=0.5`` (half of every replayed batch from it, RLPD's symmetric sampling), and
   without it: env steps until the first greedy evaluation (20 episodes, every 5 iterations of
   >= 1,000 env steps) reaches 450 (the config's stop), and that evaluation's mean;
   ``--data expert`` mixes in 50,000 greedy transitions of that trained seed-0 policy instead
   (``flowkit record``, as bench/offline_acceptance.py records its expert);
3. (``--offline``) CQL on DQN from the run.output dataset alone (no env steps), greedy mean
   over 50 episodes.

The local backend is deterministic: the online-only figures are those of the tuned config
(seeds 0-2: 61,440, 66,560, 51,200 env steps; the seed-0 run with run.output gives the same).

Usage: python bench/offline_mix.py [--out DIR] [--seeds 1 2] [--data run|expert] [--skip-baseline] [--offline]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

import flowkit
from flowkit.datasets import open_dataset, record

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DQN = os.path.join(HERE, "configs", "dqn", "CartPole-v1.yaml")


def dqn(run_dir: str, seed: int, extra=()) -> dict:
    shutil.rmtree(run_dir, ignore_errors=True)
    t = time.perf_counter()
    res = flowkit.train([f"seed={seed}", f"run.dir={run_dir}", "run.reporters=[csv,checkpoint,evaluation]", *extra],
                        config_file=DQN, verbose=False)
    m = res.metrics
    return {"env_steps": m["env_steps_sampled"], "eval": m.get("evaluation_return_mean", float("nan")),
            "stop": res.stop_reason, "seconds": time.perf_counter() - t,
            "dataset_rows": m.get("dataset_rows_replayed", 0), "trained": m["env_steps_trained"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/offline-mix")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--skip-baseline", action="store_true")
    p.add_argument("--offline", action="store_true")
    p.add_argument("--data", choices=("run", "expert"), default="run")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    data = os.path.join(a.out, "dqn-seed0-v0")
    if not os.path.exists(os.path.join(data, "data", "metadata.json")):
        r = dqn(os.path.join(a.out, "dqn-seed0"), 0, [f"run.output={data}"])
        print(f"DQN seed 0 with run.output: {r['stop']} at {r['env_steps']} env steps (greedy {r['eval']:.1f}), "
              f"{r['seconds']:.0f} s", flush=True)
    ds = open_dataset(data)
    print(f"dataset {data}: {ds.total_episodes} episodes, {ds.total_steps} transitions", flush=True)
    run_data = data
    if a.data == "expert":
        data = os.path.join(a.out, "dqn-seed0-greedy-50k-v0")
        if not os.path.exists(os.path.join(data, "data", "metadata.json")):
            r = record(os.path.join(a.out, "dqn-seed0"), steps=50_000, explore="greedy", seed=0, out=data)
            print(f"recorded {data}: {r['episodes']} episodes, return mean {r['return_mean']:.1f}", flush=True)
    rows = []
    for seed in a.seeds:
        for mode in ("mix 0.5", "online only"):
            if mode == "online only" and a.skip_baseline:
                continue
            extra = [f"input.dataset={data}", "input.mix=0.5"] if mode != "online only" else []
            r = dqn(os.path.join(a.out, f"dqn-seed{seed}-{mode.replace(' ', '')}-{a.data}"), seed, extra)
            rows.append((mode, seed, r))
            print(f"{mode:12s} seed {seed}: {r['stop']} at {r['env_steps']} env steps (greedy {r['eval']:.1f}; "
                  f"{r['dataset_rows']} of {r['trained']} rows trained from the dataset), {r['seconds']:.0f} s", flush=True)
    if a.offline:
        run = os.path.join(a.out, "cql-dqn")
        shutil.rmtree(run, ignore_errors=True)
        res = flowkit.train(["algo=cql_dqn", "env=CartPole-v1", f"input.dataset={run_data}", "seed=0",
                             "cql_dqn.target_network_update_freq=100", "cql_dqn.n_step=3", "stop.env_steps=500000",
                             "runtime.backend=local", f"run.dir={run}", "run.reporters=[csv,checkpoint]"], verbose=False)
        ev = flowkit.evaluation.evaluate(res.run_dir, episodes=50, seed=1000)
        print(f"cql_dqn on {run_data} alone (500,000 rows): greedy mean {ev['episode_return_mean']:.1f} over 50 episodes",
              flush=True)
    print("\nmode          seed  env steps to greedy >= 450  evaluation mean")
    for mode, seed, r in rows:
        print(f"{mode:12s}  {seed:4d}  {r['env_steps']:26d}  {r['eval']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
