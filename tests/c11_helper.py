"""C11 helper: the two halves of a checkpoint/restore run, so that run 2 can go in a fresh
process (``python tests/c11_helper.py run2 ALGO WORK_DIR [ALGO WORK_DIR ...]``)."""
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))

DQN_OVERRIDES = ["algo=dqn", "env.factory=dqn_envs:chain5", "seed=0", "runtime.backend=local",
                 "runtime.num_workers=1", "runtime.num_envs_per_worker=1", "runtime.rollout_fragment_length=10",
                 "model.hidden_sizes=[32,32]", "dqn.lr=1e-3", "dqn.buffer_size=1000", "dqn.initial_epsilon=1.0",
                 "dqn.final_epsilon=0.05", "dqn.epsilon_timesteps=500", "dqn.learning_starts=100",
                 "dqn.train_batch_size=32", "dqn.target_network_update_freq=20", "run.reporters=[csv,checkpoint,evaluation]"]
PPO_OVERRIDES = ["algo=ppo", "env=CartPole-v1", "seed=0", "runtime.backend=local", "runtime.num_workers=1",
                 "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=16", "ppo.minibatch_size=16",
                 "ppo.num_epochs=2", "run.reporters=[csv,checkpoint,evaluation]"]
STEPS = {"dqn": 300, "ppo": 64}


def build(algo: str, work: str):
    from flowkit.engine import build_plan, load_config, setup
    over = (DQN_OVERRIDES if algo == "dqn" else PPO_OVERRIDES) + [f"run.dir={work}/run"]
    pm, cfg = load_config(over)
    ctx = setup(cfg, pm, f"{work}/run")
    return ctx, build_plan(ctx)


def one_step(algo: str, ctx, work: str):
    """The same one training step in both runs: DQN from the replay buffer alone, PPO on a
    fixed batch saved by run 1."""
    from flowkit.core.ops import TrainOneStep
    if algo == "dqn":
        batch = ctx.stateful["dqn/replay_buffer"].sample(32)
        TrainOneStep(ctx, ctx.learners["dqn"])(batch)
    else:
        from flowkit.checkpoint import from_plain
        from flowkit.core.batch import MultiAgentBatch
        batch = MultiAgentBatch.from_dict(from_plain(torch.load(f"{work}/fixed_batch.pt", weights_only=True)))
        TrainOneStep(ctx, ctx.learners["ppo"], num_epochs=2, minibatch_size=16)(batch)
    return {k: v.copy() for k, v in ctx.policies["default"].get_weights().items()}


def snapshot(ctx):
    pol = ctx.policies["default"]
    opt = pol.optimizer.state_dict()["state"][0]
    return {"counters": dict(ctx.counters), "epsilon": getattr(pol, "epsilon", None),
            "opt_step": float(opt["step"]), "exp_avg": opt["exp_avg"].clone(),
            "exp_avg_sq": opt["exp_avg_sq"].clone(), "num_updates": pol.num_updates}


def run1(algo: str, work: str):
    from flowkit.engine import save_checkpoint
    ctx, plan = build(algo, work)
    while ctx.counters["env_steps_sampled"] < STEPS[algo]:
        next(plan)
    ck = save_checkpoint(ctx, f"{work}/run")
    # what the uninterrupted run's worker explores its next fragment with
    worker_exploration = ctx.workers.local_worker().policies["default"].exploration_state()
    if algo == "ppo":
        from flowkit.checkpoint import save_state
        save_state(ctx.workers.local_worker().sample().to_dict(), f"{work}/fixed_batch.pt")
    snap = {**snapshot(ctx), "worker_exploration": worker_exploration}
    weights = one_step(algo, ctx, work)
    ctx.shutdown()
    return ck, snap, weights


def run2(algo: str, work: str):
    from flowkit.engine import find_checkpoint, restore
    ctx, plan = build(algo, work)
    restore(ctx, find_checkpoint(f"{work}/run"))
    snap = snapshot(ctx)
    weights = one_step(algo, ctx, work)
    assert not ctx.workers.started
    # the resumed run's worker before its first fragment (issue 27 item 4: it had initial_epsilon)
    snap["worker_exploration"] = ctx.workers.local_worker().policies["default"].exploration_state()
    ctx.shutdown()
    from flowkit.checkpoint import save_state
    save_state({"snap": snap, "weights": weights}, f"{work}/run2.pt")


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    for i in range(2, len(sys.argv), 2):
        run2(sys.argv[i], sys.argv[i + 1])
