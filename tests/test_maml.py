"""MAML (plugins/maml, issue 25 item 2): the task-settable env protocol and the 2D navigation
task distribution (flowkit.testing), the meta-gradient of a tiny linear model by hand (second
order against first order, one and two inner steps), the workers' inner step reproduced by
the driver's meta-loss (ratio 1 at the first outer step), the meta-batch, config checks, the
plan, conformance, a smoke run with resume, and learning to adapt (slow)."""
import os

import gymnasium as gym
import numpy as np
import pytest
import torch
from flowkit_maml import MAMLConfig
from flowkit_maml.maml import (MAML, AdaptToTasks, MAMLPolicy, adaptation_returns, inner_update,
                               linear_baseline_advantages, meta_batch)

import flowkit
from flowkit.config import ConfigError
from flowkit.core import EnvError, TaskSettableEnv, task_env
from flowkit.core import batch as sb
from flowkit.engine import build_plan, load_config, setup
from flowkit.testing import check_algorithm, local_overrides
from flowkit.testing.envs import PointGoalEnv, TinyEnv

POINT = "env=flowkit.testing.envs:PointGoal-v0"


# ---- the task-settable env and the task distribution ----------------------------------------------
def test_point_goal_env_by_hand():
    env = gym.make("flowkit.testing.envs:PointGoal-v0", horizon=3)
    t = task_env(env)
    assert isinstance(t, TaskSettableEnv) and isinstance(t, PointGoalEnv)
    t.set_task([0.3, -0.4])
    obs, _ = env.reset(seed=0)
    np.testing.assert_array_equal(obs, [0.0, 0.0])
    obs, r, term, trunc, _ = env.step(np.array([0.5, -0.1], np.float32))  # clipped to (0.1, -0.1)
    np.testing.assert_allclose(obs, [0.1, -0.1])
    assert r == pytest.approx(-np.hypot(0.2, 0.3)) and not term and not trunc
    env.step(np.zeros(2, np.float32))
    *_, trunc, _ = env.step(np.zeros(2, np.float32))
    assert trunc  # the horizon
    np.testing.assert_array_equal(t.get_task(), np.array([0.3, -0.4], np.float32))
    env.reset(seed=5)
    a = t.sample_tasks(4)
    env.reset(seed=5)
    assert np.array_equal(np.stack(a), np.stack(t.sample_tasks(4)))  # seeded by reset
    assert all(g.shape == (2,) and (np.abs(g) <= 0.5).all() for g in a)
    free = PointGoalEnv()  # no task set: each reset draws a goal (the whole distribution)
    free.reset(seed=1)
    g1 = free.goal.copy()
    free.reset()
    assert not np.array_equal(g1, free.goal) and free.get_task() is None


def test_task_env_refuses_an_env_without_the_protocol():
    with pytest.raises(EnvError, match=r"env 'CartPole-v1' is not task-settable: it needs methods sample_tasks"):
        task_env(gym.make("CartPole-v1"), "CartPole-v1")


def _worker(run_dir, *extra):
    pm, cfg = load_config(local_overrides(str(run_dir), "algo=maml", POINT, "seed=0", "runtime.num_workers=1",
                                          "runtime.num_envs_per_worker=4", "runtime.rollout_fragment_length=10",
                                          "env.kwargs.horizon=10", *extra))
    ctx = setup(cfg, pm)
    return ctx, ctx.workers.local_worker()


def test_worker_set_task_starts_new_episodes_of_the_task(tmp_path):
    """set_task reaches every sub-env under its wrappers and restarts their episodes: a fragment
    of exactly the horizon holds 4 whole episodes of that goal (rewards: minus the distance)."""
    ctx, w = _worker(tmp_path)
    try:
        w.sample()  # some episodes of random goals first
        w.set_task(np.array([0.5, 0.5], np.float32))
        b = w.sample()
        pb = b.policy_batches["default"]
        assert len(b.episodes) == 4 and (pb[sb.T].reshape(4, 10) == np.arange(10)).all()
        dist = -np.linalg.norm(pb[sb.NEXT_OBS] - 0.5, axis=1)
        np.testing.assert_allclose(pb[sb.REWARDS], dist, rtol=1e-5)
        assert all(task_env(e).get_task().tolist() == [0.5, 0.5] for e in w._envs)
    finally:
        ctx.shutdown()


def test_set_task_refuses_a_native_vector_env_at_config():
    with pytest.raises(ConfigError, match=r"CartPole-v1 has a vectorized implementation, whose sub-envs maml cannot"):
        setup(*reversed(load_config(["algo=maml", "env=CartPole-v1"])))


# ---- the meta-gradient by hand ---------------------------------------------------------------------
def _meta_grad(inner_steps, first_order):
    """w = 1; inner loss 0.5 (2 w - 1)^2, alpha 0.1; outer loss 0.5 (3 w' - 0.5)^2: d outer / d w."""
    w = torch.tensor(1.0, requires_grad=True)
    params = {"w": w}
    for _ in range(inner_steps):
        params = inner_update(lambda p: 0.5 * (2 * p["w"] - 1.0) ** 2, params, 0.1, create_graph=not first_order)
    outer = 0.5 * (3 * params["w"] - 0.5) ** 2
    (g,) = torch.autograd.grad(outer, [w])
    return float(params["w"].detach()), float(g)


def test_meta_gradient_of_a_linear_model_by_hand():
    """One inner step: w' = 1 - 0.1 * 2 (2 - 1) = 0.8; dL_out/dw' = 3 (2.4 - 0.5) = 5.7;
    second order multiplies by dw'/dw = 1 - 0.1 * 2^2 = 0.6 -> 3.42; first order keeps 5.7.
    Two steps: w'' = 0.8 - 0.1 * 2 (1.6 - 1) = 0.68, dL_out/dw'' = 3 (2.04 - 0.5) = 4.62,
    second order times 0.6^2 -> 1.6632; first order 4.62."""
    assert _meta_grad(1, False) == pytest.approx((0.8, 3.42))
    assert _meta_grad(1, True) == pytest.approx((0.8, 5.7))
    assert _meta_grad(2, False) == pytest.approx((0.68, 1.6632))
    assert _meta_grad(2, True) == pytest.approx((0.68, 4.62))


def _meta_batch(tmp_path, *extra, tasks=2):
    ctx, w = _worker(tmp_path, f"maml.tasks_per_worker={tasks}", *extra)
    algo = ctx.algorithms["maml"]
    req, = algo.adaptation_requests(0, 1)
    assert req.tasks == algo.tasks(0, tasks)
    out = req(w)
    return ctx, w, out, meta_batch([out], "default", int(algo.config.inner_steps))


def test_the_driver_rebuilds_the_workers_adaptation(tmp_path):
    """The driver's theta'(theta), from the same pre-adaptation rows by the same function, is the
    worker's adapted policy: at the first outer step every ratio is 1 (KL 0, nothing clipped),
    for two tasks and two inner steps. The worker's policy holds theta again afterwards."""
    ctx, w, out, mb = _meta_batch(tmp_path, "maml.inner_steps=2", "maml.inner_lr=0.5")
    try:
        theta = ctx.policies["default"].get_weights()
        for k, v in next(iter(w.policies.values())).get_weights().items():
            np.testing.assert_array_equal(v, theta[k])
        assert len(out["tasks"]) == 2 and all(len(steps) == 3 for steps in out["tasks"])
        pb = mb.policy_batches["default"]
        assert sorted(set(zip(pb[sb.TASK_INDEX].tolist(), pb[sb.ADAPTATION_STEP].tolist()))) == \
            [(t, k) for t in range(2) for k in range(3)]
        assert mb.env_steps == out["env_steps"] == 2 * 3 * 40
        assert out["episodes"] == out["tasks"][0][-1].episodes + out["tasks"][1][-1].episodes  # post-adaptation only
        assert len(out["episodes"]) == 2 * 4
        pol = ctx.policies["default"]
        loss, st = pol.loss(pol.prepare_batch(pb))
        assert st["kl"] < 1e-6 and st["clip_frac"] == 0.0
        # the adaptation changed the policy: the pre-adaptation rows' logp differ under theta_2
        ad = mb.meta["adaptation"]
        assert set(ad) == {"return_mean_step_0", "return_mean_step_1", "return_mean_step_2", "adaptation_delta",
                           "num_tasks"} and ad["num_tasks"] == 2
    finally:
        ctx.shutdown()


def test_linear_baseline_by_hand():
    """Two pieces (gamma 0.5, lambda 1): piece A, 4 steps of reward 1 ending in a truncation,
    returns to its end [1.875, 1.75, 1.5, 1]; piece B, 2 steps of reward 2 that terminate,
    returns [3, 2]. The observation (a constant 0) gives no feature, so the fit is a ridge
    regression (1e-5) on a cubic in t/100 over 6 points; the advantages are the returns minus the fit (lambda 1, nothing after a
    piece's end), and sum to about 0 over the batch (the constant feature)."""
    b = sb.SampleBatch({sb.OBS: np.zeros((6, 2), np.float32), sb.T: np.array([0, 1, 2, 3, 0, 1]),
                        sb.REWARDS: np.array([1, 1, 1, 1, 2, 2], np.float32),
                        sb.TERMINATEDS: np.array([0, 0, 0, 0, 0, 1], bool),
                        sb.TRUNCATEDS: np.array([0, 0, 0, 1, 0, 0], bool),
                        sb.ADVANTAGES: np.full(6, 99.0, np.float32), sb.VALUE_TARGETS: np.full(6, 7.0, np.float32)})
    y = np.array([1.875, 1.75, 1.5, 1.0, 3.0, 2.0])
    t = np.array([0, 1, 2, 3, 0, 1]) / 100.0
    f = np.stack([t, t ** 2, t ** 3, np.ones(6)], 1)
    fit = f @ np.linalg.solve(f.T @ f + 1e-5 * np.eye(4), f.T @ y)
    out = linear_baseline_advantages(b, 0.5, 1.0)
    np.testing.assert_allclose(out[sb.ADVANTAGES], y - fit, atol=2e-3)
    assert abs(float(out[sb.ADVANTAGES].sum())) < 1e-2
    np.testing.assert_array_equal(out[sb.VALUE_TARGETS], 7.0)  # the value network's targets are kept
    assert b[sb.ADVANTAGES][0] == 99.0  # a copy
    # lambda 0: one-step TD errors over the fit, the next fitted value inside a piece, 0 after its end
    v = y - np.asarray(out[sb.ADVANTAGES], np.float64)
    td = linear_baseline_advantages(b, 0.5, 0.0)[sb.ADVANTAGES]
    nv = np.array([v[1], v[2], v[3], 0.0, v[5], 0.0])
    np.testing.assert_allclose(td, b[sb.REWARDS] + 0.5 * nv - v, atol=1e-4)


def test_linear_baseline_on_the_workers_and_the_driver(tmp_path):
    """maml.baseline=linear: the worker's advantages are the linear fit's (not the value
    network's), the inner step uses them, and the driver's rebuilt adaptation still matches the
    worker's (ratio 1 at the first outer step)."""
    ctx, w, out, mb = _meta_batch(tmp_path, "maml.baseline=linear")
    try:
        pb = mb.policy_batches["default"]
        for i, k in [(0, 0), (1, 1)]:
            rows = (pb[sb.TASK_INDEX] == i) & (pb[sb.ADAPTATION_STEP] == k)
            part = sb.SampleBatch({c: v[rows] for c, v in pb.items()})
            np.testing.assert_allclose(part[sb.ADVANTAGES], linear_baseline_advantages(part, 0.99, 1.0)[sb.ADVANTAGES],
                                       rtol=1e-5, atol=1e-4)
            assert not np.allclose(part[sb.ADVANTAGES], part[sb.VALUE_TARGETS] - part[sb.VF_PREDS], atol=1e-2)
        pol = ctx.policies["default"]
        _, st = pol.loss(pol.prepare_batch(pb))
        assert st["kl"] < 1e-6 and st["clip_frac"] == 0.0
    finally:
        ctx.shutdown()


def test_second_order_and_first_order_meta_gradients_differ_on_the_policy(tmp_path):
    """On the same meta-batch, first_order drops the second-derivative terms: the meta-losses
    are equal, their gradients are not; with inner_lr -> 0 both tend to the gradient of the
    outer loss at theta."""
    ctx, w, out, mb = _meta_batch(tmp_path)
    try:
        pol = ctx.policies["default"]
        tb = pol.prepare_batch(mb.policy_batches["default"])

        def grad(first_order, inner_lr=None):
            pol.config = MAMLConfig(**{**pol.config.__dict__, "first_order": first_order,
                                       "inner_lr": inner_lr or pol.config.inner_lr})
            for p in pol._params:
                p.grad = None
            loss, _ = pol.loss(tb)
            loss.backward()
            return float(loss.detach()), torch.cat([p.grad.reshape(-1) for p in pol._params if p.grad is not None])
        (l2, g2), (l1, g1) = grad(False), grad(True)
        assert l1 == pytest.approx(l2, rel=1e-6)
        assert not torch.allclose(g1, g2, rtol=1e-3, atol=1e-6)
        (_, s2), (_, s1) = grad(False, 1e-6), grad(True, 1e-6)
        torch.testing.assert_close(s1, s2, rtol=1e-3, atol=1e-5)
    finally:
        ctx.shutdown()


# ---- config, plan, conformance, runs ----------------------------------------------------------------
def test_plan_shows_the_shape_and_starts_nothing():
    pm, cfg = load_config(["algo=maml", POINT, "runtime.num_workers=2", "maml.tasks_per_worker=3",
                           "maml.first_order=true"])
    ctx = setup(cfg, pm)
    text = build_plan(ctx).to_text()
    for line in ("SyncWeights(to=all)", "AdaptationMetrics(returns before and after adaptation)",
                 "MetaUpdate(first-order, 5 Adam steps on the clipped surrogate after adaptation)",
                 "MetaBatch(tasks x 2 adaptation steps; post-adaptation episodes reported)",
                 "ParallelAdaptation(2 workers x 3 tasks: sample, 1 inner step(s) of lr 0.1, sample).gather_sync"):
        assert line in text
    assert not ctx.workers.started and len(text.splitlines()) <= 30


def test_conformance_config_plan_actions_checkpoint(tmp_path):
    out = check_algorithm(MAML, ["maml.outer_steps=2", "env.kwargs.horizon=16"],
                          env=TinyEnv("flowkit.testing.envs:point_goal", -1.0),
                          checks=["config", "plan", "actions", "checkpoint"], tmp_dir=str(tmp_path), learn_env_steps=200)
    assert "ParallelAdaptation" in out["plan"]


def _run(run_dir, *extra):
    return flowkit.train(local_overrides(str(run_dir), "algo=maml", POINT, "seed=0", "runtime.num_workers=2",
                                         "runtime.num_envs_per_worker=4", "runtime.rollout_fragment_length=20",
                                         "env.kwargs.horizon=20", "maml.tasks_per_worker=2", "maml.outer_steps=2",
                                         "evaluation.interval=0", "run.min_iter_env_steps=0", *extra), verbose=False)


@pytest.mark.slow
def test_smoke_counts_and_resumes(tmp_path):
    """3 meta steps on 2 in-process workers x 2 tasks: 2 x 2 x 2 x 80 env steps each, 2 Adam steps
    each; a run resumed from meta step 2 continues the counts (meta steps, so the tasks drawn)
    and Adam's state from the checkpoint. (Not bit for bit: restored workers sample with new
    seeds, as every resumed run's workers do.)"""
    full = _run(tmp_path / "full", "stop.iterations=3")
    m = full.metrics
    assert m["env_steps_sampled"] == m["env_steps_trained"] == 3 * 2 * 2 * 2 * 80
    assert m["num_updates"] == 6 and m["learner/default/num_tasks"] == 4
    assert m["episodes_total"] == 3 * 4 * 4  # post-adaptation episodes only
    part = _run(tmp_path / "part", "stop.iterations=2", "checkpoint.at_end=true")
    resumed = flowkit.train([f"resume={part.checkpoint}", "stop.iterations=3", "run.reporters=[csv,checkpoint]"],
                            verbose=False)
    assert resumed.metrics["env_steps_sampled"] == m["env_steps_sampled"] and resumed.metrics["num_updates"] == 6
    a = flowkit.Algorithm.from_checkpoint(part.checkpoint).get_policy()
    b = flowkit.Algorithm.from_checkpoint(resumed.checkpoint).get_policy()
    assert b.get_state()["optimizer"]["state"][0]["step"] == 6
    assert not np.allclose(a._flat.detach().numpy(), b._flat.detach().numpy())


@pytest.mark.ray
@pytest.mark.slow
def test_ray_workers_get_their_tasks(ray_session, tmp_path):
    """On 2 Ray workers a meta step holds every task of the meta step, drawn on the driver, each
    with its adaptation steps (2 x 2 tasks x 2 steps x 80 env steps)."""
    res = _run(tmp_path / "ray", "runtime.backend=ray", "runtime.num_cpus_per_worker=0.5", "stop.iterations=1")
    assert res.metrics["env_steps_sampled"] == 2 * 2 * 2 * 80 and res.metrics["learner/default/num_tasks"] == 4
    assert res.metrics["num_updates"] == 2


def test_adaptation_returns_of_any_actor_critic(tmp_path):
    """adaptation_returns runs the workers' own adaptation on a local worker with given weights,
    one row per task, one column per adaptation step."""
    ctx, w = _worker(tmp_path)
    try:
        tasks = [np.array([0.4, 0.4], np.float32), np.array([-0.4, 0.0], np.float32)]
        r = adaptation_returns(w, ctx.policies["default"].get_weights(), tasks, 1)
        assert r.shape == (2, 2) and np.isfinite(r).all() and (r < 0).all()
    finally:
        ctx.shutdown()


# ---- learning ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_learns_to_adapt_on_point_goal(tmp_path):
    """configs/maml/PointGoal-v0.yaml, cut to 15 meta steps (1.2M env steps; minutes): one inner step
    then improves the return on held-out tasks (drawn from another seed) by a clear margin, to a
    return the initial weights do not reach after their step."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = flowkit.train(local_overrides(str(tmp_path), "seed=0", "evaluation.interval=0", "runtime.backend=local",
                                        "stop.iterations=15"),
                        config_file=os.path.join(repo, "configs", "maml", "PointGoal-v0.yaml"), verbose=False)
    ctx, w = _worker(tmp_path / "eval", "runtime.num_envs_per_worker=20", "runtime.rollout_fragment_length=100",
                     "env.kwargs.horizon=100", f"maml.inner_lr={res.config.maml.inner_lr}",
                     f"maml.baseline={res.config.maml.baseline}")
    try:
        env = PointGoalEnv()
        env.reset(seed=12345)
        held_out = env.sample_tasks(10)
        theta = flowkit.Algorithm.from_checkpoint(res.checkpoint).get_policy().get_weights()
        r = adaptation_returns(w, theta, held_out, 1)
    finally:
        ctx.shutdown()
    # before meta-training the same held-out measure gives about -70 before and -54 after the step
    assert (r[:, 1] - r[:, 0]).mean() > 10.0 and r[:, 1].mean() > -25.0, r
