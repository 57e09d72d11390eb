"""Offline RL acceptance figures (issue 26), not run in CI:

1. an expert: PPO with the tuned configs/ppo/CartPole-v1.yaml (seed 0, local backend);
2. ``flowkit record`` 50,000 greedy transitions of it; BC on them (greedy mean over 50 episodes);
3. mixed datasets of 50,000 transitions: greedy expert ones (half, and a tenth: ``--mix``) and
   the rest from a uniformly random policy (``explore=random``, ``append=true``); BC and MARWIL
   on each, seeds 0-2.

Usage: python bench/offline_acceptance.py [--out DIR] [--seeds 0 1 2] [--rows 200000] [--mix 0.5 0.1]
Prints one line per figure and a summary table at the end.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import flowkit
from flowkit.datasets import record
from flowkit.evaluation import evaluate


def offline_run(out: str, algo: str, dataset: str, seed: int, rows: int, extra=()) -> float:
    t = time.perf_counter()
    res = flowkit.train([f"algo={algo}", "env=CartPole-v1", f"input.dataset={dataset}", f"seed={seed}",
                         "runtime.backend=local", f"stop.env_steps={rows}", "evaluation.interval=0",
                         f"run.dir={out}", "run.reporters=[csv,checkpoint]", *extra], verbose=False)
    ev = evaluate(res.run_dir, episodes=50, seed=1000)
    print(f"{algo} seed {seed} on {os.path.basename(dataset)}: greedy mean {ev['episode_return_mean']:.1f} "
          f"(std {ev['episode_return_std']:.1f}) over 50 episodes; {rows} rows in {time.perf_counter() - t:.1f} s",
          flush=True)
    return float(ev["episode_return_mean"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="runs/offline-acceptance")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rows", type=int, default=200_000, help="dataset rows trained on per offline run")
    p.add_argument("--mix", type=float, nargs="+", default=[0.5, 0.1],
                   help="expert shares of the mixed datasets (the rest: random actions)")
    p.add_argument("--no-expert", action="store_true", help="skip BC on the expert-only dataset")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    expert = os.path.join(a.out, "ppo-expert")
    if not os.path.exists(os.path.join(expert, "result.json")):
        flowkit.train(["seed=0", "runtime.backend=local", f"run.dir={expert}", "run.reporters=[csv,checkpoint]"],
                      config_file=os.path.join(here, "configs/ppo/CartPole-v1.yaml"), verbose=False)
    ev = evaluate(expert, episodes=50, seed=1000)
    print(f"expert (PPO, tuned config, seed 0): greedy mean {ev['episode_return_mean']:.1f} over 50 episodes",
          flush=True)
    d_exp = os.path.join(a.out, "expert-50k-v0")
    if not os.path.exists(d_exp):
        r = record(expert, steps=50_000, out=d_exp)
        print(f"recorded {d_exp}: {r['episodes']} episodes, return mean {r['return_mean']:.1f}", flush=True)
    rows = []
    if not a.no_expert:
        rows.append(("bc", "expert-50k", 0, offline_run(os.path.join(a.out, "bc-expert-0"), "bc", d_exp, 0, a.rows)))
    for frac in a.mix:  # expert share of a 50k-transition dataset, the rest uniformly random
        n_exp = int(round(50_000 * frac))
        name = f"mixed{int(round(100 * frac))}-50k"
        d_mix = os.path.join(a.out, f"{name}-v0")
        if not os.path.exists(d_mix):
            r1 = record(expert, steps=n_exp, out=d_mix, seed=7)
            r2 = record(expert, steps=50_000 - n_exp, out=d_mix, seed=8, explore="random", append=True)
            print(f"recorded {d_mix}: {n_exp} expert steps (return mean {r1['return_mean']:.1f}), "
                  f"{50_000 - n_exp} random (return mean {r2['return_mean']:.1f}); {r2['episodes']} episodes",
                  flush=True)
        for seed in a.seeds:
            for algo in ("bc", "marwil"):
                rows.append((algo, name, seed, offline_run(os.path.join(a.out, f"{algo}-{name}-{seed}"), algo,
                                                           d_mix, seed, a.rows)))
    print("\nalgo    dataset         seed  greedy mean (50 episodes)")
    for algo, ds, seed, r in rows:
        print(f"{algo:<7} {ds:<15} {seed:>4}  {r:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
