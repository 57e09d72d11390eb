"""Learner speed: gradient steps per second of flowkit's Learner against Stable-Baselines3's
PPO ``train()`` on the same data.

Both sides get the same fixed batch of 2048 rows (CartPole-sized: 4 observations, 2 actions)
and the same network (separate 64x64 tanh policy and value MLPs, Adam, gradient-norm
clipping 0.5, per-minibatch advantage normalisation, PPO clipped loss), one torch thread,
``--epochs`` passes of shuffled minibatches. The sides alternate, ``--repeats`` times each,
and the table shows the median steps/s per minibatch size (at small minibatches the
per-update overhead decides).

Run: python bench/learner.py [--minibatch 64 256] [--epochs 4] [--repeats 5]
(needs the `bench` extra: pip install -e .[bench])
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np
import torch

warnings.filterwarnings("ignore")
ROWS = 2048


def fixed_data(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(ROWS, 2)).astype(np.float32)
    actions = rng.integers(0, 2, ROWS)
    logp = logits[np.arange(ROWS), actions] - np.log(np.exp(logits).sum(1))
    values = rng.normal(size=ROWS).astype(np.float32)
    returns = (values + rng.normal(size=ROWS)).astype(np.float32)
    return {"obs": rng.normal(size=(ROWS, 4)).astype(np.float32), "actions": actions, "logits": logits,
            "logp": logp.astype(np.float32), "values": values, "returns": returns,
            "advantages": (returns - values).astype(np.float32)}


def flowkit_side(data: dict, minibatch: int, epochs: int):
    """A Learner over a PPO policy; returns ``train() -> gradient steps``."""
    from flowkit.core import batch as sb
    from flowkit.engine import load_config, setup
    pm, cfg = load_config(["algo=ppo", "env=CartPole-v1", "runtime.backend=local", "model.hidden_sizes=[64,64]",
                           "model.activation=tanh", "ppo.max_grad_norm=0.5", "ppo.normalize_advantages=minibatch"])
    ctx = setup(cfg, pm)
    learner = ctx.add_learner("ppo", ["default"])
    learner.configure(num_epochs=epochs, minibatch_size=minibatch)
    pb = sb.SampleBatch({sb.OBS: data["obs"], sb.ACTIONS: data["actions"], sb.ACTION_LOGP: data["logp"],
                         sb.VF_PREDS: data["values"], sb.ADVANTAGES: data["advantages"],
                         sb.VALUE_TARGETS: data["returns"], sb.ACTION_DIST_INPUTS: data["logits"]})
    batch = sb.MultiAgentBatch({"default": pb}, ROWS)

    def train() -> int:
        return learner.update(batch)["num_updates"]
    return train


def sb3_side(data: dict, minibatch: int, epochs: int):
    """SB3's PPO with its rollout buffer filled with the same rows; ``train() -> steps``."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.logger import configure
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=ROWS, batch_size=minibatch, n_epochs=epochs,
                policy_kwargs={"net_arch": [64, 64]}, device="cpu", max_grad_norm=0.5, seed=0)
    model.set_logger(configure(None, []))
    buf = model.rollout_buffer
    buf.observations[:] = data["obs"][:, None]
    buf.actions[:] = data["actions"][:, None, None]
    buf.log_probs[:] = data["logp"][:, None]
    buf.values[:] = data["values"][:, None]
    buf.returns[:] = data["returns"][:, None]
    buf.advantages[:] = data["advantages"][:, None]
    buf.full = True

    def train() -> int:
        model.train()
        return epochs * -(-ROWS // minibatch)
    return train


def measure(train) -> float:
    t0 = time.perf_counter()
    steps = train()
    return steps / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minibatch", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    data = fixed_data()
    rows = []
    for mb in args.minibatch:
        sides = {"flowkit": flowkit_side(data, mb, args.epochs), "sb3": sb3_side(data, mb, args.epochs)}
        for train in sides.values():  # warm-up
            train()
        rates = {k: [] for k in sides}
        for _ in range(args.repeats):  # alternating
            for k, train in sides.items():
                rates[k].append(measure(train))
        fk, s3 = statistics.median(rates["flowkit"]), statistics.median(rates["sb3"])
        rows.append((mb, fk, s3))
    print(f"\nLearner gradient steps/s ({ROWS} rows, 64x64 MLP, PPO loss, {args.epochs} epochs, "
          f"1 torch thread, median of {args.repeats}, alternating)\n")
    print("| minibatch | flowkit Learner | SB3 PPO.train() | ratio |")
    print("|---:|---:|---:|---:|")
    for mb, fk, s3 in rows:
        print(f"| {mb} | {fk:,.0f} | {s3:,.0f} | {fk / s3:.2f}x |")


if __name__ == "__main__":
    main()
