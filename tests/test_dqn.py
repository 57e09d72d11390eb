"""DQN plugin (issue 3): hand-computed n-step returns and double-Q targets, action masks (C05),
next-step autoreset in collection (C02), Box refusal, the Ape-X plan and a local Ape-X run,
exact checkpoint/restore for DQN and PPO (C11), and `train resume=`."""
import os
import shutil
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

import flowkit
from flowkit.testing import local_overrides
from flowkit import ConfigError
from flowkit.checkpoint import from_plain, load_state
from flowkit.core import batch as sb
from flowkit.core.flow import NOT_READY
from flowkit.engine import build_plan, load_config, read_metrics, setup
from flowkit_dqn.dqn import DQNPolicy, apex_epsilon, compute_n_step, compute_q_targets, epsilon_at
from flowkit_dqn import DQNConfig

HERE = os.path.dirname(os.path.abspath(__file__))


def model_cfg(hidden=()):
    from omegaconf import OmegaConf
    return OmegaConf.create({"hidden_sizes": list(hidden), "activation": "relu", "shared_value_network": False})


# ---- n-step returns -------------------------------------------------------------------------
def test_n_step_return_with_termination_inside_window():
    # rewards 1, 2, 3, 4; the episode terminates at row 1; rows 2-3 are a second episode cut
    # (truncated) at row 3. gamma = 0.5, n = 3.
    ret, last, steps = compute_n_step(np.array([1, 2, 3, 4], np.float32), np.array([0, 1, 0, 1], bool), 0.5, 3)
    np.testing.assert_allclose(ret, [1 + 0.5 * 2, 2, 3 + 0.5 * 4, 4])
    assert last.tolist() == [1, 1, 3, 3] and steps.tolist() == [2, 1, 2, 1]
    # the policy's postprocess takes next_obs / terminated from the window's last row
    cfg = DQNConfig(n_step=3, gamma=0.5)
    pol = DQNPolicy(gym.spaces.Box(-10, 10, (1,)), gym.spaces.Discrete(2), cfg, model_cfg([8]), inference_only=True)
    b = sb.SampleBatch({sb.OBS: np.array([[0], [1], [10], [11]], np.float32),
                        sb.NEXT_OBS: np.array([[1], [2], [11], [12]], np.float32),
                        sb.ACTIONS: np.zeros(4, np.int64), sb.REWARDS: np.array([1, 2, 3, 4], np.float32),
                        sb.TERMINATEDS: np.array([0, 1, 0, 0], bool), sb.TRUNCATEDS: np.array([0, 0, 0, 1], bool),
                        sb.EPS_ID: np.array([7, 7, 8, 8])})
    out = pol.postprocess_trajectory(b)
    np.testing.assert_allclose(out[sb.REWARDS], [2.0, 2.0, 5.0, 4.0])
    assert out[sb.NEXT_OBS][:, 0].tolist() == [2, 2, 12, 12]
    assert out[sb.TERMINATEDS].tolist() == [True, True, False, False]
    assert out[sb.TRUNCATEDS].tolist() == [False, False, True, True]
    assert out[sb.N_STEPS].tolist() == [2, 1, 2, 1]
    assert b[sb.REWARDS].tolist() == [1, 2, 3, 4]  # input untouched


def test_double_q_target_hand_computed():
    r = torch.tensor([1.0, 1.0, 2.0])
    term = torch.tensor([False, True, False])
    disc = torch.tensor([0.9, 0.9, 0.81])  # gamma^n_steps
    q_online = torch.tensor([[5.0, 1.0], [3.0, 2.0], [0.0, 1.0]])
    q_target = torch.tensor([[10.0, 20.0], [30.0, 40.0], [4.0, 8.0]])
    # double-Q: a* from the online net = [0, 0, 1] -> Q_target = [10, 30, 8]
    y = compute_q_targets(r, term, disc, q_target, q_online)
    np.testing.assert_allclose(y.numpy(), [1 + 0.9 * 10, 1.0, 2 + 0.81 * 8])
    # vanilla: max of the target net = [20, 40, 8]
    y = compute_q_targets(r, term, disc, q_target, None)
    np.testing.assert_allclose(y.numpy(), [1 + 0.9 * 20, 1.0, 2 + 0.81 * 8])


def test_epsilon_schedules():
    cfg = DQNConfig(initial_epsilon=1.0, final_epsilon=0.05, epsilon_timesteps=500)
    assert epsilon_at(cfg, 300) == pytest.approx(0.43)
    assert epsilon_at(cfg, 10_000) == pytest.approx(0.05)
    assert apex_epsilon(0, 2) == pytest.approx(0.4) and apex_epsilon(1, 2) == pytest.approx(0.4 ** 8)
    assert apex_epsilon(1, 3) == pytest.approx(0.4 ** 4.5) and apex_epsilon(0, 1) == pytest.approx(0.4)


# ---- C05: action masks -------------------------------------------------------------------------
def masked_policy(double_q):
    from dqn_envs import MaskedTwoState
    env = MaskedTwoState()
    cfg = DQNConfig(gamma=0.9, dueling=False, double_q=double_q, n_step=1)
    pol = DQNPolicy(env.observation_space, env.action_space, cfg, model_cfg(), seed=0)
    # no hidden layer: Q = W one_hot(s) + b; Q(s0) = [0, 0], Q(s1) = [0, 10]
    w = {"q_head.0.weight": np.array([[0.0, 0.0], [0.0, 10.0]], np.float32), "q_head.0.bias": np.zeros(2, np.float32)}
    pol.set_weights(w)
    pol.target.update()
    return env, pol


@pytest.mark.parametrize("double_q", [False, True])
def test_c05_masked_target_is_max_over_legal_actions(double_q):
    env, pol = masked_policy(double_q)
    s0, s1 = np.array([[1, 0]], np.float32), np.array([[0, 1]], np.float32)
    batch = {sb.OBS: torch.tensor(s0), sb.ACTIONS: torch.tensor([1]), sb.REWARDS: torch.tensor([0.0]),
             sb.TERMINATEDS: torch.tensor([False]), sb.NEXT_OBS: torch.tensor(s1),
             sb.N_STEPS: torch.tensor([1]), sb.NEXT_ACTION_MASK: torch.tensor([[1, 0]], dtype=torch.int8)}
    pol.loss(batch)
    # Q(s0, 1) = 0 and the target is 0 + 0.9 * max_{legal} Q(s1) = 0 (not 0.9 * 10 = 9)
    assert pol.td_error.tolist() == [0.0]
    batch[sb.NEXT_ACTION_MASK] = torch.tensor([[1, 1]], dtype=torch.int8)
    pol.loss(batch)
    assert pol.td_error[0] == pytest.approx(-9.0)
    # an all-zero mask at a terminal next observation is not an error, and adds nothing
    batch[sb.NEXT_ACTION_MASK] = torch.tensor([[0, 0]], dtype=torch.int8)
    batch[sb.TERMINATEDS] = torch.tensor([True])
    pol.loss(batch)
    assert pol.td_error.tolist() == [0.0]


def test_c05_acting_respects_masks():
    env, pol = masked_policy(True)
    obs1 = {"observation": 1, "action_mask": np.array([1, 0], np.int8)}
    assert pol.compute_actions(obs1, explore=False) == 0  # greedy: Q(s1, 1) = 10 is illegal
    pol.epsilon = 1.0
    many = {"observation": np.ones(1000, np.int64), "action_mask": np.tile(np.array([1, 0], np.int8), (1000, 1))}
    assert (pol.compute_actions(many, explore=True) == 0).all()
    obs0 = {"observation": np.zeros(1000, np.int64), "action_mask": np.ones((1000, 2), np.int8)}
    acts = pol.compute_actions(obs0, explore=True)
    assert 400 < (acts == 1).sum() < 600  # both legal actions explored
    with pytest.raises(ValueError, match="action_mask allows no action"):
        pol.compute_actions({"observation": 1, "action_mask": np.array([0, 0], np.int8)}, explore=True)


def test_c05_training_run_never_takes_an_illegal_action(run_dir):
    # the env asserts on an illegal action; the buffer stores both masks
    res = flowkit.train(local_overrides(run_dir, "algo=dqn", "env.factory=dqn_envs:masked_two_state",
                                        "runtime.num_workers=1", "runtime.num_envs_per_worker=2",
                                        "runtime.rollout_fragment_length=8", "dqn.learning_starts=32",
                                        "dqn.train_batch_size=8", "model.hidden_sizes=[8]", "stop.env_steps=160",
                                        "checkpoint.at_end=false"))
    assert res.metrics["env_steps_sampled"] == 160 and res.metrics["num_updates"] > 0


def test_linear_lr_schedule_follows_env_steps_sampled(run_dir):
    # lr = 1e-3 * (1 - sampled / 320): the last train step of 160 sampled env steps ran at 5e-4
    res = flowkit.train(local_overrides(run_dir, "algo=dqn", "env.factory=dqn_envs:masked_two_state",
                                        "runtime.num_workers=1", "runtime.num_envs_per_worker=2",
                                        "runtime.rollout_fragment_length=8", "dqn.learning_starts=32",
                                        "dqn.train_batch_size=8", "model.hidden_sizes=[8]", "stop.env_steps=160",
                                        "dqn.lr=1e-3", "dqn.lr_schedule=linear", "dqn.schedule_env_steps=320",
                                        "checkpoint.at_end=false"))
    assert res.metrics["learner/default/lr"] == pytest.approx(5e-4)
    with pytest.raises(ConfigError, match="dqn.lr_schedule='cosine' must be 'constant' or 'linear'"):
        load_and_setup(["dqn.lr_schedule=cosine"])
    with pytest.raises(ConfigError, match="dqn.lr_schedule=linear needs a horizon"):
        load_and_setup(["dqn.lr_schedule=linear"])


# ---- C02: next-step autoreset -------------------------------------------------------------------
def collect_counter(run_dir, mode):
    pm, cfg = load_config(local_overrides(run_dir, "algo=dqn", "env.factory=dqn_envs:counter",
                                          f"env.autoreset_mode={mode}", "runtime.num_workers=1",
                                          "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=4",
                                          "dqn.learning_starts=1000", "model.hidden_sizes=[8]"))
    ctx = setup(cfg, pm, run_dir)
    plan = build_plan(ctx)
    while ctx.counters["env_steps_sampled"] < 24:
        assert next(plan) is NOT_READY  # nothing trains before learning_starts
    st = ctx.stateful["dqn/replay_buffer"].buffers["default"].storage
    ctx.shutdown()
    return {k: v[:st.size].copy() for k, v in st.cols.items()}


def test_c02_autoreset_steps_never_enter_the_buffer(run_dir):
    bufs = {m: collect_counter(run_dir + m, m) for m in ("next_step", "same_step")}
    for mode, c in bufs.items():
        assert len(c[sb.OBS]) == 24, mode
        obs, nxt = c[sb.OBS].argmax(1), c[sb.NEXT_OBS].argmax(1)
        assert (nxt == obs + 1).all(), mode  # never final -> reset observation
        assert not c[sb.TERMINATEDS].any()
        trunc = c[sb.TRUNCATEDS]
        # sub-env 0 (TimeLimit 3) truncates 4 times in 12 steps, sub-env 1 (TimeLimit 4) 3 times
        assert sorted(nxt[trunc].tolist()) == [3] * 4 + [4] * 3, mode
        assert (nxt[~trunc] < 4).all()
    # the same transitions in both modes; actions are random draws (epsilon = 1) and next_step
    # mode also acts (unrecorded) on its reset steps, so only their RNG streams differ
    for k in bufs["next_step"]:
        if k not in (sb.EPS_ID, sb.ACTIONS):
            np.testing.assert_array_equal(bufs["next_step"][k], bufs["same_step"][k], err_msg=k)


def test_c02_unsupported_autoreset_mode_fails_at_setup(run_dir):
    with pytest.raises(ConfigError, match="autoreset_mode='disabled'"):
        flowkit.train(local_overrides(run_dir, "algo=dqn", "env.factory=dqn_envs:counter",
                                      "env.autoreset_mode=disabled"))


# ---- set-up errors and plans -------------------------------------------------------------------------
def test_box_actions_refused_at_setup(run_dir):
    with pytest.raises(ConfigError, match="policy 'default': DQN needs a Discrete action space, got Box"):
        flowkit.train(local_overrides(run_dir, "algo=dqn", "env.factory=dqn_envs:box_actions"))


def test_bad_dqn_keys_fail_naming_the_key():
    with pytest.raises(ConfigError, match="dqn.n_step=0 must be > 0"):
        load_and_setup(["dqn.n_step=0"])
    with pytest.raises(ConfigError, match="dqn.train_batch_size=64 is larger than dqn.buffer_size=32"):
        load_and_setup(["dqn.train_batch_size=64", "dqn.buffer_size=32"])


def test_model_normalize_obs_keeps_statistics_in_the_checkpoint_and_acts_through_them(run_dir):
    """model.normalize_obs=true was silently ignored by DQN (no obs_rms in the checkpoint): the
    replayed batches update the statistics, the loss, the workers (numpy copy), evaluation and
    export see normalised observations."""
    res = flowkit.train(local_overrides(run_dir, "algo=dqn", "env=CartPole-v1", "model.normalize_obs=true", "seed=0",
                                        "runtime.num_workers=1", "runtime.num_envs_per_worker=2",
                                        "runtime.rollout_fragment_length=16", "dqn.learning_starts=64",
                                        "dqn.train_batch_size=16", "model.hidden_sizes=[16]", "stop.env_steps=256"),
                        verbose=False)
    w = load_state(res.checkpoint)["policies"]["default"]["weights"]
    mean, var, count = w["obs_rms.mean"], w["obs_rms.var"], float(w["obs_rms.count"])
    assert mean.shape == (4,) and count > 0 and count == pytest.approx(res.metrics["env_steps_trained"], abs=1e-3)
    assert np.abs(mean).max() > 0.001 and not np.allclose(var, 1.0)  # not the initial identity
    pol = flowkit.Algorithm.from_checkpoint(res.checkpoint).get_policy()
    np.testing.assert_array_equal(pol.model.obs_rms.var.numpy(), var)
    obs = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    x = torch.clamp((torch.from_numpy(obs) - torch.from_numpy(mean)) / torch.sqrt(torch.from_numpy(var) + 1e-8), -10, 10)
    with torch.no_grad():
        want = pol.model(x).numpy()
    np.testing.assert_allclose(pol.q_values(obs), want, rtol=1e-6)
    np.testing.assert_array_equal(pol.compute_actions(obs, explore=False), want.argmax(1))
    with torch.no_grad():  # export's network
        np.testing.assert_allclose(pol.action_model()(torch.from_numpy(obs)).numpy(), want, rtol=1e-6)
    make = pol.worker_policy_class()  # a Ray worker's torch-free copy, built from the weights
    worker = make(pol.observation_space, pol.action_space, pol.config, pol.model_config)
    np.testing.assert_allclose(worker.q_values(obs), want, rtol=1e-5, atol=1e-6)
    # the loss sees normalised obs and next_obs, after the statistics took the batch in
    b = sb.SampleBatch({sb.OBS: obs, sb.NEXT_OBS: obs[::-1].copy(), sb.ACTIONS: np.zeros(6, np.int64),
                        sb.REWARDS: np.ones(6, np.float32), sb.TERMINATEDS: np.zeros(6, bool),
                        sb.N_STEPS: np.ones(6, np.int64)})
    t = pol.prepare_batch(b)
    assert float(pol.model.obs_rms.count) == pytest.approx(count + 6)
    np.testing.assert_allclose(t[sb.NEXT_OBS].numpy(), pol.model.obs_rms(torch.from_numpy(obs[::-1].copy())).numpy())


def test_model_normalize_obs_off_adds_nothing_and_image_observations_are_refused():
    from omegaconf import OmegaConf

    from flowkit.config import ModelConfig
    model = OmegaConf.structured(ModelConfig)
    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    pol = DQNPolicy(frames, gym.spaces.Discrete(3), DQNConfig(), model)  # Atari, the key off: as before
    assert not any(k.startswith("obs_rms") for k in pol.get_weights())
    model.normalize_obs = True
    with pytest.raises(ConfigError, match=r"^model.normalize_obs=true: DQN normalises flat observations only, got "
                                          r"image observations Box\(0, 255, \(4, 84, 84\), uint8\)"):
        DQNPolicy(frames, gym.spaces.Discrete(3), DQNConfig(), model)


def load_and_setup(extra):
    pm, cfg = load_config(["algo=dqn", "env=CartPole-v1", "runtime.backend=local", *extra])
    return setup(cfg, pm)


def test_plans_show_both_branches_and_the_apex_graph():
    plain = flowkit.describe_plan(["algo=dqn", "env=CartPole-v1", "dqn.training_intensity=8",
                                   "runtime.num_workers=1", "runtime.num_envs_per_worker=4",
                                   "runtime.rollout_fragment_length=16"])["text"]
    for op in ("StoreToReplayBuffer", "Replay(batch_size=32", "TrainOneStep", "UpdateTargetNetwork",
               "SyncWeights(to=all, every=512 env_steps)", "union(weights=[1, 16.0])", "gather_sync(prefetch)"):
        assert op in plain, op
    apex = flowkit.describe_plan(["algo=dqn", "env=CartPole-v1", "dqn.num_replay_shards=2",
                                  "dqn.prioritized_replay=true"])["text"]
    for op in ("ParallelRollouts(async", "StoreToReplayShards(2)",
               "SyncWeights(to=source, every=512 env_steps, with next sample)",
               "ReplayFromShards(2 shards", "zip_with_source_actor", "UpdatePriorities",
               "UpdateExploration(per-worker epsilon)"):
        assert op in apex, op


def test_apex_local_run_trains_from_shards_with_per_worker_epsilon(run_dir):
    pm, cfg = load_config(local_overrides(run_dir, "algo=dqn", "env=CartPole-v1", "runtime.num_workers=2",
                                          "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=8",
                                          "dqn.num_replay_shards=2", "dqn.prioritized_replay=true",
                                          "dqn.learning_starts=64", "dqn.train_batch_size=16",
                                          "model.hidden_sizes=[16]"))
    ctx = setup(cfg, pm, run_dir)
    plan = build_plan(ctx)
    got = [x for x in plan.take(20)]
    assert all(set(r["stats"]) == {"default"} for r in got)
    eps = [a.obj.policies["default"].epsilon for a in ctx.workers.actors]
    assert eps == pytest.approx([0.4, 0.4 ** 8])
    shards = ctx.stateful["dqn/replay_shards"]
    sizes = [a.obj.sizes()["default"] for a in shards.actors]
    assert min(sizes) > 0 and sum(sizes) == ctx.counters["env_steps_sampled"]
    # priorities came back: some slot has a priority other than the initial 1
    trees = [a.obj.buffers["default"].sampler.sum for a in shards.actors]
    assert any(np.any(np.abs(t.leaves(s) - 1.0) > 1e-6) for t, s in zip(trees, sizes))
    ctx.shutdown()


# ---- C11: exact checkpoint / restore ---------------------------------------------------------------
@pytest.mark.slow
def test_c11_checkpoint_restore_continues_the_same_run(tmp_path):
    import c11_helper as h
    work = {a: str(tmp_path / a) for a in ("dqn", "ppo")}
    r1 = {}
    for algo, w in work.items():
        os.makedirs(w)
        r1[algo] = h.run1(algo, w)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "c11_helper.py"), "run2",
                           "dqn", work["dqn"], "ppo", work["ppo"]], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for algo, w in work.items():
        ck, s1, w1 = r1[algo]
        out = from_plain(torch.load(f"{w}/run2.pt", weights_only=True))
        s2, w2 = out["snap"], out["weights"]
        assert s2["counters"] == s1["counters"]
        assert s2["num_updates"] == s1["num_updates"] > 0
        assert s2["opt_step"] == s1["opt_step"] > 0
        assert torch.equal(s2["exp_avg"], s1["exp_avg"]) and torch.equal(s2["exp_avg_sq"], s1["exp_avg_sq"])
        for k in w1:
            np.testing.assert_array_equal(w1[k], w2[k], err_msg=f"{algo}: {k}")
        assert s2["worker_exploration"] == s1["worker_exploration"]  # the next fragment explores alike
    assert r1["dqn"][1]["worker_exploration"] == {"epsilon": pytest.approx(0.43)}
    assert r1["dqn"][1]["counters"]["env_steps_sampled"] == 300
    assert r1["dqn"][1]["epsilon"] == pytest.approx(1 - 0.95 * 300 / 500) == pytest.approx(0.43)
    out = from_plain(torch.load(f"{work['dqn']}/run2.pt", weights_only=True))
    assert out["snap"]["epsilon"] == pytest.approx(0.43)


def test_train_resume_continues_counters_and_replay(run_dir):
    base = local_overrides(run_dir, "algo=dqn", "env.factory=dqn_envs:chain5", "runtime.num_workers=1",
                           "runtime.num_envs_per_worker=1", "runtime.rollout_fragment_length=10",
                           "dqn.learning_starts=50", "dqn.train_batch_size=8", "model.hidden_sizes=[8]",
                           "dqn.epsilon_timesteps=500")
    r1 = flowkit.train(base + ["stop.env_steps=200"])
    assert r1.metrics["env_steps_sampled"] == 200
    r2 = flowkit.train(["resume=" + run_dir, "stop.env_steps=300", "run.reporters=[csv,plot,checkpoint,evaluation]"],
                       trust_config=True)  # env.factory=dqn_envs:chain5, the tests' own
    assert r2.run_dir == run_dir
    assert r2.metrics["env_steps_sampled"] == 300
    assert r2.metrics["iteration"] > r1.metrics["iteration"]
    assert r2.metrics["learner/default/epsilon"] == pytest.approx(1 - 0.98 * 300 / 500)
    st = load_state(r2.checkpoint)
    assert st["stateful"]["dqn/replay_buffer"]["buffers"]["default"]["storage"]["size"] == 300


def test_a_resumed_run_trains_the_steps_its_last_iteration_left_in_the_cycle(run_dir, tmp_path):
    """An iteration ends at the first train step once enough env steps were sampled; with 4
    train steps per stored fragment the other 3 come at the start of the next iteration. A
    resume used to start a fresh store/train cycle and drop them (3 gradient steps short per
    resume, seen on the DQN Pong run): the cycle's position is in the checkpoint now."""
    args = ["algo=dqn", "env.factory=dqn_envs:chain5", "runtime.num_workers=1", "runtime.num_envs_per_worker=1",
            "runtime.rollout_fragment_length=10", "dqn.learning_starts=50", "dqn.train_batch_size=8",
            "model.hidden_sizes=[8]", "dqn.training_intensity=3.2", "run.min_iter_env_steps=30"]  # [1, 4]
    whole = flowkit.train(local_overrides(str(tmp_path / "whole"), *args) + ["stop.env_steps=200"])
    half = flowkit.train(local_overrides(run_dir, *args) + ["stop.env_steps=100"])
    assert load_state(half.checkpoint)["stateful"]["dqn/store_train_cycle"] == {"credit": [0.0, 0.0], "turn": 1,
                                                                               "left": 3.0}
    older = str(tmp_path / "older")  # a checkpoint from before the cursor: resumes, from a fresh cycle
    shutil.copytree(run_dir, older)
    path = os.path.join(half.checkpoint.replace(run_dir, older), "state.pt")
    st = torch.load(path, weights_only=True)
    del st["stateful"]["dqn/store_train_cycle"]
    torch.save(st, path)
    resumed = flowkit.train(["resume=" + run_dir, "stop.env_steps=200"], trust_config=True)
    assert resumed.metrics["env_steps_sampled"] == whole.metrics["env_steps_sampled"] == 200
    assert resumed.metrics["env_steps_trained"] == whole.metrics["env_steps_trained"] == 488  # 61 steps of 8
    assert flowkit.train(["resume=" + older, "stop.env_steps=200"], trust_config=True).metrics["env_steps_trained"] == 464


# ---- the replay warm-up (learning_starts) reports and stops --------------------------------------
WARM_UP = ["algo=dqn", "env=CartPole-v1", "runtime.num_workers=1", "runtime.num_envs_per_worker=2",
           "runtime.rollout_fragment_length=64", "model.hidden_sizes=[8]", "dqn.train_batch_size=16"]  # rounds of 128


def test_stop_env_steps_below_learning_starts_stops_at_the_first_round_that_reaches_it(run_dir):
    """learning_starts 5,000 > stop.env_steps 1,000: the run stops at the first sampled round at or
    after 1,000 env steps (1,024), trains nothing and says so at start-up (before: an iteration
    ended only with a train step, so the run sampled 5,120 env steps, the first round past
    learning_starts, and trained one step). Each round of the warm-up is an iteration (as each
    train step is after it, run.min_iter_env_steps being 0)."""
    warning = "dqn.learning_starts=5000 >= stop.env_steps=1000: the run stops in the replay warm-up and trains nothing"
    with pytest.warns(UserWarning, match=warning.replace(".", r"\.")):
        res = flowkit.train(local_overrides(run_dir, *WARM_UP, "dqn.learning_starts=5000", "stop.env_steps=1000"),
                            verbose=False)
    assert res.stop_reason == "stop.env_steps=1000 reached"
    assert [r["env_steps_sampled"] for r in res.history] == [128 * i for i in range(1, 9)]
    assert res.metrics["env_steps_sampled"] == 1024 and res.metrics["num_updates"] == res.metrics["env_steps_trained"] == 0
    rows = read_metrics(os.path.join(run_dir, "metrics.csv"))
    assert [r["env_steps_sampled"] for r in rows] == [r["env_steps_sampled"] for r in res.history]


def test_the_warm_up_reports_by_min_iter_env_steps_and_meets_stop_iterations(run_dir, tmp_path):
    """In the warm-up an iteration ends on the sampled round that completes run.min_iter_env_steps;
    the round that reaches learning_starts (512) starts training, and from there iterations end
    on train steps as before. stop.iterations is met inside the warm-up too."""
    res = flowkit.train(local_overrides(run_dir, *WARM_UP, "dqn.learning_starts=512", "run.min_iter_env_steps=256",
                                        "stop.env_steps=1024"), verbose=False)
    assert [(r["env_steps_sampled"], r["env_steps_trained"] > 0) for r in res.history] == [
        (256, False), (512, True), (768, True), (1024, True)]
    assert res.history[0]["perf/train_steps_this_iter"] == 0 and "learner/default/epsilon" not in res.history[0]
    res = flowkit.train(local_overrides(str(tmp_path / "it"), *WARM_UP, "dqn.learning_starts=100000",
                                        "run.min_iter_env_steps=256", "stop.iterations=2"), verbose=False)
    assert res.stop_reason == "stop.iterations=2 reached" and res.metrics["env_steps_sampled"] == 512


def test_a_run_resumed_from_a_warm_up_checkpoint_continues_as_the_whole_run(run_dir, tmp_path):
    """A checkpoint taken in the warm-up (an iteration that ended on a sampled round, inside the
    store turn of the round-robin) resumes into the same iterations and train steps as a run
    that never stopped."""
    args = ["algo=dqn", "env.factory=dqn_envs:chain5", "runtime.num_workers=1", "runtime.num_envs_per_worker=1",
            "runtime.rollout_fragment_length=10", "dqn.learning_starts=50", "dqn.train_batch_size=8",
            "model.hidden_sizes=[8]", "dqn.training_intensity=3.2", "run.min_iter_env_steps=30"]  # [1, 4]
    whole = flowkit.train(local_overrides(str(tmp_path / "whole"), *args, "stop.env_steps=200"), verbose=False)
    with pytest.warns(UserWarning, match="trains nothing"):
        half = flowkit.train(local_overrides(run_dir, *args, "stop.env_steps=30"), verbose=False)
    assert half.metrics["env_steps_sampled"] == 30 and half.metrics["num_updates"] == 0
    assert load_state(half.checkpoint)["stateful"]["dqn/store_train_cycle"] == {"credit": [0.0, 0.0], "turn": 0,
                                                                               "left": 0.0}
    resumed = flowkit.train(["resume=" + run_dir, "stop.env_steps=200"], trust_config=True, verbose=False)
    assert [r["env_steps_sampled"] for r in resumed.history] == [r["env_steps_sampled"] for r in whole.history] == [
        30, 60, 90, 120, 150, 180, 200]
    for k in ("iteration", "env_steps_sampled", "env_steps_trained", "num_updates"):
        assert resumed.metrics[k] == whole.metrics[k], k


def test_resumed_workers_explore_at_the_restored_epsilon_from_the_first_sample(run_dir, monkeypatch):
    """Issue 27 item 4: a resumed run's workers sampled their first fragments at
    initial_epsilon 1.0 (the learner's restored epsilon reached them only after the first
    stored sample; a probe measured 0.776 on average)."""
    from flowkit.checkpoint import find_checkpoint
    from flowkit.core.workers import RolloutWorker
    base = local_overrides(run_dir, "algo=dqn", "env.factory=dqn_envs:chain5", "runtime.num_workers=2",
                           "runtime.num_envs_per_worker=1", "runtime.rollout_fragment_length=10",
                           "dqn.learning_starts=50", "dqn.train_batch_size=8", "model.hidden_sizes=[8]",
                           "dqn.epsilon_timesteps=500")
    flowkit.train(base + ["stop.env_steps=200"])
    restored = load_state(find_checkpoint(run_dir))["policies"]["default"]["epsilon"]
    assert restored == pytest.approx(1 - 0.98 * 200 / 500, abs=0.05)
    seen, sample = [], RolloutWorker.sample

    def spy(self, *args, **kwargs):
        seen.append((self.index, self.policies["default"].epsilon))
        return sample(self, *args, **kwargs)
    monkeypatch.setattr(RolloutWorker, "sample", spy)
    flowkit.train(["resume=" + run_dir, "stop.env_steps=300"], trust_config=True)  # dqn_envs: the tests' own factory
    first = {i: e for i, e in reversed(seen)}
    assert sorted(first) == [0, 1]
    assert list(first.values()) == pytest.approx([restored] * 2)  # each worker's first sample
    assert max(e for _, e in seen) == pytest.approx(restored)  # never back to initial_epsilon


RESUME_RUNS = {
    "dqn": ["algo=dqn", "env=CartPole-v1", "dqn.learning_starts=32", "dqn.train_batch_size=16",
            "dqn.epsilon_timesteps=400", "dqn.training_intensity=0.5"],  # one step of 16 per round of 32
    "sac-gsde": ["algo=sac", "env=Pendulum-v1", "sac.learning_starts=32", "sac.train_batch_size=16",
                 "sac.use_sde=true", "sac.sde_sample_freq=8", "sac.training_intensity=0.5"],
    "td3": ["algo=td3", "env=Pendulum-v1", "td3.learning_starts=32", "td3.train_batch_size=16",
            "td3.training_intensity=0.5"],
    "ppo-gsde": ["algo=ppo", "env=Pendulum-v1", "ppo.use_sde=true", "ppo.normalize_observations=true",
                 "ppo.train_batch_size=64", "ppo.minibatch_size=32", "ppo.num_epochs=1"],
    "a2c": ["algo=a2c", "env=CartPole-v1"],
    "a3c": ["algo=a3c", "env=CartPole-v1"],
    "impala": ["algo=impala", "env=CartPole-v1", "impala.train_batch_size=32"],
    "appo": ["algo=appo", "env=CartPole-v1", "appo.train_batch_size=32"],
    "r2d2": ["algo=r2d2", "env=CartPole-v1", "r2d2.seq_len=4", "r2d2.burn_in=1", "r2d2.learning_starts=32",
             "r2d2.train_batch_size=4", "r2d2.epsilon_timesteps=400"],
    "apex": ["algo=dqn", "env=CartPole-v1", "dqn.learning_starts=32", "dqn.train_batch_size=16",
             "dqn.num_replay_shards=2", "dqn.training_intensity=1"],  # rounds of 16 per shard
}  # not here: ES and ARS (a worker gets the centre weights with each perturbation to evaluate: no
#   acting state between requests), DD-PPO (each worker is a learner that restores its own
#   checkpointed state: tests/test_ddppo.py), MAML (adapts from the meta-weights on each task)


@pytest.mark.parametrize("name", list(RESUME_RUNS))
def test_resumed_workers_sample_first_with_the_checkpoints_acting_state(name, run_dir, monkeypatch):
    """Each worker's first post-resume fragment is sampled with the checkpoint's weights (SAC/TD3:
    with its update count, so not uniformly at random) and exploration state (DQN and R2D2:
    epsilon; Ape-X: each worker's own; gSDE's log-std and the normalizer statistics travel with
    the weights; the gSDE noise matrix is drawn anew from the worker's RNG), for every
    algorithm with rollout workers (issue 27 item 4). What is not restored: the envs' own state
    (workers start new episodes; Gymnasium envs have no state API, and a checkpoint holds no
    pickled objects), so the first batch's observations differ from an uninterrupted run's.
    The replay runs train one step per stored round here: with more, the last iteration ends
    inside a train turn, the resumed run takes that turn's remaining steps first, and its
    workers sample with the weights of the last sync, as an uninterrupted run's would."""
    from flowkit.core.workers import RolloutWorker
    first = flowkit.train(local_overrides(run_dir, "runtime.num_workers=2", "runtime.num_envs_per_worker=1",
                                          "runtime.rollout_fragment_length=16", "model.hidden_sizes=[16]",
                                          *RESUME_RUNS[name], "stop.env_steps=128"))
    algo = flowkit.Algorithm.from_checkpoint(run_dir)
    driver = algo.get_policy()
    want_w, want_x = driver.get_weights(), driver.exploration_state()
    assert driver.num_updates > 0 and (name not in ("dqn", "r2d2") or 0.1 < want_x["epsilon"] < 0.9)
    cycle = load_state(first.checkpoint)["stateful"].get(f"{algo.name}/store_train_cycle")
    assert cycle is None or cycle["left"] == 0  # nothing left in the cycle: the checkpoint's weights act first
    seen, sample = {}, RolloutWorker.sample

    def spy(self, *args, **kwargs):
        if self.index not in seen:
            pol = self.policies["default"]
            seen[self.index] = ({k: np.array(v) for k, v in pol.get_weights().items()}, pol.exploration_state())
        return sample(self, *args, **kwargs)
    monkeypatch.setattr(RolloutWorker, "sample", spy)
    flowkit.train(["resume=" + run_dir, "stop.env_steps=192"])
    assert sorted(seen) == [0, 1]
    for i, (w, x) in seen.items():
        assert x == algo.worker_exploration_state("default", want_x, i, 2)  # Ape-X: each worker's own epsilon
        assert sorted(w) == sorted(want_w)
        for k in want_w:
            np.testing.assert_array_equal(w[k], want_w[k], err_msg=k)


@pytest.mark.parametrize("apex", [False, True])
def test_rebuilt_and_new_workers_start_at_the_learners_epsilon(run_dir, apex):
    """A worker has its epsilon before its first sample: at start (Ape-X: its own) and when
    rebuilt after a failure (it started at initial_epsilon 1.0 until the next update)."""
    pm, cfg = load_config(local_overrides(run_dir, "algo=dqn", "env=CartPole-v1", "runtime.num_workers=2",
                                          "runtime.num_envs_per_worker=1", "runtime.rollout_fragment_length=8",
                                          "dqn.learning_starts=32", "dqn.train_batch_size=8",
                                          "dqn.epsilon_timesteps=200", "model.hidden_sizes=[8]",
                                          "evaluation.episodes=2", "evaluation.explore=true",
                                          *(["dqn.num_replay_shards=2"] if apex else [])))
    ctx = setup(cfg, pm, run_dir)
    try:
        want = [0.4, 0.4 ** 8] if apex else [1.0, 1.0]
        assert [a.obj.policies["default"].epsilon for a in ctx.workers.actors] == pytest.approx(want)
        plan = build_plan(ctx)
        while ctx.counters["env_steps_sampled"] < 120:
            next(plan)
        learner_eps = ctx.policies["default"].epsilon
        if not apex:
            assert learner_eps < 0.6
            want = [learner_eps] * 2
        old = ctx.workers.actors[1]
        assert ctx.workers.on_failure(old, RuntimeError("test: worker lost"))
        new = ctx.workers.actors[1]
        assert new is not old and new.obj.restart_count == 1
        assert new.obj.policies["default"].epsilon == pytest.approx(want[1])
        if not apex:  # evaluation.explore=true explores as training does (it used initial_epsilon)
            ctx.evaluate()
            assert ctx._eval_worker.policies["default"].epsilon == pytest.approx(learner_eps)
    finally:
        ctx.shutdown()


@pytest.mark.ray
@pytest.mark.slow
def test_exploration_reaches_ray_workers_in_both_modes(ray_session, run_dir):
    from flowkit_dqn.dqn import epsilon_at as eps_at

    def run(extra, steps):
        pm, cfg = load_config(["algo=dqn", "env=CartPole-v1", "runtime.backend=ray", "runtime.num_workers=2",
                               "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=8",
                               "dqn.learning_starts=64", "dqn.train_batch_size=16", "model.hidden_sizes=[16]",
                               "dqn.epsilon_timesteps=1000", f"run.dir={run_dir}", *extra])
        ctx = setup(cfg, pm, run_dir)
        ctx.workers.start()  # before the first sample: the numpy acting copies have their epsilon
        first = ctx.workers.foreach_worker("apply", lambda w: w.policies["default"].epsilon)
        assert first == pytest.approx([0.4, 0.4 ** 8] if extra else [1.0, 1.0])
        plan = build_plan(ctx)
        try:
            while ctx.counters["env_steps_sampled"] < steps:
                next(plan)
            eps = ctx.workers.foreach_worker("apply", lambda w: w.policies["default"].epsilon)
            return ctx, cfg, eps
        finally:
            ctx.shutdown()
    ctx, cfg, eps = run([], 320)
    assert ctx.prefetch  # off-policy: sampling runs ahead of learning
    assert ctx.counters["num_updates"] > 0
    assert eps == pytest.approx([eps_at(cfg.dqn, ctx.counters["env_steps_sampled"])] * 2)
    ctx, cfg, eps = run(["dqn.num_replay_shards=2"], 320)
    assert ctx.counters["num_updates"] > 0
    assert eps == pytest.approx([0.4, 0.4 ** 8])
