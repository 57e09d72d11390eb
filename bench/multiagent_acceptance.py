"""Acceptance runs of the multi-agent plugin (issue 5); prints one table row per run.

    python bench/multiagent_acceptance.py tictactoe [--seeds 0 1] [--env-steps N]
    python bench/multiagent_acceptance.py spread
    python bench/multiagent_acceptance.py tag

- tictactoe: PPO (seats alternated) against a random opponent, <= 300,000 env steps; then
  200 greedy evaluation games against a random opponent, half of them moving first:
  win + draw >= 90%.
- spread: mpe2 simple_spread, one shared PPO policy, <= 600,000 env steps; then 100 greedy
  episodes: >= -20 per agent.
- tag: mpe2 simple_tag, PPO for the adversaries and DQN for the prey in one run on Ray,
  <= 1,000,000 env steps; then 100 greedy episodes with a random prey (each adversary >= 11)
  and 100 with random adversaries (prey >= -7.4).

Evaluations are run after training, from the final checkpoint, with the opponents replaced
through ``multiagent.eval_opponents``. Timings are wall-clock on a shared machine.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

from omegaconf import OmegaConf

COMMON = ["run.reporters=[csv,plot,checkpoint,evaluation]", "runtime.num_workers=2", "runtime.num_envs_per_worker=8"]

GAMES = {
    "tictactoe": dict(
        steps=300_000, iter_env_steps=8192,
        overrides=["env.factory=pettingzoo.classic.tictactoe_v3:env", "runtime.rollout_fragment_length=32",
                   "multiagent.policies.learner.algo=ppo", "multiagent.policies.opponent.algo=random",
                   "multiagent.mapping.player_1=learner", "multiagent.mapping.player_2=opponent",
                   "multiagent.alternate_seats=true", "ppo.train_batch_size=2048", "ppo.minibatch_size=256",
                   "ppo.num_epochs=10", "ppo.ent_coef=0.01", "ppo.lr=1e-3", "model.hidden_sizes=[128,128]",
                   "run.min_iter_env_steps=8000"],
        evals=[("vs random, seats alternated",
                ["multiagent.eval_opponents.opponent=random", "multiagent.eval_alternate_seats=true", "evaluation.episodes=200"],
                lambda r: r["evaluation/learner/win_rate"] + r["evaluation/learner/draw_rate"], 0.90,
                "win+draw")]),
    "spread": dict(
        steps=600_000, iter_env_steps=10_000,
        overrides=["env.factory=mpe2.simple_spread_v3:parallel_env", "runtime.rollout_fragment_length=25",
                   "ppo.train_batch_size=2000", "ppo.minibatch_size=500", "ppo.num_epochs=10",
                   "ppo.ent_coef=0.01", "ppo.lr=7e-4", "run.min_iter_env_steps=10000"],
        evals=[("shared PPO, greedy", ["evaluation.episodes=100"],
                lambda r: r["evaluation_return_mean"] / 3, -20.0, "per agent")]),  # one policy: no evaluation/<id>
    "tag": dict(
        steps=1_000_000, iter_env_steps=20_000,
        overrides=["env.factory=mpe2.simple_tag_v3:parallel_env", "runtime.rollout_fragment_length=25",
                   "runtime.backend=ray",
                   "multiagent.policies.adversaries.algo=ppo", "multiagent.policies.prey.algo=dqn",
                   # opponent sampling: the adversaries act at random in 7 of 8 episodes (drawn per
                   # episode), so the prey also learns what to do when it is not chased
                   "multiagent.policies.random_adversaries.algo=random",
                   "multiagent.mapping.adversary_*={adversaries: 1, random_adversaries: 7}",
                   "multiagent.mapping.agent_*=prey",
                   "ppo.train_batch_size=2000", "ppo.minibatch_size=500", "ppo.num_epochs=10",
                   "ppo.ent_coef=0.01", "ppo.lr=7e-4",
                   "dqn.training_intensity=8.0", "dqn.lr=5e-4", "dqn.lr_schedule=linear", "dqn.gamma=0.95",
                   "dqn.target_network_update_freq=2000", "dqn.epsilon_timesteps=200000",
                   "dqn.buffer_size=200000", "dqn.learning_starts=5000", "dqn.n_step=3",
                   "run.min_iter_env_steps=20000"],
        # 500 episodes: one prey episode's return has a standard deviation of ~12-14 against
        # random adversaries, so 100 would leave a standard error of ~1.3 on the mean
        evals=[("adversaries vs random prey", ["multiagent.eval_opponents.prey=random", "evaluation.episodes=500"],
                lambda r: r["evaluation/adversaries/episode_return_mean"], 11.0, "each adversary"),
               ("prey vs random adversaries", ["multiagent.eval_opponents.adversaries=random", "evaluation.episodes=500"],
                lambda r: r["evaluation/prey/episode_return_mean"], -7.4, "prey")]),
}


def evaluate_run(run_dir: str, overrides):
    """Greedy evaluation of a finished run's final checkpoint with extra ``overrides``
    (e.g. ``multiagent.eval_opponents.prey=random``); returns the evaluation metrics."""
    from flowkit.checkpoint import load_state
    from flowkit.config import build_config
    from flowkit.engine import find_checkpoint, setup
    from flowkit.hooks import get_plugin_manager
    ck = find_checkpoint(run_dir)
    saved = OmegaConf.load(os.path.join(ck, "config.yaml"))
    saved.runtime.backend = "local"
    saved.multiagent.eval_opponents = {}
    merged = OmegaConf.merge(saved, OmegaConf.from_dotlist(list(overrides)))
    pm = get_plugin_manager(list(merged.plugins))
    cfg = build_config(OmegaConf.to_container(merged, resolve=True), None, pm.config_sections())
    ctx = setup(cfg, pm)
    st = load_state(ck)
    for pid, ps in st["policies"].items():
        ctx.policies[pid].set_weights(ps["weights"])
    try:
        return ctx.evaluate()
    finally:
        ctx.shutdown()


def run_game(game: str, seed: int, env_steps: int, out_root: str, extra=()):
    import flowkit
    g = GAMES[game]
    run_dir = os.path.join(out_root, f"{game}-seed{seed}")
    # stop is checked once per reported iteration: stop at the last whole iteration within the budget
    stop = max(1, env_steps - g["iter_env_steps"] + 1)
    over = (list(COMMON) + list(g["overrides"]) + list(extra)
            + [f"seed={seed}", f"stop.env_steps={stop}", f"run.dir={run_dir}"])
    if not any(o.startswith("runtime.backend=") for o in over):
        over.append("runtime.backend=ray")
    t0 = time.perf_counter()
    res = flowkit.train(over)
    wall = time.perf_counter() - t0
    rows = []
    m = res.metrics
    train_cols = {k: v for k, v in m.items() if k.startswith("policy/") and k.endswith("episode_return_mean")}
    for label, ev_over, pick, thr, unit in g["evals"]:
        r = evaluate_run(run_dir, ev_over)
        val = pick(r)
        rows.append(dict(game=game, seed=seed, env_steps=m["env_steps_sampled"], wall_s=wall, train=train_cols,
                         eval=label, value=val, threshold=thr, unit=unit, ok=val >= thr,
                         extra={k: v for k, v in r.items() if k.startswith("evaluation/")}))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("game", choices=sorted(GAMES))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--env-steps", type=int, default=None, help="budget (default: the acceptance budget)")
    ap.add_argument("--out", default="runs/bench-multiagent")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="extra config overrides (after the game's own), e.g. ppo.lr=1e-3")
    args = ap.parse_args()
    steps = args.env_steps or GAMES[args.game]["steps"]
    rows = []
    for s in args.seeds:
        rows += run_game(args.game, s, steps, args.out, args.set)
    print(f"\n{args.game}: budget {steps:,} env steps\n")
    print("| seed | env steps | wall s | evaluation | value | threshold | pass | training returns (last 20 episodes) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        tr = ", ".join(f"{k.split('/')[1]} {v:.2f}" for k, v in r["train"].items())
        print(f"| {r['seed']} | {r['env_steps']:,} | {r['wall_s']:.0f} | {r['eval']} | {r['value']:.3f} ({r['unit']}) "
              f"| {r['threshold']} | {'yes' if r['ok'] else 'NO'} | {tr} |")
    for r in rows:
        print(f"  seed {r['seed']} {r['eval']}: " + ", ".join(f"{k}={v:.3f}" for k, v in r["extra"].items()))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
