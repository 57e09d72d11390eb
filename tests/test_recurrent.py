"""Issue 24: recurrent policies through the dataflow. The workers keep one state per sub-env and
reset it at every episode start (both autoreset modes, a hand-built episode sequence), the
batches record the state each row acted from, sequences never cross an episode boundary (the
same outputs and gradients whether episodes are batched together or apart), the learner's
minibatches are whole sequences, and the config says clearly what cannot be recurrent."""
import numpy as np
import pytest
import torch
from envs import EpisodesEnv
from omegaconf import OmegaConf

from flowkit.config import ConfigError, ModelConfig
from flowkit.core import PolicySpec, RandomPolicy, RolloutWorker
from flowkit.core import batch as sb
from flowkit.core.learner import sequence_cuts, sequence_minibatches
from flowkit.core.recurrent import RecurrentTrunk, forward_sequences
from flowkit.engine import load_config, setup


class CountingPolicy(RandomPolicy):
    """A recurrent policy whose state is (steps acted in this episode, sum of the observations
    acted on): a row's ``state_in`` says exactly which steps its state has seen."""

    def initial_state(self, n):
        return np.zeros((n, 2), np.float32)

    def compute_actions_encoded(self, obs, mask=None, explore=True, state=None):
        assert state is not None and state.shape == (len(obs), 2)
        out = state + np.stack([np.ones(len(obs), np.float32), obs[:, 0]], 1)
        return np.zeros(len(obs), np.int64), {sb.STATE_IN: state.copy(), sb.STATE_OUT: out}


def _config(*overrides):
    return load_config(["runtime.backend=local", "env.factory=envs:episodes", "runtime.num_workers=1",
                        "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=7", "run.reporters=[]",
                        *overrides])


def _episodes(batches):
    """``{eps_id: rows in time order}`` over consecutive fragments."""
    b = sb.concat_samples(batches)
    return {int(e): b.take(np.flatnonzero(b[sb.EPS_ID] == e)) for e in np.unique(b[sb.EPS_ID])}


def test_sequence_lengths_cut_every_piece_from_its_first_row():
    b = {sb.TERMINATEDS: np.array([0, 0, 0, 1, 0, 0, 0, 0, 0, 0], bool), sb.TRUNCATEDS: np.zeros(10, bool),
         sb.EPS_ID: np.array([1, 1, 1, 1, 2, 2, 2, 3, 3, 3])}
    assert sb.sequence_lengths(b, 2).tolist() == [2, 2, 2, 1, 2, 1]
    assert sb.sequence_lengths(b, 3).tolist() == [3, 1, 3, 3]
    assert sb.sequence_lengths(b, 100).tolist() == [4, 3, 3]
    assert sb.sequence_lengths({sb.TERMINATEDS: np.zeros(0, bool), sb.TRUNCATEDS: np.zeros(0, bool)}, 4).tolist() == []


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_worker_resets_the_state_at_every_episode_start(mode):
    """Episodes of 3, 5, 1 and 4 steps (terminated and truncated, one of a single step) on two
    sub-envs, fragments of 7 that cut episodes: every row's state_in is exactly (its step in the
    episode, the sum of this episode's earlier observations) -- nothing of a previous episode,
    nor of next-step autoreset's reset step, which acts on the final observation."""
    pm, cfg = _config(f"env.autoreset_mode={mode}")
    env = EpisodesEnv()
    w = RolloutWorker(cfg, 0, 1, {"default": PolicySpec(CountingPolicy, env.observation_space, env.action_space,
                                                        None)}, pm=pm)
    eps = _episodes([w.sample()["default"] for _ in range(4)])
    complete = 0
    for rows in eps.values():
        obs = rows[sb.OBS][:, 0]
        n = len(rows)
        e, first = divmod(int(obs[0]) - 1, 10)
        assert first == 0 and obs.tolist() == [10 * e + t + 1 for t in range(n)]  # whole episodes, in order
        want = np.stack([np.arange(n), np.concatenate([[0.0], np.cumsum(obs)[:-1]])], 1)
        np.testing.assert_array_equal(rows[sb.STATE_IN], want)
        if rows[sb.TERMINATEDS][-1] or rows[sb.TRUNCATEDS][-1]:
            complete += 1
            assert bool(rows[sb.TERMINATEDS][-1]) == (e % 2 == 0)
    assert complete >= 6 and 1 in {len(r) for r in eps.values()}


def _lstm_ctx(mode="next_step", *extra):
    pm, cfg = _config("algo=ppo", f"env.autoreset_mode={mode}", "model.recurrent=lstm", "model.recurrent_size=8",
                      "model.hidden_sizes=[8]", "model.max_seq_len=3", *extra)
    return setup(cfg, pm)


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_an_lstm_worker_acts_as_its_network_over_each_whole_episode(mode):
    """A PPO LSTM policy through the worker: each episode's action_dist_inputs and vf_preds are
    those of the network run over that episode's observations from the initial state, whatever
    came before on the sub-env and wherever the fragments cut it."""
    ctx = _lstm_ctx(mode)
    try:
        w = ctx.workers.actors[0].obj
        pol = w.policies["default"]
        eps = _episodes([w.sample()["default"] for _ in range(3)])
        for rows in eps.values():
            if rows[sb.T][0] != 0:
                continue
            with torch.no_grad():
                obs = torch.from_numpy(rows[sb.OBS])[None]
                inputs, values, _ = pol.model(obs, pol.model.initial_state(1))
            np.testing.assert_allclose(rows[sb.ACTION_DIST_INPUTS], inputs[0].numpy(), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(rows[sb.VF_PREDS], values[0].numpy(), rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(rows[sb.STATE_IN][0], 0.0)
        assert len(eps) >= 6
    finally:
        ctx.shutdown()


def _trunk_model(seed=0):
    torch.manual_seed(seed)
    mc = OmegaConf.structured(ModelConfig)
    mc.hidden_sizes, mc.recurrent, mc.recurrent_size = [4], "gru", 5

    class Net(torch.nn.Module):  # a recurrent Q-network: the trunk and one head
        def __init__(self):
            super().__init__()
            from gymnasium import spaces

            from flowkit.core import ObsEncoder
            self.trunk = RecurrentTrunk(ObsEncoder(spaces.Box(-1, 1, (3,))), mc)
            self.head = torch.nn.Linear(self.trunk.out_dim, 2)  # 4: the MLP after the GRU

        def initial_state(self, n):
            return self.trunk.initial_state(n)

        def forward(self, obs, state, resets=None):
            z, s = self.trunk(obs, state, resets)
            return self.head(z), s
    return Net()


def test_sequence_batches_keep_episode_boundaries():
    """Two episodes (5 and 7 rows, sequences of at most 4) batched together give each row the
    same output and the same gradient as batched apart; nothing of the first episode reaches
    the second's outputs (zero gradient with respect to its observations)."""
    net = _trunk_model()
    rng = np.random.default_rng(0)
    a = {sb.OBS: rng.normal(size=(5, 3)), sb.TERMINATEDS: np.eye(5, dtype=bool)[4], sb.EPS_ID: np.full(5, 1)}
    b = {sb.OBS: rng.normal(size=(7, 3)), sb.TERMINATEDS: np.zeros(7, bool), sb.EPS_ID: np.full(7, 2)}
    for x in (a, b):
        x[sb.OBS] = x[sb.OBS].astype(np.float32)
        x[sb.TRUNCATEDS] = np.zeros(len(x[sb.OBS]), bool)
        x[sb.STATE_IN] = rng.normal(size=(len(x[sb.OBS]), 5)).astype(np.float32)  # read at sequence starts only
    both = sb.concat_samples([sb.SampleBatch(a), sb.SampleBatch(b)])

    def run(batch, obs=None):
        obs = torch.from_numpy(batch[sb.OBS]) if obs is None else obs
        return forward_sequences(net, obs, torch.from_numpy(sb.sequence_lengths(batch, 4)),
                                 torch.from_numpy(batch[sb.STATE_IN]))[0]

    apart = torch.cat([run(a), run(b)])
    obs = torch.from_numpy(both[sb.OBS]).requires_grad_(True)
    together = run(both, obs)
    torch.testing.assert_close(together, apart)
    weights = torch.from_numpy(rng.normal(size=(12, 2)).astype(np.float32))
    grads = []
    for out in (together, apart):
        net.zero_grad()
        (out * weights).sum().backward(retain_graph=out is together)
        grads.append(torch.cat([p.grad.flatten() for p in net.parameters()]))
    torch.testing.assert_close(grads[0], grads[1])
    g_obs, = torch.autograd.grad((together[5:] * weights[5:]).sum(), obs)
    assert (g_obs[:5] == 0).all() and (g_obs[5:] != 0).any()
    # with a reset inside one long sequence: the same outputs as two sequences
    resets = torch.zeros(12, dtype=torch.bool)
    resets[5] = True
    st = torch.from_numpy(both[sb.STATE_IN]).clone()
    st[0] = st[5] = 0.0  # episode starts: the initial state
    packed = forward_sequences(net, torch.from_numpy(both[sb.OBS]), torch.tensor([12]), st, resets)[0]
    split = forward_sequences(net, torch.from_numpy(both[sb.OBS]), torch.tensor([5, 7]), st)[0]
    torch.testing.assert_close(packed, split)


def test_learner_minibatches_are_whole_sequences():
    lens = torch.tensor([4, 1, 4, 3, 2, 4])
    rows = torch.arange(18)
    tb = {sb.OBS: rows.float()[:, None], "rows": rows, sb.SEQ_LENS: lens}
    seen = []
    for mb in sequence_minibatches(tb, 6, np.random.default_rng(0)):
        assert int(mb[sb.SEQ_LENS].sum()) == len(mb["rows"]) and len(mb[sb.SEQ_LENS]) == 2  # round(6 * 6 / 18)
        starts = torch.cumsum(lens, 0) - lens
        at = 0
        for n in mb[sb.SEQ_LENS].tolist():  # each sequence's rows, whole and in order
            piece = mb["rows"][at:at + n]
            assert int(piece[0]) in starts.tolist() and (torch.diff(piece) == 1).all()
            at += n
        seen += mb["rows"].tolist()
    assert sorted(seen) == list(range(18))
    assert sequence_cuts(np.array([4, 1, 4, 3, 2, 4]), 5) == [0, 5, 12]


def _setup(*overrides):
    pm, cfg = load_config(["runtime.backend=local", *overrides])
    return setup(cfg, pm)


def test_recurrent_settings_that_cannot_work_are_config_errors():
    with pytest.raises(ConfigError, match=r"model.recurrent=lstm but DQN trains feed-forward networks only"):
        _setup("algo=dqn", "env=CartPole-v1", "model.recurrent=lstm")
    # the installed algorithms that train recurrent networks, from their plugins (before Ray or torch)
    from flowkit.config import check_run
    pm, cfg = load_config(["algo=sac", "env=Pendulum-v1", "model.recurrent=gru"])
    with pytest.raises(ConfigError, match=r"SAC trains feed-forward networks only \(installed algorithms that do: "
                                          r"a2c, a3c, appo, impala, ppo, qmix, r2d2, vdn\)"):
        check_run(cfg, pm)
    with pytest.raises(ConfigError, match=r"model.recurrent='rnn'.*'lstm' or 'gru'"):
        load_config(["model.recurrent=rnn"])
    with pytest.raises(ConfigError, match="use_sde=true does not combine with model.recurrent"):
        _setup("env=Pendulum-v1", "model.recurrent=gru", "ppo.use_sde=true")


RECALL = ["env.factory=flowkit.testing.envs:recall", "runtime.num_workers=1", "runtime.num_envs_per_worker=4",
          "runtime.rollout_fragment_length=16", "model.recurrent=lstm", "model.recurrent_size=16",
          "model.hidden_sizes=[16]", "model.max_seq_len=8", "ppo.minibatch_size=32", "ppo.num_epochs=4"]


@pytest.mark.slow  # a Ray session and three short runs: about 30 s on a quiet machine
def test_conformance_exact_checkpoint_and_the_same_batch_on_both_backends(ray_session, tmp_path):
    """check_algorithm on PPO with an LSTM: acting from the initial state, a checkpoint restored
    into a fresh run gives back exactly the trained state (weights, optimizer, RNGs, counters),
    and worker 0's first batch, state_in included, is the same on the local and Ray backends."""
    from flowkit_ppo.ppo import PPO

    from flowkit.testing import check_algorithm
    out = check_algorithm(PPO, RECALL, checks=("config", "plan", "actions", "checkpoint", "backends"),
                          tmp_dir=str(tmp_path))
    assert "TrainOneStep" in out["plan"]


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
@pytest.mark.slow
def test_export_takes_the_state_and_evaluate_carries_it(tmp_path, fmt):
    """The exported module takes the state as its last input and returns (action, state_out),
    checked against the policy over 50 steps of 5 sequences; `flowkit evaluate` gives each
    episode its own state from the initial one: the same returns as a loop that does."""
    import flowkit
    from flowkit.evaluation import evaluate
    from flowkit.export import export_policy, input_arrays, run_exported, sample_observations
    from flowkit.testing import local_overrides
    from flowkit.testing.envs import recall
    res = flowkit.train(local_overrides(str(tmp_path / "run"), *RECALL, "stop.iterations=2"), verbose=False)
    pol = flowkit.Algorithm.from_checkpoint(res.checkpoint).get_policy()
    path = str(tmp_path / f"policy.{fmt}")
    sig = export_policy(pol, fmt, path, check=256)
    assert sig["checked"] == 250 and sig["recurrent_state_size"] == 64  # two LSTMs (policy, value): h and c, 16 each
    assert [d["name"] for d in sig["inputs"]] == ["obs", "state_in"]
    assert [d["name"] for d in sig["outputs"]] == ["action", "state_out"]
    from flowkit.cli import signature_text  # what `flowkit export` prints (before: action listed as an input)
    assert signature_text(sig).endswith(", state_in: float32[B, 64]) -> (action: int64[B], state_out: float32[B, 64])")
    obs = sample_observations(pol.observation_space, 3, seed=5)
    a, s = run_exported(path, fmt, [*input_arrays(pol.observation_space, obs), pol.initial_state(3)])
    want_a, want_s = pol.compute_actions(obs, state=pol.initial_state(3))
    np.testing.assert_array_equal(a, want_a)
    np.testing.assert_allclose(s, want_s, rtol=1e-4, atol=1e-5)
    if fmt == "onnx":
        return
    report = evaluate(res.run_dir, episodes=5, seed=3, num_envs=2)
    returns = []
    for i in range(5):
        env, state, total = recall(), pol.initial_state(1)[0], 0.0
        o, _ = env.reset(seed=3 + i)
        done = False
        while not done:
            act, state = pol.compute_actions(o, state=state)
            o, r, term, trunc, _ = env.step(act)
            total, done = total + r, term or trunc
        returns.append(total)
    assert report["returns"] == returns
    with pytest.raises(ValueError, match="a recurrent policy needs state="):
        pol.compute_actions(obs)


def test_a_multiagent_game_mixes_a_recurrent_and_a_feed_forward_policy():
    """Turn game: p0 plays with a GRU policy, p1 with a feed-forward one, both PPO in one group.
    The recurrent policy's rows carry state_in (its state per agent per episode: the initial one
    at each agent's first move, moving on between its moves), the other's do not; both train."""
    pm, cfg = load_config(["runtime.backend=local", "env.factory=flowkit.testing.envs:turn_game",
                           "runtime.num_workers=1", "runtime.num_envs_per_worker=2",
                           "runtime.rollout_fragment_length=8", "run.reporters=[]", "multiagent.mapping.p0=mem",
                           "multiagent.mapping.p1=ff", "multiagent.policies.mem.model.recurrent=gru",
                           "multiagent.policies.mem.model.recurrent_size=4", "ppo.minibatch_size=8"])
    ctx = setup(cfg, pm)
    try:
        assert ctx.policies["mem"].is_recurrent and not ctx.policies["ff"].is_recurrent
        w = ctx.workers.actors[0].obj
        b = w.sample()
        mem, ff = b["mem"], b["ff"]
        assert sb.STATE_IN in mem and sb.STATE_IN not in ff and mem[sb.STATE_IN].shape == (len(mem), 8)  # two GRUs of 4
        first = mem[sb.T] == 0
        assert first.any() and (mem[sb.STATE_IN][first] == 0).all() and (mem[sb.STATE_IN][~first] != 0).any()
        pol = w.policies["mem"]
        for rows in _episodes([mem]).values():  # each agent's moves: the network over them from the initial state
            if rows[sb.T][0] == 0:
                with torch.no_grad():
                    inputs = pol.model(torch.from_numpy(rows[sb.OBS])[None], pol.model.initial_state(1))[0]
                np.testing.assert_allclose(rows[sb.ACTION_DIST_INPUTS], inputs[0].numpy(), rtol=1e-5, atol=1e-6)
        from flowkit.core.learner import Learner
        out = Learner("g", ctx.policies, num_epochs=2, minibatch_size=8).update(b)
        assert out["stats"]["mem"]["num_sgd_steps"] > 0 and out["stats"]["ff"]["num_sgd_steps"] > 0
    finally:
        ctx.shutdown()


@pytest.mark.parametrize("algo", ["a2c", "a3c", "impala", "appo", "appo_shuffled"])
def test_every_actor_critic_algorithm_trains_a_recurrent_policy(tmp_path, algo):
    """A2C (one step per batch), A3C (gradients on the workers), IMPALA and APPO (V-trace over
    contiguous chunks of whole sequences, learner thread; APPO also over the whole batch, then
    shuffled sequences) train a GRU policy from the same batches PPO does; the checkpoint's
    policy is recurrent."""
    import flowkit
    from flowkit.testing import local_overrides
    if algo == "appo_shuffled":
        algo, extra = "appo", ["appo.minibatch_mode=shuffled"]
    else:
        extra = []
    if algo in ("impala", "appo"):
        extra += [f"{algo}.train_batch_size=64", f"{algo}.minibatch_size=32", f"{algo}.num_epochs=2"]
    res = flowkit.train(local_overrides(str(tmp_path), *RECALL[:3], "runtime.rollout_fragment_length=16",
                                        "model.recurrent=gru", "model.recurrent_size=8", "model.max_seq_len=6",
                                        f"algo={algo}", "stop.iterations=3", *extra), verbose=False)
    assert res.metrics["learner/default/num_sgd_steps"] > 0 and np.isfinite(res.metrics["learner/default/vf_loss"])
    assert flowkit.Algorithm.from_checkpoint(res.checkpoint).get_policy().is_recurrent


MEMORY = ["env.factory=flowkit.testing.envs:recall", "runtime.num_workers=1", "runtime.num_envs_per_worker=8",
          "runtime.rollout_fragment_length=16", "model.hidden_sizes=[32]", "model.recurrent_size=32",
          "model.max_seq_len=16", "ppo.minibatch_size=64", "ppo.num_epochs=8", "ppo.lr=3e-3", "ppo.ent_coef=0.01",
          "stop.env_steps=6000", "seed=0"]


@pytest.mark.slow  # two runs of 6,000 env steps: about 40 s on a quiet machine
def test_the_memory_task_needs_memory(tmp_path):
    """Repeat the symbol shown one step before (15 rewarded steps an episode): PPO with a GRU
    solves it within 6,000 env steps, a feed-forward PPO stays at chance (7.5), both measured
    greedily by `flowkit evaluate` over 20 episodes (seeds 100-119)."""
    import flowkit
    from flowkit.evaluation import evaluate
    from flowkit.testing import local_overrides
    got = {}
    for name, extra in (("gru", ["model.recurrent=gru"]), ("ff", [])):
        run = str(tmp_path / name)
        flowkit.train(local_overrides(run, *MEMORY, *extra), verbose=False)
        got[name] = evaluate(run, episodes=20, seed=100)["episode_return_mean"]
    assert got["gru"] >= 14.0 and got["ff"] <= 9.5, got


@pytest.mark.slow  # up to 4 runs of 150,000 env steps: 10-20 minutes on 2 cores
def test_ppo_lstm_solves_cartpole_without_velocities_and_feed_forward_ppo_does_not(tmp_path):
    """Issue 24's acceptance: configs/ppo/CartPoleNoVel-v1.yaml (PPO, LSTM) reaches a mean return
    of 475 (last 20 episodes) within 150,000 env steps on at least 2 of seeds 0-2; the same config
    without the LSTM (model.recurrent=null) does not on seed 0."""
    import os

    import flowkit
    config = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "ppo",
                          "CartPoleNoVel-v1.yaml")

    def run(name, *extra):
        res = flowkit.train([f"run.dir={tmp_path / name}", "run.reporters=[csv]", *extra], config_file=config,
                            verbose=False)
        return res.metrics["episode_return_mean"] >= 475, res.metrics["env_steps_sampled"]
    solved = [run(f"lstm{s}", f"seed={s}")[0] for s in (0, 1, 2)]
    assert sum(solved) >= 2, solved
    ff, steps = run("ff", "seed=0", "model.recurrent=null")
    assert not ff and steps >= 150_000


@pytest.mark.parametrize("kind,shared,box", [("lstm", False, False), ("gru", True, True), ("lstm", True, True)])
def test_the_numpy_acting_mirror_is_the_torch_network(kind, shared, box):
    """Workers act with a numpy copy of an MLP recurrent actor-critic (one LSTM or GRU step per
    env step): the same dist inputs, values and next states as the torch network, and the
    weights it sees are the model's own (an update is seen at once)."""
    from flowkit_ppo import PPOConfig
    from flowkit_ppo.ppo import PPOPolicy
    from gymnasium import spaces

    from flowkit.core.recurrent import step
    mc = OmegaConf.structured(ModelConfig)
    mc.hidden_sizes, mc.recurrent, mc.recurrent_size, mc.shared_value_network = [6], kind, 5, shared
    cfg = OmegaConf.structured(PPOConfig)
    cfg.normalize_observations = True
    act = spaces.Box(-1, 1, (2,)) if box else spaces.Discrete(3)
    pol = PPOPolicy(spaces.Box(-5, 5, (3,)), act, cfg, mc, seed=0)
    with torch.no_grad():
        pol.model.obs_rms.mean += 0.3
        pol.model.obs_rms.var *= 2.0
    npm = pol.numpy_model()
    assert npm is not None
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 3)).astype(np.float32)
    s = rng.normal(size=(5, pol.initial_state(1).shape[1])).astype(np.float32)
    for _ in range(2):
        out = npm.forward(x, s)
        inputs, value, s_out = out["pi"], out["vf"][:, 0], out["state_out"]
        with torch.no_grad():
            want = step(pol.model, torch.from_numpy(x), torch.from_numpy(s))
        for got, w in zip((inputs, value, s_out), want):
            np.testing.assert_allclose(got, w.numpy(), rtol=1e-5, atol=1e-5)
        with torch.no_grad():  # an optimizer step in place: the mirror sees it
            for p in pol.model.parameters():
                p.add_(0.1)
    mc.numpy_inference = False
    off = PPOPolicy(spaces.Box(-5, 5, (3,)), act, cfg, mc, seed=0)
    assert off.numpy_model() is None
