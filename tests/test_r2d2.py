"""Issue 24 item 4: R2D2 (``algo=r2d2``, in the DQN plugin). Hand-computed value rescaling and
its inverse, n-step rescaled targets on a hand-built sequence, the max/mean priority, burn-in
without gradient, sequences that never cross an episode boundary (hand-built rows and a real
worker), config errors, the checkpoint round trip (replay of sequences and their priorities),
export with the state, the Ape-X mode, the conformance kit, and learning CartPole without
velocities (slow)."""
import math
import os

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import flowkit
from flowkit import ConfigError
from flowkit.checkpoint import load_state
from flowkit.config import ModelConfig
from flowkit.core import batch as sb
from flowkit.engine import build_plan, load_config, setup
from flowkit.testing import local_overrides
from flowkit_dqn.r2d2 import R2D2, R2D2Policy, SequenceCutter, inverse_value_rescale, r2d2_targets, sequence_priorities, value_rescale
from flowkit_dqn import R2D2Config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOVEL = "env=flowkit.testing.envs:CartPoleNoVel-v1"
SMALL = ["runtime.num_workers=1", "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=16",
         "model.recurrent_size=8", "model.hidden_sizes=[8]", "r2d2.seq_len=8", "r2d2.burn_in=2",
         "r2d2.learning_starts=64", "r2d2.train_batch_size=8", "r2d2.target_network_update_freq=20"]


def h(x, eps=1e-3):  # the formula, by hand, in float64
    return math.copysign(math.sqrt(abs(x) + 1) - 1, x) + eps * x


# ---- value rescaling ----------------------------------------------------------------------------
def test_value_rescaling_and_its_exact_inverse_by_hand():
    x = torch.tensor([3.0, -8.0, 0.0, 99.0], dtype=torch.float64)
    # sqrt(4) - 1 + 0.003; -(sqrt(9) - 1) - 0.008; 0; sqrt(100) - 1 + 0.099
    np.testing.assert_allclose(value_rescale(x).numpy(), [1.003, -2.008, 0.0, 9.099], rtol=0, atol=1e-12)
    # h^-1(1.003): sqrt(1 + 0.004 * 2.004) = sqrt(1.008016) = 1.004, (0.004 / 0.002)^2 - 1 = 3
    np.testing.assert_allclose(inverse_value_rescale(torch.tensor([1.003, -2.008], dtype=torch.float64)).numpy(),
                               [3.0, -8.0], rtol=0, atol=1e-9)
    grid = torch.linspace(-1e4, 1e4, 20001, dtype=torch.float64)
    np.testing.assert_allclose(inverse_value_rescale(value_rescale(grid)).numpy(), grid.numpy(), rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(value_rescale(inverse_value_rescale(grid / 100)).numpy(), (grid / 100).numpy(),
                               rtol=1e-10, atol=1e-10)
    assert value_rescale(torch.tensor(5.0), eps=0.01).item() == pytest.approx(h(5.0, 0.01))


# ---- targets ---------------------------------------------------------------------------------------
def test_n_step_rescaled_targets_on_a_hand_built_sequence():
    """Two sequences of L=4 (n=2, gamma 0.5): the first has 3 real steps and terminates at its
    last; the second is 4 real steps cut without termination (bootstraps from o_4). q_boot holds
    h(v), so h^-1(q_boot) = v."""
    v = torch.tensor([[4.0, 8.0, 12.0, 16.0, 0.0], [0.0, 2.0, 4.0, 6.0, 8.0]], dtype=torch.float64)
    rewards = torch.tensor([[1.0, 2.0, 3.0, 0.0], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    term = torch.tensor([[False, False, True, False], [False] * 4])
    mask = torch.tensor([[True, True, True, False], [True] * 4])
    y = r2d2_targets(rewards, term, mask, value_rescale(v), gamma=0.5, n=2)
    want = [[h(1 + 0.5 * 2 + 0.25 * 12),   # t=0: m=2, bootstrap from o_2
             h(2 + 0.5 * 3),               # t=1: m=2, the window ends at the terminal step 2
             h(3)],                        # t=2: m=1, terminal
            [h(1.5 + 0.25 * 4), h(1.5 + 0.25 * 6), h(1.5 + 0.25 * 8),
             h(1 + 0.5 * 8)]]              # t=3: m=1, bootstrap from o_4
    np.testing.assert_allclose(y[0, :3].numpy(), want[0], rtol=1e-12)
    np.testing.assert_allclose(y[1].numpy(), want[1], rtol=1e-12)
    plain = r2d2_targets(rewards, term, mask, v, gamma=0.5, n=2, eps=None)  # no rescaling
    np.testing.assert_allclose(plain[1].numpy(), [2.5, 3.0, 3.5, 5.0], rtol=1e-12)
    np.testing.assert_allclose(plain[0, :3].numpy(), [5.0, 3.5, 3.0], rtol=1e-12)


def test_sequence_priority_mixes_max_and_mean_of_the_trained_steps():
    td = torch.tensor([[1.0, -3.0, 0.5, 9.0], [2.0, 2.0, 2.0, 2.0]])
    mask = torch.tensor([[True, True, True, False], [False] * 4])
    p = sequence_priorities(td, mask, eta=0.9)
    # row 0: max 3, mean (1 + 3 + 0.5) / 3 = 1.5 -> 0.9 * 3 + 0.1 * 1.5; row 1: no trained step
    np.testing.assert_allclose(p.numpy(), [2.85, 0.0], rtol=1e-6)
    assert sequence_priorities(td, mask, eta=0.0)[0].item() == pytest.approx(1.5)


# ---- the policy's loss -----------------------------------------------------------------------------
def make_policy(seed=0, **over):
    import gymnasium as gym
    cfg = R2D2Config(**{"seq_len": 6, "burn_in": 3, "n_step": 2, "gamma": 0.9, **over})
    mc = OmegaConf.structured(ModelConfig)
    mc.hidden_sizes, mc.recurrent, mc.recurrent_size = [8], "lstm", 8
    return R2D2Policy(gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(3), cfg, mc, seed=seed)


def seq_batch(B=2, L=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[1, 5:] = False  # row 1: 5 real steps, then padding
    term = torch.zeros(B, L, dtype=torch.bool)
    term[1, 4] = True
    return {sb.OBS: torch.randn(B, L + 1, 2, generator=g), sb.ACTIONS: torch.randint(0, 3, (B, L), generator=g),
            sb.REWARDS: torch.rand(B, L, generator=g), sb.TERMINATEDS: term, sb.SEQ_MASK: mask,
            sb.STATE_IN: 0.5 * torch.randn(B, 16, generator=g), sb.PRIO_WEIGHTS: torch.tensor([1.0, 0.5])}


def test_burn_in_steps_give_no_gradient_and_no_loss():
    """Burn-in 3 of 6: the loss's gradient reaches the observations of the trained steps 3..5
    only (not the burn-in, not the padding, not the bootstrap observation o_6), nor the stored
    state; rewards of the burn-in steps do not change the loss. Without burn-in, step 0 gets
    a gradient (the check can fail)."""
    pol = make_policy()
    b = seq_batch()
    b[sb.OBS].requires_grad_(True)
    b[sb.STATE_IN].requires_grad_(True)
    loss, stats = pol.loss(b)
    loss.backward()
    g = b[sb.OBS].grad.abs().sum(-1)  # [B, L + 1]
    assert torch.all(g[:, :3] == 0) and torch.all(g[:, 6] == 0)
    assert torch.all(g[0, 3:6] > 0) and torch.all(g[1, 3:5] > 0) and g[1, 5] == 0  # row 1's step 5: padding
    assert b[sb.STATE_IN].grad is None
    assert pol.td_error.shape == (2,) and np.all(pol.td_error > 0)
    b2 = {k: v.detach().clone() for k, v in b.items()}
    b2[sb.REWARDS][:, :3] += 10.0
    assert pol.loss(b2)[0].item() == pytest.approx(loss.item(), rel=1e-6)
    b3 = {k: v.detach().clone() for k, v in b.items()}
    b3[sb.REWARDS][:, 3] += 10.0
    assert pol.loss(b3)[0].item() != pytest.approx(loss.item(), rel=1e-3)
    pol0 = make_policy(burn_in=0)
    b4 = {k: v.detach().clone() for k, v in b.items()}
    b4[sb.OBS].requires_grad_(True)
    pol0.loss(b4)[0].backward()
    assert b4[sb.OBS].grad[:, 0].abs().sum() > 0


def test_an_episode_no_longer_than_the_burn_in_is_trained_without_burn_in():
    """Row 0 is a whole episode of 2 steps (t = 0, burn-in 3: no step past the burn-in; its stored
    state is the initial state, not stale), row 1 is not (t = 7): row 0's steps are trained
    (gradient, their rewards change the loss), row 1's first 3 stay burn-in only, as in the
    test above; with row 0 starting at t = 7 instead, nothing of it is trained."""
    pol = make_policy()
    b = seq_batch()
    b[sb.SEQ_MASK][0, 2:] = False
    b[sb.T] = torch.tensor([0, 7])
    b[sb.OBS].requires_grad_(True)
    loss, _ = pol.loss(b)
    loss.backward()
    g = b[sb.OBS].grad.abs().sum(-1)  # [B, L + 1]
    assert torch.all(g[0, :2] > 0) and torch.all(g[0, 3:] == 0)
    assert torch.all(g[1, :3] == 0) and torch.all(g[1, 3:5] > 0)
    late = {k: v.detach().clone() for k, v in b.items()}
    late[sb.T] = torch.tensor([7, 7])
    late[sb.OBS].requires_grad_(True)
    pol.loss(late)[0].backward()
    assert torch.all(late[sb.OBS].grad[0] == 0)
    for row, changes in ((0, True), (1, False)):
        b2 = {k: v.detach().clone() for k, v in b.items()}
        b2[sb.REWARDS][row, 0] += 10.0
        assert (pol.loss(b2)[0].item() != pytest.approx(loss.item(), rel=1e-4)) is changes


def test_loss_is_the_rescaled_double_q_td_on_the_unrolled_networks():
    """The policy's priorities are those of the module's functions applied to its own networks:
    online unrolled with burn-in, a* by the online network, Q_target at a*; the targets do not
    depend on the burn-in split (the same values, no gradient)."""
    pol = make_policy(seed=3)
    with torch.no_grad():
        for p in pol.target.module.parameters():  # a target different from the online network
            p.add_(0.05)
    b = seq_batch(seed=1)
    pol.loss(b)
    with torch.no_grad():
        q, _ = pol.model(b[sb.OBS], b[sb.STATE_IN])
        qt, _ = pol.target.module(b[sb.OBS], b[sb.STATE_IN])
        q_boot = qt.gather(-1, q.argmax(-1, keepdim=True)).squeeze(-1)
        y = r2d2_targets(b[sb.REWARDS], b[sb.TERMINATEDS], b[sb.SEQ_MASK], q_boot, 0.9, 2, 1e-3)
        q_taken = q[:, :6].gather(-1, b[sb.ACTIONS].unsqueeze(-1)).squeeze(-1)
        trained = b[sb.SEQ_MASK] & (torch.arange(6) >= 3)
        want = sequence_priorities((q_taken - y) * trained, trained, 0.9)
    np.testing.assert_allclose(pol.td_error, want.numpy(), rtol=1e-5)


# ---- sequences ---------------------------------------------------------------------------------------
def rows(eps_id, ts, done_at=None, term=True):
    """Rows of episode ``eps_id`` at steps ``ts``: obs = 100 * eps_id + t, next_obs = obs + 1,
    state_in = (eps_id, t), the last row ends the episode when ``done_at`` is its step."""
    ts = np.asarray(ts, np.int64)
    o = (100 * eps_id + ts).astype(np.float32)[:, None]
    end = ts == done_at
    return sb.SampleBatch({sb.OBS: o, sb.NEXT_OBS: o + 1, sb.ACTIONS: ts % 2, sb.REWARDS: np.ones(len(ts), np.float32),
                           sb.TERMINATEDS: end & term, sb.TRUNCATEDS: end & (not term),
                           sb.STATE_IN: np.stack([np.full(len(ts), eps_id), ts], 1).astype(np.float32),
                           sb.EPS_ID: np.full(len(ts), eps_id, np.int64), sb.T: ts})


def test_sequences_are_cut_per_episode_across_fragments_and_padded_at_its_end():
    """seq_len 6, burn-in 2, stride 4. Episode 1 (12 steps, terminated) arrives in two
    fragments, episode 2 (3 steps, truncated) and 3 (running) in the second: sequences start at
    steps 0, 4 and 8 of episode 1 (the last padded after its 4 real steps), at 0 of episode 2
    (3 real steps); none mixes two episodes; episode 3 waits."""
    cut = SequenceCutter(seq_len=6, stride=4, burn_in=2)
    out1 = cut.add(sb.concat_samples([rows(1, range(8))]))
    assert out1[sb.T].tolist() == [0] and out1[sb.EPS_ID].tolist() == [1]
    out2 = cut.add(sb.concat_samples([rows(1, range(8, 12), done_at=11), rows(2, range(3), done_at=2, term=False),
                                      rows(3, range(5))]))
    assert list(zip(out2[sb.EPS_ID].tolist(), out2[sb.T].tolist())) == [(1, 4), (1, 8), (2, 0)]
    assert out2[sb.OBS].shape == (3, 7, 1) and out2[sb.ACTIONS].shape == (3, 6)
    np.testing.assert_array_equal(out2[sb.OBS][0, :, 0], 100 + np.arange(4, 11))  # o_4 .. o_9, then o_10
    np.testing.assert_array_equal(out2[sb.OBS][1, :, 0], [108, 109, 110, 111, 112, 0, 0])  # o_12: the final obs
    np.testing.assert_array_equal(out2[sb.SEQ_MASK], [[1] * 6, [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]])
    np.testing.assert_array_equal(out2[sb.TERMINATEDS], [[0] * 6, [0, 0, 0, 1, 0, 0], [0] * 6])  # 2 truncated
    np.testing.assert_array_equal(out2[sb.STATE_IN], [[1, 4], [1, 8], [2, 0]])
    np.testing.assert_array_equal(out2[sb.REWARDS][1], [1, 1, 1, 1, 0, 0])
    assert list(cut.open) == [(3, 0)] and len(cut.open[(3, 0)]) == 5
    # episode 3 goes on: its first sequence comes out whole, from the waiting rows
    out3 = cut.add(rows(3, range(5, 7)))
    np.testing.assert_array_equal(out3[sb.OBS][0, :, 0], 300 + np.arange(7))
    # a gap in the steps (rows lost) starts over from the new rows' own recorded state
    out4 = cut.add(rows(3, range(10, 17)))
    assert out4[sb.T].tolist() == [10] and out4[sb.STATE_IN].tolist() == [[3, 10]]
    # an episode no longer than the burn-in gives one sequence (trained without burn-in) ...
    short = cut.add(rows(4, range(2), done_at=1))
    assert short[sb.T].tolist() == [0] and short[sb.SEQ_MASK].tolist() == [[1, 1, 0, 0, 0, 0]]
    assert len(cut.add(rows(6, range(3), done_at=2))) == 1  # 3 steps: one past the burn-in, as before
    # ... but the rows after a gap that hold no step past the burn-in give none
    assert len(cut.add(rows(5, range(3, 5), done_at=4))) == 0


def test_a_worker_stores_sequences_that_never_cross_an_episode_boundary():
    """A real worker (tests/envs.py EpisodesEnv: episodes of 3, 5, 1 and 4 steps, obs = 10 *
    episode + step + 1, terminated and truncated in turn) with R2D2: every sequence's real
    observations are consecutive steps of one episode and its bootstrap observation the next;
    a sequence that starts an episode starts from the zero state; terminated only at an even
    episode's last step; each step after the burn-in is trained in exactly one sequence, also
    where a fragment cuts the episode, and the episodes of 1 step (no longer than the burn-in)
    are one sequence, trained without burn-in."""
    pm, cfg = load_config(["runtime.backend=local", "algo=r2d2", "env.factory=envs:episodes",
                           "runtime.num_workers=1", "runtime.num_envs_per_worker=2",
                           "runtime.rollout_fragment_length=7", "run.reporters=[]", "model.recurrent_size=4",
                           "model.hidden_sizes=[4]", "r2d2.seq_len=3", "r2d2.burn_in=1"])
    ctx = setup(cfg, pm)
    try:
        w = ctx.workers.actors[0].obj
        got = sb.concat_samples([w.sample()["default"] for _ in range(4)])
    finally:
        ctx.shutdown()
    trained = {}
    assert len(got) >= 8
    for i in range(len(got)):
        n = int(got[sb.SEQ_MASK][i].sum())
        o = got[sb.OBS][i, :, 0]
        e, t0 = divmod(int(o[0]) - 1, 10)
        assert t0 == int(got[sb.T][i]) and o[:n + 1].tolist() == [10 * e + t0 + j + 1 for j in range(n + 1)]
        assert np.all(o[n + 1:] == 0) and not got[sb.SEQ_MASK][i, n:].any()
        if t0 == 0:
            assert np.all(got[sb.STATE_IN][i] == 0)
        else:
            assert np.any(got[sb.STATE_IN][i] != 0)
        term = got[sb.TERMINATEDS][i]
        assert term.sum() <= 1 and (not term.any() or (term[n - 1] and e % 2 == 0))
        for t in range(0 if t0 == 0 and n <= 1 else 1, n):  # burn-in 1, none for a 1-step episode
            key = (int(got[sb.EPS_ID][i]), t0 + t)
            assert key not in trained, f"step {key} trained twice"
            trained[key] = True
    by_episode = {}
    for e, t in trained:
        by_episode.setdefault(e, []).append(t)
    # no step missing either, where fragments cut an episode (its rows wait for the next fragment)
    assert all(sorted(ts) in ([0], list(range(1, len(ts) + 1))) for ts in by_episode.values()), by_episode
    assert max(len(ts) for ts in by_episode.values()) == 4  # an episode of 5 steps, cut by fragments of 7
    assert [0] in by_episode.values()  # an episode of 1 step


# ---- config ------------------------------------------------------------------------------------------
def _setup(*extra):
    pm, cfg = load_config(["algo=r2d2", "runtime.backend=local", NOVEL, *extra])
    return setup(cfg, pm)


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"r2d2.burn_in=20 must be smaller than r2d2.seq_len=20"):
        _setup("r2d2.seq_len=20", "r2d2.burn_in=20")
    with pytest.raises(ConfigError, match=r"r2d2.seq_stride=30 must be at most r2d2.seq_len=20"):
        _setup("r2d2.seq_len=20", "r2d2.burn_in=5", "r2d2.seq_stride=30")
    with pytest.raises(ConfigError, match=r"r2d2.train_batch_size=64 is larger than r2d2.buffer_size=32"):
        _setup("r2d2.buffer_size=32")
    with pytest.raises(ConfigError, match=r"R2D2 needs a Discrete action space"):
        _setup("env=Pendulum-v1")
    with pytest.raises(ConfigError, match=r"r2d2 trains a recurrent Q-network: model.class='custom_models:TinyQ'"):
        _setup("model.class=custom_models:TinyQ")


def test_model_recurrent_defaults_to_an_lstm_and_a_gru_is_taken():
    ctx = _setup("model.recurrent_size=4")
    try:
        pol = ctx.policies["default"]
        assert pol.is_recurrent and pol.model.trunk.is_lstm and pol.initial_state(3).shape == (3, 8)
    finally:
        ctx.shutdown()
    ctx = _setup("model.recurrent=gru", "model.recurrent_size=4")
    try:
        assert not ctx.policies["default"].model.trunk.is_lstm and ctx.policies["default"].initial_state(1).shape == (1, 4)
    finally:
        ctx.shutdown()


def test_the_plan_is_dqns_with_sequence_sized_steps():
    text = flowkit.describe_plan(["algo=r2d2", NOVEL, "r2d2.seq_len=10", "r2d2.burn_in=2", "r2d2.train_batch_size=4",
                                  "r2d2.weight_sync_freq=3", "r2d2.training_intensity=5", "runtime.num_workers=1",
                                  "runtime.num_envs_per_worker=4", "runtime.rollout_fragment_length=16"])["text"]
    # 3 gradient steps of 4 sequences of 10 steps; 5 * 64 sampled / 40 per step = 8 steps a round
    for op in ("SyncWeights(to=all, every=120 env_steps)", "union(weights=[1, 8.0])", "UpdatePriorities",
               "Replay(batch_size=4", "UpdateTargetNetwork(every 2500 gradient steps)"):
        assert op in text, op


# ---- runs ---------------------------------------------------------------------------------------------
def test_checkpoint_holds_the_sequences_and_their_priorities_and_resume_goes_on(tmp_path):
    run = str(tmp_path / "run")
    r1 = flowkit.train(local_overrides(run, "algo=r2d2", NOVEL, *SMALL, "stop.env_steps=256"), verbose=False)
    st = load_state(r1.checkpoint)
    buf = st["stateful"]["r2d2/replay_buffer"]["buffers"]["default"]
    cols, size = buf["storage"]["cols"], buf["storage"]["size"]
    assert cols[sb.OBS].shape == (size, 9, 2) and cols[sb.SEQ_MASK].shape == (size, 8)
    assert cols[sb.STATE_IN].shape == (size, 16) and size >= 16
    leaves = buf["sampler"]["sum"][len(buf["sampler"]["sum"]) // 2:][:size]
    assert np.any(np.abs(leaves - 1.0) > 1e-6)  # priorities came back from the loss (alpha 0.9)
    assert r1.metrics["env_steps_trained"] % (8 * 8) == 0 and r1.metrics["env_steps_trained"] > 0
    r2 = flowkit.train(["resume=" + run, "stop.env_steps=384"], verbose=False)
    assert r2.metrics["env_steps_sampled"] == 384 and r2.metrics["env_steps_trained"] > r1.metrics["env_steps_trained"]
    assert load_state(r2.checkpoint)["stateful"]["r2d2/replay_buffer"]["buffers"]["default"]["storage"]["size"] > size


def test_conformance_config_plan_actions_and_exact_checkpoint(tmp_path):
    from flowkit.testing import check_algorithm
    out = check_algorithm(R2D2, SMALL[3:] + ["r2d2.burn_in=0"], checks=("config", "plan", "actions", "checkpoint"),
                          tmp_dir=str(tmp_path))
    assert "UpdatePriorities" in out["plan"]


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_export_takes_and_returns_the_state(tmp_path, fmt):
    from flowkit.export import export_policy, input_arrays, run_exported, sample_observations
    res = flowkit.train(local_overrides(str(tmp_path / "run"), "algo=r2d2", NOVEL, *SMALL, "stop.env_steps=128"),
                        verbose=False)
    pol = flowkit.Algorithm.from_checkpoint(res.checkpoint).get_policy()
    path = str(tmp_path / f"policy.{fmt}")
    sig = export_policy(pol, fmt, path, check=256)
    assert sig["recurrent_state_size"] == 16 and sig["checked"] in (250, 0)  # 0: no onnxruntime
    assert [d["name"] for d in sig["outputs"]] == ["action", "state_out"]
    if sig["checked"]:
        obs = sample_observations(pol.observation_space, 3, seed=5)
        a, s = run_exported(path, fmt, [*input_arrays(pol.observation_space, obs), pol.initial_state(3)])
        want_a, want_s = pol.compute_actions(obs, state=pol.initial_state(3))
        np.testing.assert_array_equal(a, want_a)
        np.testing.assert_allclose(s, want_s, rtol=1e-4, atol=1e-5)


def test_apex_mode_stores_sequences_in_shards_with_per_worker_epsilons(tmp_path):
    pm, cfg = load_config(local_overrides(str(tmp_path), "algo=r2d2", NOVEL, *SMALL, "runtime.num_workers=2",
                                          "r2d2.num_replay_shards=2"))
    ctx = setup(cfg, pm, str(tmp_path))
    try:
        got = list(build_plan(ctx).take(10))
        assert all(set(r["stats"]) == {"default"} for r in got)
        assert [a.obj.policies["default"].epsilon for a in ctx.workers.actors] == pytest.approx([0.4, 0.4 ** 8])
        shards = ctx.stateful["r2d2/replay_shards"].actors
        stored = [a.obj.buffers["default"] for a in shards]
        assert all(len(b) > 0 and b.storage.cols[sb.OBS].shape[1:] == (9, 2) for b in stored)
        assert any(np.any(np.abs(b.sampler.sum.leaves(len(b)) - 1.0) > 1e-6) for b in stored)
    finally:
        ctx.shutdown()


class StopWhenSolved:
    """Stops the run at its first greedy evaluation >= 450 (the ``evaluation`` reporter's column)."""

    def __init__(self):
        self.solved_at = None

    @flowkit.hookimpl
    def flowkit_on_train_result(self, result, ctx):
        if result.get("evaluation_return_mean", -1) >= 450 and self.solved_at is None:
            self.solved_at = result["env_steps_sampled"]
            ctx.request_stop("solved")


@pytest.mark.slow  # one run of up to 200,000 env steps: 1-5 minutes on 2 shared cores
def test_r2d2_solves_cartpole_without_velocities(tmp_path):
    """Issue 24's acceptance: configs/r2d2/CartPoleNoVel-v1.yaml reaches a greedy evaluation
    return of 450 within 200,000 env steps on seed 0."""
    stop = StopWhenSolved()
    flowkit.train([f"run.dir={tmp_path / 'run'}", "run.reporters=[csv,evaluation]", "seed=0"],
                  config_file=os.path.join(ROOT, "configs", "r2d2", "CartPoleNoVel-v1.yaml"), plugins=[stop],
                  verbose=False)
    assert stop.solved_at is not None and stop.solved_at <= 200_000
