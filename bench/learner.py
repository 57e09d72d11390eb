"""Learner speed: gradient steps per second of flowkit's Learner against Stable-Baselines3's
PPO ``train()`` on the same data.

Both sides get the same fixed batch of 2048 rows (CartPole-sized: 4 observations, 2 actions)
and the same network (separate 64x64 tanh policy and value MLPs, Adam, gradient-norm
clipping 0.5, per-minibatch advantage normalisation, PPO clipped loss), one torch thread,
``--epochs`` passes of shuffled minibatches. The sides alternate, ``--repeats`` times each,
and the table shows the median steps/s per minibatch size (at small minibatches the
per-update overhead decides).

``--optimizers``: instead, flowkit's Learner with its FlatAdam (torch's fused Adam kernel on
CPU), with FlatAdam on the single-tensor kernel (``fused=None``: the one it used before) and with
``torch.optim.Adam`` (default, ``foreach=True``, ``fused=True``) over the same flat buffer,
alternating, median of ``--repeats`` (the table in FlatAdam's docstring). ``--net nature``:
the same on DQN's learner for Atari frames (the Nature CNN with its 512-unit layer, 1.69M
parameters; ``--minibatch`` rows of random uint8 4x84x84 frame stacks, one gradient step per
update, 20 updates per measurement) instead of the 64x64 MLP.

Run: python bench/learner.py [--minibatch 64 256] [--epochs 4] [--repeats 5] [--optimizers [--net nature]]
(run with the bench environment: bash scripts/bench_env.sh, then .venv-bench/bin/python)
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


def nature_side(data: dict, minibatch: int, epochs: int):
    """DQN's Learner on Pong's frames (the Nature CNN, batches of ``minibatch`` random uint8
    frame stacks, as the Zoo's ``dqn.yml`` Atari settings); ``train() -> gradient steps``."""
    from flowkit.core import batch as sb
    from flowkit.engine import load_config, setup
    pm, cfg = load_config(["algo=dqn", "env=PongNoFrameskip-v4", "env.preset=atari", "runtime.backend=local",
                           "model.hidden_sizes=[512]", "model.activation=relu", "dqn.max_grad_norm=10"])
    learner = setup(cfg, pm).add_learner("dqn", ["default"])
    rng = np.random.default_rng(0)
    frames = lambda: rng.integers(0, 256, (minibatch, 4, 84, 84), dtype=np.uint8)  # noqa: E731
    pb = sb.SampleBatch({sb.OBS: frames(), sb.NEXT_OBS: frames(), sb.ACTIONS: rng.integers(0, 6, minibatch),
                         sb.REWARDS: rng.normal(size=minibatch).astype(np.float32),
                         sb.TERMINATEDS: np.zeros(minibatch, bool), sb.N_STEPS: np.ones(minibatch, np.int64)})
    batch = sb.MultiAgentBatch({"default": pb}, minibatch)

    def train() -> int:
        return sum(learner.update(batch)["num_updates"] for _ in range(20))
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


def optimizer_sides(data: dict, minibatch: int, epochs: int, side=flowkit_side) -> dict:
    """``{name: train}``: ``side`` with FlatAdam (fused kernel, and single-tensor) and with
    torch.optim.Adam variants."""
    from flowkit.core.policy import Policy
    orig = Policy.make_optimizer
    variants = {"FlatAdam": None, "FlatAdam single-tensor": "unfused", "Adam": {}, "Adam foreach": {"foreach": True},
                "Adam fused": {"fused": True}}
    sides = {}
    for name, kw in variants.items():
        def make(self, lr, eps=1e-8, module=None, sizes=None, kw=kw):
            opt = orig(self, lr, eps, module, sizes)
            if kw == "unfused":
                opt.fused = None
                return opt
            return opt if kw is None else torch.optim.Adam([self._flat], lr=lr, eps=eps, **kw)
        Policy.make_optimizer = make
        try:
            sides[name] = side(data, minibatch, epochs)
        finally:
            Policy.make_optimizer = orig
    return sides


def measure(train) -> float:
    t0 = time.perf_counter()
    steps = train()
    return steps / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minibatch", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--optimizers", action="store_true", help="FlatAdam against torch.optim.Adam")
    ap.add_argument("--net", choices=["mlp", "nature"], default="mlp",
                    help="with --optimizers: PPO's 64x64 MLP (CartPole) or DQN's Nature CNN (Pong frames)")
    args = ap.parse_args()
    if args.net == "nature" and not args.optimizers:
        ap.error("--net nature goes with --optimizers")
    torch.set_num_threads(1)
    data = fixed_data()
    rows = []
    for mb in args.minibatch:
        sides = (optimizer_sides(data, mb, args.epochs, nature_side if args.net == "nature" else flowkit_side)
                 if args.optimizers
                 else {"flowkit": flowkit_side(data, mb, args.epochs), "sb3": sb3_side(data, mb, args.epochs)})
        for train in sides.values():  # warm-up
            train()
        rates = {k: [] for k in sides}
        for _ in range(args.repeats):  # alternating
            for k, train in sides.items():
                rates[k].append(measure(train))
        rows.append((mb, {k: statistics.median(v) for k, v in rates.items()}))
    what = ("DQN's Nature CNN on uint8 4x84x84 frames, TD loss, 20 updates of one minibatch" if args.net == "nature"
            else f"{ROWS} rows, 64x64 MLP, PPO loss, {args.epochs} epochs")
    print(f"\nLearner gradient steps/s ({what}, 1 torch thread, median of {args.repeats}, alternating)\n")
    if args.optimizers:
        names = list(rows[0][1])
        print("| minibatch | " + " | ".join(names) + " |")
        print("|---:|" + "---:|" * len(names))
        for mb, med in rows:
            print(f"| {mb} | " + " | ".join(f"{med[k]:,.{0 if med[k] >= 100 else 1}f} ({med[k] / med[names[0]]:.2f}x)" for k in names) + " |")
        return
    print("| minibatch | flowkit Learner | SB3 PPO.train() | ratio |")
    print("|---:|---:|---:|---:|")
    for mb, med in rows:
        fk, s3 = med["flowkit"], med["sb3"]
        print(f"| {mb} | {fk:,.0f} | {s3:,.0f} | {fk / s3:.2f}x |")


if __name__ == "__main__":
    main()
