"""Offline RL acceptance figures (issue 26), not run in CI:

1. an expert: PPO with the tuned configs/ppo/CartPole-v1.yaml (seed 0, local backend);
2. ``flowkit record`` 50,000 greedy transitions of it; BC on them (greedy mean over 50 episodes);
3. mixed datasets of 50,000 transitions: greedy expert ones (half, and a tenth: ``--mix``) and
   the rest from a uniformly random policy (``explore=random``, ``append=true``); BC and MARWIL
   on each, seeds 0-2;
4. (``--parts pendulum``) a partly trained SAC on Pendulum-v1 (configs/sac/Pendulum-v1.yaml
   stopped at 2,500 env steps), 100,000 of its sampled transitions recorded
   (:func:`make_pendulum_dataset`, at the ``input.dataset`` of configs/cql_sac/Pendulum-v1.yaml);
   CQL on SAC with that tuned config and BC (1,000,000 rows, the same 64x64 ReLU network) on it,
   seeds 0-2.

Every offline run is evaluated greedily over 50 episodes reset with seeds 1000-1049.

Usage: python bench/offline_acceptance.py [--parts cartpole pendulum] [--out DIR] [--seeds 0 1 2]
       [--rows 200000] [--mix 0.5 0.1]
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

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PENDULUM_CQL = os.path.join(HERE, "configs", "cql_sac", "Pendulum-v1.yaml")


def make_pendulum_dataset(path: str, out: str = "runs/offline-acceptance") -> dict:
    """The Pendulum dataset of configs/cql_sac/Pendulum-v1.yaml at ``path``: SAC with its tuned
    config stopped at 2,500 env steps (seed 0), then 100,000 of its sampled transitions
    (``flowkit record ... steps=100000 explore=sample seed=0``)."""
    sac = os.path.join(out, "sac-partial-2500")
    if not os.path.exists(os.path.join(sac, "result.json")):
        flowkit.train(["seed=0", "stop.env_steps=2500", "run.min_iter_env_steps=500", f"run.dir={sac}",
                       "run.reporters=[csv,checkpoint]", "evaluation.final=false"],
                      config_file=os.path.join(HERE, "configs", "sac", "Pendulum-v1.yaml"), verbose=False)
    ev = evaluate(sac, episodes=50, seed=1000)
    r = record(sac, steps=100_000, explore="sample", seed=0, out=path)
    print(f"partly trained SAC (2,500 env steps, seed 0): greedy mean {ev['episode_return_mean']:.1f} over 50 "
          f"episodes; recorded {path}: {r['episodes']} episodes, sampled actions, return mean "
          f"{r['return_mean']:.1f} over its {len(r['returns'])} whole episodes", flush=True)
    return r


DATASETS = {"pendulum-sac-partial-100k-v0": make_pendulum_dataset}  # what bench/tuned_configs.py can make


def offline_run(out: str, algo: str, dataset: str, seed: int, rows: int, extra=(), env: str = "CartPole-v1",
                config_file=None) -> float:
    t = time.perf_counter()
    res = flowkit.train([f"algo={algo}", f"env={env}", f"input.dataset={dataset}", f"seed={seed}",
                         "runtime.backend=local", f"stop.env_steps={rows}", "evaluation.interval=0",
                         "evaluation.final=false", f"run.dir={out}", "run.reporters=[csv,checkpoint]", *extra],
                        config_file=config_file, verbose=False)
    ev = evaluate(res.run_dir, episodes=50, seed=1000)
    print(f"{algo} seed {seed} on {os.path.basename(dataset)}: greedy mean {ev['episode_return_mean']:.1f} "
          f"(std {ev['episode_return_std']:.1f}) over 50 episodes; {rows} rows in {time.perf_counter() - t:.1f} s",
          flush=True)
    return float(ev["episode_return_mean"])


def pendulum(a, rows: list) -> None:
    from omegaconf import OmegaConf
    cfg = OmegaConf.load(PENDULUM_CQL)
    path = str(cfg.input.dataset)
    if not os.path.exists(path):
        make_pendulum_dataset(path, a.out)
    for seed in a.seeds:
        rows.append(("cql_sac", "pendulum-100k", seed, offline_run(
            os.path.join(a.out, f"cql_sac-pendulum-{seed}"), "cql_sac", path, seed, int(cfg.stop.env_steps),
            env="Pendulum-v1", config_file=PENDULUM_CQL)))
        rows.append(("bc", "pendulum-100k", seed, offline_run(
            os.path.join(a.out, f"bc-pendulum-{seed}"), "bc", path, seed, 1_000_000, env="Pendulum-v1",
            extra=("model.hidden_sizes=[64,64]", "model.activation=relu"))))


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--parts", nargs="+", choices=("cartpole", "pendulum"), default=["cartpole", "pendulum"])
    p.add_argument("--out", default="runs/offline-acceptance")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rows", type=int, default=200_000, help="dataset rows trained on per offline run")
    p.add_argument("--mix", type=float, nargs="+", default=[0.5, 0.1],
                   help="expert shares of the mixed datasets (the rest: random actions)")
    p.add_argument("--no-expert", action="store_true", help="skip BC on the expert-only dataset")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    rows: list = []
    if "cartpole" in a.parts:
        cartpole(a, rows)
    if "pendulum" in a.parts:
        pendulum(a, rows)
    print("\nalgo     dataset         seed  greedy mean (50 episodes)")
    for algo, ds, seed, r in rows:
        print(f"{algo:<8} {ds:<15} {seed:>4}  {r:.1f}")
    return 0


def cartpole(a, rows: list) -> None:
    expert = os.path.join(a.out, "ppo-expert")
    if not os.path.exists(os.path.join(expert, "result.json")):
        flowkit.train(["seed=0", "runtime.backend=local", f"run.dir={expert}", "run.reporters=[csv,checkpoint]"],
                      config_file=os.path.join(HERE, "configs/ppo/CartPole-v1.yaml"), verbose=False)
    ev = evaluate(expert, episodes=50, seed=1000)
    print(f"expert (PPO, tuned config, seed 0): greedy mean {ev['episode_return_mean']:.1f} over 50 episodes",
          flush=True)
    d_exp = os.path.join(a.out, "expert-50k-v0")
    if not os.path.exists(d_exp):
        r = record(expert, steps=50_000, out=d_exp)
        print(f"recorded {d_exp}: {r['episodes']} episodes, return mean {r['return_mean']:.1f}", flush=True)
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


if __name__ == "__main__":
    sys.exit(main())
