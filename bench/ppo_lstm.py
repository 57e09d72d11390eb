"""flowkit PPO with an LSTM against sb3-contrib's RecurrentPPO on CartPole-v1 without velocities
(issue 24), each measurement in a fresh process, one torch thread each, the two sides
alternating, median of ``--repeats`` (3).

Both run the RL Zoo's CartPoleNoVel-v1 settings for RecurrentPPO: 8 sub-envs x 32 steps = 256 env
steps per train batch, 20 epochs of one minibatch of 256, gamma 0.98, gae_lambda 0.8, lr 1e-3 and
clip 0.2 decayed linearly over 100,000 env steps, observations normalised, ReLU, separate LSTMs of
64 units for the policy and the value function (flowkit: configs/ppo/CartPoleNoVel-v1.yaml in-process, ``runtime.backend=local``: the
sampling and the learning in one process, as sb3-contrib; sb3-contrib: a DummyVecEnv of 8).

  (a) env steps/s with learning over ``--steps`` env steps (first sample to last update);
  (b) with ``--learn``: per seed, the env steps at which the mean return of the last 20 training
      episodes reached 475 (or the best within ``--budget``), both sides.
  (c) sampling only (flowkit's workers acting with the LSTM, no learning) against a plain loop
      over the same vector env and torch LSTM networks.

    python bench/ppo_lstm.py [--repeats 3] [--steps 20480] [--learn --seeds 0 1 2] [--json out.json]

Needs the bench environment (``bash scripts/bench_env.sh``, then ``.venv-bench/bin/python``: sb3-contrib).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CONFIG = os.path.join(REPO, "configs", "ppo", "CartPoleNoVel-v1.yaml")
SOLVE = 475.0


# ---- flowkit -------------------------------------------------------------------------------------
def flowkit_run(seed: int, steps: int, stop_at_solve: bool = False) -> dict:
    import torch
    torch.set_num_threads(1)
    import flowkit
    res = flowkit.train([f"seed={seed}", f"stop.env_steps={steps}", "run.reporters=[csv]",
                         *([] if stop_at_solve else ["stop.episode_return_mean=null"]),
                         f"run.dir=/tmp/flowkit-bench/ppo-lstm-{seed}-{steps}-{os.getpid()}"],
                        config_file=CONFIG, verbose=False)
    m = res.metrics
    first = m.get("time_first_sample_s", 0.0)
    reached = next((h["env_steps_sampled"] for h in res.history if h.get("episode_return_mean", 0) >= SOLVE), None)
    best = max(h.get("episode_return_mean", 0.0) for h in res.history)
    dt = m["time_total_s"] - first
    return {"env_steps": m["env_steps_sampled"], "seconds": dt, "steps_per_s": m["env_steps_sampled"] / dt,
            "reached": reached, "best": best}


def flowkit_sampling(seconds: float) -> dict:
    import torch
    torch.set_num_threads(1)
    from flowkit.engine import load_config, setup
    pm, cfg = load_config(["run.reporters=[]", "runtime.rollout_fragment_length=256"], CONFIG)
    ctx = setup(cfg, pm)
    try:
        w = ctx.workers.actors[0].obj
        w.sample()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            n += w.sample().env_steps
        return {"steps_per_s": n / (time.perf_counter() - t0)}
    finally:
        ctx.shutdown()


# ---- the plain loop and sb3-contrib --------------------------------------------------------------------
def _no_vel_env():
    from flowkit.testing.envs import cartpole_no_velocity
    return cartpole_no_velocity()


def raw_sampling(seconds: float) -> dict:
    """8 sub-envs (SyncVectorEnv), two torch LSTMs of 64 on the observations, a linear head each,
    a categorical draw: the least any LSTM actor does per step."""
    import gymnasium as gym
    import torch
    from torch import nn
    torch.set_num_threads(1)
    envs = gym.vector.SyncVectorEnv([_no_vel_env for _ in range(8)])
    mlp = [nn.Sequential(nn.Linear(2, 64), nn.ReLU()) for _ in range(2)]
    lstm = [nn.LSTM(64, 64, batch_first=True) for _ in range(2)]
    pi, vf = nn.Linear(64, 2), nn.Linear(64, 1)
    st = [(torch.zeros(1, 8, 64), torch.zeros(1, 8, 64)) for _ in range(2)]
    obs, _ = envs.reset(seed=0)
    n, t0 = 0, time.perf_counter()
    with torch.inference_mode():
        while time.perf_counter() - t0 < seconds:
            x = torch.from_numpy(obs)
            outs = []
            for i in range(2):
                h, st[i] = lstm[i](mlp[i](x)[:, None], st[i])
                outs.append(h[:, 0])
            logits, _ = pi(outs[0]), vf(outs[1])
            a = torch.multinomial(torch.softmax(logits, -1), 1).squeeze(-1).numpy()
            obs, r, term, trunc, _ = envs.step(a)
            done = torch.from_numpy(term | trunc)[None, :, None]
            st = [(h * ~done, c * ~done) for h, c in st]
            n += 8
    return {"steps_per_s": n / (time.perf_counter() - t0)}


def sb3_run(seed: int, steps: int, stop_at_solve: bool = False) -> dict:
    import numpy as np
    import torch
    torch.set_num_threads(1)
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    class Watch(BaseCallback):
        def __init__(self):
            super().__init__()
            self.t_first, self.reached, self.best = None, None, 0.0

        def _on_step(self) -> bool:
            if self.t_first is None:
                self.t_first = time.perf_counter()
            buf = self.model.ep_info_buffer
            if len(buf) >= 20:
                ret = float(np.mean([e["r"] for e in list(buf)[-20:]]))
                self.best = max(self.best, ret)
                if ret >= SOLVE and self.reached is None:
                    self.reached = self.model.num_timesteps
                    return not stop_at_solve
            return True
    from stable_baselines3.common.vec_env import VecNormalize
    env = VecNormalize(make_vec_env(_no_vel_env, n_envs=8, seed=seed), norm_obs=True, norm_reward=False)
    horizon = 100_000  # the Zoo's n_timesteps: lin_1e-3 and lin_0.2 reach 0 there

    def lin(v):
        return lambda p: v * max(0.0, 1.0 - (1.0 - p) * steps / horizon)  # p: the fraction of `steps` left
    model = RecurrentPPO("MlpLstmPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98,
                         n_epochs=20, ent_coef=0.0, learning_rate=lin(1e-3), clip_range=lin(0.2),
                         policy_kwargs=dict(ortho_init=False, activation_fn=torch.nn.ReLU, lstm_hidden_size=64,
                                            enable_critic_lstm=True, net_arch=dict(pi=[64], vf=[64])),
                         seed=seed, verbose=0)
    cb = Watch()
    model.learn(total_timesteps=steps, callback=cb)
    dt = time.perf_counter() - (cb.t_first or time.perf_counter())
    return {"env_steps": model.num_timesteps, "seconds": dt, "steps_per_s": model.num_timesteps / dt,
            "reached": cb.reached, "best": cb.best}


# ---- main ------------------------------------------------------------------------------------------
def main() -> int:
    sys.path.insert(0, HERE)
    from _isolated import run_isolated
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20480)
    ap.add_argument("--sampling-seconds", type=float, default=10.0)
    ap.add_argument("--learn", action="store_true", help="also (b): the env steps to 475, per seed, both sides")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--budget", type=int, default=150_000)
    ap.add_argument("--skip", nargs="*", default=[], choices=["a", "c"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    out: dict = {"steps": args.steps, "repeats": args.repeats}

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=2)
    if "a" not in args.skip:
        out["a"] = {"flowkit": [], "sb3_contrib": []}
        for r in range(args.repeats):  # alternating, the first side swapped every repeat
            order = [("flowkit", "flowkit_run"), ("sb3_contrib", "sb3_run")]
            for side, fn in order if r % 2 == 0 else order[::-1]:
                out["a"][side].append(run_isolated("ppo_lstm", fn, r, args.steps))
                save()
    if "c" not in args.skip:
        out["c"] = {"flowkit": [], "raw": []}
        for r in range(args.repeats):
            order = [("flowkit", "flowkit_sampling"), ("raw", "raw_sampling")]
            for side, fn in order if r % 2 == 0 else order[::-1]:
                out["c"][side].append(run_isolated("ppo_lstm", fn, args.sampling_seconds))
                save()
    if args.learn:
        out["b"] = {"flowkit": {}, "sb3_contrib": {}}
        for s in args.seeds:
            out["b"]["flowkit"][s] = run_isolated("ppo_lstm", "flowkit_run", s, args.budget, True)
            out["b"]["sb3_contrib"][s] = run_isolated("ppo_lstm", "sb3_run", s, args.budget, True)
            save()
    print(table(out))
    return 0


def table(out: dict) -> str:
    med = statistics.median
    lines = ["", "PPO-LSTM on CartPole-v1 without velocities: flowkit vs sb3-contrib RecurrentPPO (RL Zoo settings, "
                 "one torch thread each)", f"{'measure':<60} {'flowkit':>10} {'peer':>10} {'ratio':>7}"]
    if "a" in out:
        f, p = (med([x["steps_per_s"] for x in out["a"][k]]) for k in ("flowkit", "sb3_contrib"))
        lines.append(f"{'(a) env steps/s with learning, ' + str(out['steps']) + ' steps, median of ' + str(out['repeats']):<60}"
                     f" {f:>10.0f} {p:>10.0f} {f / p:>6.2f}x")
    if "c" in out:
        f, p = (med([x["steps_per_s"] for x in out["c"][k]]) for k in ("flowkit", "raw"))
        lines.append(f"{'(c) sampling only, env steps/s (peer: a plain torch LSTM loop)':<60} {f:>10.0f} {p:>10.0f} "
                     f"{f / p:>6.2f}x")
    if "b" in out:
        for s in out["b"]["flowkit"]:
            f, p = out["b"]["flowkit"][s], out["b"]["sb3_contrib"][s]

            def cell(x):
                return f"{x['reached']}" if x["reached"] else f"best {x['best']:.0f}"
            lines.append(f"{'(b) seed ' + str(s) + ': env steps to a mean return of 475':<60} {cell(f):>10} "
                         f"{cell(p):>10}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
