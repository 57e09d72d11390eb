"""A2C and A3C (plugins/a2c): the loss and n-step returns by hand, RMSprop against torch's,
worker gradients applied on the driver = a driver step, exact checkpoint round trip, the A3C
plan and its weight routing (local and Ray), multi-agent mixing, and learning smoke tests."""
import os

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import local_overrides
from flowkit_a2c import A2CConfig
from flowkit_a2c.a2c import A2CPolicy

import flowkit
from flowkit import ConfigError
from flowkit.checkpoint import find_checkpoint, restore, save_checkpoint
from flowkit.config import section_object
from flowkit.core import NOT_READY
from flowkit.core import batch as sb
from flowkit.core.learner import Learner
from flowkit.core.ops import TrainOneStep
from flowkit.core.policy import FlatRMSprop
from flowkit.engine import build_plan, describe_plan, load_config, setup

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _policy(inference_only=False, **kw):
    _, cfg = load_config(["algo=a2c", "env=CartPole-v1", *[f"a2c.{k}={v}" for k, v in kw.items()]])
    return A2CPolicy(gym.spaces.Box(-10.0, 10.0, (1,), np.float32), gym.spaces.Discrete(2),
                     section_object(cfg, "a2c", A2CConfig), cfg.model, "cpu", 0, inference_only)


def _piece_batch():
    """Rows 0-2: one episode cut by the fragment end after row 2 (bootstrap V(next_obs));
    rows 3-4: an episode that terminates at row 4 (no bootstrap)."""
    return sb.SampleBatch({sb.OBS: np.array([[0.1], [0.2], [0.3], [0.4], [0.5]], np.float32),
                           sb.NEXT_OBS: np.array([[0.2], [0.3], [0.6], [0.5], [0.9]], np.float32),
                           sb.ACTIONS: np.array([0, 1, 1, 0, 1]), sb.REWARDS: np.array([1, 2, 3, 4, 5], np.float32),
                           sb.TERMINATEDS: np.array([0, 0, 0, 0, 1], bool), sb.TRUNCATEDS: np.zeros(5, bool),
                           sb.EPS_ID: np.array([7, 7, 7, 8, 8]), sb.T: np.array([0, 1, 2, 0, 1]),
                           sb.VF_PREDS: np.array([1.0, 2.0, 3.0, 4.0, 5.0], np.float32)})


def test_nstep_returns_by_hand():
    """R_t = r_t + gamma R_{t+1} to the end of each piece; the cut piece bootstraps from
    V(next_obs) = 10 * obs = 6, the terminated one from 0. A = R - V."""
    pol = _policy(gamma=0.5, returns="nstep")
    pol.compute_values = lambda obs: 10.0 * np.asarray(obs, np.float32)[:, 0]
    out = pol.postprocess_trajectory(_piece_batch())
    r2 = 3 + 0.5 * 6.0            # 6
    r1 = 2 + 0.5 * r2             # 5
    r0 = 1 + 0.5 * r1             # 3.5
    r4 = 5.0
    r3 = 4 + 0.5 * r4             # 6.5
    np.testing.assert_allclose(out[sb.VALUE_TARGETS], [r0, r1, r2, r3, r4], rtol=1e-6)
    np.testing.assert_allclose(out[sb.ADVANTAGES], np.array([r0, r1, r2, r3, r4]) - [1, 2, 3, 4, 5], rtol=1e-6)
    # returns=gae with lambda 0: one-step TD errors
    gae = _policy(gamma=0.5, returns="gae", gae_lambda=0.0)
    gae.compute_values = pol.compute_values
    adv = gae.postprocess_trajectory(_piece_batch())[sb.ADVANTAGES]
    np.testing.assert_allclose(adv, [1 + 1 - 1, 2 + 1.5 - 2, 3 + 3 - 3, 4 + 2.5 - 4, 5 - 5], rtol=1e-6)


def test_loss_by_hand():
    """Two rows, fixed network outputs: logits (0, ln 3) and (0, 0), V = (1, 2)."""
    pol = _policy(vf_coef=0.25, ent_coef=0.1)
    logits = torch.tensor([[0.0, np.log(3.0)], [0.0, 0.0]], requires_grad=True)
    values = torch.tensor([1.0, 2.0], requires_grad=True)
    pol.model = lambda obs: (logits, values)  # type: ignore[assignment]
    batch = {sb.OBS: torch.zeros(2, 1), sb.ACTIONS: torch.tensor([1, 0]), sb.ADVANTAGES: torch.tensor([2.0, -1.0]),
             sb.VALUE_TARGETS: torch.tensor([3.0, 0.0])}
    loss, st = pol.loss(batch)
    pg = -(np.log(0.75) * 2.0 + np.log(0.5) * -1.0) / 2
    vf = 0.5 * ((1 - 3) ** 2 + (2 - 0) ** 2) / 2
    ent = (-(0.25 * np.log(0.25) + 0.75 * np.log(0.75)) + np.log(2.0)) / 2
    assert st["pg_loss"] == pytest.approx(pg, rel=1e-6)
    assert st["vf_loss"] == pytest.approx(vf, rel=1e-6)
    assert st["entropy"] == pytest.approx(ent, rel=1e-6)
    assert float(loss.detach()) == pytest.approx(pg + 0.25 * vf - 0.1 * ent, rel=1e-6)
    loss.backward()  # the value gradient is vf_coef * (V - target) / n; advantages are constants
    np.testing.assert_allclose(values.grad.numpy(), 0.25 * np.array([1 - 3, 2 - 0]) / 2, rtol=1e-6)


def test_flat_rmsprop_matches_torch():
    w0 = torch.randn(7, generator=torch.Generator().manual_seed(0))
    flat, ref = w0.clone(), w0.clone().requires_grad_()
    opt, torch_opt = FlatRMSprop(flat, 0.01, 0.9, 1e-5), torch.optim.RMSprop([ref], lr=0.01, alpha=0.9, eps=1e-5)
    for k in range(3):
        g = torch.randn(7, generator=torch.Generator().manual_seed(k + 1))
        flat.grad, ref.grad = g.clone(), g.clone()
        opt.step()
        torch_opt.step()
    torch.testing.assert_close(flat, ref.detach(), rtol=0, atol=0)


def test_worker_gradient_applied_on_the_driver_equals_a_driver_step():
    """A3C's path (gradient on an inference copy, applied by the Learner) gives the weights
    A2C's one step on the same rows gives."""
    rng = np.random.default_rng(0)
    b = _piece_batch()
    b[sb.ADVANTAGES], b[sb.VALUE_TARGETS] = rng.normal(size=5).astype(np.float32), rng.normal(size=5).astype(np.float32)
    for opt in ("rmsprop", "adam"):
        a, c, worker = (_policy(optimizer=opt), _policy(optimizer=opt), _policy(inference_only=True, optimizer=opt))
        c.set_weights(a.get_weights())
        worker.set_weights(a.get_weights())
        Learner("a2c", {"default": a}).update(sb.MultiAgentBatch({"default": b}, 5))
        g, st, n = (*worker.compute_gradients(b), len(b))
        out = Learner("a3c", {"default": c}).apply_gradients(
            sb.MultiAgentBatch({}, 5, 5, meta={"gradients": {"default": (g, st, n)}, "weights_version": 0}))
        assert out["num_updates"] == 1 and out["stats"]["default"]["train_batch_size"] == 5
        for k, v in a.get_weights().items():
            np.testing.assert_allclose(c.get_weights()[k], v, rtol=0, atol=1e-7, err_msg=f"{opt}: {k}")


def test_checkpoint_round_trip_is_exact(tmp_path):
    over = local_overrides(str(tmp_path / "run"), "algo=a2c", "env=CartPole-v1", "runtime.num_workers=1",
                           "runtime.num_envs_per_worker=4", "runtime.rollout_fragment_length=5", "seed=3")

    def build():
        pm, cfg = load_config(over)
        ctx = setup(cfg, pm, str(tmp_path / "run"))
        return ctx, build_plan(ctx)
    ctx, plan = build()
    while ctx.counters["env_steps_sampled"] < 200:
        next(plan)
    batch = ctx.workers.local_worker().sample()
    save_checkpoint(ctx, str(tmp_path / "run"))
    ctx2, _ = build()
    restore(ctx2, find_checkpoint(str(tmp_path / "run")))
    p1, p2 = ctx.policies["default"], ctx2.policies["default"]
    assert dict(ctx2.counters) == dict(ctx.counters) and ctx2.counters["num_updates"] == 10
    assert ctx2.learners["a2c"].num_updates == ctx.learners["a2c"].num_updates == p2.num_updates == 10
    s1, s2 = p1.optimizer.state_dict()["state"][0], p2.optimizer.state_dict()["state"][0]
    assert set(s1) == {"step", "square_avg"} and float(s2["step"]) == float(s1["step"]) == 10
    assert torch.equal(s1["square_avg"], s2["square_avg"])
    for pol in (p1, p2):  # one more identical step from both
        TrainOneStep(ctx, Learner("again", {"default": pol}))(batch)
    for k, v in p1.get_weights().items():
        np.testing.assert_array_equal(p2.get_weights()[k], v, err_msg=k)
    ctx.shutdown()
    ctx2.shutdown()


def test_plans_show_both_graphs():
    a3c = describe_plan(["algo=a3c", "env=CartPole-v1"])["text"]
    for part in ("ParallelGradients.gather_async(num_async=1, resubmit after use)", "ParallelRollouts(async_gradients)",
                 "zip_with_source_actor", "ApplyGradients", "SyncWeights(to=source, with next sample)", "DropSource"):
        assert part in a3c, part
    a2c = describe_plan(["algo=a2c", "env=CartPole-v1", "a2c.train_batch_size=1024"])["text"]
    for part in ("ParallelRollouts(bulk_sync)", "ConcatBatches(1024)", "TrainOneStep(num_epochs=1, minibatch_size=None)",
                 "SyncWeights(to=all)"):
        assert part in a2c, part
    with pytest.raises(ConfigError, match="a2c.lr_schedule=linear needs a horizon"):
        describe_plan(["algo=a2c", "env=CartPole-v1", "a2c.lr_schedule=linear"])


def _routing(ctx, n_items):
    """Pull ``n_items`` gradients through the A3C plan, recording each weights push and, per
    gradient, (worker, weights version it was computed with, learner version after it)."""
    pushes, seen = [], []
    ws = ctx.workers
    orig = ws.sync_weights

    def spy(weights, actors=None, version=None, with_next_sample=False):
        pushes.append(([a.index for a in actors] if actors is not None else None, version, with_next_sample))
        return orig(weights, actors, version, with_next_sample)
    ws.sync_weights = spy
    plan = build_plan(ctx)
    learner = ctx.learners["a3c"]
    while len(seen) < n_items:
        out = next(plan)
        if out is NOT_READY:
            continue
        b = out["batch"]
        seen.append((b.worker_index, b.meta["weights_version"], learner.num_updates))
    return pushes, seen


def _check_routing(pushes, seen, num_workers):
    # the workers' first weights at start-up go to all; after that, every push went to exactly
    # the worker whose gradient had just been applied, with its next request
    assert pushes[0] in ((None, None, False), (list(range(num_workers)), None, False))  # every worker
    pushes = pushes[1:]
    assert [p[0] for p in pushes] == [[w] for w, _, _ in seen] and all(p[2] for p in pushes)
    assert [p[1] for p in pushes] == [after for _, _, after in seen]
    # each worker's next gradient was computed with the weights its own last gradient produced,
    # not with a later version another worker's update made
    last = dict.fromkeys(range(num_workers), 0)
    for w, version, after in seen:
        assert version == last[w], (w, version, last)
        last[w] = after
    assert {w for w, _, _ in seen} == set(range(num_workers))
    assert any(v < after - 1 for _, v, after in seen)  # others' updates landed in between (stale by design)


def test_a3c_weights_go_only_to_the_source_worker_local(run_dir):
    pm, cfg = load_config(local_overrides(run_dir, "algo=a3c", "env=CartPole-v1", "runtime.num_workers=3",
                                          "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=5"))
    ctx = setup(cfg, pm, run_dir)
    pushes, seen = _routing(ctx, 12)
    _check_routing(pushes, seen, 3)
    assert [w for w, _, _ in seen[:6]] == [0, 1, 2, 0, 1, 2]  # local: one worker at a time, in turn
    ctx.shutdown()


@pytest.mark.ray
@pytest.mark.slow
def test_a3c_weights_go_only_to_the_source_worker_on_ray(ray_session, run_dir):
    pm, cfg = load_config(["algo=a3c", "env=CartPole-v1", "runtime.backend=ray", "runtime.num_workers=2",
                           "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=5",
                           f"run.dir={run_dir}", "run.reporters=[csv]"])
    ctx = setup(cfg, pm, run_dir)
    try:
        pushes, seen = _routing(ctx, 40)
        _check_routing(pushes, seen, 2)
    finally:
        ctx.shutdown()


def test_a3c_mixed_with_bulk_sync_pulls_its_own_gradient_stream():
    """A3C (async_gradients) beside PPO (bulk_sync): each pulls its own stream (issue 51 item 7)."""
    pm, cfg = load_config(["runtime.backend=local", "env.factory=pettingzoo.classic.tictactoe_v3:env",
                           "runtime.num_workers=1", "runtime.num_envs_per_worker=2",
                           "runtime.rollout_fragment_length=8", "ppo.train_batch_size=16", "ppo.minibatch_size=8",
                           "multiagent.policies.p1.algo=a3c", "multiagent.policies.p2.algo=ppo",
                           "multiagent.mapping.player_1=p1", "multiagent.mapping.player_2=p2"])
    ctx = setup(cfg, pm)
    try:
        plan = build_plan(ctx)
        text = plan.to_text()
        assert "ParallelRollouts(async_gradients)" in text and "ParallelRollouts(bulk_sync)" in text
        plan.take(4)
        assert ctx.policies["p1"].num_updates > 0 and ctx.policies["p2"].num_updates > 0
    finally:
        ctx.shutdown()


def test_a2c_and_dqn_in_one_tictactoe_run(run_dir):
    res = flowkit.train(local_overrides(run_dir, "env.factory=pettingzoo.classic.tictactoe_v3:env",
                                        "runtime.num_workers=1", "runtime.num_envs_per_worker=4",
                                        "runtime.rollout_fragment_length=16", "stop.env_steps=512",
                                        "multiagent.policies.x.algo=a2c", "multiagent.policies.o.algo=dqn",
                                        "multiagent.mapping.player_1=x", "multiagent.mapping.player_2=o",
                                        "multiagent.alternate_seats=true", "dqn.learning_starts=64"))
    m = res.metrics
    assert m["env_steps_sampled"] == 512
    assert m["learner/x/num_sgd_steps"] == 1 and np.isfinite(m["learner/x/pg_loss"])
    assert any(k.startswith("learner/o/") for k in m) and np.isfinite(m["policy/o/episode_return_mean"])


@pytest.mark.parametrize("algo", ["a2c", "a3c"])
@pytest.mark.slow
def test_learns_cartpole_smoke(run_dir, algo):
    """The documented configs on the local backend (A3C one worker at a time), seed 0, a
    loose threshold: a few seconds to a few tens."""
    res = flowkit.train(local_overrides(run_dir, "seed=0", "stop.episode_return_mean=300", "stop.env_steps=100000",
                                        "checkpoint.at_end=false"),
                        config_file=os.path.join(REPO, "configs", algo, "CartPole-v1.yaml"))
    assert res.metrics["episode_return_mean"] >= 300, res.metrics


@pytest.mark.parametrize("algo", ["a2c", "a3c"])
def test_box_actions_train(run_dir, algo):
    res = flowkit.train(local_overrides(run_dir, f"algo={algo}", "env=Pendulum-v1", "runtime.num_workers=2",
                                        "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=8",
                                        f"{algo}.optimizer=adam", f"{algo}.returns=gae", "stop.env_steps=320",
                                        "checkpoint.at_end=false"))
    m = res.metrics
    assert m["env_steps_sampled"] == 320 and m["num_updates"] == (20 if algo == "a3c" else 10)  # a gradient per fragment vs per round
    assert np.isfinite(m["learner/default/total_loss"]) and np.isfinite(m["learner/default/entropy"])
