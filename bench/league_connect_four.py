"""A league against plain PPO on PettingZoo connect_four_v3 (issue 51's acceptance).

Trains two runs of the same PPO settings for the same env steps (``configs/multiagent/
connect_four_league.yaml``): the league (self-play, PFSP over past snapshots and the random
player) and a PPO policy trained only against random (the same config with
``multiagent.league.main=null``). Then plays, in both seats alternately:

- the league's main policy (greedy) against a uniformly random player: ``games`` games;
- the league's main policy against the PPO-vs-random policy: ``games`` games, both sampling
  their actions (greedy against greedy is one game per seat), seeded.

Target: the league wins >= 95% against random and >= 65% against PPO-vs-random (draws count
one half in the win rate shown; the wins alone are shown too). flowkit's own environment, no peer.

    nice -n 19 .venv/bin/python bench/league_connect_four.py [--env-steps N] [--seed S] [--games G]
        [--set KEY=VALUE ...] [--out DIR]

``--set`` overrides apply to both runs (a config variant: PPO settings are the same on both
sides; league keys matter only to the league). A run folder that holds a ``result.json``
already is not trained again (``--out`` of an earlier run: only the games are played again).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "multiagent", "connect_four_league.yaml")


def run(name, env_steps, seed, extra, out_root):
    from flowkit.cli import main as cli
    run_dir = os.path.join(out_root, name)
    if os.path.exists(os.path.join(run_dir, "result.json")):  # trained already: only the games again
        print(f"{name}: reusing {run_dir}")
        return run_dir, float("nan")
    argv = ["train", "-c", CONFIG, f"stop.env_steps={env_steps}", f"seed={seed}", f"run.dir={run_dir}",
            "run.reporters=[csv,checkpoint]", *extra]
    t0 = time.time()
    rc = cli(argv)
    if rc:
        sys.exit(f"{name}: flowkit train exited {rc}")
    return run_dir, time.time() - t0


def load_policy(run_dir, pid):
    from flowkit.checkpoint import load_trained
    return load_trained(run_dir).policies[pid]


def play(first, second, games, seed, explore):
    """``games`` connect-four games, ``first`` in seat player_0 in even games and player_1 in odd
    ones. A side is a policy or None (uniformly random over legal moves). Returns (wins, draws,
    losses) of ``first``."""
    from pettingzoo.classic import connect_four_v3
    rng = np.random.default_rng(seed)
    env = connect_four_v3.env()
    out = [0, 0, 0]
    for g in range(games):
        env.reset(seed=int(seed) + g)
        seats = {"player_0": first, "player_1": second} if g % 2 == 0 else {"player_0": second, "player_1": first}
        me = "player_0" if g % 2 == 0 else "player_1"
        r_me = 0.0
        for agent in env.agent_iter():
            obs, r, term, trunc, _ = env.last()
            if term or trunc:
                r_me = float(r) if agent == me else r_me  # the final reward of `first`'s seat
                env.step(None)
                continue
            pol = seats[agent]
            if pol is None:
                a = int(rng.choice(np.flatnonzero(obs["action_mask"])))
            else:
                enc, mask = pol.encoder(_one(pol, obs), 1)
                acts, _ = pol.compute_actions_encoded(enc, mask, explore)
                a = int(acts[0])
            env.step(a)
        out[0 if r_me > 0 else 1 if r_me == 0 else 2] += 1
    env.close()
    return tuple(out)


def _one(pol, obs):
    from flowkit_multiagent.runners import stack_raw
    return stack_raw(pol.observation_space, [obs])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env-steps", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--games", type=int, default=200)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides for both runs")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_league_connect_four"))
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    league_dir, t_league = run("league", args.env_steps, args.seed, args.set, args.out)
    ppo_dir, t_ppo = run("ppo_vs_random", args.env_steps, args.seed, [*args.set, "multiagent.league.main=null"],
                         args.out)
    main_pol, ppo_pol = load_policy(league_dir, "learner"), load_policy(ppo_dir, "learner")
    rows = [("league vs random (greedy)", play(main_pol, None, args.games, 10_000 + args.seed, False), 0.95),
            ("league vs ppo-vs-random (sampled)", play(main_pol, ppo_pol, args.games, 20_000 + args.seed, True), 0.65),
            ("ppo-vs-random vs random (greedy)", play(ppo_pol, None, args.games, 10_000 + args.seed, False), None)]
    print(f"connect_four_v3, {args.env_steps} env steps each, seed {args.seed}, overrides {args.set}; "
          f"train time league {t_league:.0f} s, ppo-vs-random {t_ppo:.0f} s; {args.games} games per line, seats alternated")
    print(f"{'match':<36}{'wins':>6}{'draws':>7}{'losses':>8}{'win rate':>10}{'target':>8}")
    report = {}
    for name, (w, d, lo), target in rows:
        rate = (w + 0.5 * d) / args.games
        ok = "" if target is None else (">=%.2f %s" % (target, "ok" if w / args.games >= target else "MISSED"))
        print(f"{name:<36}{w:>6}{d:>7}{lo:>8}{rate:>10.3f}  {ok}")
        report[name] = {"wins": w, "draws": d, "losses": lo, "target": target}
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump({"env_steps": args.env_steps, "seed": args.seed, "games": args.games, "overrides": args.set,
                   "train_s": {"league": t_league, "ppo_vs_random": t_ppo}, "results": report}, f, indent=2)


if __name__ == "__main__":
    main()
