"""Frame replay (issue 23): stacked uint8 frames are stored once each and the stacks rebuilt
exactly -- across episode boundaries, ring wrap-around, n-step windows, prioritized sampling and
a checkpoint round trip -- at about one frame of bytes per transition."""
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
from flowkit_dqn.acting import DQNActing

from flowkit.core import batch as sb
from flowkit.core import replay
from flowkit.core._frames import FrameStorage

H = W = 84
K = 4


class RandomFrames(gym.Env):
    """Random 84x84 uint8 frames; episodes of ``lo``-``hi`` steps (terminated, or truncated at
    ``limit``)."""
    observation_space = gym.spaces.Box(0, 255, (H, W), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, lo=5, hi=40, limit=25):
        self.lo, self.hi, self.limit = lo, hi, limit

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.left, self.t = int(self.np_random.integers(self.lo, self.hi)), 0
        return self.np_random.integers(0, 256, (H, W), dtype=np.uint8), {}

    def step(self, action):
        self.left, self.t = self.left - 1, self.t + 1
        obs = self.np_random.integers(0, 256, (H, W), dtype=np.uint8)
        return obs, float(self.np_random.normal()), self.left == 0, self.t >= self.limit, {}


class NStep(DQNActing):
    def __init__(self, n):
        self.config = SimpleNamespace(n_step=n, gamma=0.9)


def fragments(num_streams: int, frag_len: int, rounds: int, n_step: int, seed: int = 0, episodes=(5, 40, 25)):
    """Batches as rollout workers send them: per round, one fragment of each stream (sub-env
    rows contiguous), through FrameStackObservation(4) and DQN's n-step postprocessing."""
    envs = [gym.wrappers.FrameStackObservation(RandomFrames(*episodes), K) for _ in range(num_streams)]
    obs = [e.reset(seed=seed + i)[0] for i, e in enumerate(envs)]
    eps = list(range(num_streams))
    t = [0] * num_streams
    next_eps = num_streams
    post = NStep(n_step)
    for _ in range(rounds):
        parts = []
        for i, e in enumerate(envs):
            rows = []
            for _ in range(frag_len):
                a = int(e.np_random.integers(2)) if hasattr(e, "np_random") else 0
                nxt, r, term, trunc, _ = e.step(a)
                rows.append({sb.OBS: obs[i], sb.ACTIONS: a, sb.REWARDS: np.float32(r), sb.TERMINATEDS: term,
                             sb.TRUNCATEDS: trunc and not term, sb.NEXT_OBS: nxt, sb.EPS_ID: eps[i], sb.T: t[i]})
                if term or trunc:
                    obs[i], eps[i], t[i] = e.reset()[0], next_eps, 0
                    next_eps += 1
                else:
                    obs[i], t[i] = nxt, t[i] + 1
            piece = sb.SampleBatch({k: np.stack([np.asarray(r[k]) for r in rows]) for k in rows[0]})
            parts.append(post.postprocess_trajectory(piece))
        yield sb.concat_samples(parts)


def same(a: sb.SampleBatch, b: sb.SampleBatch):
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


@pytest.mark.parametrize("n_step,prioritized", [(1, False), (3, True)])
def test_frame_replay_rebuilds_stacks_exactly(n_step, prioritized):
    cap = 300
    kw = dict(alpha=0.6, beta=0.4, eps=1e-6) if prioritized else {}
    frames = replay.MultiAgentReplayBuffer(cap, prioritized, seed=3, **kw).buffer("p")
    plain = replay.ReplayBuffer(cap, (replay.PrioritizedSampler(cap, 0, **kw) if prioritized
                                      else replay.UniformSampler(cap, 0)))
    plain.storage = replay.Storage(cap)  # the reference: every column as it came
    for b in fragments(num_streams=3, frag_len=32, rounds=8, n_step=n_step):  # 768 rows: wraps twice
        frames.add(b)
        plain.storage.add(b)
        assert b[sb.OBS].dtype == np.uint8
    st = frames.storage
    assert isinstance(st, FrameStorage) and len(st) == cap
    every = np.arange(cap)
    same(st.get(every), plain.storage.get(every))  # all live rows, obs and n-step next_obs
    # about one stored frame per transition (not 2 * K): the frames the live rows use
    used = st.frames_added - int(st.minref.min())
    assert used < 1.3 * cap, used
    if prioritized:
        td = np.linspace(0.1, 5.0, 64).astype(np.float32)
        frames.update_priorities(np.arange(64), td)
    # checkpoint round trip: same stacks, same samples afterwards
    state = frames.get_state()
    assert "frames" in state["storage"] and state["storage"]["frames"].nbytes <= 1.3 * cap * H * W
    restored = replay.MultiAgentReplayBuffer(cap, prioritized, seed=99, **kw).buffer("p")
    restored.set_state(state)
    same(restored.storage.get(every), plain.storage.get(every))
    s1, s2 = frames.sample(32), restored.sample(32)
    same(s1, s2)
    same(sb.SampleBatch({k: v for k, v in s1.items() if k not in (sb.BATCH_INDEXES, sb.PRIO_WEIGHTS)}),
         plain.storage.get(s1[sb.BATCH_INDEXES]))
    # adding after the restore keeps working (sharing starts afresh)
    more = next(fragments(num_streams=2, frag_len=16, rounds=1, n_step=n_step, seed=50))
    restored.add(more)
    plain.storage.add(more)
    same(restored.storage.get(every), plain.storage.get(every))


def test_frame_storage_grows_for_frames_that_are_not_shared():
    st = FrameStorage(replay.Storage(50), frame_capacity=60)
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(4):  # no frame repeats: 8 frames a transition, the ring must grow
        b = sb.SampleBatch({sb.OBS: rng.integers(0, 256, (20, K, 16, 16), dtype=np.uint8),
                            sb.NEXT_OBS: rng.integers(0, 256, (20, K, 16, 16), dtype=np.uint8),
                            sb.ACTIONS: np.arange(20)})
        st.add(b)
        rows.append(b)
    ref = sb.concat_samples(rows).slice(30, 80)  # the newest 50 rows, in slot order below
    got = st.get((np.arange(30, 80)) % 50)
    same(got, ref)
    assert st.frame_capacity >= 50 * 2 * K


def test_frame_replay_bytes_per_transition_fit_1m_in_7_5_gb():
    cap = 2000
    buf = replay.MultiAgentReplayBuffer(cap, seed=0).buffer("p")
    # episodes of 100-1000 steps (Pong's games with frame skip 4 are about 800-1000)
    # (a row's stack reaches back into its stream's previous fragment: one round of all streams,
    # 64 rows here, small against the capacity as 16 sub-envs x 64 steps are against 1M)
    for b in fragments(num_streams=4, frag_len=16, rounds=36, n_step=1, episodes=(100, 1000, 1000)):
        buf.add(b)
    st = buf.storage
    frames_per_row = (st.frames_added - int(st.minref.min())) / cap  # frames the live rows use
    assert frames_per_row < 1.04, frames_per_row
    assert st.frame_capacity == 2126 and st.nbytes() / cap < 7700  # no growth; 56,448 as stacked columns
    # a 1M buffer allocates its ring by the same rule: frames, ids and the other columns
    big = FrameStorage(replay.Storage(1_000_000))
    per_row = (st.refs.nbytes + st.minref.nbytes + sum(v.nbytes for v in st.rest.cols.values())) / cap
    total = big.frame_capacity * (H * W + 8) + 1_000_000 * per_row
    assert big.frame_capacity >= 1_000_000 * frames_per_row and total <= 7.5e9, total
