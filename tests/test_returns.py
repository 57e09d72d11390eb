"""Core returns and advantages, computed by hand: GAE (Schulman et al. 2016, eq. 16), V-trace
(Espeholt et al. 2018, eq. 1) against the paper's sum, and where trajectory pieces end and
bootstrap."""
import numpy as np

from flowkit.core import batch as sb
from flowkit.core.learner import Learner
from flowkit.core import bootstrap_rows, compute_gae, next_values, trajectory_ends, vtrace


# ---- GAE -------------------------------------------------------------------------------------
def test_compute_gae_three_steps_by_hand():
    """gamma=0.9, lambda=0.8, r=[1,2,3], V=[0.5,1,1.5]; row 1 truncated (V(final obs)=2),
    row 2 terminated: A2 = 3 - 1.5 = 1.5; A1 = 2 + 0.9*2 - 1 = 2.8;
    A0 = (1 + 0.9*1 - 0.5) + 0.9*0.8*2.8 = 3.416."""
    adv, vt = compute_gae(np.array([1.0, 2.0, 3.0], np.float32), np.array([0.5, 1.0, 1.5], np.float32),
                          np.array([1.0, 2.0, 0.0], np.float32), np.array([1.0, 0.0, 0.0], np.float32),
                          gamma=0.9, gae_lambda=0.8)
    assert adv.dtype == np.float32 and vt.dtype == np.float32
    np.testing.assert_allclose(adv, [3.416, 2.8, 1.5], rtol=1e-6)
    np.testing.assert_allclose(vt, [3.916, 3.8, 3.0], rtol=1e-6)


def test_compute_gae_cut_fragment_bootstraps():
    adv, vt = compute_gae(np.array([1.0, 1.0]), np.array([0.0, 0.0]), np.array([0.0, 5.0]),
                          np.array([1.0, 0.0]), gamma=0.5, gae_lambda=1.0)
    # A1 = 1 + 0.5*5 = 3.5 ; A0 = 1 + 0.5*0 - 0 + 0.5*1*3.5 = 2.75
    np.testing.assert_allclose(adv, [2.75, 3.5])
    np.testing.assert_allclose(vt, [2.75, 3.5])


def test_bootstrap_rows_and_next_values():
    """Rows: [e7 t0, e7 t1 truncated, e8 t0 terminated, e9 t0 (cut: the last row)]."""
    b = sb.SampleBatch({sb.TERMINATEDS: np.array([False, False, True, False]),
                        sb.TRUNCATEDS: np.array([False, True, False, False]), sb.EPS_ID: np.array([7, 7, 8, 9])})
    cont, boot = bootstrap_rows(b)
    assert cont.tolist() == [1.0, 0.0, 0.0, 0.0] and boot.tolist() == [1, 3]
    nv = next_values(np.array([0.5, 1.0, 1.5, -2.0], np.float32), cont, boot, np.array([7.0, 9.0], np.float32))
    assert nv.dtype == np.float32 and nv.tolist() == [1.0, 7.0, 0.0, 9.0]


def test_a_gap_in_the_step_index_is_a_trajectory_end():
    """A replayed fragment (t = 0, 1) next to a newer one of the same episode (t = 5, 6)."""
    b = sb.SampleBatch({sb.TERMINATEDS: np.zeros(4, bool), sb.TRUNCATEDS: np.zeros(4, bool),
                        sb.EPS_ID: np.full(4, 3), sb.T: np.array([0, 1, 5, 6])})
    ends, term = trajectory_ends(b)
    assert ends.tolist() == [False, True, False, True] and not term.any()



# ---- V-trace ---------------------------------------------------------------------------------
def test_vtrace_two_steps_by_hand():
    """gamma=0.9, r=[1,2], V(x0)=0.5, V(x1)=1, bootstrap V(x2)=2, pi/mu=[2, 0.5], rho_bar=c_bar=1.
    rho=[1, 0.5], c=[1, 0.5]
    delta1 = 0.5*(2 + 0.9*2 - 1) = 1.4          v1 = 1 + 1.4 = 2.4
    delta0 = 1*(1 + 0.9*1 - 0.5) = 1.4          v0 = 0.5 + 1.4 + 0.9*1*1.4 = 3.16
    A0 = 1*(1 + 0.9*v1 - 0.5) = 2.66            A1 = 0.5*(2 + 0.9*2 - 1) = 1.4
    Terminated at step 2 instead (V(x2) = v2 = 0):
    delta1 = 0.5*(2 - 1) = 0.5 -> v1 = 1.5;  v0 = 0.5 + 1.4 + 0.9*0.5 = 2.35
    A1 = 0.5*(2 - 1) = 0.5;  A0 = 1 + 0.9*1.5 - 0.5 = 1.85"""
    log_rhos = np.log([2.0, 0.5])
    r, v = np.array([1.0, 2.0]), np.array([0.5, 1.0])
    vs, adv = vtrace(log_rhos, r, v, next_values=np.array([1.0, 2.0]), nextnonterminal=np.array([1.0, 0.0]),
                     gamma=0.9)
    np.testing.assert_allclose(vs, [3.16, 2.4], atol=1e-6)
    np.testing.assert_allclose(adv, [2.66, 1.4], atol=1e-6)
    vs, adv = vtrace(log_rhos, r, v, next_values=np.array([1.0, 0.0]), nextnonterminal=np.array([1.0, 0.0]),
                     gamma=0.9)
    np.testing.assert_allclose(vs, [2.35, 1.5], atol=1e-6)
    np.testing.assert_allclose(adv, [1.85, 0.5], atol=1e-6)


def paper_vtrace(log_rhos, r, values, bootstrap, gamma, rho_bar, c_bar, pg_rho_bar):
    """One trajectory, straight from eq. 1: v_s = V(x_s) + sum_{t>=s} gamma^(t-s)
    (prod_{i=s}^{t-1} c_i) delta_t, with V(x_n) = bootstrap; A_s = rho^pg_s (r_s + gamma
    v_{s+1} - V(x_s)) with v_n = bootstrap."""
    n = len(r)
    ratio = np.exp(log_rhos)
    V = list(values) + [bootstrap]
    vs = []
    for s in range(n):
        total = V[s]
        for t in range(s, n):
            prod_c = 1.0
            for i in range(s, t):
                prod_c *= min(c_bar, ratio[i])
            delta = min(rho_bar, ratio[t]) * (r[t] + gamma * V[t + 1] - V[t])
            total += gamma ** (t - s) * prod_c * delta
        vs.append(total)
    vs_next = vs[1:] + [bootstrap]
    adv = [min(pg_rho_bar, ratio[s]) * (r[s] + gamma * vs_next[s] - V[s]) for s in range(n)]
    return np.array(vs), np.array(adv)


def test_vtrace_four_steps_clipping_matches_the_papers_sum():
    """Ratios above and below the thresholds: rho_bar=1.0, c_bar=0.9, pg_rho_bar=1.2."""
    ratios = np.array([2.0, 0.5, 1.5, 0.8])
    r = np.array([1.0, -0.5, 2.0, 0.3])
    v = np.array([0.2, 1.1, -0.4, 0.7])
    boot = 1.3
    kw = dict(gamma=0.95, clip_rho_threshold=1.0, clip_c_threshold=0.9, clip_pg_rho_threshold=1.2)
    vs, adv = vtrace(np.log(ratios), r, v, next_values=np.array([1.1, -0.4, 0.7, boot]),
                     nextnonterminal=np.array([1.0, 1.0, 1.0, 0.0]), **kw)
    ref_vs, ref_adv = paper_vtrace(np.log(ratios), r, v, boot, 0.95, 1.0, 0.9, 1.2)
    np.testing.assert_allclose(vs, ref_vs, atol=1e-5)
    np.testing.assert_allclose(adv, ref_adv, atol=1e-5)
    # clipping really happened: unclipped traces give a different answer
    vs_unclipped, _ = vtrace(np.log(ratios), r, v, np.array([1.1, -0.4, 0.7, boot]),
                             np.array([1.0, 1.0, 1.0, 0.0]), gamma=0.95, clip_rho_threshold=10.0,
                             clip_c_threshold=10.0, clip_pg_rho_threshold=10.0)
    assert np.abs(vs_unclipped - vs).max() > 0.1
    # on-policy (all ratios 1) V-trace is the n-step bootstrapped return
    vs1, _ = vtrace(np.zeros(4), r, v, np.array([1.1, -0.4, 0.7, boot]), np.array([1.0, 1.0, 1.0, 0.0]), gamma=0.95)
    g = [boot]
    for t in range(3, -1, -1):
        g.insert(0, r[t] + 0.95 * g[0])
    np.testing.assert_allclose(vs1, g[:4], atol=1e-5)


# ---- the actor-critic base -------------------------------------------------------------------
def test_a_new_actor_critic_policy_writes_only_its_loss():
    """An A2C-style policy: ActorCriticPolicy gives acting (numpy mirror and torch: the same
    actions and log-probs), V(s) and GAE; the subclass writes its loss."""
    import dataclasses

    import gymnasium as gym
    import torch

    from flowkit.core import ActorCriticPolicy
    from flowkit.engine import load_config

    @dataclasses.dataclass
    class A2CConfig:
        lr: float = 1e-3
        adam_eps: float = 1e-5
        log_std_init: float = 0.0
        gamma: float = 0.9
        gae_lambda: float = 1.0
        max_grad_norm: float = 0.5

    class A2CPolicy(ActorCriticPolicy):
        def postprocess_trajectory(self, batch):
            return self.add_gae(batch)

        def loss(self, batch):
            inputs, values = self.model(batch[sb.OBS])
            logp = self.dist.logp(inputs, batch[sb.ACTIONS])
            pg_loss = -(logp * batch[sb.ADVANTAGES]).mean()
            vf_loss = 0.5 * (values - batch[sb.VALUE_TARGETS]).pow(2).mean()
            return pg_loss + vf_loss, {"pg_loss": pg_loss.item(), "vf_loss": vf_loss.item()}

    _, cfg = load_config(["env=CartPole-v1"])
    obs_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    pol = A2CPolicy(obs_space, gym.spaces.Discrete(2), A2CConfig(), cfg.model, "cpu", 0)
    obs = np.random.default_rng(0).uniform(-1, 1, (4, 3)).astype(np.float32)
    assert pol.numpy_model() is not None
    a, extras = pol.compute_actions_encoded(obs, explore=False)
    ta, textras = pol._compute_actions_torch(obs, explore=False)
    np.testing.assert_array_equal(a, ta)
    np.testing.assert_allclose(extras[sb.ACTION_LOGP], textras[sb.ACTION_LOGP], atol=1e-5)
    np.testing.assert_allclose(extras[sb.VF_PREDS], pol.compute_values(obs), atol=1e-5)
    batch = sb.SampleBatch({sb.OBS: obs, sb.NEXT_OBS: obs[::-1].copy(), sb.ACTIONS: a,
                            sb.REWARDS: np.ones(4, np.float32), sb.VF_PREDS: extras[sb.VF_PREDS],
                            sb.TERMINATEDS: np.array([False, True, False, False]),
                            sb.TRUNCATEDS: np.zeros(4, bool), sb.EPS_ID: np.array([1, 1, 2, 2])})
    out = pol.postprocess_trajectory(batch)
    v = extras[sb.VF_PREDS]
    # row 3 is a cut: bootstraps from V(next_obs[3]); row 1 terminated: no bootstrap
    a3 = 1 + 0.9 * pol.compute_values(obs[:1])[0] - v[3]
    a2 = 1 + 0.9 * v[3] - v[2] + 0.9 * a3
    np.testing.assert_allclose(out[sb.ADVANTAGES], [1 + 0.9 * v[1] - v[0] + 0.9 * (1 - v[1]), 1 - v[1], a2, a3],
                               rtol=1e-5, atol=1e-6)
    before = {k: t.clone() for k, t in pol.model.state_dict().items()}
    res = Learner("a2c", {"default": pol}).update(sb.MultiAgentBatch({"default": out}, 4, 4))
    stats = res["stats"]["default"]
    assert set(stats) >= {"pg_loss", "vf_loss", "grad_norm"} and res["num_updates"] == 1
    assert any(not torch.equal(before[k], t) for k, t in pol.model.state_dict().items())
