"""What RL Zoo users set for continuous control, on PPO: reward normalisation (running std
of discounted returns, SB3's VecNormalize norm_reward) and gSDE (Raffin et al. 2021)."""
import gymnasium as gym
import numpy as np
import pytest
import torch

import flowkit
from conftest import local_overrides
from flowkit.checkpoint import from_plain, load_state, to_plain
from flowkit.config import section_object
from flowkit.core import batch as sb
from flowkit.engine import load_config
from flowkit_ppo import PPOConfig
from flowkit_ppo.ppo import PPOPolicy

BOX1 = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)


def _ppo(obs_space=BOX1, act_space=BOX1, inference_only=False, seed=0, **kw):
    _, cfg = load_config(["algo=ppo", "env=Pendulum-v1", *[f"ppo.{k}={v}" for k, v in kw.items()]])
    return PPOPolicy(obs_space, act_space, section_object(cfg, "ppo", PPOConfig), cfg.model, "cpu", seed,
                     inference_only=inference_only)


def _frag(eps, rewards, term, trunc=None):
    n = len(rewards)
    return sb.SampleBatch({sb.OBS: np.zeros((n, 1), np.float32), sb.NEXT_OBS: np.zeros((n, 1), np.float32),
                           sb.ACTIONS: np.zeros((n, 1), np.float32), sb.REWARDS: np.array(rewards, np.float32),
                           sb.TERMINATEDS: np.array(term, bool),
                           sb.TRUNCATEDS: np.array(trunc if trunc is not None else [0] * n, bool),
                           sb.EPS_ID: np.array(eps, np.int64), sb.VF_PREDS: np.zeros(n, np.float32)})


# ---- reward normalisation ----------------------------------------------------------------------
def test_reward_normalisation_by_hand():
    """gamma 0.5, var(R) = 4 (std 2). Fragment 1: episode 7 gets r = 1, 2 and is cut;
    episode 8 gets r = 3 and terminates. R = [1, 0.5 * 1 + 2 = 2.5, 3]; rewards / 2 =
    [0.5, 1, 1.5]. Fragment 2: episode 7 goes on (R = 0.5 * 2.5 + 4 = 5.25) and is truncated;
    episode 9 starts with r = 30 (R = 30; 15 clipped to 10)."""
    pol = _ppo(normalize_rewards=True, gamma=0.5)
    pol.model.ret_rms.var.fill_(4.0)
    out = pol.normalize_rewards(_frag([7, 7, 8], [1, 2, 3], [0, 0, 1]))
    np.testing.assert_allclose(out[sb.DISCOUNTED_RETURNS], [1, 2.5, 3])
    np.testing.assert_allclose(out[sb.REWARDS], [0.5, 1, 1.5], rtol=1e-6)
    assert pol._ret_acc == {(7, 0): 2.5}                      # only the cut episode is carried
    out = pol.postprocess_trajectory(_frag([7, 9], [4, 30], [0, 0], [1, 0]))
    np.testing.assert_allclose(out[sb.DISCOUNTED_RETURNS], [5.25, 30])
    np.testing.assert_allclose(out[sb.REWARDS], [2, 10], rtol=1e-6)
    np.testing.assert_allclose(out[sb.VALUE_TARGETS][0], 2.0, rtol=1e-6)  # GAE sees the scaled reward (V = 0)
    assert pol._ret_acc == {(9, 0): 30}
    # the learner's statistics: the variance of the returns it trained on (count starts at 1e-4)
    pol.model.ret_rms.var.fill_(1.0)
    pol.update_normalizers({sb.OBS: torch.zeros(3, 1), sb.DISCOUNTED_RETURNS: torch.tensor([1.0, 2.5, 3.0])})
    assert float(pol.model.ret_rms.var) == pytest.approx(np.var([1, 2.5, 3]), rel=1e-3)
    assert float(pol.model.ret_rms.mean) == pytest.approx(6.5 / 3, rel=1e-3)


def test_reward_normalisation_is_off_by_default_and_its_statistics_are_checkpointed(run_dir):
    pol = _ppo()
    assert pol.model.ret_rms is None
    assert sb.DISCOUNTED_RETURNS not in pol.postprocess_trajectory(_frag([1, 1], [1, 2], [0, 1]))
    res = flowkit.train(local_overrides(run_dir, "algo=ppo", "env=Pendulum-v1", "runtime.num_envs_per_worker=2",
                                        "runtime.rollout_fragment_length=128", "ppo.minibatch_size=128",
                                        "ppo.num_epochs=1", "ppo.normalize_rewards=true", "stop.iterations=3"))
    assert np.isfinite(res.metrics["learner/default/vf_loss"])
    assert res.metrics["episode_return_mean"] < -100            # reported returns stay raw (Pendulum)
    st = load_state(res.checkpoint)
    w = st["policies"]["default"]["weights"]                    # one update per trained row
    assert float(w["ret_rms.count"]) == pytest.approx(st["counters"]["env_steps_trained"], abs=1e-3)
    assert float(w["ret_rms.var"]) > 1.0 and w["ret_rms.var"].shape == ()   # 0-d stays 0-d
    algo = flowkit.Algorithm.from_checkpoint(res.checkpoint)
    rms = algo.get_policy().model.ret_rms
    assert all(np.array_equal(getattr(rms, k).numpy(), w[f"ret_rms.{k}"]) for k in ("mean", "var", "count"))
    assert rms.count.dtype == torch.float64
    # and a policy's state round trip through the checkpoint's plain format is exact
    pol = _ppo(normalize_rewards=True)
    pol.update_normalizers({sb.OBS: torch.zeros(2, 1), sb.DISCOUNTED_RETURNS: torch.tensor([-3.0, 7.5])})
    pol2 = _ppo(normalize_rewards=True)
    pol2.set_state(from_plain(to_plain(pol.get_state())))
    for k in ("mean", "var", "count"):
        assert torch.equal(getattr(pol.model.ret_rms, k), getattr(pol2.model.ret_rms, k))


# ---- gSDE ----------------------------------------------------------------------------------------
def _sde_policy(hidden="[]", obs_dim=2, act_dim=1, **kw):
    _, cfg = load_config(["algo=ppo", "env=Pendulum-v1", f"model.hidden_sizes={hidden}", "ppo.use_sde=true",
                          *[f"ppo.{k}={v}" for k, v in kw.items()]])
    return PPOPolicy(gym.spaces.Box(-5.0, 5.0, (obs_dim,), np.float32), gym.spaces.Box(-1.0, 1.0, (act_dim,)),
                     section_object(cfg, "ppo", PPOConfig), cfg.model, "cpu", 0, inference_only=True)


def test_sde_log_prob_by_hand():
    """No hidden layer, so gSDE's features z(s) are the observation: obs (1, 2), exploration
    stds exp(sde_log_std) = (1, 0.5) -> var = 1 * 1 + 4 * 0.25 = 2; mean 0.3 (bias only).
    The action 1.3 has log N(1.3; 0.3, 2 + 1e-6)."""
    pol = _sde_policy()
    with torch.no_grad():
        pol.model.twin.wa.zero_()
        pol.model.twin.ba.fill_(0.3)
        pol.model.sde_log_std.copy_(torch.log(torch.tensor([[1.0], [0.5]])))
    inputs, _ = pol.model(torch.tensor([[1.0, 2.0]]))
    var = 2.0 + 1e-6
    want = -0.5 * 1.0 / var - 0.5 * np.log(var) - 0.5 * np.log(2 * np.pi)
    assert float(pol.dist.logp(inputs, torch.tensor([[1.3]])).detach()) == pytest.approx(want, rel=1e-6)
    # sampled: a = mean + z @ W, and the stored log-prob is that of the state-dependent Gaussian
    obs = np.array([[1.0, 2.0], [-3.0, 0.5]], np.float32)
    a, extras = pol.compute_actions_encoded(obs)
    w = pol._sde_w.numpy()                                    # [2 rows, 2 features, 1 action]
    np.testing.assert_allclose(a - 0.3, np.einsum("bi,bij->bj", obs, w), rtol=1e-5, atol=1e-6)
    std = np.sqrt(obs ** 2 @ np.array([[1.0], [0.25]]) + 1e-6)
    logp = (-0.5 * ((a - 0.3) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi)).sum(-1)
    np.testing.assert_allclose(extras[sb.ACTION_LOGP], logp, rtol=1e-5)
    np.testing.assert_array_equal(pol.compute_actions_encoded(obs, explore=False)[0], np.full((2, 1), 0.3, np.float32))


@pytest.mark.parametrize("freq", [3, -1])
def test_sde_noise_is_held_between_draws(freq):
    """The same observations give the same actions until the exploration matrices are drawn
    again: every ``sde_sample_freq`` steps, or (-1) only when new weights arrive."""
    pol = _sde_policy(hidden="[8]", obs_dim=3, act_dim=2, sde_sample_freq=freq)
    obs = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    acts = [pol.compute_actions_encoded(obs)[0] for _ in range(7)]
    assert not np.array_equal(acts[0][0], acts[0][1])         # one matrix per sub-env (row)
    if freq == 3:
        groups = [acts[0:3], acts[3:6], acts[6:7]]
        for g in groups:
            assert all(np.array_equal(g[0], x) for x in g)
        assert not np.array_equal(acts[2], acts[3]) and not np.array_equal(acts[5], acts[6])
    else:
        assert all(np.array_equal(acts[0], x) for x in acts)
    pol.set_weights(pol.get_weights())                        # a new rollout: new matrices
    assert not np.array_equal(pol.compute_actions_encoded(obs)[0], acts[-1])


def test_sde_is_off_by_default_and_ppo_trains_with_it(run_dir):
    pol = _ppo()
    assert pol.model.sde_log_std is None and pol.model.log_std is not None
    with pytest.raises(flowkit.ConfigError, match="ppo.sde_sample_freq=0"):
        flowkit.describe_plan(["algo=ppo", "env=Pendulum-v1", "ppo.use_sde=true", "ppo.sde_sample_freq=0"])
    res = flowkit.train(local_overrides(run_dir, "algo=ppo", "env=Pendulum-v1", "runtime.num_envs_per_worker=2",
                                        "runtime.rollout_fragment_length=128", "ppo.minibatch_size=128",
                                        "ppo.num_epochs=2", "ppo.use_sde=true", "ppo.sde_sample_freq=4",
                                        "ppo.log_std_init=-2", "stop.iterations=3"))
    m = res.metrics
    assert np.isfinite(m["learner/default/total_loss"]) and np.isfinite(m["learner/default/entropy"])
    w = load_state(res.checkpoint)["policies"]["default"]["weights"]
    assert w["sde_log_std"].shape == (64, 1) and "log_std" not in w
    assert not np.allclose(w["sde_log_std"], -2.0)            # learned through the loss


# ---- issue 27 item 11: model.init and gSDE's SB3 options -------------------------------------
def _linear_layers(module):
    """(weight, bias, fan_in) of every linear layer, TwinMLP layers included."""
    from flowkit.core import TwinMLP
    out = []
    for m in module.modules():
        if isinstance(m, TwinMLP):
            out += [(w, b, w.shape[1]) for w, b in ([(m.w0, m.b0)] if m.hidden else []) + list(zip(m.ws, m.bs))
                    + [(m.wa, m.ba), (m.wb, m.bb)]]
        elif isinstance(m, torch.nn.Linear):
            out.append((m.weight, m.bias, m.weight.shape[1]))
    return out


@pytest.mark.parametrize("algo, env", [("ppo", "Pendulum-v1"), ("ppo", "CartPole-v1"), ("impala", "CartPole-v1"),
                                       ("a2c", "CartPole-v1"), ("dqn", "CartPole-v1"), ("sac", "Pendulum-v1"),
                                       ("td3", "Pendulum-v1")])
def test_model_init_sets_every_network(algo, env):
    """``model.init=default``: PyTorch's init (weights and biases in +-1/sqrt(fan_in), biases
    not zero); ``orthogonal``: zero biases, orthogonal weights; ``auto``: as each algorithm
    builds it (DQN: PyTorch's)."""
    from flowkit.engine import setup
    layers = {}
    for init in ("auto", "orthogonal", "default"):
        pm, cfg = load_config([f"algo={algo}", f"env={env}", "runtime.backend=local", f"model.init={init}",
                               "model.hidden_sizes=[16,16]"])
        layers[init] = _linear_layers(setup(cfg, pm).policies["default"].model)
        assert len(layers[init]) >= 3, (algo, init)
    for w, b, fan_in in layers["default"]:
        w, b = w.detach(), b.detach()
        assert float(w.abs().max()) <= 1 / np.sqrt(fan_in) + 1e-6 and float(b.abs().max()) <= 1 / np.sqrt(fan_in) + 1e-6
        assert float(b.abs().max()) > 0
    for w, b, _ in layers["orthogonal"]:
        assert float(b.abs().max()) == 0.0
        w2 = w.detach().reshape(-1, w.shape[-1]) if w.dim() == 2 else w.detach()[0].T  # (out, in) rows
        rows = w2 if w2.shape[0] <= w2.shape[1] else w2.T
        gram = rows @ rows.T  # gain^2 I for orthogonal rows
        np.testing.assert_allclose(gram.numpy(), np.eye(len(gram)) * float(gram[0, 0]), atol=1e-4)
    auto_zero = all(float(b.abs().max()) == 0.0 for _, b, _ in layers["auto"])
    assert auto_zero == (algo != "dqn")  # DQN's Q-network: PyTorch's init unless model.init=orthogonal


def test_sde_expln_and_learn_features():
    """SB3's gSDE options. use_expln: std = exp(x) for x <= 0, log1p(x) + 1 above; learn_features:
    the log-prob's gradient reaches the policy's hidden layer through the std."""
    from flowkit.core import sde_std
    x = torch.tensor([-2.0, 0.0, 0.5, 3.0])
    np.testing.assert_allclose(sde_std(x, True).numpy(), [np.exp(-2.0), 1.0, np.log1p(0.5) + 1, np.log1p(3.0) + 1],
                               rtol=1e-6)
    np.testing.assert_allclose(sde_std(x).numpy(), np.exp(x.numpy()), rtol=1e-6)
    pol = _sde_policy(use_expln="true")
    with torch.no_grad():
        pol.model.twin.wa.zero_()
        pol.model.twin.ba.fill_(0.3)
        pol.model.sde_log_std.copy_(torch.tensor([[1.0], [-1.0]]))  # stds log1p(1) + 1 and exp(-1)
    inputs, _ = pol.model(torch.tensor([[1.0, 2.0]]))
    var = (np.log(2.0) + 1) ** 2 + 4 * np.exp(-2.0)
    assert float(inputs[0, 1]) == pytest.approx(0.5 * np.log(var + 1e-6), rel=1e-5)
    a, _ = pol.compute_actions_encoded(np.array([[1.0, 2.0]], np.float32))  # W's entries ~ N(0, std^2)
    assert pol._sde_w.shape == (1, 2, 1)
    grads = {}
    for learn in ("false", "true"):
        p = _sde_policy(hidden="[4]", learn_features=learn)
        inputs, _ = p.model(torch.tensor([[1.0, 2.0]]))
        inputs[0, 1].backward()  # the log-std output: reaches the hidden layer only through z(s) when learned
        grads[learn] = float(p.model.twin.w0.grad.abs().sum())
    assert grads["false"] == 0.0 and grads["true"] > 0.0


def test_sac_sde_clip_mean_expln_and_learn_features():
    from flowkit_sac import SACConfig
    from flowkit_sac.sac import SACPolicy
    from flowkit.config import ModelConfig
    obs, act = gym.spaces.Box(-5.0, 5.0, (3,), np.float32), gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    x = torch.tensor([[4.0, -4.0, 4.0]])
    for clip in (2.0, 0.0):
        pol = SACPolicy(obs, act, SACConfig(use_sde=True, clip_mean=clip, use_expln=True), ModelConfig(), "cpu", 0)
        actor = pol.model.actor
        with torch.no_grad():
            actor.mu[0].bias.fill_(5.0)  # a pre-tanh mean of about 5
            actor.log_std.fill_(1.0)
        mean = float(actor(x)[0, 0])
        assert mean == pytest.approx(2.0) if clip else mean > 4.0
        np.testing.assert_allclose(actor.std().detach().numpy(), np.log1p(1.0) + 1.0, rtol=1e-6)
    pol = SACPolicy(obs, act, SACConfig(use_sde=True, learn_features=True), ModelConfig(), "cpu", 0)
    pol.model.actor(x)[0, 1].backward()
    assert float(pol.model.actor.trunk[0].weight.grad.abs().sum()) > 0.0
