"""Issue 51, items 1 and 4: centralized critics (MAPPO) and parameter sharing with agent ids
(flowkit_multiagent.centralized, flowkit_multiagent.mappo)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from flowkit_multiagent.centralized import CRITIC_OBS, NEXT_CRITIC_OBS
from flowkit_multiagent.config import MAPPOConfig
from flowkit_multiagent.mappo import MAPPO, MAPPOPolicy
from gymnasium import spaces

import flowkit
from flowkit import ConfigError
from flowkit.core import batch as sb
from flowkit.engine import load_config, setup
from flowkit.testing import TinyEnv, local_overrides

TEAM = "env.factory=ma_envs:TeamMatch"
LATE = "env.factory=ma_envs:LateEarlyEnv"
SPREAD = ["env.factory=mpe2.simple_spread_v3:parallel_env", "env.kwargs.max_cycles=25"]


def make_ctx(*overrides):
    pm, cfg = load_config(["runtime.backend=local", "runtime.num_workers=1", "runtime.num_envs_per_worker=1",
                           *overrides])
    return setup(cfg, pm)


class Inputs:
    """Records the input tensor of every forward call of a module."""

    def __init__(self, module):
        self.seen = []
        module.register_forward_hook(lambda m, args, out: self.seen.append(args[0].detach().clone()))


# ---- the MAPPO networks on a hand-built two-agent batch ---------------------------------------------
def test_mappo_critic_gets_the_global_state_and_the_actor_only_its_own_observation():
    # two agents (ids 0 and 1), two steps each; own observations Box(2,), global state float32[3]
    cfg = MAPPOConfig(critic_input="state", critic_input_dim=5, minibatch_size=4)
    pol = MAPPOPolicy(spaces.Box(0.0, 1.0, (2,), np.float32), spaces.Discrete(2), cfg, None, "cpu", 0)
    obs = np.array([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6], [0.7, 0.8]], np.float32)
    state = np.array([[10.0, 11.0, 12.0], [20.0, 21.0, 22.0]], np.float32)  # at t=0 and t=1
    onehot = np.eye(2, dtype=np.float32)
    critic = np.stack([np.r_[state[0], onehot[0]], np.r_[state[1], onehot[0]],     # agent 0, t=0, 1
                       np.r_[state[0], onehot[1]], np.r_[state[1], onehot[1]]])    # agent 1, t=0, 1
    next_critic = np.stack([critic[1], np.r_[30.0, 31.0, 32.0, onehot[0]], critic[3], np.r_[30.0, 31.0, 32.0, onehot[1]]])
    batch = sb.SampleBatch({
        sb.OBS: obs, sb.NEXT_OBS: obs[[1, 1, 3, 3]], sb.ACTIONS: np.array([0, 1, 1, 0]),
        sb.REWARDS: np.array([1.0, 0.0, 0.5, 0.5], np.float32), sb.TERMINATEDS: np.zeros(4, bool),
        sb.TRUNCATEDS: np.array([False, True, False, True]), sb.EPS_ID: np.array([0, 0, 1, 1]),
        sb.AGENT_INDEX: np.array([0, 0, 1, 1]), sb.T: np.array([0, 1, 0, 1]),
        CRITIC_OBS: critic, NEXT_CRITIC_OBS: next_critic})
    actor, vf = Inputs(pol.model.pi), Inputs(pol.model.vf)
    acts, extras = pol.compute_actions_encoded(obs, None, True)
    assert len(actor.seen) == 1 and torch.equal(actor.seen[0], torch.from_numpy(obs)) and not vf.seen
    assert set(extras) == {sb.ACTION_LOGP, sb.ACTION_DIST_INPUTS}  # acting never evaluates the critic
    batch[sb.ACTION_LOGP], batch[sb.ACTION_DIST_INPUTS] = extras[sb.ACTION_LOGP], extras[sb.ACTION_DIST_INPUTS]
    batch[sb.ACTIONS] = acts
    post = pol.postprocess_trajectory(batch)
    # postprocessing: V(critic_obs) of every row, then V(next_critic_obs) of the truncated rows 1 and 3
    assert len(actor.seen) == 1 and len(vf.seen) == 2
    assert torch.equal(vf.seen[0], torch.from_numpy(critic))
    assert torch.equal(vf.seen[1], torch.from_numpy(next_critic[[1, 3]]))
    with torch.no_grad():
        v = pol.model.vf(torch.from_numpy(critic)).squeeze(-1).numpy()
        v_boot = pol.model.vf(torch.from_numpy(next_critic[[1, 3]])).squeeze(-1).numpy()
    np.testing.assert_allclose(post[sb.VF_PREDS], v, rtol=1e-6)
    g, lam = cfg.gamma, cfg.gae_lambda  # GAE by hand (two pieces of two rows, each truncated at its end)
    d1, d3 = 0.0 + g * v_boot[0] - v[1], 0.5 + g * v_boot[1] - v[3]
    d0, d2 = 1.0 + g * v[1] - v[0], 0.5 + g * v[3] - v[2]
    np.testing.assert_allclose(post[sb.ADVANTAGES], [d0 + g * lam * d1, d1, d2 + g * lam * d3, d3], rtol=1e-5, atol=1e-6)
    actor.seen.clear(), vf.seen.clear()
    pol.loss(pol.prepare_batch(post))  # the learner: actor on obs [4, 2], critic on critic_obs [4, 5]
    assert [tuple(t.shape) for t in actor.seen] == [(4, 2)] and torch.equal(actor.seen[0], torch.from_numpy(obs))
    assert [tuple(t.shape) for t in vf.seen] == [(4, 5)] and torch.equal(vf.seen[0], torch.from_numpy(critic))


# ---- the runner's columns ------------------------------------------------------------------------------
def test_runner_gives_mappo_the_env_state_and_the_agent_id_per_row():
    ctx = make_ctx("algo=mappo", TEAM, "runtime.rollout_fragment_length=3")
    spec = ctx.policy_specs["shared"]
    assert (spec.config.critic_input, spec.config.critic_input_dim) == ("state", 5)  # auto -> the env's state()
    pb = ctx.workers.local_worker().sample().policy_batches["shared"]
    assert len(pb) == 6 and set(pb[sb.AGENT_INDEX].tolist()) == {0, 1}
    by_t = {(int(i), int(t)): k for k, (i, t) in enumerate(zip(pb[sb.AGENT_INDEX], pb[sb.T], strict=True))}
    for (i, t), k in by_t.items():  # state() = [target a0, target a1, 10 t + 100]; targets are obs[0] of each agent
        want = [pb[sb.OBS][by_t[(0, t)]][0], pb[sb.OBS][by_t[(1, t)]][0], 10.0 * t + 100.0, float(i == 0), float(i == 1)]
        np.testing.assert_array_equal(pb[CRITIC_OBS][k], np.array(want, np.float32))
        nxt = [pb[sb.NEXT_OBS][by_t[(0, t)]][0], pb[sb.NEXT_OBS][by_t[(1, t)]][0], 10.0 * (t + 1) + 100.0]
        np.testing.assert_array_equal(pb[NEXT_CRITIC_OBS][k], np.array([*nxt, float(i == 0), float(i == 1)], np.float32))
    assert pb[sb.OBS].shape == (6, 2)  # the actor's input: the agent's own observation only
    pol = ctx.workers.local_worker().policies["shared"]
    np.testing.assert_allclose(pb[sb.VF_PREDS], pol.compute_values(pb[CRITIC_OBS]), rtol=1e-6)


def test_concat_obs_joins_the_teams_observations_with_zeros_for_an_absent_agent():
    # LateEarlyEnv has no state: auto -> concat_obs of a, b, c (Box(2,) each) + the one-hot of 3 agents
    ctx = make_ctx("algo=mappo", LATE, "runtime.rollout_fragment_length=6", "mappo.critic_agent_id=false")
    assert (ctx.policy_specs["shared"].config.critic_input, ctx.policy_specs["shared"].config.critic_input_dim) \
        == ("concat_obs", 6)
    pb = ctx.workers.local_worker().sample().policy_batches["shared"]
    for k in range(len(pb)):  # every row holds its own agent's observation in that agent's slot
        i = int(pb[sb.AGENT_INDEX][k])
        np.testing.assert_array_equal(pb[CRITIC_OBS][k][2 * i:2 * i + 2], pb[sb.OBS][k])
    a_rows = np.flatnonzero(pb[sb.AGENT_INDEX] == 0)
    first = pb[CRITIC_OBS][a_rows[0]]  # at reset: a and b observed, c not yet in the game
    np.testing.assert_array_equal(first, np.array([0.0, 0.0, 0.0, 1 / 3, 0.0, 0.0], np.float32))
    assert pb[sb.T][a_rows[3]] == 3  # after step 3: b has left (zeros), c has joined
    np.testing.assert_array_equal(pb[CRITIC_OBS][a_rows[3]], np.array([0.3, 0.0, 0.0, 0.0, 0.3, 2 / 3], np.float32))


def test_turn_based_games_get_the_critic_input_at_each_agents_turn():
    # AEC: p0 and p1 move in turns; concat_obs of both (masks taken out) + the one-hot id
    ctx = make_ctx("algo=mappo", "env.factory=flowkit.testing.envs:turn_game", "runtime.rollout_fragment_length=8")
    assert ctx.policy_specs["shared"].config.critic_input == "concat_obs"
    pb = ctx.workers.local_worker().sample().policy_batches["shared"]
    d = pb[sb.OBS].shape[1]
    assert pb[CRITIC_OBS].shape == (len(pb), 2 * d + 2)
    for k in range(len(pb)):  # the own slot holds the row's observation (and, next, its next observation)
        i = int(pb[sb.AGENT_INDEX][k])
        np.testing.assert_array_equal(pb[CRITIC_OBS][k][i * d:(i + 1) * d], pb[sb.OBS][k])
        np.testing.assert_array_equal(pb[CRITIC_OBS][k][2 * d:], np.eye(2, dtype=np.float32)[i])
        if not pb[sb.TERMINATEDS][k]:
            np.testing.assert_array_equal(pb[NEXT_CRITIC_OBS][k][i * d:(i + 1) * d], pb[sb.NEXT_OBS][k])


def test_the_team_is_the_training_group():
    from flowkit_multiagent.centralized import team_of
    from flowkit_multiagent.specs import build_mapping
    mixed = [TEAM, "multiagent.policies.team.algo=mappo", "multiagent.policies.solo.algo=ppo",
             "multiagent.mapping.a0=team", "multiagent.mapping.a1=solo", "mappo.critic_input=concat_obs"]
    ctx = make_ctx(*mixed)
    assert ctx.policy_specs["team"].config.critic_input_dim == 2 + 2  # a0's observation alone, + 2 agent ids
    _, cfg = load_config(["runtime.backend=local", *mixed])
    m = build_mapping(cfg, ["a0", "a1"])
    assert team_of(cfg, m, ["a0", "a1"], "team") == ["a0"] and team_of(cfg, m, ["a0", "a1"], "solo") == ["a1"]
    _, cfg = load_config(["runtime.backend=local", TEAM, "multiagent.share_parameters=false", "algo=mappo"])
    m = build_mapping(cfg, ["a0", "a1"])  # two policies of one group: one team
    assert team_of(cfg, m, ["a0", "a1"], "a1") == ["a0", "a1"]


def test_critic_input_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"^mappo\.critic_input=state: env LateEarlyEnv declares no state_space"):
        make_ctx("algo=mappo", LATE, "mappo.critic_input=state")
    with pytest.raises(ConfigError, match=r"multiagent\.policies\.shared\.config\.critic_input=state: env LateEarlyEnv"):
        make_ctx("algo=mappo", LATE, "multiagent.policies.shared.config.critic_input=state")
    with pytest.raises(ConfigError, match=r"^mappo\.critic_input_dim=7: the state input of policy 'shared' \(team a0, "
                                          r"a1\) is 5 wide here"):
        make_ctx("algo=mappo", TEAM, "mappo.critic_input_dim=7")
    with pytest.raises(ConfigError, match=r"mappo\.critic_input.*must be one of|critic_input.*auto"):
        make_ctx("algo=mappo", TEAM, "mappo.critic_input=global")
    with pytest.raises(ConfigError, match=r"^algo=mappo needs a multi-agent PettingZoo env"):
        make_ctx("algo=mappo", "env.factory=flowkit.testing.envs:match")
    with pytest.raises(ConfigError, match=r"model\.shared_value_network=True is not supported by mappo"):
        make_ctx("algo=mappo", TEAM, "model.shared_value_network=true")


# ---- parameter sharing -------------------------------------------------------------------------------
def test_share_parameters_false_gives_each_agent_its_own_policy():
    ctx = make_ctx(TEAM, "multiagent.share_parameters=false")
    assert {p: s.agents for p, s in ctx.policy_specs.items()} == {"a0": ("a0",), "a1": ("a1",)}
    assert make_ctx(TEAM).policy_specs["shared"].agents == ("a0", "a1")  # the default: one shared policy
    with pytest.raises(ConfigError, match=r"^multiagent\.share_parameters=false gives each agent a policy of its own; "
                                          r"it does not combine with multiagent\.policies / multiagent\.mapping"):
        make_ctx(TEAM, "multiagent.share_parameters=false", "multiagent.mapping.a0=x", "multiagent.mapping.a1=x")


def test_obs_agent_id_one_network_and_the_one_hot_tells_the_agents_apart(tmp_path):
    ctx = make_ctx(TEAM, "multiagent.obs_agent_id=true", "runtime.rollout_fragment_length=2")
    spec = ctx.policy_specs["shared"]
    assert spec.observation_space == spaces.Dict({"obs": spaces.Box(0.0, 1.0, (2,), np.float32),
                                                  "agent_id": spaces.Discrete(2)})
    assert list(ctx.policies) == ["shared"] and ctx.policies["shared"].encoder.shape == (4,)
    pb = ctx.workers.local_worker().sample().policy_batches["shared"]
    enc = ctx.policies["shared"].encoder
    for k in range(len(pb)):  # the encoded row: the Dict's keys in order, agent_id one-hot first
        i = int(pb[sb.AGENT_INDEX][k])
        raw = {"agent_id": np.array([i]), "obs": pb[sb.OBS][k][None, 2:]}
        np.testing.assert_array_equal(pb[sb.OBS][k], enc(raw, 1)[0][0])
        np.testing.assert_array_equal(pb[sb.OBS][k][:2], np.eye(2, dtype=np.float32)[i])
    # one network: the same observation under the two ids gives two different action distributions
    pol = ctx.policies["shared"]
    two = pol.encoder({"agent_id": np.array([0, 1]), "obs": np.full((2, 2), 0.5, np.float32)}, 2)[0]
    _, ex = pol.compute_actions_encoded(two, None, False)
    assert not np.allclose(ex[sb.ACTION_DIST_INPUTS][0], ex[sb.ACTION_DIST_INPUTS][1])
    # exported, the one network takes the agent id as an input of its own
    from flowkit.export import export_policy
    sig = export_policy(pol, "torchscript", str(tmp_path / "shared.pt"))
    assert [(i["name"], i["dtype"], i["shape"]) for i in sig["inputs"]] == [("agent_id", "int64", ["B"]),
                                                                            ("obs", "float32", ["B", 2])]
    # off (the default): the observation is the env's
    assert make_ctx(TEAM).policy_specs["shared"].observation_space == spaces.Box(0.0, 1.0, (2,), np.float32)


def test_a_mappo_policy_and_an_independent_ppo_policy_train_in_one_run(run_dir):
    res = flowkit.train(local_overrides(run_dir, TEAM, "multiagent.policies.team.algo=mappo",
                                        "multiagent.policies.solo.algo=ppo", "multiagent.mapping.a0=team",
                                        "multiagent.mapping.a1=solo", "runtime.rollout_fragment_length=16",
                                        "stop.env_steps=600", "mappo.minibatch_size=16", "ppo.minibatch_size=16"),
                        verbose=False)
    assert res.metrics["env_steps_sampled"] >= 600
    assert np.isfinite(res.metrics["learner/team/vf_loss"]) and np.isfinite(res.metrics["learner/solo/vf_loss"])


# ---- conformance and export ----------------------------------------------------------------------------
TEAM_ENV = TinyEnv("ma_envs:TeamMatch", 14.0)  # both agents' return; random: 8 of 16
KIT = ["mappo.minibatch_size=32", "mappo.num_epochs=4"]


def test_mappo_conformance_config_plan_actions_and_exact_resume(tmp_path):
    from flowkit.testing import check_algorithm
    out = check_algorithm(MAPPO, KIT, env=TEAM_ENV, checks=("config", "plan", "actions", "checkpoint"),
                          tmp_dir=str(tmp_path))
    assert "TrainOneStep" in out["plan"]


@pytest.mark.slow
def test_mappo_passes_the_whole_conformance_kit(ray_session, tmp_path):
    from flowkit.testing import check_algorithm
    out = check_algorithm(MAPPO, KIT, env=TEAM_ENV, learn_env_steps=8000, tmp_dir=str(tmp_path))
    assert out["learn_return"] >= 14.0


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_export_acts_from_the_agents_own_observation(run_dir, fmt, tmp_path):
    from flowkit.export import export_policy, input_arrays, run_exported
    res = flowkit.train(local_overrides(run_dir, "algo=mappo", TEAM, "runtime.rollout_fragment_length=16",
                                        "stop.env_steps=64", "mappo.minibatch_size=16"), verbose=False)
    pol = flowkit.Algorithm.from_checkpoint(res.checkpoint, trust_config=True).get_policy("shared")  # ma_envs: the tests' own
    path = str(tmp_path / f"pol.{fmt}")
    sig = export_policy(pol, fmt, path)  # checks the file's actions against compute_actions on sampled observations
    assert sig["checked"] > 0
    obs = np.random.default_rng(0).random((5, 2), dtype=np.float32)  # own observations only: no critic input
    np.testing.assert_array_equal(np.asarray(run_exported(path, fmt, input_arrays(pol.observation_space, obs))).reshape(-1),
                                  pol.compute_actions(obs, explore=False))


# ---- learning ------------------------------------------------------------------------------------------
LEARN_STEPS = 60000  # env steps of the slow learning check (a few minutes on 2 quiet cores)


def random_return(episodes: int, seed: int = 0) -> float:
    """Mean return per agent of uniformly random actions on simple_spread (25-step episodes)."""
    from mpe2 import simple_spread_v3
    env, rng, out = simple_spread_v3.parallel_env(max_cycles=25), np.random.default_rng(seed), []
    for ep in range(episodes):
        env.reset(seed=seed + ep)
        ret = 0.0
        while env.agents:
            ret += sum(env.step({a: int(rng.integers(5)) for a in env.agents})[1].values())
        out.append(ret / 3)
    return float(np.mean(out))


@pytest.mark.slow
def test_mappo_beats_random_on_simple_spread(run_dir):
    """The tuned config (a shared actor with agent ids, the critic on the env's state) for
    LEARN_STEPS env steps, greedy over 50 evaluation episodes, against random actions: mean
    return per agent (random: about -27; the tuned config's greedy return after 150,000 env steps: -19)."""
    import os
    conf = os.path.join(os.path.dirname(__file__), "..", "configs", "multiagent", "mappo_simple_spread.yaml")
    res = flowkit.train(local_overrides(run_dir, f"stop.env_steps={LEARN_STEPS}", "evaluation.episodes=50"),
                        config_file=conf, verbose=False)
    # evaluation_return_mean is an episode's return summed over its 3 agents (one shared policy: no
    # per-policy evaluation column)
    per_agent = res.metrics["evaluation_return_mean"] / 3
    assert per_agent > random_return(50) + 4.0, (per_agent, random_return(50))
