"""CQL against BC on greedy expert data (issue 48, item 16), not run in CI:

1. Pendulum-v1: an expert SAC (configs/sac/Pendulum-v1.yaml, seed 0, ``--sac-env-steps``
   8,000 env steps), ``flowkit record`` 40,000 of its greedy transitions; BC (64x64 ReLU, as
   the CQL config) and CQL on SAC (``-c configs/cql_sac/Pendulum-v1.yaml`` with the dataset
   swapped in, ``--pendulum-rows`` rows, ``--extra-cql`` overrides, which replace the
   defaults: 2,500 warm-start steps of BC at 1e-3, then the actor at 3e-5, fixed temperature
   0.05; 768,000 rows, 3,015 gradient steps: each pass over the dataset ends with a short batch;
   docs/offline.md) on it, seeds 0-2;
2. CartPole-v1: an expert PPO (configs/ppo/CartPole-v1.yaml, seed 0, local backend),
   ``flowkit record`` 50,000 of its greedy transitions; BC and CQL on DQN (the defaults and
   ``--extra-dqn``, ``--cartpole-rows`` rows) on it, seeds 0-2.

The experts run without the evaluation reporter (DQN's tuned config would train its whole
budget). Each offline run is evaluated greedily over 50 episodes reset with seeds 1000-1049
(bench/offline_acceptance.py's ``offline_run``). Acceptance: per env, CQL's median over the
seeds is no more than 10 % of |BC's median| below BC's median. Experts, datasets and finished
offline runs already under ``--out`` are reused (``--tag`` names the offline runs' folder).

Usage: python bench/cql_expert.py [--parts pendulum cartpole] [--out DIR] [--seeds 0 1 2]
       [--tag NAME] [--pendulum-rows N] [--cartpole-rows N] [--extra-cql KEY=VALUE ...]
       [--extra-dqn KEY=VALUE ...]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import flowkit
from flowkit.datasets import record
from flowkit.evaluation import evaluate

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import offline_acceptance  # noqa: E402  (bench/ is not a package)


def offline_run(out: str, *args, **kwargs) -> float:
    """bench/offline_acceptance.py's ``offline_run``; a run already finished at ``out`` is only
    evaluated again (greedy, 50 episodes, seeds 1000-1049)."""
    if os.path.exists(os.path.join(out, "result.json")):
        r = float(evaluate(out, episodes=50, seed=1000)["episode_return_mean"])
        print(f"{out}: reused, greedy mean {r:.1f} over 50 episodes", flush=True)
        return r
    return offline_acceptance.offline_run(out, *args, **kwargs)


def expert(out: str, config: str, overrides=()) -> str:
    """A tuned config trained on seed 0 into ``out`` (reused when it has finished there)."""
    if not os.path.exists(os.path.join(out, "result.json")):
        flowkit.train(["seed=0", f"run.dir={out}", "run.reporters=[csv,checkpoint]", *overrides],
                      config_file=os.path.join(REPO, "configs", config), verbose=False)
    ev = evaluate(out, episodes=50, seed=1000)
    print(f"expert {config} seed 0: greedy mean {ev['episode_return_mean']:.1f} over 50 episodes", flush=True)
    return out


def greedy_dataset(run: str, path: str, steps: int) -> str:
    """``flowkit record RUN steps=N`` (greedy, seed 0) at ``path`` (reused when there)."""
    if not os.path.exists(path):
        r = record(run, steps=steps, seed=0, out=path)
        print(f"recorded {path}: {r['episodes']} episodes, {steps} greedy steps, return mean "
              f"{r['return_mean']:.1f}", flush=True)
    return path


def pendulum(a, rows: list) -> None:
    sac = expert(os.path.join(a.out, "sac-expert"), "sac/Pendulum-v1.yaml", [f"stop.env_steps={a.sac_env_steps}"])
    data = greedy_dataset(sac, os.path.join(a.out, "pendulum-sac-greedy-40k-v0"), 40_000)
    config = os.path.join(REPO, "configs", "cql_sac", "Pendulum-v1.yaml")
    for seed in a.seeds:
        rows.append(("Pendulum-v1", "bc", seed, offline_run(
            os.path.join(a.out, a.tag, f"bc-pendulum-{seed}"), "bc", data, seed, a.bc_rows, env="Pendulum-v1",
            extra=("model.hidden_sizes=[64,64]", "model.activation=relu"))))
        rows.append(("Pendulum-v1", "cql_sac", seed, offline_run(
            os.path.join(a.out, a.tag, f"cql_sac-pendulum-{seed}"), "cql_sac", data, seed, a.pendulum_rows,
            env="Pendulum-v1", config_file=config,
            extra=(f"run.min_iter_env_steps={a.pendulum_rows // 4}", *a.extra_cql))))


def cartpole(a, rows: list) -> None:
    ppo = expert(os.path.join(a.out, "ppo-expert"), "ppo/CartPole-v1.yaml", ["runtime.backend=local"])
    data = greedy_dataset(ppo, os.path.join(a.out, "cartpole-ppo-greedy-50k-v0"), 50_000)
    for seed in a.seeds:
        rows.append(("CartPole-v1", "bc", seed, offline_run(os.path.join(a.out, a.tag, f"bc-cartpole-{seed}"), "bc", data,
                                                            seed, a.bc_rows)))
        rows.append(("CartPole-v1", "cql_dqn", seed, offline_run(
            os.path.join(a.out, a.tag, f"cql_dqn-cartpole-{seed}"), "cql_dqn", data, seed, a.cartpole_rows,
            extra=tuple(a.extra_dqn))))


def table(rows: list) -> bool:
    """Prints the runs and, per env, the medians and the verdict; True if every env passes."""
    print("\nenv          algo     seed  greedy mean (50 episodes)")
    for env, algo, seed, r in rows:
        print(f"{env:<12} {algo:<8} {seed:>4}  {r:.1f}")
    ok = True
    print("\nenv          BC median  CQL median  CQL bound (BC - 10% |BC|)  pass")
    for env in dict.fromkeys(r[0] for r in rows):
        med = {algo: statistics.median(r for e, al, _, r in rows if e == env and al == algo)
               for algo in dict.fromkeys(al for e, al, _, _ in rows if e == env)}
        bc = med.pop("bc")
        cql = next(iter(med.values()))
        bound = bc - 0.1 * abs(bc)
        ok &= cql >= bound
        print(f"{env:<12} {bc:>9.1f}  {cql:>10.1f}  {bound:>25.1f}  {'yes' if cql >= bound else 'no'}")
    return ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", nargs="+", choices=("pendulum", "cartpole"), default=["pendulum", "cartpole"])
    p.add_argument("--out", default="runs/cql-expert")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--sac-env-steps", type=int, default=8_000, help="env steps of the Pendulum expert")
    p.add_argument("--bc-rows", type=int, default=1_000_000, help="rows per BC run")
    p.add_argument("--pendulum-rows", type=int, default=768_000, help="rows per CQL-SAC run (256 a step)")
    p.add_argument("--cartpole-rows", type=int, default=1_000_000, help="rows per CQL-DQN run (256 a step)")
    p.add_argument("--extra-cql", nargs="*", help="overrides of the CQL-SAC runs",
                   default=["cql_sac.bc_steps=2500", "cql_sac.bc_lr=1e-3", "cql_sac.actor_lr=3e-5",
                            "cql_sac.tune_alpha=false", "cql_sac.initial_alpha=0.05"])
    p.add_argument("--tag", default="runs", help="the offline runs go to OUT/TAG/<algo>-<env>-<seed>")
    p.add_argument("--extra-dqn", nargs="*", default=[], help="overrides of the CQL-DQN runs")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    rows: list = []
    if "pendulum" in a.parts:
        pendulum(a, rows)
    if "cartpole" in a.parts:
        cartpole(a, rows)
    return 0 if table(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
