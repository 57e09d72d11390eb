"""The Learner (update loop counts, minibatch order, versions, thread mode: back-pressure,
crashes, stop and restart) and the two operators around it (TrainOneStep, SyncWeights)."""
import queue
import time
import traceback
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import nn

from flowkit.core import batch as sb
from flowkit.core.flow import NOT_READY, FlowContext, Sourced, from_items
from flowkit.core.learner import Learner
from flowkit.core.metrics import Metrics
from flowkit.core.ops import SyncWeights, TrainOneStep
from flowkit.core.policy import Policy


class LinPolicy(Policy):
    """y = w.x + b; loss = mean(y^2); records every minibatch's x column."""

    def __init__(self, seed=0, explode=False):
        super().__init__(spaces.Box(-1, 1, (2,)), spaces.Discrete(2), SimpleNamespace(max_grad_norm=1.0))
        torch.manual_seed(seed)
        self.model = nn.Linear(2, 1)
        self.optimizer = self.make_optimizer(0.1)
        self.seen, self.prepared, self.explode = [], 0, explode

    def prepare_batch(self, batch):
        self.prepared += 1
        return super().prepare_batch(batch)

    def loss(self, batch):
        if self.explode:
            raise FloatingPointError("loss exploded")
        self.seen.append(batch["x"][:, 0].tolist())
        out = self.model(batch["x"]).pow(2).mean()
        return out, {"loss": float(out.detach())}


def _mab(n=10, version=0, pid="p"):
    x = np.stack([np.arange(n, dtype=np.float32), np.ones(n, np.float32)], 1)
    return sb.MultiAgentBatch({pid: sb.SampleBatch({"x": x})}, n, meta={"weights_version": version})


class FakeWorkers:
    backend = "local"
    num_restarts = 0

    def __init__(self):
        self.calls = []

    def sync_weights(self, weights, actors=None, version=None, with_next_sample=False):
        self.calls.append((None if actors is None else [a.index for a in actors], version, with_next_sample))


class FakeCtx(FlowContext):
    def __init__(self):
        super().__init__()
        self.metrics, self.workers = Metrics(), FakeWorkers()


def test_update_runs_epochs_times_minibatches_sgd_steps_and_versions_the_weights():
    pol = LinPolicy()
    lr = Learner("g", {"p": pol}, num_epochs=3, minibatch_size=4, rng=np.random.default_rng(0))
    v0, w0 = lr.get_weights()
    assert v0 == 0 and lr.get_weights()[1] is w0          # cached per version
    out = lr.update(_mab(10))
    st = out["stats"]["p"]
    assert out["num_updates"] == 9 and st["num_sgd_steps"] == 9 and st["train_batch_size"] == 10
    assert [len(m) for m in pol.seen] == [4, 4, 2] * 3     # ceil(10 / 4) minibatches per epoch
    for e in range(3):                                     # each epoch a permutation of all rows
        assert sorted(sum(pol.seen[3 * e:3 * e + 3], [])) == list(range(10))
    assert pol.seen[0:3] != pol.seen[3:6]                  # reshuffled every epoch
    assert pol.prepared == 1 and pol.num_updates == 9 and out["policy_lag"] == [0]
    v1, w1 = lr.get_weights()
    assert v1 == 9 and not np.array_equal(w1["p"]["weight"], w0["p"]["weight"])
    lr.update(_mab(10, version=9))
    assert lr.get_weights()[0] == 18 and lr.get_state() == {"num_updates": 18, "env_steps_trained": 20}


def test_contiguous_minibatches_keep_rows_in_order_and_prepare_each_slice():
    pol = LinPolicy()
    lr = Learner("g", {"p": pol}, num_epochs=2, minibatch_size=4, contiguous=True)
    lr.update(_mab(10))
    assert pol.seen == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] * 2 and pol.prepared == 3


def test_untrainable_policies_and_other_policies_rows_are_not_trained():
    frozen, trained = LinPolicy(), LinPolicy()
    lr = Learner("g", {"frozen": frozen, "p": trained}, trainable=["p"])
    b = sb.MultiAgentBatch.concat([_mab(4, pid="frozen"), _mab(6, pid="p")])
    out = lr.update(b)
    assert list(out["stats"]) == ["p"] and frozen.seen == [] and len(trained.seen) == 1
    assert out["agent_steps"] == 6 and out["num_updates"] == 1


def test_train_one_step_counts_into_the_context():
    ctx = FakeCtx()
    lr = Learner("g", {"p": LinPolicy()})
    op = TrainOneStep(ctx, lr, num_epochs=2, minibatch_size=5)
    assert op.name == "TrainOneStep(num_epochs=2, minibatch_size=5)"
    op(_mab(10))
    assert ctx.counters["env_steps_trained"] == 10 and ctx.counters["agent_steps_trained"] == 10
    assert ctx.counters["num_updates"] == 4 and ctx.metrics.learner_stats["p"]["num_sgd_steps"] == 4


def _pull(flow, n, timeout_s=10.0):
    out, t0 = [], time.time()
    while len(out) < n:
        assert time.time() - t0 < timeout_s, "timed out"
        x = next(flow)
        if x is not NOT_READY:
            out.append(x)
    return out


def test_thread_mode_trains_in_the_background_with_policy_lag_and_stops():
    ctx = FakeCtx()
    lr = Learner("g", {"p": LinPolicy()})
    batches = [_mab(4, version=0), sb.MultiAgentBatch.concat([_mab(3, 0), _mab(5, 1)])]
    flow = TrainOneStep(ctx, lr).in_thread(from_items(batches, ctx=ctx), queue_size=1)
    try:
        outs = _pull(flow, 2)
        assert lr.threaded and lr._thread.name == "g-learner"
    finally:
        lr.stop()
    assert not lr.threaded
    assert ctx.counters["env_steps_trained"] == 12 and ctx.counters["num_updates"] == 2
    assert outs[0]["policy_lag"] == [0] and outs[1]["policy_lag"] == [1, 0]  # updates before - version
    assert ctx.metrics.learner_stats["p"]["policy_lag_max"] == 1.0
    # restart: the same learner trains again in a new thread
    flow = TrainOneStep(ctx, lr).in_thread(from_items([_mab(4, version=2)], ctx=ctx))
    try:
        _pull(flow, 1)
    finally:
        lr.stop()
    assert lr.get_state() == {"num_updates": 3, "env_steps_trained": 16}


def test_thread_mode_full_queue_is_not_ready_and_keeps_the_item():
    ctx = FakeCtx()
    lr = Learner("g", {"p": LinPolicy()})
    lr.inqueue = queue.Queue(maxsize=1)
    lr.start = lambda queue_size: None            # no consumer: the queue stays full
    items = [_mab(1), _mab(2)]
    put = TrainOneStep(ctx, lr).in_thread(from_items(items, ctx=ctx), wait_s=0.001).parents[0].parents[0]
    assert next(put) is items[0]
    assert next(put) is NOT_READY and next(put) is NOT_READY
    assert lr.inqueue.get_nowait() is items[0]
    assert next(put) is items[1] and ctx.counters["learner_queue_full"] == 2


def test_a_crash_in_the_learner_thread_surfaces_with_its_type_traceback_and_a_note():
    ctx = FakeCtx()
    lr = Learner("g", {"p": LinPolicy(explode=True)})
    flow = TrainOneStep(ctx, lr).in_thread(from_items([_mab(), _mab()], ctx=ctx))
    with pytest.raises(FloatingPointError, match="loss exploded") as ei:
        for _ in range(2000):
            next(flow)
    frames = [f.name for f in traceback.extract_tb(ei.value.__traceback__)]
    assert "loss" in frames and "_run" in frames
    assert "[flowkit] raised in the learner thread (g-learner)" in ei.value.__notes__
    lr.stop()


class _Actor:
    def __init__(self, index):
        self.index = index


def test_sync_weights_to_all_every_n_env_steps_trained():
    ctx = FakeCtx()
    lr = Learner("g", {"p": LinPolicy()})
    op = SyncWeights(ctx, lr, every=20)
    for trained in (10, 19, 20, 35, 40, 41):
        ctx.counters["env_steps_trained"] = trained
        lr.num_updates = trained                   # the version the weights carry
        assert op("item") == "item"
    assert ctx.workers.calls == [(None, 20, False), (None, 40, False)]
    every_item = SyncWeights(ctx, lr)
    every_item(1)
    every_item(2)
    assert ctx.workers.calls[2:] == [(None, 41, False), (None, 41, False)]


def test_sync_weights_to_the_source_every_n_batches_per_worker():
    ctx = FakeCtx()
    lr = Learner("g", {"p": LinPolicy()})
    op = SyncWeights(ctx, lr, to="source", every=2, unit="batches", with_next_sample=True)
    assert op.name == "SyncWeights(to=source, every=2 batches, with next sample)"
    a0, a1 = _Actor(0), _Actor(1)
    for k in range(4):
        lr.num_updates += 1
        assert op(Sourced(a0, "b0")) == Sourced(a0, "b0")
        op(Sourced(a1, "b1"))
    # each worker's 2nd and 4th batch trigger a sync, with the version at that time
    assert ctx.workers.calls == [([0], 2, True), ([1], 2, True), ([0], 4, True), ([1], 4, True)]


def test_sync_weights_to_source_skips_known_versions_and_serves_a_restarted_worker_at_once():
    ctx = FakeCtx()
    lr = Learner("g", {"p": LinPolicy()})
    op = SyncWeights(ctx, lr, to="source", every=100, unit="env_steps")
    a0 = _Actor(0)
    op(Sourced(a0, 1))                                     # never synced: at once
    ctx.counters["env_steps_trained"] = 50
    op(Sourced(a0, 2))                                     # 50 < 100 env steps: nothing
    ctx.counters["env_steps_trained"] = 100
    op(Sourced(a0, 3))                                     # due, but the version is unchanged: nothing
    restarted = _Actor(0)                           # same index, new actor
    op(Sourced(restarted, 4))
    lr.num_updates = 7
    ctx.counters["env_steps_trained"] = 200
    op(Sourced(restarted, 5))
    assert ctx.workers.calls == [([0], 0, False), ([0], 0, False), ([0], 7, False)]
    assert ctx.counters["num_weight_pushes"] == 3


def test_restored_learner_versions_the_workers_first_weights():
    from flowkit.engine import load_config, setup
    pm, cfg = load_config(["algo=ppo", "env=CartPole-v1", "runtime.backend=local"])
    ctx = setup(cfg, pm)
    lr = ctx.add_learner("ppo", ["default"])
    assert ctx.learners == {"ppo": lr} and ctx.stateful["ppo/learner"] is lr and ctx.trainable_policies == {"default"}
    lr.set_state({"num_updates": 37, "env_steps_trained": 1000})
    assert lr.get_weights()[0] == 37
    ctx.workers.weights_fn()
    assert ctx.workers.weights_version == 37


def test_flat_adam_matches_torch_adam_bit_for_bit_and_its_state_round_trips():
    # on CPU FlatAdam runs torch's fused kernel: the same updates as torch.optim.Adam(fused=True)
    from flowkit.core.policy import FlatAdam
    torch.manual_seed(0)
    ref, flat = torch.randn(50, requires_grad=True), torch.zeros(50)
    flat.copy_(ref.detach())
    adam, mine = torch.optim.Adam([ref], lr=3e-3, eps=1e-7, fused=True), FlatAdam(flat, 3e-3, eps=1e-7)
    for i in range(5):
        g = torch.randn(50)
        ref.grad, flat.grad = g.clone(), g.clone()
        adam.param_groups[0]["lr"] = mine.param_groups[0]["lr"] = 3e-3 * (1 - i / 10)
        adam.step()
        mine.step()
        assert torch.equal(ref.detach(), flat)
    sd = mine.state_dict()
    assert sd["param_groups"] == adam.state_dict()["param_groups"]
    assert all(torch.equal(sd["state"][0][k], v) for k, v in adam.state_dict()["state"][0].items())
    again = FlatAdam(flat.clone(), 1.0)
    again.load_state_dict(adam.state_dict())  # a checkpoint written with torch.optim.Adam
    g = torch.randn(50)
    ref.grad, flat.grad, again.flat.grad = g.clone(), g.clone(), g.clone()
    adam.step()
    mine.step()
    again.step()
    assert torch.equal(ref.detach(), flat) and torch.equal(flat, again.flat)


@pytest.mark.slow
def test_a_policys_optimizer_steps_without_importing_torch_dynamo():
    """Why FlatAdam/FlatRMSprop exist (see FlatAdam's docstring): building and stepping a PPO
    and an A2C-RMSprop optimizer must not import torch._dynamo, which torch.optim's
    constructor does (1.3 s per learning process)."""
    import subprocess
    import sys
    code = ("import sys\nfrom flowkit.engine import load_config, setup\n"
            "for algo, extra in (('ppo', []), ('a2c', ['a2c.optimizer=rmsprop'])):\n"
            "    pm, cfg = load_config([f'algo={algo}', 'env=CartPole-v1', 'runtime.backend=local', *extra])\n"
            "    pol = setup(cfg, pm).add_learner(algo, ['default']).policies['default']\n"
            "    pol._flat.grad = pol._flat.detach().clone()\n"
            "    pol.optimizer.step()\n"
            "    print(type(pol.optimizer).__name__, 'torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["FlatAdam", "False", "FlatRMSprop", "False"], out.stdout


def test_reuse_freed_memory_serves_a_learners_large_blocks_without_fresh_page_faults():
    # learner.reuse_freed_memory (the default): a 40 MB block freed and allocated again (a
    # minibatch's tensors) comes back from the heap; glibc's default maps it fresh each time
    # (10,240 pages faulted in). In a child: mallopt settings stay for a process's life.
    import subprocess
    import sys
    code = """
import resource, torch
from flowkit.core.workers import reuse_freed_memory
def faults():
    out = []
    for _ in range(10):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        a = torch.ones(10 << 20); del a
        out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    return min(out[7:])  # (steady state: the first few blocks may not fit the holes small ones left)
before = faults()
print(before, reuse_freed_memory() and faults())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, after = out.stdout.split()
    if after == "False":
        pytest.skip("not glibc: no mallopt")
    assert int(before) >= 9000 and int(after) < 500, out.stdout
