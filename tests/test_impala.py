"""IMPALA (V-trace itself: test_returns.py): per-trajectory ends inside a batch, contiguous
minibatches, the replay mix-in, both plans (the learner in its thread, weights to the source
worker), and learning CartPole on Ray with 2 workers. The Learner and its operators have their
own tests in test_learner.py."""
import os
import threading
import traceback

import gymnasium as gym
import numpy as np
import pytest
import torch

import flowkit
from flowkit.testing import local_overrides
from flowkit.checkpoint import load_state
from flowkit.core import batch as sb
from flowkit.core.flow import FlowContext
from flowkit.core.learner import Learner, weights_versions
from flowkit.engine import load_config, setup
from flowkit_impala.impala import IMPALAPolicy, MixInReplay
from test_returns import paper_vtrace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _policy(gamma=0.9, **kw):
    _, cfg = load_config(["algo=impala", "env=CartPole-v1", f"impala.gamma={gamma}",
                          *[f"impala.{k}={v}" for k, v in kw.items()]])
    from flowkit.config import section_object
    from flowkit_impala import IMPALAConfig
    sec = section_object(cfg, "impala", IMPALAConfig)
    obs_space = gym.spaces.Box(-10.0, 10.0, (1,), np.float32)
    return IMPALAPolicy(obs_space, gym.spaces.Discrete(2), sec, cfg.model, "cpu", 0)


def test_trajectory_ends_inside_a_batch_are_handled_per_trajectory():
    """Three pieces in one batch, V(x) = 10 * obs (value net replaced): rows 0-1 truncated
    (bootstrap V(next_obs)=7), rows 2-3 terminated (no bootstrap), row 4 cut by the fragment
    end with another eps_id (bootstrap V(next_obs)=9). Ratios off 1, so traces matter."""
    pol = _policy(gamma=0.9, clip_c_threshold=0.8)
    pol.model.value = lambda obs: 10.0 * obs[:, 0]
    obs = np.array([[0.1], [0.2], [0.3], [0.4], [0.5]], np.float32)
    nxt = np.array([[0.2], [0.7], [0.4], [0.6], [0.9]], np.float32)
    b = sb.SampleBatch({sb.OBS: obs, sb.NEXT_OBS: nxt, sb.ACTIONS: np.zeros(5, np.int64),
                        sb.REWARDS: np.array([1, 2, 3, 4, 5], np.float32),
                        sb.TERMINATEDS: np.array([0, 0, 0, 1, 0], bool),
                        sb.TRUNCATEDS: np.array([0, 1, 0, 0, 0], bool),
                        sb.EPS_ID: np.array([7, 7, 8, 8, 9]), sb.ACTION_LOGP: np.zeros(5, np.float32)})
    tb = pol.prepare_batch(b)
    log_rhos = torch.log(torch.tensor([1.5, 0.6, 0.9, 2.0, 0.7]))
    values = pol.model.value(tb[sb.OBS])
    vs, adv = pol.vtrace_targets(tb, log_rhos, values)
    lr, r, v = log_rhos.numpy(), b[sb.REWARDS], values.numpy()
    refs = [paper_vtrace(lr[0:2], r[0:2], v[0:2], 7.0, 0.9, 1.0, 0.8, 1.0),
            paper_vtrace(lr[2:4], r[2:4], v[2:4], 0.0, 0.9, 1.0, 0.8, 1.0),
            paper_vtrace(lr[4:5], r[4:5], v[4:5], 9.0, 0.9, 1.0, 0.8, 1.0)]
    np.testing.assert_allclose(vs.numpy(), np.concatenate([x[0] for x in refs]), atol=1e-5)
    np.testing.assert_allclose(adv.numpy(), np.concatenate([x[1] for x in refs]), atol=1e-5)
    assert tb["boot_idx"].tolist() == [1, 4]


def test_loss_is_finite_and_minibatches_are_contiguous_cuts():
    pol = _policy(minibatch_size=3, num_epochs=2, train_batch_size=8)
    rng = np.random.default_rng(0)
    n = 8
    b = sb.SampleBatch({sb.OBS: rng.normal(size=(n, 1)).astype(np.float32),
                        sb.NEXT_OBS: rng.normal(size=(n, 1)).astype(np.float32),
                        sb.ACTIONS: rng.integers(0, 2, n), sb.REWARDS: np.ones(n, np.float32),
                        sb.TERMINATEDS: np.zeros(n, bool), sb.TRUNCATEDS: np.zeros(n, bool),
                        sb.EPS_ID: np.zeros(n, np.int64), sb.ACTION_LOGP: np.full(n, np.log(0.5), np.float32)})
    before = {k: v.clone() for k, v in pol.model.state_dict().items()}
    learner = Learner("impala", {"default": pol}, num_epochs=2, minibatch_size=3, contiguous=True)
    st = learner.update(sb.MultiAgentBatch({"default": b}, n))["stats"]["default"]
    assert st["num_sgd_steps"] == 2 * 3 and st["train_batch_size"] == 8 and learner.num_updates == 6
    assert all(np.isfinite(v) for v in st.values())
    assert any(not torch.equal(before[k], v) for k, v in pol.model.state_dict().items())


# ---- helpers -----------------------------------------------------------------------------------
class FakeCtx(FlowContext):
    pass


def _mab(n=4, version=0, worker=0):
    pb = sb.SampleBatch({sb.REWARDS: np.ones(n, np.float32)})
    return sb.MultiAgentBatch({"default": pb}, n, worker_index=worker, meta={"weights_version": version})


def test_weights_versions_of_nested_concats():
    b = sb.MultiAgentBatch.concat([sb.MultiAgentBatch.concat([_mab(1, 3), _mab(1, 4)]), _mab(1, 5)])
    assert weights_versions(b) == [3, 4, 5]


def test_mix_in_replay_proportion_and_no_double_counted_episodes():
    ctx = FakeCtx()
    rep = MixInReplay(ctx, replay_proportion=1.5, capacity=3, seed=0)
    total = 0
    for i in range(200):
        b = _mab(2, worker=i)
        b.episodes.append({"return": 1.0})
        out = rep(b)
        assert out[0] is b
        assert all(o.episodes == [] for o in out[1:])
        total += len(out) - 1
    assert len(rep.buffer) == 3
    assert 1.3 * 199 < total < 1.7 * 199            # 1 or 2 per batch, 1.5 on average
    assert ctx.counters["env_steps_replayed"] == 2 * total


# ---- runs --------------------------------------------------------------------------------------
def test_plan_shows_the_impala_graph():
    d = flowkit.describe_plan(["algo=impala", "env=CartPole-v1"])
    text = d["text"]
    for op in ("Concurrently(async", "to the learner thread (queue 2)", "results of the learner thread",
               "TrainOneStep(num_epochs=1, minibatch_size=None, contiguous)", "ConcatBatches(500)",
               "SyncWeights(to=source, every=1 batches, with next sample)", "zip_with_source_actor",
               "ParallelRollouts(async"):
        assert op in text, text
    assert not any(t.name.startswith("impala-learner") for t in threading.enumerate())  # nothing started
    d = flowkit.describe_plan(["algo=impala", "env=CartPole-v1", "impala.rollout_mode=bulk_sync"])
    assert "TrainOneStep(num_epochs=1" in d["text"] and "SyncWeights(to=all)" in d["text"]
    assert "learner thread" not in d["text"]


def test_bad_impala_config_fails_naming_the_key():
    with pytest.raises(flowkit.ConfigError, match="impala.rollout_mode"):
        flowkit.describe_plan(["algo=impala", "env=CartPole-v1", "impala.rollout_mode=sync"])
    with pytest.raises(flowkit.ConfigError, match="impala.minibatch_size"):
        flowkit.describe_plan(["algo=impala", "env=CartPole-v1", "impala.minibatch_size=1000"])
    with pytest.raises(flowkit.ConfigError, match="impala.lr_schedule=linear needs a horizon"):
        flowkit.describe_plan(["algo=impala", "env=CartPole-v1", "impala.lr_schedule=linear"])


@pytest.mark.parametrize("mode", ["async", "bulk_sync"])
def test_linear_lr_schedule_follows_env_steps_sampled(run_dir, mode):
    # lr = 1e-3 * (1 - sampled / 256), set as each 64-step train batch is formed: the last of
    # 128 sampled env steps trains at 5e-4 (async: the learner thread, same value)
    res = flowkit.train(local_overrides(run_dir, "algo=impala", "env=CartPole-v1", f"impala.rollout_mode={mode}",
                                        "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=16",
                                        "impala.train_batch_size=64", "impala.lr=1e-3", "impala.lr_schedule=linear",
                                        "impala.schedule_env_steps=256", "stop.env_steps=128",
                                        "checkpoint.at_end=false"))
    m = res.metrics
    if mode == "bulk_sync":
        assert m["env_steps_sampled"] == 128
        assert m["learner/default/lr"] == pytest.approx(5e-4)
    else:
        # the sampler runs beside the learner thread, so the stop check may find one or two more
        # 32-step items sampled; the lr is that of the last batch trained, formed at
        # env_steps_trained sampled steps (no replay: every sampled step is trained once, in order)
        assert 128 <= m["env_steps_sampled"] <= 128 + 2 * 32
        assert m["env_steps_trained"] in (128, 192)
        assert m["learner/default/lr"] == pytest.approx(1e-3 * (1 - m["env_steps_trained"] / 256))


@pytest.mark.parametrize("mode", ["async", "bulk_sync"])
def test_local_run_reports_lag_queue_and_cpu_and_checkpoints(run_dir, mode):
    res = flowkit.train(local_overrides(run_dir, "algo=impala", "env=CartPole-v1", f"impala.rollout_mode={mode}",
                                        "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=16",
                                        "impala.train_batch_size=64", "impala.replay_proportion=0.5",
                                        "stop.time_s=2.5", "run.min_iter_time_s=0.5"))
    m = res.metrics                          # perf/* figures are refreshed once a second
    assert m["env_steps_sampled"] > 0
    assert m["env_steps_trained"] > 0 and np.isfinite(m["learner/default/total_loss"])
    assert m["learner/default/policy_lag_mean"] >= 0
    assert "perf/cpu_util_driver" in m and "perf/learner_queue_size" in m
    st = load_state(res.checkpoint)
    # the learner may have finished updates the results branch has not counted yet
    assert st["stateful"]["impala/learner"]["num_updates"] >= st["counters"]["num_updates"] > 0
    assert st["stateful"]["impala/replay"]["buffer"]


def test_box_actions_train(run_dir):
    res = flowkit.train(local_overrides(run_dir, "algo=impala", "env=Pendulum-v1", "runtime.num_envs_per_worker=2",
                                        "runtime.rollout_fragment_length=32", "impala.train_batch_size=128",
                                        "stop.env_steps=1000"))
    assert np.isfinite(res.metrics["learner/default/total_loss"])
    assert np.isfinite(res.metrics["learner/default/entropy"])


def test_learner_thread_crash_stops_the_run_with_the_original_error(run_dir, monkeypatch):
    def boom(self, batch):
        raise FloatingPointError("loss exploded")
    monkeypatch.setattr(IMPALAPolicy, "loss", boom)
    with pytest.raises(FloatingPointError, match="loss exploded") as ei:
        flowkit.train(local_overrides(run_dir, "algo=impala", "env=CartPole-v1", "runtime.num_envs_per_worker=2",
                                      "runtime.rollout_fragment_length=16", "impala.train_batch_size=32",
                                      "stop.env_steps=5000", "checkpoint.at_end=false"))
    assert "boom" in [f.name for f in traceback.extract_tb(ei.value.__traceback__)]


@pytest.mark.slow
def test_async_plan_on_ray_workers(run_dir, ray_session):
    """The operators on the Ray backend (read-only arrays, RayActor weight pushes, remote
    worker CPU figures), a few seconds."""
    res = flowkit.train([f"run.dir={run_dir}", "run.reporters=[csv,checkpoint,evaluation]", "algo=impala",
                         "env=CartPole-v1", "runtime.backend=ray", "runtime.num_workers=2",
                         "runtime.num_envs_per_worker=4", "runtime.rollout_fragment_length=16",
                         "impala.train_batch_size=64", "stop.time_s=3", "run.min_iter_time_s=0.5",
                         "checkpoint.at_end=false"])
    m = res.metrics
    assert m["env_steps_trained"] > 0 and np.isfinite(m["learner/default/total_loss"])
    assert 0 <= m["learner/default/policy_lag_max"] <= 20
    assert m["perf/cpu_util_workers"] > 0


@pytest.mark.slow
def test_impala_solves_cartpole_two_ray_workers(run_dir):
    """configs/impala/CartPole-v1.yaml as the README runs it (``flowkit train``, its own process
    and Ray session): 2 Ray workers, episode_return_mean >= 450 within 500,000 env steps (10-55 s
    on 2 shared cores; more seeds: bench/impala.py --acceptance). Async runs are not
    reproducible; with ent_coef 0.01 and two sample requests in flight per worker 3 of 14 seeds
    collapsed to return 9-10 (this test failed in CI at 431 by 500k); the config's settings
    solved 28 of 28 seeds (its comment has the figures)."""
    import json
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "flowkit.cli", "train", "-c", os.path.join(REPO, "configs", "impala",
                        "CartPole-v1.yaml"), f"run.dir={run_dir}", "run.reporters=[csv,checkpoint,evaluation]",
                        "seed=0", "checkpoint.at_end=false"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert p.returncode == 0, p.stderr[-2000:]
    metrics = json.load(open(os.path.join(run_dir, "result.json")))
    assert metrics["episode_return_mean"] >= 450, metrics
    assert metrics["env_steps_sampled"] <= 500_000
    # weights reach the producing workers: the lag stays bounded by the queues (without the
    # pushes it would grow with every update)
    assert 0 <= metrics["learner/default/policy_lag_max"] <= 20
    assert metrics["perf/cpu_util_workers"] > 0
