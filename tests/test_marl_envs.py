"""The MARL benchmark envs (issue 51, item 5): VMAS as one batched env per rollout worker
(:mod:`flowkit_multiagent.vmas`), Level-Based Foraging and the multi-robot warehouse as
PettingZoo games (:mod:`flowkit_multiagent.gym_teams`)."""
from __future__ import annotations

import numpy as np
import pytest

import flowkit
from flowkit import ConfigError
from flowkit.core import batch as sb
from flowkit.engine import load_config, setup
from flowkit.testing import local_overrides

pytest.importorskip("vmas")
VMAS = "env.factory=flowkit_multiagent.vmas:parallel_env"
TEAMS = "env.factory=flowkit_multiagent.gym_teams:parallel_env"


def make_ctx(*overrides, n=4, T=5, algo="ppo"):
    pm, cfg = load_config(["runtime.backend=local", "runtime.num_workers=1", f"runtime.num_envs_per_worker={n}",
                           f"algo={algo}", f"{algo}.minibatch_size=8",
                           f"runtime.rollout_fragment_length={T}", *overrides])
    return setup(cfg, pm)


def rows_of(pb, agent, j, n, T):
    """The rows of ``agent``'s piece of sub-env ``j`` (rows are ordered agent, sub-env, time)."""
    k = int(np.flatnonzero(np.unique(pb[sb.AGENT_INDEX]) == agent)[0])
    lo = (k * n + j) * T
    return pb.take(np.arange(lo, lo + T))


# ---- VMAS ----------------------------------------------------------------------------------
def test_vmas_sub_envs_are_one_vmas_env_stepped_once_per_env_step():
    ctx = make_ctx(VMAS, "env.kwargs.scenario=balance", "env.kwargs.n_agents=3", n=4, T=5)
    w = ctx.workers.local_worker()
    runner = w.runner
    assert type(runner).__name__ == "VmasRunner" and runner.env.num_envs == 4
    calls = []
    step = runner.env.step
    runner.env.step = lambda actions: calls.append({a: tuple(x.shape) for a, x in actions.items()}) or step(actions)
    b = w.sample()
    # 5 env steps of 4 sub-envs: 5 VMAS calls, each with every agent's 4 actions (Box(2,): force x, y)
    assert calls == [{f"agent_{i}": (4, 2) for i in range(3)}] * 5
    assert (b.env_steps, b.agent_steps) == (20, 60)
    pb = b["shared"]
    assert len(pb) == 60 and pb[sb.OBS].shape == (60, 16) and pb[sb.ACTIONS].shape == (60, 2)
    assert pb[sb.NEXT_OBS].shape == (60, 16) and pb[sb.REWARDS].dtype == np.float32
    # rows: agent-major, then sub-env, then time
    assert pb[sb.AGENT_INDEX].tolist() == [a for a in range(3) for _ in range(20)]
    assert pb[sb.T].tolist() == list(range(5)) * 12
    assert ctx.policies["shared"].dist.is_gauss
    ctx.shutdown()


def test_vmas_rows_equal_a_plain_vmas_loop_with_episode_ends_and_resets():
    """max_steps=3 and 7 steps per fragment: each sub-env truncates at its 3rd and 6th step and is
    reset at once. Replaying the recorded actions in a plain VMAS env of the same seed gives the
    same observations, rewards and ends; the episode summaries add up the rows."""
    n, T = 2, 7
    ctx = make_ctx(VMAS, "env.kwargs.scenario=navigation", "env.kwargs.n_agents=2", "env.kwargs.max_steps=3",
                   "multiagent.mapping.agent_0=p0", "multiagent.mapping.agent_1=p1", n=n, T=T)
    w = ctx.workers.local_worker()
    b = w.sample()
    assert sorted(b.policy_batches) == ["p0", "p1"] and all(len(pb) == n * T for pb in b.policy_batches.values())
    # the reference: one VMAS env of the same sub-envs and seed, the same actions (clipped to the
    # action space, as the policy's to_env does); a sub-env that ends is reset (all of them: one reset)
    import torch
    from flowkit_multiagent.vmas import parallel_env
    game = parallel_env("navigation", n_agents=2, max_steps=3)
    low, high = game.action_space("agent_0").low, game.action_space("agent_0").high
    env = game.make(n, w.runner.seed)
    obs = env.reset(seed=w.runner.seed)
    for t in range(T):
        acts = {}
        for i, pid in enumerate(("p0", "p1")):
            rows = [rows_of(b[pid], i, j, n, T) for j in range(n)]
            np.testing.assert_allclose(np.stack([r[sb.OBS][t] for r in rows]), obs[f"agent_{i}"].numpy(), atol=1e-6)
            acts[f"agent_{i}"] = torch.from_numpy(np.stack([np.clip(r[sb.ACTIONS][t], low, high) for r in rows]))
        obs, rew, term, trunc, _ = env.step(acts)
        for i, pid in enumerate(("p0", "p1")):
            for j in range(n):
                r = rows_of(b[pid], i, j, n, T)
                assert r[sb.REWARDS][t] == pytest.approx(float(rew[f"agent_{i}"][j]), abs=1e-6)
                np.testing.assert_allclose(r[sb.NEXT_OBS][t], obs[f"agent_{i}"][j].numpy(), atol=1e-6)
                assert (bool(r[sb.TERMINATEDS][t]), bool(r[sb.TRUNCATEDS][t])) == (bool(term[j]), bool(trunc[j]) and not bool(term[j]))
        done = (term | trunc).numpy()
        if done.all():
            obs = env.reset()
            continue
        for j in np.flatnonzero(done):
            env.reset_at(int(j), return_observations=False)
        obs = env.get_from_scenario(get_observations=True, get_rewards=False, get_infos=False, get_dones=False)[0]
    # episode accounting: steps 0..2 and 3..5 are whole episodes (truncated), step 6 starts a third
    r00 = rows_of(b["p0"], 0, 0, n, T)
    assert r00[sb.T].tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert r00[sb.TRUNCATEDS].tolist() == [False, False, True, False, False, True, False]
    assert len(np.unique(r00[sb.EPS_ID])) == 3
    assert len(b.episodes) == 4 and [e["length"] for e in b.episodes] == [3, 3, 3, 3]
    first = b.episodes[0]  # sub-env 0's first episode ends first (sub-env 0 is closed before sub-env 1)
    r10 = rows_of(b["p1"], 1, 0, n, T)
    assert first["policy_returns"] == {"p0": {"agent_0": pytest.approx(float(r00[sb.REWARDS][:3].sum()), abs=1e-5)},
                                       "p1": {"agent_1": pytest.approx(float(r10[sb.REWARDS][:3].sum()), abs=1e-5)}}
    assert first["return"] == pytest.approx(float(r00[sb.REWARDS][:3].sum() + r10[sb.REWARDS][:3].sum()), abs=1e-5)
    ctx.shutdown()


def test_vmas_discrete_actions_and_evaluation_from_the_same_states():
    ctx = make_ctx(VMAS, "env.kwargs.scenario=balance", "env.kwargs.n_agents=2", "env.kwargs.continuous_actions=false",
                   "env.kwargs.max_steps=4", n=3, T=4)
    assert ctx.policies["shared"].dist.kind == "cat"
    w = ctx.workers.local_worker()
    b = w.sample()
    acts = b["shared"][sb.ACTIONS]
    assert acts.shape == (24,) and acts.dtype.kind == "i" and set(acts.tolist()) <= set(range(9))
    assert len(b.episodes) == 3  # every sub-env: one whole 4-step episode (unless the package fell earlier)
    e1, e2 = w.evaluate(5), w.evaluate(5)
    assert len(e1) == 5 and [e["return"] for e in e1] == [e["return"] for e in e2]
    assert all(e["length"] <= 4 for e in e1)
    assert len(w.sample()["shared"]) == 24  # training goes on after the evaluation
    ctx.shutdown()


def test_vmas_mappo_critic_rows_are_the_team_observations_and_obs_agent_id_tells_agents_apart():
    """MAPPO on balance (3 agents, observations of 16): the critic's row of agent k is the 3 agents'
    observations of the same sub-env and step, then k one-hot (48 + 3 = 51); with obs_agent_id the
    shared actor's observation is k one-hot, then its own 16."""
    from flowkit_multiagent.centralized import CRITIC_OBS, NEXT_CRITIC_OBS
    n, T = 2, 4
    ctx = make_ctx(VMAS, "env.kwargs.scenario=balance", "env.kwargs.n_agents=3", "multiagent.obs_agent_id=true",
                   n=n, T=T, algo="mappo")
    pb = ctx.workers.local_worker().sample()["shared"]
    assert pb[sb.OBS].shape == (24, 19) and pb[CRITIC_OBS].shape == (24, 51) and pb[NEXT_CRITIC_OBS].shape == (24, 51)
    own = pb[sb.OBS][:, 3:].reshape(3, n * T, 16)  # agent-major rows
    nxt = pb[sb.NEXT_OBS][:, 3:].reshape(3, n * T, 16)
    np.testing.assert_array_equal(pb[sb.OBS][:, :3], np.repeat(np.eye(3, dtype=np.float32), n * T, axis=0))
    for k in range(3):
        rows = slice(k * n * T, (k + 1) * n * T)
        np.testing.assert_allclose(pb[CRITIC_OBS][rows, :48], np.concatenate(list(own), axis=1), atol=1e-6)
        np.testing.assert_allclose(pb[NEXT_CRITIC_OBS][rows, :48], np.concatenate(list(nxt), axis=1), atol=1e-6)
        assert (pb[CRITIC_OBS][rows, 48:] == np.eye(3)[k]).all()
    ctx.shutdown()


def test_vmas_bad_input_is_named():
    with pytest.raises(ConfigError, match=r"env.kwargs.scenario='balanse' is not a VMAS scenario; did you mean 'balance'"):
        make_ctx(VMAS, "env.kwargs.scenario=balanse")
    with pytest.raises(ConfigError, match=r"env.kwargs: n_agent not an argument of VMAS scenario 'balance'"):
        make_ctx(VMAS, "env.kwargs.scenario=balance", "env.kwargs.n_agent=3")
    with pytest.raises(ConfigError, match=r"env.kwargs.max_steps=0 must be a positive int"):
        make_ctx(VMAS, "env.kwargs.scenario=balance", "env.kwargs.max_steps=0")
    with pytest.raises(ConfigError, match=r"multiagent.mapping.agent_\*: a weighted choice is drawn per episode"):
        make_ctx(VMAS, "env.kwargs.scenario=balance", "multiagent.policies.a.algo=ppo",
                 "multiagent.policies.b.algo=random", "multiagent.mapping.agent_*={a: 1, b: 1}")


def test_vmas_ppo_trains_two_iterations(run_dir):
    res = flowkit.train(local_overrides(run_dir, VMAS, "env.kwargs.scenario=balance", "env.kwargs.n_agents=2",
                                        "env.kwargs.max_steps=10", "runtime.num_workers=1",
                                        "runtime.num_envs_per_worker=4", "runtime.rollout_fragment_length=10",
                                        "ppo.train_batch_size=40", "ppo.minibatch_size=40", "stop.iterations=2"))
    m = res.metrics
    assert m["iteration"] == 2 and m["env_steps_sampled"] == 80 and m["agent_steps_sampled"] == 160
    assert m["episodes_total"] <= 8 and m["learner/shared/num_sgd_steps"] > 0


@pytest.mark.slow  # (quick pass under 15 min: Ray workers, ~30 s)
def test_vmas_mappo_on_ray_workers(ray_session, run_dir):
    """Two Ray rollout workers (numpy acting copies of the policies), each one VMAS env of 3 sub-envs."""
    res = flowkit.train(["runtime.backend=ray", f"run.dir={run_dir}", "run.reporters=[csv]", "algo=mappo", VMAS,
                         "env.kwargs.scenario=balance", "env.kwargs.n_agents=2", "env.kwargs.max_steps=10",
                         "runtime.num_workers=2", "runtime.num_envs_per_worker=3", "runtime.rollout_fragment_length=10",
                         "mappo.train_batch_size=60", "mappo.minibatch_size=60", "mappo.num_epochs=1",
                         "stop.iterations=2"])
    m = res.metrics
    assert (m["env_steps_sampled"], m["agent_steps_sampled"], m["episodes_total"]) == (120, 240, 12)
    assert np.isfinite(m["policy/shared/episode_return_mean"]) and np.isfinite(m["learner/shared/vf_loss"])


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_ippo_learns_vmas_balance(run_dir):
    """IPPO (one PPO policy shared by the 4 agents, each on its own observation) on VMAS balance,
    configs/multiagent/vmas_balance_ippo.yaml: the team return starts at about -7 (a random
    policy drops the package) and passes 20 within 100,000 env steps (seed 0: at 48,000)."""
    import os
    cfg = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "multiagent",
                       "vmas_balance_ippo.yaml")
    res = flowkit.train(local_overrides(run_dir, "seed=0"), config_file=cfg)
    first = res.history[0]["episode_return_mean"]
    assert first < 0 and res.metrics["episode_return_mean"] >= 20 and res.metrics["env_steps_sampled"] <= 100_000


# ---- Level-Based Foraging, the multi-robot warehouse -------------------------------------------
@pytest.mark.parametrize("env_id, obs_dim, n_actions", [("Foraging-8x8-2p-2f-coop-v3", 12, 6),
                                                        ("rware-tiny-2ag-v2", 71, 5)])
def test_gym_team_spaces_and_agents(env_id, obs_dim, n_actions):
    pytest.importorskip(env_id.split("-")[0].lower().replace("foraging", "lbforaging"))
    from flowkit_multiagent.gym_teams import parallel_env
    env = parallel_env(env_id)
    assert env.possible_agents == ["agent_0", "agent_1"]
    for a in env.possible_agents:
        assert env.observation_space(a).shape == (obs_dim,) and env.action_space(a).n == n_actions
    obs, _ = env.reset(seed=0)
    assert sorted(obs) == ["agent_0", "agent_1"] and obs["agent_0"].shape == (obs_dim,)
    env.close()


def test_lbf_one_episode_is_truncated_at_its_limit_and_terminates_when_the_food_is_gone():
    pytest.importorskip("lbforaging")
    ctx = make_ctx(TEAMS, "env.kwargs.env_id=Foraging-8x8-2p-2f-coop-v3", "env.kwargs.max_episode_steps=6", n=1, T=6)
    w = ctx.workers.local_worker()
    b = w.sample()
    pb = b["shared"]
    assert (b.env_steps, b.agent_steps, len(pb)) == (6, 12, 12)
    assert len(b.episodes) == 1 and b.episodes[0]["length"] == 6
    ends = pb.take(np.flatnonzero(pb[sb.T] == 5))
    assert ends[sb.TRUNCATEDS].tolist() == [True, True] and not pb[sb.TERMINATEDS].any()
    ctx.shutdown()
    from flowkit_multiagent.gym_teams import parallel_env
    env = parallel_env("Foraging-8x8-2p-2f-coop-v3")
    env.reset(seed=0)
    env.env.unwrapped.field[:] = 0  # every food eaten: the game is over
    _, _, term, trunc, _ = env.step({"agent_0": 0, "agent_1": 0})
    assert term == {"agent_0": True, "agent_1": True} and trunc == {"agent_0": False, "agent_1": False}
    assert env.agents == []


def test_rware_one_episode_never_terminates():
    pytest.importorskip("rware")
    ctx = make_ctx(TEAMS, "env.kwargs.env_id=rware-tiny-2ag-v2", "env.kwargs.max_steps=8", n=2, T=8)
    b = ctx.workers.local_worker().sample()
    pb = b["shared"]
    assert (b.env_steps, b.agent_steps, len(pb)) == (16, 32, 32)
    assert [e["length"] for e in b.episodes] == [8, 8]
    assert pb[sb.TRUNCATEDS].sum() == 4 and not pb[sb.TERMINATEDS].any()
    ctx.shutdown()


def test_gym_team_bad_ids_are_named():
    with pytest.raises(ConfigError, match=r"env.kwargs.env_id='Foraging-8x8-2p-2f-coop-v9' is not a registered "
                                          r"Gymnasium id; did you mean 'Foraging-8x8-2p-2f-coop-v3'"):
        make_ctx(TEAMS, "env.kwargs.env_id=Foraging-8x8-2p-2f-coop-v9")
    with pytest.raises(ConfigError, match=r"env.kwargs.env_id='os:system': give a registered id without `module:`"):
        make_ctx(TEAMS, "env.kwargs.env_id=os:system")
    with pytest.raises(ConfigError, match=r"env.kwargs.env_id='CartPole-v1': not an env of several agents"):
        make_ctx(TEAMS, "env.kwargs.env_id=CartPole-v1")
