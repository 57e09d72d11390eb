"""APPO (plugins/impala/flowkit_impala/appo.py): the loss by hand on a 3-row batch, the target
network and KL coefficient through a checkpoint, the plan, and learning CartPole (local smoke
test; the 2-Ray-worker acceptance run is marked slow)."""
import math
import os

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

import flowkit
from conftest import local_overrides
from flowkit.checkpoint import from_plain, load_state, to_plain
from flowkit.config import section_object
from flowkit.core import batch as sb
from flowkit.core.learner import Learner
from flowkit.engine import load_config
from flowkit_impala import APPOConfig
from flowkit_impala.appo import APPOPolicy

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _policy(**kw):
    _, cfg = load_config(["algo=appo", "env=CartPole-v1", *[f"appo.{k}={v}" for k, v in kw.items()]])
    sec = section_object(cfg, "appo", APPOConfig)
    return APPOPolicy(gym.spaces.Box(-10.0, 10.0, (1,), np.float32), gym.spaces.Discrete(2), sec, cfg.model, "cpu", 0)


def _last_linear(seq: nn.Module) -> nn.Linear:
    return [m for m in seq.modules() if isinstance(m, nn.Linear)][-1]


@torch.no_grad()
def _set_heads(model, logits, value):
    """Make the policy output ``logits`` and the value ``value`` for every observation."""
    for seq, bias in ((model.pi, logits), (model.vf, [value])):
        lin = _last_linear(seq)
        lin.weight.zero_()
        lin.bias.copy_(torch.tensor(bias))


def _batch(rng=None, n=3):
    """One trajectory of 3 rows ending in a termination, actions [1, 0, 1], behaviour
    probabilities mu = [0.5, 0.25, 0.8], rewards [1, 0, 2]."""
    if rng is not None:
        return sb.SampleBatch({sb.OBS: rng.normal(size=(n, 1)).astype(np.float32),
                               sb.NEXT_OBS: rng.normal(size=(n, 1)).astype(np.float32),
                               sb.ACTIONS: rng.integers(0, 2, n), sb.REWARDS: rng.normal(size=n).astype(np.float32),
                               sb.TERMINATEDS: np.arange(n) % 5 == 4, sb.TRUNCATEDS: np.zeros(n, bool),
                               sb.EPS_ID: np.arange(n) // 5, sb.ACTION_LOGP: np.full(n, np.log(0.5), np.float32)})
    return sb.SampleBatch({sb.OBS: np.array([[0.1], [0.2], [0.3]], np.float32),
                           sb.NEXT_OBS: np.array([[0.2], [0.3], [0.4]], np.float32),
                           sb.ACTIONS: np.array([1, 0, 1]), sb.REWARDS: np.array([1.0, 0.0, 2.0], np.float32),
                           sb.TERMINATEDS: np.array([0, 0, 1], bool), sb.TRUNCATEDS: np.zeros(3, bool),
                           sb.EPS_ID: np.zeros(3, np.int64),
                           sb.ACTION_LOGP: np.log(np.array([0.5, 0.25, 0.8], np.float32))})


@pytest.mark.parametrize("use_kl_loss,mode", [(False, "contiguous"), (True, "contiguous"), (False, "shuffled")])
def test_loss_by_hand(use_kl_loss, mode):
    """pi = (0.25, 0.75) and pi_target = (0.5, 0.5) everywhere, V = 0.5, gamma 0.9.
    V-trace with pi_target: rho = 0.5 / mu = [1, 2, 0.625] -> clipped [1, 1, 0.625];
    delta = [0.95, -0.05, 0.9375]; vs - V = [1.664375, 0.79375, 0.9375] (backwards, c = rho);
    A = [1.664375, 0.79375, 0.625 * 1.5]. Surrogate ratio is_ratio * pi / mu with
    is_ratio = min(2, mu / 0.5) = [1, 0.5, 1.6]: [1.5, 0.5, 1.5] = pi / pi_target, clipped to
    [1.2, 0.8, 1.2]; A > 0, so the min picks [1.2, 0.5, 1.2] * A. ``minibatch_mode=shuffled``
    takes V from the target network, 0.5 too: the same figures, from prepare_batch."""
    pol = _policy(gamma=0.9, clip_param=0.2, vf_coef=0.5, ent_coef=0.01, use_kl_loss=use_kl_loss, kl_coeff=0.5,
                  minibatch_mode=mode)
    _set_heads(pol.model, [0.0, math.log(3.0)], 0.5)
    _set_heads(pol.target.module, [0.0, 0.0], 0.5)
    loss, st = pol.loss(pol.prepare_batch(_batch()))
    adv = np.array([1.664375, 0.79375, 0.9375])
    pg_loss = -np.mean(np.array([1.2, 0.5, 1.2]) * adv)
    vf_loss = 0.5 * np.mean(adv ** 2)                       # vs - V = A here (rho = c = 1 before the end)
    entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    kl = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    total = pg_loss + 0.5 * vf_loss - 0.01 * entropy + (0.5 * kl if use_kl_loss else 0.0)
    assert st["pg_loss"] == pytest.approx(pg_loss, rel=1e-5)
    assert st["vf_loss"] == pytest.approx(vf_loss, rel=1e-5)
    assert st["entropy"] == pytest.approx(entropy, rel=1e-5)
    assert st["kl"] == pytest.approx(kl, rel=1e-5)
    assert st["clip_frac"] == 1.0 and st["is_ratio_mean"] == pytest.approx((1 + 0.5 + 1.6) / 3, rel=1e-5)
    assert float(loss.detach()) == pytest.approx(total, rel=1e-5) and st["total_loss"] == pytest.approx(total, rel=1e-5)
    loss.backward()
    grad = _last_linear(pol.model.pi).bias.grad
    assert grad is not None and torch.all(torch.isfinite(grad)) and grad.abs().sum() > 0


def test_loss_with_advantages_standardised_per_minibatch():
    """``appo.normalize_advantages=minibatch``: the batch of test_loss_by_hand with
    A = [1.664375, 0.79375, 0.9375] standardised (mean 1.13187..., population std) to
    [+, -, -]; the ratios [1.5, 0.5, 1.5] clip to [1.2, 0.8, 1.2], and the min picks
    [1.2, 0.8, 1.5] (clipped where A > 0 or the ratio is below 1 - eps, unclipped else)."""
    pol = _policy(gamma=0.9, clip_param=0.2, normalize_advantages="minibatch")
    _set_heads(pol.model, [0.0, math.log(3.0)], 0.5)
    _set_heads(pol.target.module, [0.0, 0.0], 0.5)
    _, st = pol.loss(pol.prepare_batch(_batch()))
    adv = np.array([1.664375, 0.79375, 0.9375])
    z = (adv - adv.mean()) / adv.std()
    assert np.sign(z).tolist() == [1, -1, -1]
    assert st["pg_loss"] == pytest.approx(-np.mean(np.array([1.2, 0.8, 1.5]) * z), rel=1e-5)
    assert st["vf_loss"] == pytest.approx(0.5 * np.mean(adv ** 2), rel=1e-5)  # the value targets are not standardised


def test_shuffled_minibatches_take_v_trace_from_the_target_network_once_per_batch():
    """``minibatch_mode=shuffled``: prepare_batch's targets are V-trace's on the whole batch with
    the target network's log-probs and values (the online network's value head differs), every
    column one per row; the Learner shuffles rows (contiguous=False in the plan) and trains."""
    from flowkit.core import vtrace
    pol = _policy(gamma=0.9, minibatch_mode="shuffled")
    _set_heads(pol.target.module, [0.0, 0.0], 0.5)
    _set_heads(pol.model, [0.0, 1.0], -3.0)
    b = _batch(np.random.default_rng(0), 10)
    tb = pol.prepare_batch(b)
    assert all(v.shape[0] == 10 for v in tb.values()) and "boot_obs" not in tb
    cont = np.ones(10)
    cont[[4, 9]] = 0                                  # terminations at rows 4 and 9 (t % 5 == 4)
    nv = np.where(cont > 0, 0.5, 0.0)
    vs, adv = vtrace(np.log(0.5) - b[sb.ACTION_LOGP], b[sb.REWARDS], np.full(10, 0.5), nv, cont, 0.9)
    assert np.allclose(tb["vtrace_vs"].numpy(), vs, atol=1e-6) and np.allclose(tb["vtrace_adv"].numpy(), adv, atol=1e-6)
    learner = Learner("appo", {"default": pol}, num_epochs=2, minibatch_size=4, contiguous=False)
    st = learner.update(sb.MultiAgentBatch({"default": b}, 10))["stats"]["default"]
    assert st["num_sgd_steps"] == 6 and math.isfinite(st["total_loss"])
    from flowkit_impala.appo import APPO
    _, cfg = load_config(["algo=appo", "env=CartPole-v1", "appo.minibatch_mode=shuffled"])
    assert not APPO(cfg).contiguous_minibatches()


def test_target_network_is_fixed_between_updates_and_kl_coeff_adapts():
    pol = _policy(target_update_freq=2, use_kl_loss=True, kl_coeff=1.0, kl_target=1e-9, lr=0.01)
    learner = Learner("appo", {"default": pol}, num_epochs=2, minibatch_size=None, contiguous=True)
    b = sb.MultiAgentBatch({"default": _batch(np.random.default_rng(0), 10)}, 10)
    t0 = {k: v.clone() for k, v in pol.target.module.state_dict().items()}
    learner.update(b)
    assert all(torch.equal(t0[k], v) for k, v in pol.target.module.state_dict().items())  # 1 of 2 batches
    assert pol.kl_coeff == 1.5                       # kl > 2 * kl_target after 2 epochs
    learner.update(b)
    assert all(torch.equal(pol.model.state_dict()[k], v) for k, v in pol.target.module.state_dict().items())
    assert pol.train_batches == 2 and not any(p.requires_grad for p in pol.target.module.parameters())


def test_checkpoint_round_trip_is_exact_with_the_target_network(tmp_path):
    pol = _policy(target_update_freq=3, use_kl_loss=True, lr=0.01)
    learner = Learner("appo", {"default": pol}, num_epochs=2, minibatch_size=5, contiguous=True)
    rng = np.random.default_rng(1)
    for _ in range(2):                                  # target now differs from the policy
        learner.update(sb.MultiAgentBatch({"default": _batch(rng, 10)}, 10))
    path = str(tmp_path / "state.pt")
    torch.save(to_plain(pol.get_state()), path)
    pol2 = _policy(target_update_freq=3, use_kl_loss=True, lr=0.01)
    _set_heads(pol2.target.module, [3.0, 1.0], 2.0)      # overwritten by set_state
    pol2.set_state(from_plain(torch.load(path, weights_only=True)))
    s1, s2 = pol.get_state(), pol2.get_state()
    for k in ("weights", "target_weights"):
        assert s1[k].keys() == s2[k].keys() and all(np.array_equal(s1[k][n], s2[k][n]) for n in s1[k])
    assert any(not np.array_equal(s1["weights"][n], s1["target_weights"][n]) for n in s1["weights"])
    assert (s2["kl_coeff"], s2["train_batches"], s2["num_updates"]) == (s1["kl_coeff"], 2, s1["num_updates"])
    # the next update is the same, bit for bit (optimizer state included)
    b = sb.MultiAgentBatch({"default": _batch(rng, 10)}, 10)
    learner2 = Learner("appo", {"default": pol2}, num_epochs=2, minibatch_size=5, contiguous=True)
    st1, st2 = learner.update(b)["stats"]["default"], learner2.update(b)["stats"]["default"]
    assert st1["total_loss"] == st2["total_loss"]
    w1, w2 = pol.get_state(), pol2.get_state()
    assert all(np.array_equal(w1[k][n], w2[k][n]) for k in ("weights", "target_weights") for n in w1[k])


def test_plan_and_config_keys():
    text = flowkit.describe_plan(["algo=appo", "env=CartPole-v1"])["text"]
    assert "to the learner thread (queue 2)" in text and "SyncWeights(to=source" in text
    with pytest.raises(flowkit.ConfigError, match="appo.minibatch_size"):
        flowkit.describe_plan(["algo=appo", "env=CartPole-v1", "appo.minibatch_size=1000"])
    with pytest.raises(flowkit.ConfigError, match="appo.clip_param"):
        flowkit.describe_plan(["algo=appo", "env=CartPole-v1", "appo.clip_param=0"])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["contiguous", "shuffled"])
def test_learns_cartpole_locally(run_dir, mode):
    """Smoke test: the acceptance settings on the local backend, a loose threshold (a few
    seconds; ~90k env steps to 450 on seed 0); shuffled minibatches of 64 too (4 epochs: 450 at
    108k and 48k env steps on seeds 0 and 1, contiguous ones at 138k and 116k)."""
    more = ["appo.minibatch_mode=shuffled", "appo.minibatch_size=64", "appo.num_epochs=4"] if mode == "shuffled" else []
    res = flowkit.train(local_overrides(run_dir, "seed=0", "runtime.num_workers=2", "stop.episode_return_mean=200",
                                        "stop.env_steps=150000", *more),
                        config_file=os.path.join(REPO, "configs", "appo", "CartPole-v1.yaml"))
    m = res.metrics
    assert m["episode_return_mean"] >= 200, m
    pol = load_state(res.checkpoint)["policies"]["default"]
    assert pol["target_weights"].keys() == pol["weights"].keys() and pol["train_batches"] > 0


@pytest.mark.slow
def test_appo_solves_cartpole_two_ray_workers(run_dir, ray_session):
    """configs/appo/CartPole-v1.yaml: 2 Ray workers, episode_return_mean >= 450 within 500,000
    env steps (more seeds: bench/impala.py --acceptance 0 1 2 --algo appo)."""
    res = flowkit.train([f"run.dir={run_dir}", "run.reporters=[csv,checkpoint,evaluation]", "seed=0",
                         "checkpoint.at_end=false"],
                        config_file=os.path.join(REPO, "configs", "appo", "CartPole-v1.yaml"))
    assert res.metrics["episode_return_mean"] >= 450, res.metrics
