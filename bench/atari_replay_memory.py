"""DQN Atari replay memory: real Pong transitions (env.preset=atari, random actions) into a
replay buffer of ``--transitions`` capacity, filled once; reports the process's resident memory
growth (VmRSS, from after the first batch: per transition added since) and the buffer's own bytes per transition, the frames stored per transition, and
both extrapolated to 1M transitions (issue 23 target: <= 7.5 GB; plain obs / next_obs columns of
uint8[4, 84, 84] would take 56,448 bytes a transition, 56 GB per 1M).

Transitions are made as a rollout worker makes them: ``--envs`` sub-envs of the preset's
training wrappers in a SyncVectorEnv (next-step autoreset: the reset step is not a transition),
fragments of ``--fragment`` steps per sub-env, sub-env rows contiguous.

Run: python bench/atari_replay_memory.py [--transitions 200000] [--envs 8] [--fragment 64] [--n-step 1]
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="PongNoFrameskip-v4")
    ap.add_argument("--transitions", type=int, default=200_000)
    ap.add_argument("--envs", type=int, default=8)
    ap.add_argument("--fragment", type=int, default=64)
    a = ap.parse_args()
    import gymnasium as gym
    from flowkit_atari.preset import make_env

    from flowkit.core import EnvContext, replay
    from flowkit.core import batch as sb
    n = a.envs
    vec = gym.vector.SyncVectorEnv([lambda j=j: make_env({"id": a.env}, EnvContext(0, j, 1, 0, j)) for j in range(n)])
    obs, _ = vec.reset(seed=list(range(n)))
    buf = replay.MultiAgentReplayBuffer(a.transitions, seed=0).buffer("default")
    rng = np.random.default_rng(0)
    eps = np.arange(n)
    t = np.zeros(n, np.int64)
    next_eps = n
    pending = np.zeros(n, bool)
    before = first = 0
    added, t0, add_s = 0, time.perf_counter(), 0.0
    while added < a.transitions:
        rows = [[] for _ in range(n)]
        while min(len(r) for r in rows) < a.fragment:
            act = rng.integers(0, vec.single_action_space.n, n)
            nxt, rew, term, trunc, _ = vec.step(act)
            for j in range(n):
                if not pending[j]:
                    rows[j].append((obs[j], act[j], rew[j], term[j], trunc[j] and not term[j], nxt[j], eps[j], t[j]))
            done = (term | trunc) & ~pending
            t = np.where(done, 0, t + ~pending)
            for j in np.flatnonzero(done):
                eps[j], next_eps = next_eps, next_eps + 1
            pending = done
            obs = nxt
        rows = [r[:a.fragment] for r in rows]
        flat = [x for r in rows for x in r]
        cols = list(zip(*flat))
        batch = sb.SampleBatch({sb.OBS: np.stack(cols[0]), sb.ACTIONS: np.asarray(cols[1], np.int64),
                                sb.REWARDS: np.asarray(cols[2], np.float32), sb.TERMINATEDS: np.asarray(cols[3]),
                                sb.TRUNCATEDS: np.asarray(cols[4]), sb.NEXT_OBS: np.stack(cols[5]),
                                sb.EPS_ID: np.asarray(cols[6], np.int64), sb.T: np.asarray(cols[7], np.int64),
                                sb.N_STEPS: np.ones(len(flat), np.int64)})
        s = time.perf_counter()
        buf.add(batch.slice(0, min(len(batch), a.transitions - added)))
        add_s += time.perf_counter() - s
        if not added:  # resident growth from here: the buffer's arrays fill as frames are written
            before, first = rss(), buf.storage.num_added
        added = buf.storage.num_added
    st = buf.storage
    grown = (rss() - before) * st.size / max(1, st.size - first)  # per transition added after the first batch
    live = st.frames_added - int(st.minref[:st.size].min())
    print(f"{a.env}: {added:,} transitions (random actions, {n} sub-envs x {a.fragment}-step fragments), "
          f"{time.perf_counter() - t0:.0f} s ({add_s:.1f} s in replay.add)")
    print(f"frames stored per transition (live rows): {live / st.size:.4f}; frame ring: {st.frame_capacity:,} frames")
    print(f"buffer arrays: {st.nbytes() / st.size:,.0f} bytes a transition -> {st.nbytes() / st.size * 1e6 / 1e9:.2f} GB per 1M")
    print(f"resident growth (VmRSS): {grown / st.size:,.0f} bytes a transition -> {grown / st.size * 1e6 / 1e9:.2f} GB per 1M")
    print("plain uint8 obs + next_obs columns: 56,448 bytes a transition -> 56.45 GB per 1M")
    vec.close()


if __name__ == "__main__":
    main()
