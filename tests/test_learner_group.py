"""Issue 50, item 4: a learner group (``learner.num_learners=N``): N learner processes (Ray
actors) take their share of every minibatch and all-reduce gradients; the update equals one
learner's on the same batch, the driver keeps rank 0's state, and nothing is left running."""
import gymnasium as gym
import numpy as np
import pytest
import torch
from flowkit_dqn import DQNConfig
from flowkit_dqn.dqn import DQNPolicy
from flowkit_ppo import PPOConfig
from flowkit_ppo.ppo import PPOPolicy
from flowkit_sac import SACConfig
from flowkit_sac.sac import SACPolicy

import flowkit
from flowkit.config import ConfigError
from flowkit.core import batch as sb
from flowkit.core.learner import Learner, LearnerGroup
from flowkit.core.workers import PolicySpec

pytestmark = pytest.mark.ray

CARTPOLE = (gym.spaces.Box(-5.0, 5.0, (4,), np.float32), gym.spaces.Discrete(2))
PENDULUM = (gym.spaces.Box(-8.0, 8.0, (3,), np.float32), gym.spaces.Box(-2.0, 2.0, (1,), np.float32))


def _batch(cols, n, seed=0):
    r = np.random.default_rng(seed)
    b = sb.SampleBatch({k: f(r, n) for k, f in cols.items()})
    return sb.MultiAgentBatch({"default": b}, n)


PPO_COLS = {sb.OBS: lambda r, n: r.normal(size=(n, 4)).astype(np.float32),
            sb.ACTIONS: lambda r, n: r.integers(0, 2, n),
            sb.ACTION_LOGP: lambda r, n: np.full(n, np.log(0.5), np.float32),
            sb.ACTION_DIST_INPUTS: lambda r, n: np.zeros((n, 2), np.float32),
            sb.VF_PREDS: lambda r, n: r.normal(size=n).astype(np.float32),
            sb.ADVANTAGES: lambda r, n: r.normal(size=n).astype(np.float32),
            sb.VALUE_TARGETS: lambda r, n: r.normal(size=n).astype(np.float32)}
OFF_COLS = {sb.REWARDS: lambda r, n: r.normal(size=n).astype(np.float32),
            sb.TERMINATEDS: lambda r, n: r.random(n) < 0.1}
DQN_COLS = {sb.OBS: PPO_COLS[sb.OBS], sb.NEXT_OBS: PPO_COLS[sb.OBS], sb.ACTIONS: PPO_COLS[sb.ACTIONS],
            sb.N_STEPS: lambda r, n: np.ones(n, np.int64), **OFF_COLS}
SAC_COLS = {sb.OBS: lambda r, n: r.normal(size=(n, 3)).astype(np.float32),
            sb.NEXT_OBS: lambda r, n: r.normal(size=(n, 3)).astype(np.float32),
            sb.ACTIONS: lambda r, n: r.uniform(-1, 1, (n, 1)).astype(np.float32), **OFF_COLS}

CASES = {  # policy class, config, spaces, columns, rows, (num_epochs, minibatch_size), updates
    "ppo": (PPOPolicy, PPOConfig(), CARTPOLE, PPO_COLS, 256, (3, 64), 2),
    "dqn": (DQNPolicy, DQNConfig(), CARTPOLE, DQN_COLS, 32, (1, None), 3),
    "sac": (SACPolicy, SACConfig(), PENDULUM, SAC_COLS, 64, (1, None), 3),
}


def _pair(name):
    cls, cfg, (obs, act), cols, rows, loop, updates = CASES[name]
    one = Learner(name, {"default": cls(obs, act, cfg, None, "cpu", 3)}, rng=np.random.default_rng(7))
    group = LearnerGroup(name, {"default": cls(obs, act, cfg, None, "cpu", 3)}, None, np.random.default_rng(7),
                         {"default": PolicySpec(cls, obs, act, cfg, name)}, {"default": None}, num_learners=2,
                         num_cpus=0.5, timeout_s=60)
    for lr in (one, group):
        lr.configure(*loop)
    return one, group, [_batch(cols, rows, seed=i) for i in range(updates)]


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n == "ppo" else pytest.mark.slow) for n in sorted(CASES)])
def test_two_learners_update_as_one_learner_on_the_same_batch(ray_session, name):
    """PPO (3 epochs x 4 shuffled minibatches), DQN and SAC (one step each; SAC's per-row noise
    through Policy.randn): after each of 2-3 updates the group's weights, Adam state, update
    count and minibatch RNG equal one learner's to 1e-5; DQN's td_error (priorities) too."""
    one, group, batches = _pair(name)
    try:
        for i, b in enumerate(batches):
            r1, r2 = one.update(b), group.update(b)
            p1, p2 = one.policies["default"], group.policies["default"]
            for k, w in p1.get_weights().items():
                np.testing.assert_allclose(p2.get_weights()[k], w, atol=1e-5, err_msg=f"{name} update {i}: {k}")
            s1, s2 = p1.get_state()["optimizer"]["state"], p2.get_state()["optimizer"]["state"]
            for k in s1:
                for j, t in s1[k].items():
                    torch.testing.assert_close(s2[k][j], t, atol=1e-5, rtol=1e-4)
            assert r2["num_updates"] == r1["num_updates"] == {"ppo": 12}.get(name, 1)
            assert p2.num_updates == p1.num_updates and group.num_updates == one.num_updates
            assert group.rng.bit_generator.state == one.rng.bit_generator.state
            assert r2["stats"]["default"]["train_batch_size"] == len(b)
            if name == "dqn":
                np.testing.assert_allclose(p2.td_error, p1.td_error, atol=1e-5)
            if name == "sac":
                assert torch.equal(p2.generator.get_state(), p1.generator.get_state())
        assert group.generation == 1 and group.num_rebuilds == 0
    finally:
        group.stop()
    assert group.actors == [] and group._pg is None and _live_learners() == 0


def test_the_learners_keep_the_state_and_the_driver_reads_it_only_when_asked(ray_session):
    """Three PPO updates with no read in between move no policy state to the driver (no pull);
    get_weights() takes rank 0's weights (still no pull) and equals one learner's; reading a
    driver copy pulls rank 0's state once, and a second read pulls nothing."""
    one, group, batches = _pair("ppo")
    try:
        for b in batches + batches[:1]:
            one.update(b), group.update(b)
        assert group.num_pulls == 0 and group.behind
        version, w = group.get_weights()
        assert version == one.num_updates == 36 and group.num_pulls == 0
        for k, v in one.policies["default"].get_weights().items():
            np.testing.assert_allclose(w["default"][k], v, atol=1e-5)
        st = group.policies["default"].get_state()
        assert group.num_pulls == 1 and not group.behind and st["num_updates"] == 36
        group.policies["default"]
        assert group.num_pulls == 1
    finally:
        group.stop()


def test_what_the_driver_changes_between_updates_reaches_the_learners(ray_session):
    """DQN: between updates the driver (as the plan's operators do) updates the target network,
    halves the learning rate and sets epsilon on its copy; the group's next updates equal one
    learner's that was changed alike (weights, target weights, Adam state), and the state saved
    (a checkpoint) carries the changes. A restore (policy set_state + learner set_state) reaches
    the learners whole."""
    one, group, batches = _pair("dqn")
    try:
        for lr in (one, group):
            lr.update(batches[0])
            pol = lr.policies["default"]
            pol.target.update()
            pol.optimizer.param_groups[0]["lr"] *= 0.5
            pol.epsilon = 0.25
        for b in batches[1:]:
            one.update(b), group.update(b)
        s1, s2 = one.policies["default"].get_state(), group.policies["default"].get_state()
        assert s2["epsilon"] == 0.25 and s2["optimizer"]["param_groups"][0]["lr"] == s1["optimizer"]["param_groups"][0]["lr"]
        for key in ("weights", "target_weights"):
            for k, w in s1[key].items():
                np.testing.assert_allclose(s2[key][k], w, atol=1e-5, err_msg=key)
        saved, counters = group.policies["default"].get_state(), group.get_state()
        for lr in (one, group):  # an update past the checkpoint, then a restore of it
            lr.update(batches[0])
            lr.policies["default"].set_state(saved)
            lr.set_state(counters)
            lr.update(batches[1])
        for k, w in one.policies["default"].get_weights().items():
            np.testing.assert_allclose(group.policies["default"].get_weights()[k], w, atol=1e-5)
        assert group.policies["default"].num_updates == one.policies["default"].num_updates == 4
    finally:
        group.stop()


@pytest.mark.slow  # (quick pass under 15 min: Ray learner processes, 20-40 s)
def test_a_group_trains_in_the_learner_thread(ray_session):
    """Thread mode (IMPALA's and APPO's learner thread): a batch put in the group's in-queue
    comes out trained, as one learner's update."""
    one, group, batches = _pair("dqn")
    try:
        group.start()
        assert group.put(batches[0], timeout=5.0)
        out = None
        for _ in range(300):  # starting the group's processes on a busy machine: up to minutes
            if (out := group.get(1.0)) is not None:
                break
        assert out is not None and out["num_updates"] == 1
        one.update(batches[0])
        for k, w in one.policies["default"].get_weights().items():
            np.testing.assert_allclose(group.policies["default"].get_weights()[k], w, atol=1e-5)
    finally:
        group.stop()


@pytest.mark.slow  # (quick pass under 15 min: Ray learner processes, 20-40 s)
def test_a_lost_learner_is_rebuilt_and_the_update_retried(ray_session):
    """A learner process killed between updates: the next update rebuilds the group (generation
    2) and still equals one learner's, since the driver held every state."""
    import ray
    one, group, batches = _pair("dqn")
    try:
        one.update(batches[0]), group.update(batches[0])
        ray.kill(group.actors[1], no_restart=True)
        with pytest.warns(RuntimeWarning, match="learner group dqn: .*rebuilding the group and retrying"):
            group.update(batches[1])
        one.update(batches[1])
        assert group.generation == 2 and group.num_rebuilds == 1
        for k, w in one.policies["default"].get_weights().items():
            np.testing.assert_allclose(group.policies["default"].get_weights()[k], w, atol=1e-5)
    finally:
        group.stop()


@pytest.mark.slow  # (quick pass under 15 min: Ray learner processes, 20-40 s)
def test_an_error_in_a_learner_is_raised_with_its_own_type_and_the_group_stops(ray_session):
    """A minibatch too small to share: the learners' ValueError reaches the driver as itself,
    the group is torn down (no learner left waiting in a collective), the driver's weights are
    untouched."""
    _, group, _ = _pair("dqn")
    before = group.policies["default"].get_weights()
    try:
        with pytest.raises(ValueError, match="policy 'default''s minibatch of 1 rows cannot be shared by 2 "
                                             r"learners \(learner.num_learners\): each needs at least one row"):
            group.update(_batch(DQN_COLS, 1))
        assert group.actors == []
        for k, w in before.items():
            np.testing.assert_array_equal(group.policies["default"].get_weights()[k], w)
    finally:
        group.stop()


@pytest.mark.parametrize("overrides, message", [
    (["runtime.backend=local"], "learner.num_learners=2 runs learner processes on Ray: it needs runtime.backend=ray "
                                "(got local); learner.num_learners=0 trains in this process"),
    (["algo=ddppo"], "learner.num_learners=2: algo ddppo does not train through a learner group (those that do: "
                     "appo, dqn, impala, ppo, sac); set learner.num_learners=0"),
    (["model.recurrent=lstm"], "learner.num_learners=2: a learner group trains feed-forward policies only "
                               "(model.recurrent=lstm)"),
    (["runtime.num_workers=1", "learner.num_cpus_per_learner=1"],
     "learner.num_learners=2 x learner.num_cpus_per_learner=1 and runtime.num_workers=1 x "
     "runtime.num_cpus_per_worker=1 need 3 CPUs, this machine has 2: lower them or share CPUs "
     "(learner.num_cpus_per_learner=0.5)"),
])
def test_bad_learner_group_settings_fail_before_anything_starts(tmp_path, monkeypatch, overrides, message):
    import os

    from flowkit import _ray
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(_ray, "external", lambda: False)
    with pytest.raises(ConfigError) as e:
        flowkit.train(["algo=ppo", "env=CartPole-v1", "learner.num_learners=2", f"run.dir={tmp_path / 'r'}",
                       *overrides], verbose=False)
    assert str(e.value) == message
    assert not (tmp_path / "r").exists()


def _timing(k):
    return k.startswith(("time_", "perf/")) or k.endswith("_per_s")


@pytest.mark.slow
def test_a_run_with_two_learners_resumes_exactly(ray_session, tmp_path):
    """PPO CartPole on Ray, 1 worker and 2 learner processes, 2 iterations; resumed from its
    checkpoint to 4 iterations with the 2 learners, and again with one learner in the driver:
    the same rows (every count, episode and learner figure) and weights to 1e-5, so the group's
    checkpoint is one learner's state; the group's processes are gone after each run."""
    base = ["algo=ppo", "env=CartPole-v1", "seed=3", "runtime.backend=ray", "runtime.num_workers=1",
            "runtime.num_cpus_per_worker=0.5", "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=32",
            "learner.num_learners=2", "learner.num_cpus_per_learner=0.5", "ppo.num_epochs=2", "ppo.minibatch_size=32",
            "run.min_iter_env_steps=0", "evaluation.interval=0", "evaluation.final=false",
            "run.reporters=[csv,checkpoint]", "checkpoint.every_iters=1"]
    assert _live_learners() == 0  # (an earlier test's killed learners release their CPUs within seconds)
    half = flowkit.train([*base, f"run.dir={tmp_path / 'a'}", "stop.iterations=2"], verbose=False)
    import shutil
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    ckpt_b = half.checkpoint.replace(str(tmp_path / "a"), str(tmp_path / "b"))
    group = flowkit.train([f"resume={half.checkpoint}", "stop.iterations=4"], verbose=False)
    assert _live_learners() == 0
    one = flowkit.train([f"resume={ckpt_b}", "stop.iterations=4", "learner.num_learners=0"], verbose=False)
    rows = [[{k: v for k, v in r.items() if not _timing(k)} for r in res.history if r["iteration"] > 2]
            for res in (group, one)]
    assert [r["num_updates"] for r in rows[0]] == [12, 16] and [r["env_steps_trained"] for r in rows[0]] == [192, 256]
    for a, b in zip(*rows):
        assert a.keys() == b.keys()
        assert {k: (a[k], b[k]) for k in a if a[k] != pytest.approx(b[k], rel=1e-4, abs=1e-6)} == {}
    w1 = flowkit.Algorithm.from_checkpoint(group.checkpoint).policies["default"].get_weights()
    w2 = flowkit.Algorithm.from_checkpoint(one.checkpoint).policies["default"].get_weights()
    for k in w1:
        np.testing.assert_allclose(w1[k], w2[k], atol=1e-5)


REPO = __import__("os").path.dirname(__import__("os").path.dirname(__import__("os").path.abspath(__file__)))
GROUP = ["learner.num_learners=2", "learner.num_cpus_per_learner=0.5", "runtime.num_cpus_per_worker=0.5", "seed=0",
         "run.reporters=[csv,checkpoint]", "checkpoint.at_end=false"]


@pytest.mark.slow
@pytest.mark.parametrize("algo, target, budget", [("ppo", 475, 100_000), ("appo", 450, 500_000)])
def test_two_learners_meet_the_cartpole_target_line(ray_session, run_dir, algo, target, budget):
    """configs/ppo and configs/appo CartPole-v1 with 2 learner processes (and the 2 workers at
    half a CPU each, so that all fit the 2 CPUs): the configs' target lines, seed 0."""
    import os
    res = flowkit.train([f"run.dir={run_dir}", *GROUP], config_file=os.path.join(REPO, "configs", algo, "CartPole-v1.yaml"),
                        verbose=False)
    assert res.metrics["episode_return_mean"] >= target, res.metrics
    assert res.metrics["env_steps_sampled"] <= budget
    assert _live_learners() == 0


def _live_learners(wait_s=10.0):
    """The Ray session's CPUs still held (0 once every learner process and placement group is
    gone; waiting up to ``wait_s`` for killed ones to release theirs)."""
    import time

    import ray
    t0 = time.monotonic()
    while True:
        held = ray.cluster_resources().get("CPU", 0) - ray.available_resources().get("CPU", 0)
        if held < 1e-6 or time.monotonic() - t0 > wait_s:
            return held
        time.sleep(0.5)
