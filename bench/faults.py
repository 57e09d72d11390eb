"""Worker faults under load: PPO on CartPole-v1, 2 Ray rollout workers, a fixed env-step
budget, run twice with the same seed: undisturbed, and with one worker process SIGKILLed
from outside every ``--kill-every`` env steps (flowkit.testing.KillWorkers, from the
train-result hook; workers 0 and 1 in turn).

Prints a Markdown table: wall time (train() call, Ray already up) and their ratio, worker
restarts, env steps lost (transitions a killed worker had sampled but not yet returned, so
never trained on), the final episode_return_mean (last 20 training episodes) and a final
greedy evaluation over 20 episodes.

    python bench/faults.py                       # 200,000 env steps, a kill every 25,000
    python bench/faults.py --env-steps 20000 --kill-every 5000   # a quick look
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def run(args, kill_every):
    import flowkit
    from flowkit.testing import KillWorkers
    # kills at kill_every, 2 kill_every, ... strictly before the end (a kill at the last
    # iteration would only stop a run that is over)
    plugins = [KillWorkers(kill_every, max_kills=(args.env_steps - 1) // kill_every)] if kill_every else []
    here = os.path.dirname(os.path.abspath(__file__))
    cfg = os.path.join(here, "..", "configs", "ppo", "CartPole-v1.yaml")
    run_dir = tempfile.mkdtemp(prefix="flowkit-bench-faults-")
    t0 = time.perf_counter()
    res = flowkit.train([f"seed={args.seed}", f"stop.env_steps={args.env_steps}", "stop.episode_return_mean=null",
                         f"run.dir={run_dir}", "run.reporters=[csv,checkpoint,evaluation]", "evaluation.final=true",
                         "evaluation.episodes=20", "checkpoint.at_end=false"], cfg, plugins=plugins)
    wall = time.perf_counter() - t0
    m = res.metrics
    kills = plugins[0].kills if plugins else []
    return {"wall_s": wall, "env_steps": m["env_steps_sampled"], "env_steps_trained": m["env_steps_trained"],
            "restarts": m["num_worker_restarts"], "kills": len(kills), "lost": sum(k[3] for k in kills),
            "return": m["episode_return_mean"], "eval": m["evaluation_return_mean"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env-steps", type=int, default=200_000)
    p.add_argument("--kill-every", type=int, default=25_000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    import ray
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="error")
    try:
        base = run(args, 0)
        hurt = run(args, args.kill_every)
    finally:
        ray.shutdown()
    print(f"\nPPO CartPole-v1, 2 Ray workers x 8 envs, seed {args.seed}, stop.env_steps={args.env_steps}, "
          f"one worker SIGKILLed every {args.kill_every} env steps\n")
    print("| run | wall time (s) | ratio | kills | restarts | env steps sampled | env steps lost "
          "| episode_return_mean | evaluation_return_mean |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in (("undisturbed", base), ("killed", hurt)):
        print(f"| {name} | {r['wall_s']:.1f} | {r['wall_s'] / base['wall_s']:.2f} | {r['kills']} | {r['restarts']} "
              f"| {r['env_steps']} | {r['lost']} | {r['return']:.1f} | {r['eval']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
