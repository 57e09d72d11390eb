"""SAC and TD3 (issue 16, parts 4-5): hand-computed targets, the squashed-Gaussian log-prob,
Polyak updates, the critic-constant actor path, Box-only set-up, an exact checkpoint round
trip, a learning smoke test per algorithm, and SAC mixed with PPO on continuous simple_spread."""
import copy
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

import flowkit
from conftest import local_overrides
from flowkit import ConfigError
from flowkit.core import TwinMLP
from flowkit.core import batch as sb
from flowkit.engine import build_plan, load_config, setup
from flowkit_sac.sac import SAC, SACPolicy, sac_targets, squashed_gaussian
from flowkit_sac import SACConfig, TD3Config
from flowkit_sac.td3 import TD3Policy, td3_targets
from flowkit_sac.td3 import smoothed_target_action

BOX = "env.factory=envs:BoxTargetEnv"  # obs 0, action in [0, 1], reward -(a - 0.1)^2, one step


def model_cfg(hidden=(8,)):
    from omegaconf import OmegaConf
    return OmegaConf.create({"hidden_sizes": list(hidden), "activation": "relu", "shared_value_network": False})


def pendulum_policy(cls, cfg, hidden=(8,)):
    env = gym.make("Pendulum-v1")
    return cls(env.observation_space, env.action_space, cfg, model_cfg(hidden))


# ---- the math, by hand -------------------------------------------------------------------------
def test_squashed_gaussian_log_prob_hand_computed():
    # mean 0.5, std 0.5, eps 1 -> u = 1, a = tanh(1)
    inputs = torch.tensor([[0.5, math.log(0.5)]])
    a, logp = squashed_gaussian(inputs, torch.tensor([[1.0]]))
    log_n = -0.5 * 1.0 - math.log(0.5) - 0.5 * math.log(2 * math.pi)
    assert a.item() == pytest.approx(math.tanh(1.0))
    assert logp.item() == pytest.approx(log_n - math.log(1 - math.tanh(1.0) ** 2), rel=1e-5)
    # the same density as torch's tanh-transformed Normal, for several dims (summed over them)
    mean, log_std, eps = torch.tensor([[0.3, -1.2, 2.0]]), torch.tensor([[-0.5, 0.1, -3.0]]), torch.randn(1, 3)
    a, logp = squashed_gaussian(torch.cat([mean, log_std], -1), eps)
    ref = torch.distributions.TransformedDistribution(torch.distributions.Normal(mean, log_std.exp()),
                                                      [torch.distributions.TanhTransform()])
    assert logp.item() == pytest.approx(ref.log_prob(a).sum().item(), rel=1e-4)
    # log-std clamped to [-20, 2]; no noise: the mode tanh(mean)
    a, lp = squashed_gaussian(torch.tensor([[0.0, 10.0]]), torch.tensor([[1.0]]))
    assert a.item() == pytest.approx(math.tanh(math.exp(2.0)))
    assert squashed_gaussian(torch.tensor([[0.7, 0.0]]), None)[0].item() == pytest.approx(math.tanh(0.7))


def test_sac_soft_target_hand_computed():
    # y = r + gamma (1 - term) (min(Q1', Q2') - alpha logp')
    y = sac_targets(torch.tensor([1.0, 2.0]), torch.tensor([False, True]), 0.9,
                    torch.tensor([[3.0, 4.0], [5.0, 1.0]]), torch.tensor([0.5, -1.0]), torch.tensor(0.2))
    assert y.tolist() == pytest.approx([1.0 + 0.9 * (3.0 - 0.2 * 0.5), 2.0])


def test_td3_smoothed_target_hand_computed():
    # noise clipped to +-0.5, the action to [-1, 1]
    a = smoothed_target_action(torch.tensor([[0.9, -0.2, 0.0]]), torch.tensor([[0.7, -0.1, -0.8]]), 0.5)
    assert a.tolist()[0] == pytest.approx([1.0, -0.3, -0.5])
    y = td3_targets(torch.tensor([1.0, -1.0]), torch.tensor([False, True]), 0.98,
                    torch.tensor([[2.0, 7.0], [3.0, 6.0]]))
    assert y.tolist() == pytest.approx([1.0 + 0.98 * 2.0, -1.0])


@pytest.mark.parametrize("cls,cfg", [(SACPolicy, SACConfig(tau=0.25)), (TD3Policy, TD3Config(tau=0.25))])
def test_polyak_update_moves_every_target_parameter(cls, cfg):
    pol = pendulum_policy(cls, cfg)
    n = pol.target.flat.numel()
    with torch.no_grad():
        pol.target.flat.fill_(0.0)
        pol._flat[:n].fill_(1.0)
    pol.target.update()
    assert torch.allclose(pol.target.flat, torch.full((n,), 0.25))
    # the target modules' parameters are views of target.flat: all moved (TD3: the actor's too)
    for p in pol.target.module.parameters():
        assert torch.allclose(p, torch.full_like(p, 0.25))
    assert n == sum(p.numel() for p in pol.model.critic.parameters()) + (
        sum(p.numel() for p in pol.model.actor.parameters()) if cls is TD3Policy else 0)
    assert torch.equal(pol._flat[:n], torch.ones(n))  # the online networks did not move


def test_actor_path_through_the_critic_gives_no_critic_gradient():
    twin = TwinMLP(3, [4, 4], "relu", 1, 1)
    x = torch.randn(5, 3, requires_grad=True)
    q1, q2 = twin(x, detach_params=True)
    (q1.sum() + q2.sum()).backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert all(p.grad is None for p in twin.parameters())
    # the same function either way
    assert torch.equal(twin(x)[0], twin(x, detach_params=True)[0])


def test_td3_steps_the_actor_only_on_delayed_updates():
    pol = pendulum_policy(TD3Policy, TD3Config(policy_delay=2, lr=1e-2))
    rng = np.random.default_rng(0)
    b = sb.SampleBatch({sb.OBS: rng.normal(size=(8, 3)).astype(np.float32),
                        sb.ACTIONS: rng.uniform(-1, 1, (8, 1)).astype(np.float32),
                        sb.REWARDS: rng.normal(size=8).astype(np.float32), sb.TERMINATEDS: np.zeros(8, bool),
                        sb.NEXT_OBS: rng.normal(size=(8, 3)).astype(np.float32)})
    from flowkit.core.learner import Learner
    lr = Learner("td3", {"default": pol})
    mb = sb.MultiAgentBatch({"default": b}, env_steps=8)
    actor0 = pol.actor_flat.clone()
    out = lr.update(mb)  # gradient step 1: critics only
    assert torch.equal(pol.actor_flat, actor0) and "actor_loss" not in out["stats"]["default"]
    assert set(pol.optimizer.state) == {0}
    out = lr.update(mb)  # step 2: the actor too
    assert not torch.equal(pol.actor_flat, actor0) and "actor_loss" in out["stats"]["default"]
    assert float(pol.optimizer.state[0]["step"]) == 2 and float(pol.optimizer.state[1]["step"]) == 1


def test_td3_steps_match_a_plain_torch_reference():
    """Six gradient steps (Learner.update, then the plan's UpdateTargetNetwork) against TD3's
    algorithm 1 written with separate nn.Linear networks and two torch.optim.Adam (the critics',
    the actor's): the same weights, targets and Adam moments throughout (target noise 0, so both
    sides draw nothing). Only the order inside a policy step is flowkit's: the actor loss sees the
    critics before that step's critic update (one backward pass; see flowkit_sac.td3)."""
    from flowkit.core import build_mlp
    from flowkit.core.learner import Learner
    from flowkit.core.ops import UpdateTargetNetwork
    torch.manual_seed(0)
    cfg = TD3Config(lr=3e-3, tau=0.1, gamma=0.9, policy_delay=2, target_policy_noise=0.0)
    pol = pendulum_policy(TD3Policy, cfg, hidden=(16, 12))
    c = pol.model.critic
    q = [build_mlp(4, [16, 12], "relu", 1), build_mlp(4, [16, 12], "relu", 1)]  # plain Linear/ReLU stacks
    actor = build_mlp(3, [16, 12], "relu", 1)
    with torch.no_grad():  # flowkit's initial weights into the reference
        for j, net in enumerate(q):
            net[0].weight.copy_(c.w0[16 * j:16 * (j + 1)]), net[0].bias.copy_(c.b0[16 * j:16 * (j + 1)])
            net[2].weight.copy_(c.ws[0][j].T), net[2].bias.copy_(c.bs[0][j, 0])
            net[4].weight.copy_(c.wa if j == 0 else c.wb), net[4].bias.copy_(c.ba if j == 0 else c.bb)
        for i in (0, 2, 4):
            actor[i].weight.copy_(pol.model.actor[i].weight), actor[i].bias.copy_(pol.model.actor[i].bias)
    q_t, actor_t = copy.deepcopy(q), copy.deepcopy(actor)
    opt_q = torch.optim.Adam([p for net in q for p in net.parameters()], lr=cfg.lr)
    opt_a = torch.optim.Adam(actor.parameters(), lr=cfg.lr)

    class Ctx:
        counters: dict = {"num_target_updates": 0}
    learner = Learner("td3", {"default": pol})
    target = UpdateTargetNetwork(Ctx(), learner, cfg.policy_delay)  # a stand-in context: it reads counters
    rng = np.random.default_rng(1)
    for step in range(1, 7):
        b = {sb.OBS: rng.normal(size=(8, 3)).astype(np.float32), sb.ACTIONS: rng.uniform(-1, 1, (8, 1)).astype(np.float32),
             sb.REWARDS: rng.normal(size=8).astype(np.float32), sb.TERMINATEDS: rng.random(8) < 0.3,
             sb.NEXT_OBS: rng.normal(size=(8, 3)).astype(np.float32)}
        target(learner.update(sb.MultiAgentBatch({"default": sb.SampleBatch(dict(b))}, env_steps=8)))
        o, a, r, d, o2 = (torch.from_numpy(b[k]) for k in (sb.OBS, sb.ACTIONS, sb.REWARDS, sb.TERMINATEDS, sb.NEXT_OBS))
        with torch.no_grad():  # y = r + gamma (1 - d) min_j Q_targ_j(s', mu_targ(s'))
            x2 = torch.cat([o2, torch.tanh(actor_t(o2))], -1)
            y = r + cfg.gamma * (~d).float() * torch.minimum(q_t[0](x2), q_t[1](x2)).squeeze(-1)
        x = torch.cat([o, a], -1)
        critic_loss = sum(((net(x).squeeze(-1) - y) ** 2).mean() for net in q)
        opt_q.zero_grad(), opt_a.zero_grad()
        policy_step = step % cfg.policy_delay == 0
        if policy_step:  # on the critics as they were before this step's update
            (-q[0](torch.cat([o, torch.tanh(actor(o))], -1)).mean()).backward()
            for net in q:
                for p in net.parameters():
                    p.grad = None
        critic_loss.backward()
        opt_q.step()
        if policy_step:
            opt_a.step()
            with torch.no_grad():
                for online, tgt in ((q[0], q_t[0]), (q[1], q_t[1]), (actor, actor_t)):
                    for p, pt in zip(online.parameters(), tgt.parameters()):
                        pt.lerp_(p, cfg.tau)
        for net, mine in ((actor, pol.model.actor), (actor_t, pol.target["actor"])):
            for i in (0, 2, 4):
                assert torch.allclose(net[i].weight, mine[i].weight, atol=1e-6), (step, i)
        for j, (net, tgt) in enumerate(zip(q, q_t)):
            for n_, mine in ((net, c), (tgt, pol.target["critic"])):
                assert torch.allclose(n_[0].weight, mine.w0[16 * j:16 * (j + 1)], atol=1e-6), (step, j)
                assert torch.allclose(n_[2].weight, mine.ws[0][j].T, atol=1e-6), (step, j)
                assert torch.allclose(n_[4].bias, mine.ba if j == 0 else mine.bb, atol=1e-6), (step, j)
    assert pol.num_updates == 6 and Ctx.counters["num_target_updates"] == 3
    assert not torch.allclose(actor[4].weight, actor_t[4].weight)  # the steps did move the networks


def test_box_actions_required_at_setup(run_dir):
    for algo in ("sac", "td3"):
        with pytest.raises(ConfigError, match=r"needs a Box action space, got Discrete\(2\)"):
            flowkit.train(local_overrides(run_dir, f"algo={algo}", "env=CartPole-v1", "stop.env_steps=10"))
    unbounded = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    with pytest.raises(ConfigError, match=r"SAC needs a Box action space with finite bounds, got Box\(-inf, inf"):
        SAC.check_spaces("default", unbounded, unbounded)


def test_random_actions_until_trained_weights_arrive():
    pol = pendulum_policy(SACPolicy, SACConfig())
    worker = SACPolicy(pol.observation_space, pol.action_space, pol.config, model_cfg(), inference_only=True)
    obs = np.zeros((1000, 3), np.float32)
    a, _ = worker.compute_actions_encoded(obs)
    assert a.min() < -0.9 and a.max() > 0.9 and abs(a.mean()) < 0.1  # uniform in [-1, 1]
    pol.num_updates = 3
    worker.set_weights(pol.get_weights())
    assert worker.num_updates == 3 and torch.equal(worker.actor_flat, pol.actor_flat)
    greedy, _ = worker.compute_actions_encoded(obs, explore=False)
    assert np.allclose(greedy, greedy[0]) and np.allclose(greedy, pol.compute_actions_encoded(obs, explore=False)[0])


# ---- gSDE (part 6, SAC) ------------------------------------------------------------------------------
def test_gsde_std_is_state_dependent_hand_computed():
    from flowkit_sac.sac import SDEActor
    actor = SDEActor(3, 2, model_cfg((4,)), log_std_init=-1.0)
    with torch.no_grad():
        actor.log_std.copy_(torch.tensor([[-1.0, 0.0], [0.5, -2.0], [0.0, 0.0], [-3.0, 1.0]]))
    obs = torch.tensor([[0.2, -1.0, 0.5], [1.0, 1.0, -1.0]])
    out = actor(obs)
    z = actor.trunk(obs).detach().numpy()
    S = actor.log_std.detach().numpy()
    for b in range(2):
        for j in range(2):
            var = sum(z[b, i] ** 2 * math.exp(2 * S[i, j]) for i in range(4))
            assert out[b, 2 + j].item() == pytest.approx(0.5 * math.log(var), rel=1e-5)
    assert not torch.allclose(out[0, 2:], out[1, 2:])  # the std depends on the state


@pytest.mark.parametrize("freq", [3, -1])
def test_gsde_exploration_matrix_is_held(freq):
    pol = pendulum_policy(SACPolicy, SACConfig(use_sde=True, sde_sample_freq=freq, log_std_init=0.0))
    pol.num_updates = 1  # trained weights: no uniform acting
    obs = np.full((2, 3), 0.3, np.float32)
    acts = [pol.compute_actions_encoded(obs)[0] for _ in range(4)]
    if freq == 3:
        assert np.array_equal(acts[0], acts[1]) and np.array_equal(acts[0], acts[2])
        assert not np.array_equal(acts[2], acts[3])  # redrawn after 3 steps
    else:
        assert all(np.array_equal(acts[0], a) for a in acts)
        pol.set_weights(pol.get_weights())  # new weights: a new draw
        assert not np.array_equal(acts[0], pol.compute_actions_encoded(obs)[0])
    assert not np.array_equal(acts[0][0], acts[0][1])  # one matrix per sub-env


# ---- checkpoints -------------------------------------------------------------------------------
def _build(algo, run_dir):
    pm, cfg = load_config(local_overrides(run_dir, f"algo={algo}", "env=Pendulum-v1", "runtime.num_workers=1",
                                          "runtime.num_envs_per_worker=1", "runtime.rollout_fragment_length=4",
                                          "model.hidden_sizes=[16,16]", f"{algo}.learning_starts=40",
                                          f"{algo}.train_batch_size=16", f"{algo}.buffer_size=1000"))
    ctx = setup(cfg, pm, run_dir)
    return ctx, build_plan(ctx)


def _snapshot(ctx, algo):
    pol = ctx.policies["default"]
    st = pol.get_state()
    return {"weights": st["weights"], "target": st["target_weights"], "opt": copy.deepcopy(pol.optimizer.state_dict()["state"]),
            "counters": dict(ctx.counters), "num_updates": pol.num_updates,
            "replay": ctx.stateful[f"{algo}/replay_buffer"].get_state(),
            "alpha": pol.alpha if algo == "sac" else None}


def _one_step(ctx, algo):
    from flowkit.core.ops import TrainOneStep, UpdateTargetNetwork
    learner = ctx.learners[algo]
    out = TrainOneStep(ctx, learner)(ctx.stateful[f"{algo}/replay_buffer"].sample(16))
    UpdateTargetNetwork(ctx, learner, 1)(out)
    return ctx.policies["default"].get_state()


def _equal(a, b, path=""):
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            _equal(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _equal(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=path)
    else:
        assert a == b, path


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_checkpoint_round_trip_is_exact(algo, tmp_path):
    from flowkit.checkpoint import find_checkpoint, restore, save_checkpoint
    run_dir = str(tmp_path / "run")
    ctx, plan = _build(algo, run_dir)
    while ctx.counters["num_updates"] < 30:
        next(plan)
    save_checkpoint(ctx, run_dir)
    before = _snapshot(ctx, algo)
    after = _one_step(ctx, algo)
    ctx.shutdown()
    ctx2, _ = _build(algo, str(tmp_path / "run2"))
    restore(ctx2, find_checkpoint(run_dir))
    _equal(_snapshot(ctx2, algo), before)
    _equal(_one_step(ctx2, algo), after)
    assert before["num_updates"] >= 30 and before["replay"]["buffers"]["default"]["storage"]["size"] > 40
    if algo == "sac":
        assert before["alpha"] != 1.0  # tuned, and restored exactly
    ctx2.shutdown()


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_stop_env_steps_below_learning_starts_stops_at_the_first_round_that_reaches_it(algo, run_dir):
    """learning_starts 1,000 > stop.env_steps 100: the run stops at the first sampled round at or
    after 100 env steps (128), untrained, with a start-up warning naming both keys (before: it
    sampled until learning_starts, 1,024 env steps, for one train step: SAC Hopper-v5's tuned
    config ran 10,000 env steps for stop.env_steps=2000). run.min_iter_env_steps=64: an
    iteration per two rounds of the warm-up."""
    warning = f"{algo}.learning_starts=1000 >= stop.env_steps=100: the run stops in the replay warm-up and trains nothing"
    with pytest.warns(UserWarning, match=warning.replace(".", r"\.")):
        res = flowkit.train(local_overrides(run_dir, f"algo={algo}", "env=Pendulum-v1", "runtime.num_workers=1",
                                            "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=16",
                                            "model.hidden_sizes=[16]", f"{algo}.learning_starts=1000",
                                            f"{algo}.train_batch_size=16", "run.min_iter_env_steps=64",
                                            "stop.env_steps=100"), verbose=False)
    assert res.stop_reason == "stop.env_steps=100 reached"
    assert [r["env_steps_sampled"] for r in res.history] == [64, 128]
    assert res.metrics["env_steps_trained"] == res.metrics["num_updates"] == 0


# ---- learning smoke tests ------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["sac", "td3"])
@pytest.mark.slow
def test_learning_smoke_box_target(algo, run_dir):
    """One-step episodes, reward -(a - 0.1)^2 on [0, 1]: uniform acting averages -0.24; the
    greedy policy after 600 env steps is within about 0.2 of the target (seed 0: -0.01)."""
    res = flowkit.train(local_overrides(run_dir, f"algo={algo}", BOX, "seed=0", "runtime.num_workers=1",
                                        "runtime.num_envs_per_worker=1", "runtime.rollout_fragment_length=4",
                                        "model.hidden_sizes=[32,32]", f"{algo}.learning_starts=64",
                                        f"{algo}.train_batch_size=32", f"{algo}.lr=3e-3", "stop.env_steps=600",
                                        "evaluation.final=true", "evaluation.episodes=5"))
    m = res.metrics
    assert m["env_steps_sampled"] == 600 and m["num_updates"] > 400
    assert m["evaluation_return_mean"] > -0.05, m["evaluation_return_mean"]


@pytest.mark.ray
@pytest.mark.slow
def test_sac_on_ray_workers(ray_session, run_dir):
    """The plan on Ray workers: weights arrive there as read-only arrays."""
    res = flowkit.train(["runtime.backend=ray", f"run.dir={run_dir}", "run.reporters=[csv,checkpoint,evaluation]",
                         "algo=sac", "env=Pendulum-v1", "runtime.num_workers=1", "runtime.num_envs_per_worker=2",
                         "runtime.rollout_fragment_length=8", "model.hidden_sizes=[16]", "sac.learning_starts=32",
                         "sac.train_batch_size=16", "sac.training_intensity=4", "stop.env_steps=160"])
    m = res.metrics
    assert m["env_steps_sampled"] >= 160 and m["num_updates"] > 0 and np.isfinite(m["learner/default/critic_loss"])


# ---- part 7: SAC with PPO on continuous simple_spread -----------------------------------------------
def test_sac_and_ppo_mixed_on_continuous_simple_spread(run_dir):
    res = flowkit.train(local_overrides(
        run_dir, "env.factory=mpe2.simple_spread_v3:parallel_env", "env.kwargs.continuous_actions=true",
        "env.kwargs.max_cycles=25", "runtime.num_workers=1", "runtime.num_envs_per_worker=2",
        "runtime.rollout_fragment_length=25", "multiagent.policies.soft.algo=sac",
        "multiagent.policies.onpol.algo=ppo", "multiagent.mapping.agent_0=soft", "multiagent.mapping.agent_*=onpol",
        "model.hidden_sizes=[32,32]", "sac.learning_starts=50", "sac.train_batch_size=32",
        "sac.training_intensity=8", "ppo.num_epochs=1", "ppo.minibatch_size=50", "stop.env_steps=300"))
    m = res.metrics
    assert m["env_steps_sampled"] >= 300
    assert "learner/soft/critic_loss" in m and "learner/onpol/pg_loss" in m
    assert np.isfinite(m["policy/soft/episode_return_mean"]) and np.isfinite(m["policy/onpol/episode_return_mean"])
