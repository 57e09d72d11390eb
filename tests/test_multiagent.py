"""The multi-agent plugin: C03, C04, the mixing plan, AEC reward attribution, frozen policies,
evaluation against fixed opponents, and short smoke runs of the acceptance games."""
from __future__ import annotations

import csv
import os

import numpy as np
import pytest

import flowkit
from flowkit import ConfigError
from flowkit.checkpoint import load_state
from flowkit.core import batch as sb
from flowkit.core import RandomPolicy
from flowkit.engine import build_plan, load_config, setup
from flowkit.testing import local_overrides

LATE = "env.factory=ma_envs:LateEarlyEnv"
SCOUT = "env.factory=ma_envs:ScoutTankEnv"
TINY = "env.factory=ma_envs:TinyTurnGame"
QUIET = ["run.reporters=[csv,checkpoint,evaluation]"]


def make_ctx(*overrides):
    pm, cfg = load_config(["runtime.backend=local", "runtime.num_workers=1", "runtime.num_envs_per_worker=1",
                           *overrides])
    return setup(cfg, pm)


def rows_by_agent(batches, episode_id, n_agents):
    """{agent_index: SampleBatch} of one episode, across fragments, in time order. A multi-agent
    eps_id names one agent's trajectory: episode_id * n_agents + agent_index."""
    out = {}
    for mb in batches:
        for pb in mb.policy_batches.values():
            sel = pb[sb.EPS_ID] // n_agents == episode_id
            assert (pb[sb.EPS_ID][sel] % n_agents == pb[sb.AGENT_INDEX][sel]).all()
            for ai in np.unique(pb[sb.AGENT_INDEX][sel]):
                m = sel & (pb[sb.AGENT_INDEX] == ai)
                out.setdefault(int(ai), []).append(pb.take(np.flatnonzero(m)))
    return {k: sb.concat_samples(v) for k, v in out.items()}


# ---- C03 -------------------------------------------------------------------------------------
def test_c03_agents_join_late_leave_early_and_end_on_fragment_boundary():
    ctx = make_ctx(LATE, "runtime.rollout_fragment_length=2", "ppo.gamma=0.9", "ppo.gae_lambda=1.0")
    w = ctx.workers.local_worker()
    frags = [w.sample() for _ in range(3)]  # 3 x 2 env steps = the whole first episode
    assert [f.env_steps for f in frags] == [2, 2, 2]
    # acting agents per step: (a,b) (a,b) (a) (a,c) (a) (a) -> 4, 3, 2 agent steps
    assert [f.agent_steps for f in frags] == [4, 3, 2]
    # fragment 1 ends on b's last step: b's two rows are all in it, terminated on the last
    b1 = frags[0]["shared"].take(np.flatnonzero(frags[0]["shared"][sb.AGENT_INDEX] == 1))
    assert len(b1) == 2 and b1[sb.TERMINATEDS].tolist() == [False, True]
    assert not any((f["shared"][sb.AGENT_INDEX] == 1).any() for f in frags[1:])
    # one trajectory per agent: a consumer splitting on eps_id never joins a's cut piece to b's
    assert [len(p) for p in frags[0]["shared"].split_by_episode()] == [2, 2]
    eps = [e for f in frags for e in f.episodes]
    assert len(eps) == 1 and eps[0]["length"] == 6
    assert eps[0]["policy_returns"] == {"shared": {"a": 6.0, "b": 2.0, "c": 1.0}}
    eid = int(frags[0]["shared"][sb.EPS_ID][0]) // 3
    tr = rows_by_agent(frags, eid, 3)
    assert {k: len(v) for k, v in tr.items()} == {0: 6, 1: 2, 2: 1}      # a=6, b=2, c=1: 9 agent steps
    assert tr[0][sb.T].tolist() == list(range(6))
    assert tr[0][sb.TRUNCATEDS].tolist() == [False] * 5 + [True] and not tr[0][sb.TERMINATEDS].any()
    assert tr[2][sb.TERMINATEDS].tolist() == [True]
    # value targets: terminated -> r; truncated and fragment cuts -> r + gamma * V(next_obs)
    pol = w.policies["shared"]
    v_next = pol.compute_values(tr[0][sb.NEXT_OBS])
    assert tr[2][sb.VALUE_TARGETS][0] == pytest.approx(1.0)
    assert tr[1][sb.VALUE_TARGETS][1] == pytest.approx(1.0)
    for k in (1, 3, 5):  # a's last row of each fragment (cut, cut, truncated)
        assert tr[0][sb.VALUE_TARGETS][k] == pytest.approx(1.0 + 0.9 * v_next[k], rel=1e-5)
    # a's next_obs at the truncation is its real final observation (t = 6)
    assert tr[0][sb.NEXT_OBS][5][0] == pytest.approx(0.6)
    ctx.shutdown()


def test_c03_two_iterations_train(run_dir):
    res = flowkit.train(local_overrides(run_dir, LATE, "runtime.num_workers=1", "runtime.num_envs_per_worker=1",
                                        "runtime.rollout_fragment_length=2", "ppo.train_batch_size=6",
                                        "ppo.minibatch_size=4", "stop.iterations=2"))
    m = res.metrics
    assert m["iteration"] == 2 and m["env_steps_sampled"] == 12 and m["agent_steps_sampled"] == 18
    assert m["agent_steps_trained"] == 18 and m["episodes_total"] == 2
    assert m["policy/shared/episode_return_mean"] == pytest.approx(3.0)  # (6 + 2 + 1) / 3


# ---- C04 -------------------------------------------------------------------------------------
C04_MAP = ["multiagent.mapping.scout=scout_pol", "multiagent.mapping.tank=tank_pol"]


def test_c04_spaces_inferred_per_policy_and_ppo_trains(run_dir):
    ctx = make_ctx(SCOUT, *C04_MAP)
    assert ctx.policies["scout_pol"].encoder.shape == (3,) and ctx.policies["tank_pol"].encoder.shape == (5,)
    for pid, d in (("scout_pol", 3), ("tank_pol", 5)):  # network input = the first weight's columns
        assert next(p for p in ctx.policies[pid].model.parameters() if p.ndim == 2).shape[1] == d
    assert ctx.policies["tank_pol"].dist.is_gauss and ctx.policies["scout_pol"].dist.kind == "cat"
    ctx.shutdown()
    res = flowkit.train(local_overrides(run_dir, SCOUT, *C04_MAP, "runtime.num_workers=1",
                                        "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=5",
                                        "stop.iterations=1"))
    assert res.metrics["learner/scout_pol/num_sgd_steps"] > 0 and res.metrics["learner/tank_pol/num_sgd_steps"] > 0


def test_c04_dqn_for_scout_ppo_for_tank(run_dir):
    if "dqn" not in flowkit.get_plugin_manager().algorithms():
        pytest.skip("the dqn plugin is not installed")
    res = flowkit.train(local_overrides(run_dir, SCOUT, *C04_MAP, "multiagent.policies.scout_pol.algo=dqn",
                                        "multiagent.policies.tank_pol.algo=ppo", "dqn.learning_starts=10",
                                        "runtime.num_workers=1", "runtime.num_envs_per_worker=2",
                                        "runtime.rollout_fragment_length=5", "stop.env_steps=60"))
    m = res.metrics
    assert m["env_steps_sampled"] >= 60
    assert "learner/tank_pol/pg_loss" in m and any(k.startswith("learner/scout_pol/") for k in m)


def test_c04_one_policy_for_different_spaces_fails_naming_both():
    with pytest.raises(ConfigError) as ei:
        make_ctx(SCOUT, "multiagent.mapping.*=both")
    msg = str(ei.value)
    for part in ("'both'", "'scout'", "'tank'", "(3,)", "(5,)", "Discrete(4)"):
        assert part in msg


def test_c04_box_actions_to_dqn_fail_at_setup():
    if "dqn" not in flowkit.get_plugin_manager().algorithms():
        pytest.skip("the dqn plugin is not installed")
    with pytest.raises(ConfigError) as ei:
        make_ctx(SCOUT, *C04_MAP, "multiagent.policies.scout_pol.algo=ppo", "multiagent.policies.tank_pol.algo=dqn")
    assert "tank_pol" in str(ei.value) and "Discrete" in str(ei.value)


def test_mapping_errors_are_named():
    with pytest.raises(ConfigError, match=r"agent 'tank' is not mapped"):
        make_ctx(SCOUT, "multiagent.mapping.scout=scout_pol")
    with pytest.raises(ConfigError, match=r"no agent is mapped to policy 'tank_pol'"):
        make_ctx(SCOUT, "multiagent.policies.scout_pol.algo=ppo", "multiagent.policies.tank_pol.algo=ppo",
                 "multiagent.mapping.scout=scout_pol", "multiagent.mapping.tank=tnak_pol")
    with pytest.raises(ConfigError, match=r"multiagent.policies.scout_pol.config.clip_parm.*"
                                          r"did you mean `multiagent.policies.scout_pol.config.clip_param`"):
        make_ctx(SCOUT, *C04_MAP, "multiagent.policies.scout_pol.config.clip_parm=0.1")
    with pytest.raises(ConfigError, match=r"multiagent.policies.scout_pol.algo='ppp'.*did you mean `ppo`"):
        make_ctx(SCOUT, *C04_MAP, "multiagent.policies.scout_pol.algo=ppp")
    with pytest.raises(ConfigError, match=r"env.max_episode_steps=5.*env.kwargs"):
        make_ctx(SCOUT, *C04_MAP, "env.max_episode_steps=5")


# ---- the mixing plan --------------------------------------------------------------------------
class _Recorder(flowkit.Algorithm):
    """Records which policies each train step of its fragment saw."""
    name = "rec_a"
    policy_class = RandomPolicy
    seen: list = []

    def training_flow(self, experiences, ctx, learner):
        tag = self.name

        def step(b):
            source = getattr(b, "actor", None)  # an async stream's items: (worker, batch)
            b = getattr(b, "item", b)
            type(self).seen.append((tag, sorted(b.policy_batches), sorted(learner.policies), source))
            return {"batch": b, "stats": {}}
        step.name = f"Record({tag})"
        return experiences.for_each(step)


class _RecorderB(_Recorder):
    name = "rec_b"


class _AsyncRecorder(_Recorder):
    name = "rec_async"
    rollout_mode = "async"


class _RecPlugin:
    @staticmethod
    @flowkit.hookimpl
    def flowkit_add_algorithms():
        return [_Recorder, _RecorderB, _AsyncRecorder]


@pytest.fixture
def recorders():
    flowkit.register(_RecPlugin)
    _Recorder.seen = []
    yield _Recorder
    flowkit.unregister(_RecPlugin)


def test_mixing_plan_composition(recorders):
    ctx = make_ctx(SCOUT, *C04_MAP, "multiagent.policies.scout_pol.algo=rec_a",
                   "multiagent.policies.tank_pol.algo=rec_b", "multiagent.round_robin_weights.rec_a=2",
                   "runtime.rollout_fragment_length=5")
    plan = build_plan(ctx)
    text = plan.to_text()
    for part in ("Concurrently(round_robin)", "union(weights=[2.0, 1.0])", "Record(rec_a)", "Record(rec_b)",
                 "SelectExperiences(['scout_pol'])", "SelectExperiences(['tank_pol'])", "duplicate[0/2]",
                 "duplicate[1/2]", "ParallelRollouts(bulk_sync)"):
        assert part in text, part
    assert not ctx.workers.started
    items = plan.take(6)
    assert len(items) == 6
    # round robin with weights 2:1; each fragment sees only its own policies (data and learner)
    assert [s[0] for s in recorders.seen] == ["rec_a", "rec_a", "rec_b"] * 2
    for tag, pids, learner, _ in recorders.seen:
        want = ["scout_pol"] if tag == "rec_a" else ["tank_pol"]
        assert pids == want and learner == want
    # 2 rounds for rec_a per cycle, rec_b reads the same rounds from its duplicate
    assert ctx.counters["env_steps_sampled"] == 4 * 5
    ctx.shutdown()


def test_mixing_cycle_position_is_checkpointed_and_restored(recorders):
    """An iteration ends inside one group's turn: the cursor in the state lets a resumed run
    finish that turn instead of starting the cycle again at the first group."""
    args = [SCOUT, *C04_MAP, "multiagent.policies.scout_pol.algo=rec_a", "multiagent.policies.tank_pol.algo=rec_b",
            "multiagent.round_robin_weights.rec_a=2", "runtime.rollout_fragment_length=5"]
    ctx = make_ctx(*args)
    build_plan(ctx).take(4)  # rec_a, rec_a, rec_b, rec_a: inside rec_a's second turn
    state = ctx.stateful["mixing/round_robin_cycle"].get_state()
    assert state == {"credit": [0.0, 0.0], "turn": 0, "left": 1.0}
    ctx.shutdown()
    recorders.seen = []
    again = make_ctx(*args)
    plan = build_plan(again)
    again.stateful["mixing/round_robin_cycle"].set_state(state)  # as restore() does
    plan.take(4)
    assert [s[0] for s in recorders.seen] == ["rec_a", "rec_b", "rec_a", "rec_a"]
    again.shutdown()


def test_mixing_async_with_bulk_sync_each_pulls_its_own_stream(recorders):
    """Issue 51 item 7: an async algorithm mixes with a bulk-sync one; each pulls the stream of its
    rollout mode from the same workers and trains only its own policies' rows (the async one
    with the worker that sampled each fragment)."""
    ctx = make_ctx(SCOUT, *C04_MAP, "multiagent.policies.scout_pol.algo=rec_a",
                   "multiagent.policies.tank_pol.algo=rec_async", "runtime.rollout_fragment_length=5")
    plan = build_plan(ctx)
    text = plan.to_text()
    assert "ParallelRollouts(bulk_sync)" in text and "ParallelRollouts(async, num_async=2)" in text
    assert "duplicate" not in text  # one group per stream
    plan.take(4)
    assert [s[0] for s in recorders.seen] == ["rec_a", "rec_async"] * 2
    for tag, pids, learner, source in recorders.seen:
        assert pids == learner == (["scout_pol"] if tag == "rec_a" else ["tank_pol"])
        assert (source is None) == (tag == "rec_a")  # async items come with their worker
    assert ctx.counters["env_steps_sampled"] == 4 * 5  # two fragments for each stream
    ctx.shutdown()


def test_per_policy_config_override_is_its_own_group():
    ctx = make_ctx(SCOUT, *C04_MAP, "multiagent.policies.scout_pol.config.lr=1e-3",
                   "multiagent.policies.scout_pol.config.num_epochs=2", "multiagent.policies.tank_pol.algo=ppo")
    specs = ctx.policy_specs
    assert specs["scout_pol"].config.lr == pytest.approx(1e-3) and specs["scout_pol"].config.num_epochs == 2
    assert specs["tank_pol"].config.lr == pytest.approx(3e-4) and specs["tank_pol"].config.num_epochs == 10
    assert specs["scout_pol"].group == "ppo[scout_pol]" and specs["tank_pol"].group == "ppo"
    text = build_plan(ctx).to_text()
    assert "TrainOneStep(num_epochs=2" in text and "TrainOneStep(num_epochs=10" in text
    ctx.shutdown()


# ---- AEC reward attribution -------------------------------------------------------------------
def test_aec_reward_attribution_tiny_game():
    ctx = make_ctx(TINY, "algo=random", "runtime.rollout_fragment_length=2")
    w = ctx.workers.local_worker()
    f1, f2 = w.sample(), w.sample()
    assert (f1.env_steps, f1.agent_steps, f2.env_steps, f2.agent_steps) == (2, 2, 2, 2)
    # nothing of the first episode is complete after moves 1-2: p0's reward is still arriving
    assert len(f1.policy_batches.get("shared", [])) == 0
    eid = int(f2["shared"][sb.EPS_ID][0]) // 2
    tr = rows_by_agent([f1, f2], eid, 2)
    p0, p1 = tr[0], tr[1]
    assert p0[sb.REWARDS].tolist() == [2.0, 10.0] and p0[sb.TERMINATEDS].tolist() == [False, True]
    assert p1[sb.REWARDS].tolist() == [-11.0] and p1[sb.TERMINATEDS].tolist() == [True]
    assert p0[sb.ACTIONS][1] == 1 and p0[sb.ACTION_MASK][1].tolist() == [0, 1]   # the mask was respected
    assert p0[sb.NEXT_OBS][0][0] == pytest.approx(2 / 3)  # p0's own next turn, after two moves
    assert p0[sb.NEXT_ACTION_MASK][0].tolist() == [0, 1] and p0[sb.NEXT_ACTION_MASK][1].tolist() == [0, 0]
    (ep,) = f2.episodes
    assert ep["policy_returns"] == {"shared": {"p0": 12.0, "p1": -10.5}}
    assert ep["length"] == 3 and ep["return"] == pytest.approx(1.5)
    ctx.shutdown()


def test_aec_evaluation_win_rates_and_alternating_seats(run_dir):
    """The tiny game is always won by whoever moves first (p0 +12 vs -10.5): with seats
    alternated, the learner wins exactly half of the games against a random opponent."""
    res = flowkit.train(local_overrides(run_dir, TINY, "runtime.num_workers=1", "runtime.num_envs_per_worker=2",
                                        "runtime.rollout_fragment_length=4", "stop.iterations=1",
                                        "multiagent.policies.learner.algo=ppo", "multiagent.policies.opp.algo=random",
                                        "multiagent.mapping.p0=learner", "multiagent.mapping.p1=opp",
                                        "multiagent.alternate_seats=true", "evaluation.final=true",
                                        "evaluation.episodes=10", "multiagent.eval_opponents.opp=random",
                                        "multiagent.eval_alternate_seats=true"))
    m = res.metrics
    assert m["evaluation/learner/win_rate"] == pytest.approx(0.5)
    assert m["evaluation/learner/loss_rate"] == pytest.approx(0.5)
    assert m["evaluation/learner/draw_rate"] == 0.0
    assert m["evaluation/learner/episode_return_mean"] == pytest.approx((12.0 - 10.5) / 2)
    # in training both seats were played by both policies too
    assert m["policy/learner/episode_return_mean"] == pytest.approx((12.0 - 10.5) / 2)


def test_frozen_policy_from_checkpoint(run_dir, tmp_path):
    first = flowkit.train(local_overrides(run_dir, SCOUT, *C04_MAP, "runtime.num_workers=1",
                                          "runtime.num_envs_per_worker=1", "runtime.rollout_fragment_length=5",
                                          "stop.iterations=1"))
    from flowkit.engine import find_checkpoint
    st = load_state(find_checkpoint(first.run_dir))
    saved = st["policies"]["tank_pol"]["weights"]
    pm, cfg = load_config(local_overrides(str(tmp_path / "r2"), SCOUT, *C04_MAP, "runtime.num_workers=1",
                                          "runtime.num_envs_per_worker=1", "runtime.rollout_fragment_length=5",
                                          "multiagent.policies.scout_pol.algo=ppo",
                                          "multiagent.policies.tank_pol.trainable=false",
                                          f"multiagent.policies.tank_pol.checkpoint={first.run_dir}"))
    ctx = setup(cfg, pm)
    plan = build_plan(ctx)
    assert "tank_pol" not in ctx.trainable_policies
    plan.take(2)
    now = ctx.policies["tank_pol"].get_weights()
    assert all(np.array_equal(now[k], saved[k]) for k in saved)
    worker_w = ctx.workers.local_worker().policies["tank_pol"].get_weights()
    assert all(np.array_equal(worker_w[k], saved[k]) for k in saved)
    assert ctx.metrics.learner_stats.keys() == {"scout_pol"}
    ctx.shutdown()


def test_a_checkpoint_policy_whose_network_differs_names_the_settings(run_dir, tmp_path):
    """Issue 27 item 10: reloading a policy built with other network settings (QR-DQN's
    num_quantiles) said only "model.* must match"; now the differing settings are named."""
    flowkit.train(local_overrides(run_dir, SCOUT, *C04_MAP, "runtime.num_workers=1", "runtime.num_envs_per_worker=1",
                                  "runtime.rollout_fragment_length=5", "stop.iterations=1",
                                  "multiagent.policies.scout_pol.algo=dqn"), trust_config=True)
    with pytest.raises(flowkit.ConfigError, match=r"multiagent.policies.scout_pol.checkpoint=.*its weights do not fit "
                                                  r"this run's network \(dqn.dueling=True in the checkpoint, False here\)"):
        setup(*reversed(load_config(local_overrides(
            str(tmp_path / "r2"), SCOUT, *C04_MAP, "multiagent.policies.scout_pol.algo=dqn",
            "multiagent.policies.scout_pol.config.dueling=false", f"multiagent.policies.scout_pol.checkpoint={run_dir}"))))


# ---- smoke versions of the acceptance runs (full runs: bench/multiagent_acceptance.py) -----------
def test_smoke_simple_spread_shared_ppo(run_dir):
    res = flowkit.train(local_overrides(run_dir, "env.factory=mpe2.simple_spread_v3:parallel_env",
                                        "runtime.num_workers=1", "runtime.num_envs_per_worker=2",
                                        "runtime.rollout_fragment_length=25", "stop.iterations=2",
                                        "ppo.num_epochs=1"))
    m = res.metrics
    assert m["env_steps_sampled"] == 100 and m["agent_steps_sampled"] == 300
    assert m["episodes_total"] == 4 and m["episode_len_mean"] == 25
    assert np.isfinite(m["policy/shared/episode_return_mean"])


@pytest.mark.slow
def test_smoke_simple_tag_ppo_and_dqn_on_ray(ray_session, run_dir):
    if "dqn" not in flowkit.get_plugin_manager().algorithms():
        pytest.skip("the dqn plugin is not installed")
    res = flowkit.train(["runtime.backend=ray", f"run.dir={run_dir}", *QUIET,
                         "env.factory=mpe2.simple_tag_v3:parallel_env", "runtime.num_workers=2",
                         "runtime.num_envs_per_worker=1", "runtime.rollout_fragment_length=25",
                         "multiagent.policies.adversaries.algo=ppo", "multiagent.policies.prey.algo=dqn",
                         "multiagent.mapping.adversary_*=adversaries", "multiagent.mapping.agent_*=prey",
                         "dqn.learning_starts=50", "ppo.num_epochs=1", "stop.env_steps=200"])
    m = res.metrics
    assert m["env_steps_sampled"] >= 200
    assert "learner/adversaries/pg_loss" in m and any(k.startswith("learner/prey/") for k in m)
    assert np.isfinite(m["policy/adversaries/episode_return_mean"]) and np.isfinite(m["policy/prey/episode_return_mean"])


def test_smoke_tictactoe_aec_against_random(run_dir):
    res = flowkit.train(local_overrides(run_dir, "env.factory=pettingzoo.classic.tictactoe_v3:env",
                                        "runtime.num_workers=1", "runtime.num_envs_per_worker=4",
                                        "runtime.rollout_fragment_length=16", "stop.iterations=2",
                                        "multiagent.policies.learner.algo=ppo", "multiagent.policies.opponent.algo=random",
                                        "multiagent.mapping.player_1=learner", "multiagent.mapping.player_2=opponent",
                                        "multiagent.alternate_seats=true", "evaluation.final=true",
                                        "evaluation.episodes=8", "multiagent.eval_opponents.opponent=random",
                                        "multiagent.eval_alternate_seats=true"))
    m = res.metrics
    assert m["env_steps_sampled"] == 128 and m["agent_steps_sampled"] == 128
    rates = [m[f"evaluation/learner/{k}"] for k in ("win_rate", "draw_rate", "loss_rate")]
    assert sum(rates) == pytest.approx(1.0)


def test_two_groups_of_one_algorithm_keep_separate_state():
    if "dqn" not in flowkit.get_plugin_manager().algorithms():
        pytest.skip("the dqn plugin is not installed")
    ctx = make_ctx(TINY, "multiagent.mapping.p0=a", "multiagent.mapping.p1=b", "multiagent.policies.a.algo=dqn",
                   "multiagent.policies.b.algo=dqn", "multiagent.policies.b.config.lr=1e-3")
    build_plan(ctx)
    names = sorted(ctx.stateful)
    assert "dqn/replay_buffer" in names and "dqn[b]/replay_buffer" in names
    assert "dqn/learner" in names and "dqn[b]/learner" in names
    assert ctx.learners["dqn"].policies.keys() == {"a"} and ctx.learners["dqn[b]"].policies.keys() == {"b"}
    assert ctx.policy_specs["b"].config.lr == pytest.approx(1e-3)
    ctx.shutdown()


def test_evaluation_opponent_from_checkpoint(run_dir, tmp_path):
    base = ["runtime.num_workers=1", "runtime.num_envs_per_worker=1", "runtime.rollout_fragment_length=4",
            "multiagent.mapping.p0=learner", "multiagent.mapping.p1=opp"]
    first = flowkit.train(local_overrides(run_dir, TINY, *base, "stop.iterations=1"))
    pm, cfg = load_config(local_overrides(str(tmp_path / "r2"), TINY, *base, "evaluation.episodes=4",
                                          f"multiagent.eval_opponents.opp={first.run_dir}"))
    ctx = setup(cfg, pm)
    out = ctx.evaluate()
    assert out["evaluation/learner/win_rate"] == 1.0 and out["evaluation_episodes"] == 4  # p0 always wins
    from flowkit.engine import find_checkpoint
    saved = load_state(find_checkpoint(first.run_dir))
    opp = ctx._eval_worker.runner._opponents["opp"]
    assert all(np.array_equal(opp.get_weights()[k], v) for k, v in saved["policies"]["opp"]["weights"].items())
    ctx.shutdown()
    with pytest.raises(ConfigError, match=r"multiagent.eval_opponents.opp='/nonexistent'"):
        make_ctx(TINY, *base, "multiagent.eval_opponents.opp=/nonexistent")
    with pytest.raises(ConfigError, match=r"multiagent.eval_opponents.oop: no policy 'oop'.*did you mean"):
        make_ctx(TINY, *base, "multiagent.eval_opponents.oop=random")


def test_resume_multiagent_run(run_dir):
    base = [SCOUT, *C04_MAP, "runtime.num_workers=1", "runtime.num_envs_per_worker=1",
            "runtime.rollout_fragment_length=5"]
    first = flowkit.train(local_overrides(run_dir, *base, "stop.iterations=1"))
    res = flowkit.train(local_overrides(run_dir, *base, f"resume={first.run_dir}", "stop.iterations=2"))
    assert res.metrics["iteration"] == 2 and res.metrics["env_steps_sampled"] == 10
    algo = flowkit.Algorithm.from_checkpoint(res.run_dir, trust_config=True)
    a = algo.compute_actions(np.zeros(5, np.float32), policy_id="tank_pol")
    assert a.shape == (2,) and np.all(np.abs(a) <= 1.0)


# ---- opponent sampling: weighted mapping drawn per episode --------------------------------------
def test_weighted_mapping_draws_once_per_episode_and_rule():
    from flowkit_multiagent.specs import AgentMapping
    m = AgentMapping({"adv_*": {"a": 3, "r": 1}, "prey": "p"}, ["a", "r", "p"], ["adv_0", "adv_1", "prey"], seed=7)
    draws = [(m.policy_for("adv_0", episode_id=e), m.policy_for("adv_1", episode_id=e)) for e in range(4000)]
    assert all(x == y for x, y in draws)                       # one draw per episode and rule
    share = sum(x == "r" for x, _ in draws) / len(draws)
    assert 0.22 < share < 0.28                                  # weights 3:1
    assert {m.policy_for("prey", episode_id=e) for e in range(50)} == {"p"}
    assert m.policy_for("adv_0") == "a" and m.options("adv_1") == ["a", "r"]   # no episode: the first
    again = AgentMapping({"adv_*": {"a": 3, "r": 1}, "prey": "p"}, ["a", "r", "p"], seed=7)
    assert [again.policy_for("adv_0", episode_id=e) for e in range(4000)] == [x for x, _ in draws]
    other = AgentMapping({"adv_*": {"a": 3, "r": 1}, "prey": "p"}, ["a", "r", "p"], seed=8)
    assert [other.policy_for("adv_0", episode_id=e) for e in range(200)] != [x for x, _ in draws[:200]]
    with pytest.raises(ConfigError, match=r"multiagent.mapping.adv_\*.r=0: a weight must be a positive number"):
        AgentMapping({"adv_*": {"a": 1, "r": 0}}, ["a", "r"])
    with pytest.raises(ConfigError, match=r"multiagent.mapping.adv_\*.q=1: no policy 'q'"):
        AgentMapping({"adv_*": {"a": 1, "q": 1}}, ["a", "r"])


def test_opponent_sampling_in_a_run_and_first_policy_in_evaluation():
    ctx = make_ctx(LATE, "runtime.rollout_fragment_length=6", "runtime.num_envs_per_worker=2",
                   "multiagent.policies.learner.algo=ppo", "multiagent.policies.rand.algo=random",
                   "multiagent.mapping.*={learner: 1, rand: 1}", "evaluation.episodes=4")
    build_plan(ctx)
    assert list(ctx.trainable_policies) == ["learner"] and list(ctx.learners) == ["ppo"]
    w = ctx.workers.local_worker()
    frags = [w.sample() for _ in range(5)]                      # 10 episodes of 6 steps
    eps = [e for f in frags for e in f.episodes]
    assert len(eps) == 10
    per_episode = [set(e["policy_returns"]) for e in eps]
    assert all(len(p) == 1 for p in per_episode)                # every agent of an episode: one policy
    assert {next(iter(p)) for p in per_episode} == {"learner", "rand"}
    for f in frags:                     # an agent's trajectory goes to its episode's policy only
        owner = {}
        for pid, pb in f.policy_batches.items():
            for eid in np.unique(pb[sb.EPS_ID] // 3).tolist():
                assert owner.setdefault(eid, pid) == pid
        assert sum(len(pb) for pb in f.policy_batches.values()) == f.agent_steps
    out = ctx.evaluate()
    assert "evaluation/learner/episode_return_mean" in out and "evaluation/rand/episode_return_mean" not in out
    ctx.shutdown()


def test_appo_team_and_ppo_team_train_in_one_run(run_dir):
    """Issue 51 item 7: APPO (async, learner thread) and PPO (bulk-sync) policies in one run,
    each trained from its own stream; the run resumes."""
    base = [SCOUT, *C04_MAP, "multiagent.policies.scout_pol.algo=ppo", "multiagent.policies.tank_pol.algo=appo",
            "runtime.num_workers=1", "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=10",
            "ppo.train_batch_size=20", "ppo.minibatch_size=10", "ppo.num_epochs=1", "appo.train_batch_size=20"]
    first = flowkit.train(local_overrides(run_dir, *base, "stop.iterations=10"))
    with open(os.path.join(first.run_dir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    trained = {p: sum(int(r[f"learner/{p}/train_batch_size"] or 0) for r in rows) for p in ("scout_pol", "tank_pol")}
    assert trained["scout_pol"] >= 20 * 10 and trained["tank_pol"] >= 20  # PPO every round, APPO from its thread
    res = flowkit.train(local_overrides(run_dir, *base, f"resume={first.run_dir}", "stop.iterations=12"))
    assert res.metrics["iteration"] == 12 and res.metrics["env_steps_trained"] > int(rows[-1]["env_steps_trained"])


def test_zero_sum_progress_and_summary_show_each_policy_and_the_win_rate(run_dir, capsys):
    """Issue 27 item 7: tic-tac-toe's bar and summary showed `return=0.0` and `eval=0.0` (the sum
    over both players) for the whole run while metrics.csv held the learner's win rate."""
    res = flowkit.train(local_overrides(run_dir, "env.factory=pettingzoo.classic.tictactoe_v3:env",
                                        "runtime.num_workers=1", "runtime.num_envs_per_worker=4",
                                        "runtime.rollout_fragment_length=16", "stop.iterations=2",
                                        "multiagent.policies.learner.algo=ppo", "multiagent.policies.opponent.algo=random",
                                        "multiagent.mapping.player_1=learner", "multiagent.mapping.player_2=opponent",
                                        "evaluation.final=true", "evaluation.interval=2", "evaluation.episodes=8",
                                        "multiagent.eval_opponents.opponent=random", "run.reporters=[progress,evaluation]"))
    out, err = capsys.readouterr()
    r = res.history[1]  # what the bar shows last (the final evaluation comes after it closed)
    learner, opponent = r["policy/learner/episode_return_mean"], r["policy/opponent/episode_return_mean"]
    assert f"return=learner:{learner:.2f},opponent:{opponent:.2f}" in err, err[-1500:]
    assert f"win=learner:{r['evaluation/learner/win_rate']:.3f}" in err, err[-1500:]
    assert f"eval=learner:{r['evaluation/learner/episode_return_mean']:.2f}," in err, err[-1500:]
    m = res.metrics
    learner, win = m["policy/learner/episode_return_mean"], m["evaluation/learner/win_rate"]
    line = next(x for x in out.splitlines() if x.startswith("  iteration="))
    assert f"policy/learner/episode_return_mean={learner:.4g}" in line and f"evaluation/learner/win_rate={win:.4g}" in line
    assert "  episode_return_mean=" not in line and "evaluation_return_mean=" not in line, line


def test_a_mixed_run_reports_one_row_per_round_of_the_plan_and_labels_its_bar_with_every_algorithm(run_dir, capsys):
    """Issue 48 item 11: docs/multiagent.md's two-algorithm command logged 262 iterations for
    6,144 env steps (a row per DQN gradient step: items of the round-robin between rounds) and
    its progress bar said `ppo`. A mixed run's iteration is one round of the plan: a sampling
    round (10 env steps here) and every fragment's training on it."""
    if "dqn" not in flowkit.get_plugin_manager().algorithms():
        pytest.skip("the dqn plugin is not installed")
    res = flowkit.train(local_overrides(run_dir, SCOUT, *C04_MAP, "multiagent.policies.scout_pol.algo=dqn",
                                        "multiagent.policies.tank_pol.algo=ppo", "dqn.learning_starts=10",
                                        "runtime.num_workers=1",
                                        "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=5",
                                        "stop.env_steps=60", "run.reporters=[progress,csv,checkpoint]"))
    assert [r["env_steps_sampled"] for r in res.history] == [10, 20, 30, 40, 50, 60]
    assert "dqn+ppo ma_envs:ScoutTankEnv:" in capsys.readouterr().err
    from flowkit.evaluation import evaluate  # and `flowkit evaluate` names both (it said `ppo`: a newcomer's find)
    assert evaluate(res.run_dir, episodes=2, trust_config=True)["algo"] == "dqn+ppo"


def test_mappo_team_against_dqn_team_runs_and_resumes_exactly(run_dir):
    """Issue 51 item 7: a centralized team (MAPPO adversaries, critic on their team's
    observations) against an independent one (DQN prey) in one simple_tag run; a checkpoint
    round trip gives back every policy's state (optimizers included), the replay buffer and
    the mixing cycle, and the run resumes from it."""
    from flowkit.checkpoint import STATE_FILE, checkpoint_state, restore
    base = ["env.factory=mpe2.simple_tag_v3:parallel_env", "env.kwargs.max_cycles=25",
            "multiagent.policies.adversaries.algo=mappo", "multiagent.policies.prey.algo=dqn",
            "multiagent.mapping.adversary_*=adversaries", "multiagent.mapping.agent_*=prey",
            "runtime.num_workers=1", "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=25",
            "mappo.train_batch_size=50", "mappo.minibatch_size=50", "mappo.num_epochs=1",
            "dqn.learning_starts=50", "dqn.train_batch_size=16", "dqn.buffer_size=1000"]
    res = flowkit.train(local_overrides(run_dir, *base, "stop.iterations=3"))
    saved = load_state(os.path.join(res.checkpoint, STATE_FILE))
    assert saved["policies"]["adversaries"]["num_updates"] > 0 and saved["policies"]["prey"]["num_updates"] > 0
    pm, cfg = load_config(["runtime.backend=local", *base, "stop.iterations=3"])
    ctx = setup(cfg, pm)
    try:
        build_plan(ctx)
        restore(ctx, res.checkpoint)
        now = checkpoint_state(ctx)
        for key in ("policies", "stateful", "counters", "iteration"):
            _assert_same(saved[key], now[key], key)
        assert set(now["stateful"]) == {"mappo/learner", "dqn/learner", "dqn/replay_buffer", "dqn/store_train_cycle",
                                        "mixing/round_robin_cycle"}
    finally:
        ctx.shutdown()
    again = flowkit.train(local_overrides(run_dir, *base, f"resume={res.run_dir}", "stop.iterations=4"))
    assert again.metrics["iteration"] == 4 and again.metrics["env_steps_sampled"] == 4 * 50


def _assert_same(a, b, where):
    """``a`` and ``b`` (checkpoint states: dicts, lists, arrays, tensors, numbers) are equal."""
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    elif hasattr(a, "shape") or hasattr(b, "shape"):
        assert np.array_equal(np.asarray(a), np.asarray(b)), where
    else:
        assert a == b or (a != a and b != b), where
