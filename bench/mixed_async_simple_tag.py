"""An APPO team and a PPO team in one run of MPE2 simple_tag: do both learn? (issue 51, item 7)

Trains the three adversaries with APPO (async rollouts, learner thread, weights back to the
worker that sampled) and the prey with PPO (bulk-synchronous rollouts) in one run: each
algorithm pulls its own stream of fragments from the same two workers. Then plays ``episodes``
greedy episodes of each pairing and compares each trained team with a uniformly random team in
its place, against the same trained opponents:

- adversaries' return (per adversary): trained APPO vs trained prey, against random vs trained prey;
- prey's return: trained PPO vs trained adversaries, against random vs trained adversaries.

A team has learned when its return beats the random team's. flowkit alone, no peer.

    nice -n 19 .venv/bin/python bench/mixed_async_simple_tag.py [--env-steps N] [--seed S] [--episodes E]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = ["env.factory=mpe2.simple_tag_v3:parallel_env", "env.kwargs.max_cycles=25",
         "runtime.num_workers=2", "runtime.num_envs_per_worker=8", "runtime.rollout_fragment_length=25",
         "multiagent.policies.adversaries.algo=appo", "multiagent.policies.prey.algo=ppo",
         "multiagent.mapping.adversary_*=adversaries", "multiagent.mapping.agent_*=prey",
         "appo.train_batch_size=1000", "appo.lr=5.0e-4", "appo.ent_coef=0.01",
         "ppo.train_batch_size=2000", "ppo.minibatch_size=500", "ppo.num_epochs=10", "ppo.ent_coef=0.01",
         "ppo.lr=7.0e-4", "run.reporters=[csv,checkpoint]"]


def play(adversaries, prey, episodes, seed):
    """Mean return per adversary and of the prey over ``episodes`` greedy episodes; a side that is
    None acts uniformly at random."""
    from mpe2 import simple_tag_v3
    rng = np.random.default_rng(seed)
    env = simple_tag_v3.parallel_env(max_cycles=25)
    adv_ret, prey_ret = [], []
    for e in range(episodes):
        obs, _ = env.reset(seed=seed + e)
        tot = {a: 0.0 for a in env.possible_agents}
        while env.agents:
            acts = {}
            for a, o in obs.items():
                pol = adversaries if a.startswith("adversary") else prey
                if pol is None:
                    acts[a] = int(rng.integers(env.action_space(a).n))
                else:
                    enc, mask = pol.encoder(o[None].astype(np.float32), 1)
                    acts[a] = int(pol.compute_actions_encoded(enc, mask, False)[0][0])
            obs, rew, term, trunc, _ = env.step(acts)
            for a, r in rew.items():
                tot[a] += float(r)
        adv_ret.append(np.mean([v for a, v in tot.items() if a.startswith("adversary")]))
        prey_ret.append(np.mean([v for a, v in tot.items() if a.startswith("agent")]))
    env.close()
    return float(np.mean(adv_ret)), float(np.mean(prey_ret))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env-steps", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--episodes", type=int, default=300)
    ap.add_argument("--backend", default="ray")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_mixed_async_simple_tag"))
    args = ap.parse_args()
    from flowkit.checkpoint import load_trained
    from flowkit.cli import main as cli
    run_dir = os.path.join(args.out, f"appo_ppo_seed{args.seed}")
    t0 = time.time()
    rc = cli(["train", *TRAIN, f"runtime.backend={args.backend}", f"stop.env_steps={args.env_steps}",
              f"seed={args.seed}", f"run.dir={run_dir}"])
    if rc:
        sys.exit(f"flowkit train exited {rc}")
    t_train = time.time() - t0
    algo = load_trained(run_dir)
    adv, prey = algo.policies["adversaries"], algo.policies["prey"]
    s = 50_000 + args.seed
    a_trained, p_trained = play(adv, prey, args.episodes, s)
    a_random, _ = play(None, prey, args.episodes, s)
    _, p_random = play(adv, None, args.episodes, s)
    print(f"simple_tag_v3 (max_cycles 25), APPO adversaries + PPO prey in one run: {args.env_steps} env steps, "
          f"seed {args.seed}, {t_train:.0f} s; {args.episodes} greedy episodes per line")
    print(f"{'team':<14}{'trained':>10}{'random in its place':>22}  learned")
    print(f"{'adversaries':<14}{a_trained:>10.2f}{a_random:>22.2f}  {a_trained > a_random}")
    print(f"{'prey':<14}{p_trained:>10.2f}{p_random:>22.2f}  {p_trained > p_random}")
    with open(os.path.join(args.out, f"report_seed{args.seed}.json"), "w") as f:
        json.dump({"env_steps": args.env_steps, "seed": args.seed, "train_s": t_train,
                   "adversaries": {"trained": a_trained, "random": a_random},
                   "prey": {"trained": p_trained, "random": p_random}}, f, indent=2)


if __name__ == "__main__":
    main()
