"""MAML's acceptance check: on held-out tasks of the 2D navigation distribution, the return after
one inner adaptation step against the return before it, and against a multi-task PPO policy
(trained on the same distribution without meta-learning) given the same adaptation step.

1. MAML: ``configs/maml/PointGoal-v0.yaml`` (or ``--maml-run RUN``, a finished run folder).
2. Multi-task PPO: PPO on ``flowkit.testing.envs:PointGoal-v0`` with no task set (each episode
   a new hidden goal), the same network (64 x 64 tanh, separate value network), ``--ppo-env-steps``
   env steps (or ``--ppo-run RUN``).
3. Held-out tasks: ``--tasks`` goals drawn by the env from seed 12345 (the runs draw theirs from
   seeds derived from the run's seed and the meta step). Each policy adapts on each task exactly
   as MAML's workers do (:func:`flowkit_maml.maml.adaptation_returns`: 20 trajectories of 100
   steps, one policy-gradient step on them, 20 new trajectories), with MAML's ``inner_lr``; PPO
   also with the step size that suits it best among ``--ppo-lrs``, chosen on 10 other tasks
   (seed 999), not on the held-out ones. The MAML policy before meta-training (its initial
   weights) is the third row.

Columns: the mean episode return over the held-out tasks before adaptation and after one step
(with the standard error over tasks), their difference, and how many tasks improved; then MAML's
return after one step minus each PPO row's, paired over the same tasks. Both policies adapt with
the MAML run's ``maml.baseline`` (the baseline of the adaptation step's advantages).

    python bench/maml_adaptation.py                              # trains both (minutes to hours)
    python bench/maml_adaptation.py --maml-run runs/maml-... --ppo-run runs/ppo-...
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
ENV = "env=flowkit.testing.envs:PointGoal-v0"


def train_maml(seed: int, out: str) -> str:
    import flowkit
    res = flowkit.train([f"seed={seed}", f"run.dir={out}", "run.reporters=[csv,checkpoint]"],
                        config_file=os.path.join(REPO, "configs", "maml", "PointGoal-v0.yaml"), verbose=False)
    return res.run_dir


def train_ppo(seed: int, env_steps: int, out: str) -> str:
    import flowkit
    res = flowkit.train(["algo=ppo", ENV, f"seed={seed}", f"run.dir={out}", "run.reporters=[csv,checkpoint]",
                         "runtime.backend=local", "runtime.num_workers=1", "runtime.num_envs_per_worker=20",
                         "runtime.rollout_fragment_length=100", "env.vectorization=sync", "ppo.lr=3e-4",
                         "ppo.gamma=0.99", "ppo.gae_lambda=1.0", "ppo.num_epochs=10", "ppo.minibatch_size=500",
                         "ppo.max_grad_norm=0.5", f"stop.env_steps={env_steps}"], verbose=False)
    return res.run_dir


def tasks(seed: int, n: int) -> list:
    from flowkit.testing.envs import PointGoalEnv
    env = PointGoalEnv()
    env.reset(seed=seed)
    return env.sample_tasks(n)


def evaluate(weights: dict, goals: list, inner_lr: float, seed: int, baseline: str) -> np.ndarray:
    """``float64[len(goals), 2]``: returns before and after one adaptation step."""
    from flowkit_maml.maml import adaptation_returns

    from flowkit.engine import load_config, setup
    pm, cfg = load_config(["algo=maml", ENV, f"seed={seed}", "runtime.backend=local", "runtime.num_workers=1",
                           "runtime.num_envs_per_worker=20", "runtime.rollout_fragment_length=100",
                           f"maml.inner_lr={inner_lr}", f"maml.baseline={baseline}"])
    ctx = setup(cfg, pm)
    try:
        return adaptation_returns(ctx.workers.local_worker(), weights, goals, 1)
    finally:
        ctx.shutdown()


def row(name: str, lr: float, r: np.ndarray) -> dict:
    se = r.std(0, ddof=1) / np.sqrt(len(r))
    d = r[:, 1] - r[:, 0]
    return {"policy": name, "inner_lr": lr, "pre": float(r[:, 0].mean()), "pre_se": float(se[0]),
            "post": float(r[:, 1].mean()), "post_se": float(se[1]), "delta": float(d.mean()),
            "delta_se": float(d.std(ddof=1) / np.sqrt(len(d))), "improved": int((d > 0).sum()), "tasks": len(d)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--maml-run", default=None)
    ap.add_argument("--ppo-run", default=None)
    ap.add_argument("--ppo-env-steps", type=int, default=2_000_000)
    ap.add_argument("--ppo-lrs", type=float, nargs="*", default=[0.1, 0.3, 1.0, 3.0])
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/bench-maml")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import flowkit
    t0 = time.perf_counter()
    maml_run = args.maml_run or train_maml(args.seed, os.path.join(args.out, f"maml-seed{args.seed}"))
    ppo_run = args.ppo_run or train_ppo(args.seed, args.ppo_env_steps, os.path.join(args.out, f"ppo-seed{args.seed}"))
    print(f"runs: {maml_run} (MAML), {ppo_run} (multi-task PPO); {time.perf_counter() - t0:.0f} s", flush=True)
    maml = flowkit.Algorithm.from_checkpoint(maml_run)
    inner_lr, baseline = float(maml.config.inner_lr), str(maml.config.baseline)
    theta = maml.get_policy().get_weights()
    ppo = flowkit.Algorithm.from_checkpoint(ppo_run).get_policy().get_weights()
    from flowkit.engine import load_config, setup
    pm, cfg = load_config(["algo=maml", ENV, f"seed={args.seed}", "runtime.backend=local", "runtime.num_workers=1"])
    init = setup(cfg, pm).policies["default"].get_weights()  # the MAML policy before meta-training
    held_out, val = tasks(12345, args.tasks), tasks(999, 10)
    best = max(args.ppo_lrs, key=lambda lr: float(np.diff(evaluate(ppo, val, lr, args.seed + 1, baseline),
                                                          axis=1).mean()))
    r_maml, r_ppo, r_best = (evaluate(w, held_out, lr, args.seed + 2, baseline)
                             for w, lr in ((theta, inner_lr), (ppo, inner_lr), (ppo, best)))
    rows = [row("MAML (meta-trained)", inner_lr, r_maml), row("multi-task PPO", inner_lr, r_ppo),
            row("multi-task PPO, its best step size", best, r_best),
            row("MAML's initial weights (no training)", inner_lr, evaluate(init, held_out, inner_lr, args.seed + 2,
                                                                            baseline))]
    print(f"\n2D navigation (flowkit.testing.envs:PointGoal-v0), {args.tasks} held-out tasks, 20 episodes of 100 "
          f"steps per task before and after one adaptation step (baseline of its advantages: {baseline})\n")
    print("| policy | inner_lr | return before adaptation | after one step | improvement | tasks improved |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['policy']} | {r['inner_lr']:g} | {r['pre']:.1f} +- {r['pre_se']:.1f} | {r['post']:.1f} +- "
              f"{r['post_se']:.1f} | {r['delta']:+.1f} +- {r['delta_se']:.1f} | {r['improved']}/{r['tasks']} |")
    paired = [r_maml[:, 1] - r for r in (r_ppo[:, 1], r_best[:, 1])]
    for name, d in zip(("multi-task PPO", "multi-task PPO, its best step size"), paired):
        print(f"MAML - {name}, after one step, paired over the same tasks: {d.mean():+.1f} +- "
              f"{d.std(ddof=1) / np.sqrt(len(d)):.1f} (MAML higher on {int((d > 0).sum())}/{len(d)} tasks)")
    print(f"\nmeta-training: {maml_run}; PPO: {ppo_run}; (+- one standard error over tasks)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"maml_run": maml_run, "ppo_run": ppo_run, "rows": rows}, f, indent=2)
    sys.exit(0 if rows[0]["delta"] > 0 and rows[0]["post"] > max(rows[1]["post"], rows[2]["post"]) else 1)


if __name__ == "__main__":
    main()
