"""PPO: hand-computed GAE, cases C01, C06, C07, a user variant, and learning CartPole."""
import os

import numpy as np
import pytest
import torch

import flowkit
from flowkit.testing import local_overrides
from flowkit.core import batch as sb
from flowkit.engine import load_config, setup
from flowkit_ppo.ppo import PPO, PPOPolicy

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_ctx(*overrides):
    pm, cfg = load_config(["runtime.backend=local", "runtime.num_workers=1", "run.reporters=[csv,plot,checkpoint,evaluation]", *overrides])
    return setup(cfg, pm)


# ---- GAE -------------------------------------------------------------------------------------
def test_gae_three_steps_with_truncation_and_termination():
    """Rows: t0 (same episode as t1), t1 truncated with V(final obs)=2.0, t2 terminated
    (a new episode). gamma=0.9, lambda=0.8, V = [0.5, 1.0, 1.5], r = [1, 2, 3].
    A2 = 3 - 1.5 = 1.5 (no bootstrap); A1 = 2 + 0.9*2.0 - 1.0 = 2.8 (bootstrap from the
    final observation, the trajectory ends); A0 = (1 + 0.9*1.0 - 0.5) + 0.9*0.8*2.8 = 3.416."""
    ctx = make_ctx("env=CartPole-v1", "ppo.gamma=0.9", "ppo.gae_lambda=0.8")
    pol = ctx.policies["default"]
    seen = []

    def fake_values(obs):
        seen.append(np.array(obs))
        return np.full(len(obs), 2.0, np.float32)
    pol.compute_values = fake_values
    batch = sb.SampleBatch({
        sb.OBS: np.zeros((3, 4), np.float32), sb.NEXT_OBS: np.arange(12, dtype=np.float32).reshape(3, 4),
        sb.REWARDS: np.array([1, 2, 3], np.float32), sb.VF_PREDS: np.array([0.5, 1.0, 1.5], np.float32),
        sb.TERMINATEDS: np.array([False, False, True]), sb.TRUNCATEDS: np.array([False, True, False]),
        sb.EPS_ID: np.array([7, 7, 8])})
    out = pol.postprocess_trajectory(batch)
    np.testing.assert_allclose(out[sb.ADVANTAGES], [3.416, 2.8, 1.5], rtol=1e-6)
    np.testing.assert_allclose(out[sb.VALUE_TARGETS], [3.916, 3.8, 3.0], rtol=1e-6)
    assert len(seen) == 1 and seen[0].tolist() == [[4, 5, 6, 7]]  # V asked only for the truncated row's next_obs
    assert sb.ADVANTAGES not in batch  # input untouched


# ---- C01 -------------------------------------------------------------------------------------
def _frozen_critic(pol, weight, bias):
    with torch.no_grad():
        pol.model.twin.wb.fill_(weight)
        pol.model.twin.bb.fill_(bias)


def _c01_batch(**env_kwargs):
    kw = [f"env.kwargs.{k}={v}" for k, v in env_kwargs.items()]
    ctx = make_ctx("env.factory=envs:constant", *kw, "runtime.num_envs_per_worker=1",
                   "runtime.rollout_fragment_length=5", "ppo.gamma=0.9", "ppo.gae_lambda=1.0",
                   "ppo.normalize_advantages=none", "model.hidden_sizes=[]")
    return ctx


def test_c01_truncation_is_not_termination():
    ctx = _c01_batch(limit=5)
    _frozen_critic(ctx.policies["default"], 0.0, 10.0)  # V = 10 = 1 / (1 - gamma) everywhere
    ctx.workers.start()
    b = ctx.workers.actors[0].obj.sample()["default"]
    assert b[sb.TRUNCATEDS].tolist() == [False] * 4 + [True]
    assert not b[sb.TERMINATEDS].any()
    np.testing.assert_allclose(b[sb.VALUE_TARGETS], [10.0] * 5, rtol=1e-6)
    np.testing.assert_allclose(b[sb.ADVANTAGES], [0.0] * 5, atol=1e-5)


def test_c01_termination_and_both_flags_do_not_bootstrap():
    for limit in (10, 5):  # terminated at 5 alone; terminated and truncated at 5: termination wins
        ctx = _c01_batch(limit=limit, terminate_at=5)
        _frozen_critic(ctx.policies["default"], 0.0, 10.0)
        ctx.workers.start()
        b = ctx.workers.actors[0].obj.sample()["default"]
        assert b[sb.TERMINATEDS].tolist() == [False] * 4 + [True]
        assert not b[sb.TRUNCATEDS].any()
        vt = b[sb.VALUE_TARGETS]
        assert vt[-1] == pytest.approx(1.0)  # last return is 1
        # lambda = 1: Monte-Carlo returns 1 + 0.9 + ... with no bootstrap
        np.testing.assert_allclose(vt, [1 + 0.9 * (1 + 0.9 * (1 + 0.9 * 1.9)), 1 + 0.9 * (1 + 0.9 * 1.9),
                                        1 + 0.9 * 1.9, 1.9, 1.0], rtol=1e-5)


def test_c01_bootstrap_uses_final_observation_not_reset_one():
    ctx = _c01_batch(limit=5, reset_obs=0.0)
    _frozen_critic(ctx.policies["default"], 20.0, 0.0)  # V(0.5) = 10, V(reset obs 0.0) = 0
    ctx.workers.start()
    w = ctx.workers.actors[0].obj
    b = w.sample()["default"]
    assert b[sb.NEXT_OBS][-1].tolist() == [0.5]  # the real final observation
    assert b[sb.VALUE_TARGETS][-1] == pytest.approx(1 + 0.9 * 10.0, rel=1e-5)
    b2 = w.sample()["default"]  # the next episode starts from the reset observation
    assert b2[sb.OBS][0].tolist() == [0.0]


# ---- C06 -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_c06_box_actions_in_bounds_and_reach_the_target(run_dir):
    from envs import BoxTargetEnv
    BoxTargetEnv.received.clear()
    res = flowkit.train(local_overrides(
        run_dir, "env.factory=envs:BoxTargetEnv", "runtime.num_workers=1", "runtime.num_envs_per_worker=8",
        "runtime.rollout_fragment_length=16", "ppo.num_epochs=10", "ppo.minibatch_size=32",
        "ppo.lr=3e-3", "ppo.gamma=0.0", "stop.env_steps=6000", "checkpoint.at_end=true"))
    got = np.array(BoxTargetEnv.received)
    assert len(got) >= 5000
    assert got.min() >= 0.0 and got.max() <= 1.0           # every action inside the space
    assert (got[:128] < 0.5).mean() > 0.2                  # the lower half reachable from the start
    algo = flowkit.Algorithm.from_checkpoint(res.run_dir, trust_config=True)
    mean_action = algo.compute_actions(np.zeros(1, np.float32), explore=False)
    assert abs(float(mean_action[0]) - 0.1) < 0.05


def test_c06_logp_is_of_the_sampled_unclipped_action():
    ctx = make_ctx("env.factory=envs:BoxTargetEnv", "runtime.num_envs_per_worker=64",
                   "runtime.rollout_fragment_length=4", "ppo.log_std_init=0.5")
    ctx.workers.start()
    b = ctx.workers.actors[0].obj.sample()["default"]
    a = b[sb.ACTIONS].reshape(-1)
    assert (np.abs(a) > 1.0).any()  # raw Gaussian draws, not clipped
    mean = b[sb.ACTION_DIST_INPUTS][:, 0]
    std = np.exp(0.5)
    expect = -0.5 * ((a - mean) / std) ** 2 - 0.5 - 0.5 * np.log(2 * np.pi)
    np.testing.assert_allclose(b[sb.ACTION_LOGP], expect, rtol=1e-4, atol=1e-5)


def test_c06_integer_box_rounds_and_clips_with_dtype():
    from gymnasium import spaces
    from flowkit.core import ActionDist
    d = ActionDist(spaces.Box(0, 4, (2,), np.int64))
    out = d.to_env(np.array([[-1.0, 1.0], [0.1, 5.0]], np.float32))
    assert out.dtype == np.int64
    assert out.tolist() == [[0, 4], [2, 4]]  # -1 -> 0, 1 -> 4, 0.1 -> 2.2 -> 2


# ---- C07 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("fragment,minibatch", [(5, 4), (1, 1)])
def test_c07_no_nan_from_advantage_normalisation(run_dir, fragment, minibatch):
    res = flowkit.train(local_overrides(
        run_dir, "env.factory=envs:RandomRewardEnv", "runtime.num_workers=1", "runtime.num_envs_per_worker=1",
        f"runtime.rollout_fragment_length={fragment}", f"ppo.minibatch_size={minibatch}", "ppo.num_epochs=2",
        "stop.iterations=20", "checkpoint.at_end=true"))
    for row in res.history:
        for k in ("learner/default/pg_loss", "learner/default/vf_loss", "learner/default/total_loss"):
            assert np.isfinite(row[k]), (k, row)
    algo = flowkit.Algorithm.from_checkpoint(res.run_dir, trust_config=True)
    for p in algo.get_policy().model.parameters():
        assert torch.isfinite(p).all()


def test_linear_lr_and_clip_schedules_follow_env_steps_sampled(run_dir):
    # one train batch per 32 env steps, set from the env steps sampled before it: the last of
    # 64 sampled trains at frac 64/128, so lr and clip are half their initial values
    res = flowkit.train(local_overrides(
        run_dir, "env=CartPole-v1", "runtime.num_workers=1", "runtime.num_envs_per_worker=2",
        "runtime.rollout_fragment_length=16", "ppo.train_batch_size=32", "ppo.minibatch_size=32",
        "ppo.num_epochs=1", "ppo.lr=1e-3", "ppo.lr_schedule=linear", "ppo.clip_schedule=linear",
        "ppo.schedule_env_steps=128", "stop.env_steps=64", "checkpoint.at_end=false"))
    assert res.metrics["env_steps_sampled"] == 64
    assert res.metrics["learner/default/lr"] == pytest.approx(5e-4)
    assert res.metrics["learner/default/clip_param"] == pytest.approx(0.1)


def test_c07_equal_advantages_are_only_centred_and_single_rows_kept():
    ctx = make_ctx("env=CartPole-v1")
    pol = ctx.policies["default"]

    def batch(n, adv):
        return {sb.OBS: torch.zeros(n, 4), sb.ACTIONS: torch.zeros(n, dtype=torch.long),
                sb.ACTION_LOGP: torch.full((n,), float(np.log(0.5))), sb.VF_PREDS: torch.zeros(n),
                sb.ADVANTAGES: torch.full((n,), adv), sb.VALUE_TARGETS: torch.zeros(n),
                sb.ACTION_DIST_INPUTS: torch.zeros(n, 2)}
    # the fresh policy is uniform: ratio = 1
    _, st = pol.loss(batch(4, 3.0))
    assert st["pg_loss"] == 0.0  # equal advantages -> centred to 0, never divided by std 0
    _, st1 = pol.loss(batch(1, 3.0))
    assert st1["pg_loss"] == pytest.approx(-3.0, rel=1e-5)  # a one-row minibatch is used as is


# ---- a user variant --------------------------------------------------------------------------
class L2PPOPolicy(PPOPolicy):
    def loss(self, batch):
        loss, stats = super().loss(batch)
        l2 = sum((p ** 2).sum() for p in self.model.parameters())
        stats["l2"] = float(l2.detach())
        return loss + 1e-4 * l2, stats


class L2PPO(PPO):
    name = "ppo_l2"
    policy_class = L2PPOPolicy


class L2Plugin:
    @flowkit.hookimpl
    def flowkit_add_algorithms(self):
        return [L2PPO]


def test_subclassing_the_policy_loss_makes_a_registered_variant(run_dir):
    plugin = L2Plugin()
    flowkit.register(plugin)
    try:
        res = flowkit.train(local_overrides(run_dir, "algo=ppo_l2", "env=CartPole-v1", "ppo_l2.num_epochs=1",
                                            "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=16",
                                            "stop.iterations=2"))
    finally:
        flowkit.unregister(plugin)
    assert res.metrics["learner/default/l2"] > 0
    assert res.config.algo == "ppo_l2"


# ---- learning --------------------------------------------------------------------------------
@pytest.mark.slow
def test_ppo_solves_cartpole_local_backend(run_dir):
    """The main job's config on the local backend, seed 0: >= 475 within 100,000 env steps."""
    res = flowkit.train(["runtime.backend=local", f"run.dir={run_dir}", "run.reporters=[csv,plot,checkpoint,evaluation]", "seed=0"],
                        config_file=os.path.join(REPO, "configs", "ppo", "CartPole-v1.yaml"))
    assert res.metrics["episode_return_mean"] >= 475, res.metrics
    assert res.metrics["env_steps_sampled"] <= 100_000
