"""Replay buffers and operators (issue 3, part 1): storage ring, prioritized sampling
probabilities and importance weights on a 4-item buffer (hand-computed), exact state
round-trips, the Replay source, and the Ape-X shard operators on the Ray backend."""
import numpy as np
import pytest

from flowkit.core import batch as sb
from flowkit.core.flow import NOT_READY, FlowContext, Sourced
from flowkit.core.learner import Learner
from flowkit.core.ops import UpdatePriorities, UpdateTargetNetwork
from flowkit.core.replay import (MultiAgentReplayBuffer, PrioritizedSampler, Replay, ReplayBuffer,
                                 ReplayFromShards, ReplayShards, Storage, StoreToReplayBuffer,
                                 StoreToReplayShards, UniformSampler)


def rows(start, n):
    x = np.arange(start, start + n)
    return sb.SampleBatch({sb.OBS: x.astype(np.float32)[:, None], sb.ACTIONS: x % 2,
                           sb.REWARDS: x.astype(np.float32)})


def test_storage_ring_overwrites_oldest():
    st = Storage(3)
    assert st.add(rows(0, 2)).tolist() == [0, 1]
    assert st.add(rows(2, 3)).tolist() == [2, 0, 1]
    assert len(st) == 3 and st.next_idx == 2 and st.num_added == 5
    assert st.cols[sb.REWARDS].tolist() == [3.0, 4.0, 2.0]
    # a batch larger than the capacity keeps its newest rows
    st2 = Storage(2)
    st2.add(rows(0, 5))
    assert sorted(st2.cols[sb.REWARDS].tolist()) == [3.0, 4.0]
    with pytest.raises(ValueError, match="columns"):
        st.add(sb.SampleBatch({sb.OBS: np.zeros((1, 1), np.float32)}))


def test_prioritized_probabilities_and_weights_4_items():
    # priorities p = |td| + eps = [1, 4, 9, 16]; alpha = 0.5 -> p^alpha = [1, 2, 3, 4]
    eps = 1e-6
    s = PrioritizedSampler(4, seed=0, alpha=0.5, beta=0.5, eps=eps)
    s.on_add(np.arange(4))
    s.update(np.arange(4), np.array([1.0, 4.0, 9.0, 16.0]) - eps)
    np.testing.assert_allclose(s.probabilities(4), [0.1, 0.2, 0.3, 0.4], rtol=1e-9)
    # w_i = (N P(i))^-beta / max_j (N P(j))^-beta = (P(i) / P_min)^-0.5
    idx, w = s.sample(4, 4000)
    expect = {0: 1.0, 1: 1 / np.sqrt(2), 2: 1 / np.sqrt(3), 3: 0.5}
    for i, wi in zip(idx[:20], w[:20]):
        assert wi == pytest.approx(expect[int(i)], rel=1e-6)
    # stratified draws: empirical frequencies match P(i)
    counts = np.bincount(idx, minlength=4) / len(idx)
    np.testing.assert_allclose(counts, [0.1, 0.2, 0.3, 0.4], atol=0.02)
    # alpha = 1, beta = 1: P = p / sum p, w = P_min / P
    s1 = PrioritizedSampler(4, seed=1, alpha=1.0, beta=1.0, eps=eps)
    s1.on_add(np.arange(4))
    s1.update(np.arange(4), np.array([1.0, 2.0, 3.0, 4.0]) - eps)
    idx, w = s1.sample(4, 400)
    np.testing.assert_allclose(w, 1.0 / (idx + 1.0), rtol=1e-6)
    # new rows get the largest priority seen (4): P = 4/ (1+2+3+4+4)... on a 5th slot
    s2 = PrioritizedSampler(5, seed=2, alpha=1.0, beta=1.0, eps=eps)
    s2.on_add(np.arange(4))
    s2.update(np.arange(4), np.array([1.0, 2.0, 3.0, 4.0]) - eps)
    s2.on_add(np.array([4]))
    np.testing.assert_allclose(s2.probabilities(5), np.array([1, 2, 3, 4, 4]) / 14.0, rtol=1e-6)


def test_uniform_buffer_sample_columns_and_state_roundtrip():
    buf = ReplayBuffer(10, UniformSampler(10, seed=3))
    buf.add(rows(0, 7))
    a = buf.sample(5)
    assert set(a) == {sb.OBS, sb.ACTIONS, sb.REWARDS, sb.BATCH_INDEXES, sb.PRIO_WEIGHTS}
    assert a[sb.PRIO_WEIGHTS].tolist() == [1.0] * 5
    np.testing.assert_array_equal(a[sb.REWARDS], a[sb.BATCH_INDEXES].astype(np.float32))
    st = buf.get_state()
    buf2 = ReplayBuffer(10, UniformSampler(10, seed=99))
    buf2.set_state(st)
    for _ in range(3):
        x, y = buf.sample(4), buf2.sample(4)
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


def test_prioritized_multiagent_state_roundtrip_and_no_replay_warning():
    m = MultiAgentReplayBuffer(8, prioritized=True, seed=5)
    m.add(sb.MultiAgentBatch({"a": rows(0, 6), "b": rows(10, 3)}, env_steps=6))
    m.update_priorities({"a": (np.array([0, 1]), np.array([3.0, 0.5]))})
    st = m.get_state()
    m2 = MultiAgentReplayBuffer(8, prioritized=True, seed=5)
    m2.set_state(st)
    x, y = m.sample(3), m2.sample(3)
    assert set(x.policy_batches) == {"a", "b"} and x.env_steps == 3
    for pid in ("a", "b"):
        for k in x[pid]:
            np.testing.assert_array_equal(x[pid][k], y[pid][k])
    assert m.sample(4).policy_batches.keys() == {"a"}  # b holds only 3 rows
    empty = MultiAgentReplayBuffer(8, prioritized=True, seed=5)
    with pytest.warns(UserWarning, match="include_replay=false"):
        empty.set_state(m.get_state(include_replay=False))
    assert empty.sizes() == {"a": 0, "b": 0}
    assert empty.buffers["a"].sampler.rng.bit_generator.state == m.buffers["a"].sampler.rng.bit_generator.state


class _Ctx(FlowContext):
    pass


def test_replay_source_not_ready_until_learning_starts():
    ctx = _Ctx()
    buf = MultiAgentReplayBuffer(100, seed=0)
    store = StoreToReplayBuffer(buf)
    src = Replay(ctx, buf, batch_size=4, learning_starts=10, wait_s=0.0)
    assert next(src) is NOT_READY
    store(sb.MultiAgentBatch({"p": rows(0, 6)}, env_steps=6))
    ctx.counters["env_steps_sampled"] += 6
    assert next(src) is NOT_READY  # 6 < learning_starts
    store(sb.MultiAgentBatch({"p": rows(6, 6)}, env_steps=6))
    ctx.counters["env_steps_sampled"] += 6
    b = next(src)
    assert isinstance(b, sb.MultiAgentBatch) and len(b["p"]) == 4 and b.env_steps == 4


class _Pol:
    def __init__(self):
        self.num_updates, self.targets = 0, []
        self.target = self  # the policy's TargetNetwork

    def update(self):
        self.targets.append(self.num_updates)


def test_update_target_network_every_n_gradient_steps():
    ctx = _Ctx()
    pol = _Pol()
    op = UpdateTargetNetwork(ctx, Learner("dqn", {"p": pol}, ["p"]), 3)
    for _ in range(10):
        pol.num_updates += 1
        op({"stats": {"p": {"num_sgd_steps": 1}}})
    assert pol.targets == [3, 6, 9]


@pytest.mark.ray
@pytest.mark.slow
def test_replay_shards_on_ray_priorities_go_back_to_source(ray_session):
    import ray
    # both CPUs held by other actors: shards must still schedule (num_cpus=0)
    hog = ray.remote(num_cpus=1)(type("Hog", (), {"ping": lambda self: 1}))
    hogs = [hog.remote() for _ in range(2)]
    ray.get([h.ping.remote() for h in hogs])
    ctx = _Ctx()

    class TDPol:
        td_error = None
    learner = Learner("dqn", {"p": TDPol()}, ["p"])
    shards = ReplayShards("ray", 2, capacity=40, batch_size=4, learning_starts=8, prioritized=True,
                          alpha=1.0, beta=1.0, eps=1e-6, seed=0)
    try:
        store = StoreToReplayShards(shards)
        for i in range(4):
            store(sb.MultiAgentBatch({"p": rows(10 * i, 5)}, env_steps=5))
        flow = ReplayFromShards(ctx, shards, num_async=1).zip_with_source_actor()
        got = [x for x in flow.take(4)]
        assert all(len(b["p"]) == 4 for _, b in got)
        shard, b = got[0]
        pb = b["p"]
        assert not pb[sb.OBS].flags.writeable  # arrays from Ray are read-only; nothing mutates them
        learner.policies["p"].td_error = np.full(4, 7.0, np.float32)
        UpdatePriorities(learner)(Sourced(shard, {"batch": b, "stats": {"p": {}}}))
        states = shards.get_state()["shards"]
        tree = [PrioritizedSampler(20, 0, 1.0, 1.0, 1e-6) for _ in range(2)]
        for t, s in zip(tree, states):
            t.set_state(s["buffers"]["p"]["sampler"])
        # the serving shard has the new priority 7 on the replayed slots, the other none
        leaves = tree[shard.index].sum.leaves(10)
        np.testing.assert_allclose(leaves[pb[sb.BATCH_INDEXES]], 7.0 + 1e-6)
        assert tree[1 - shard.index].sum.leaves(10).max() == 1.0
    finally:
        shards.stop()
        for h in hogs:
            ray.kill(h)
