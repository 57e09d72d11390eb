"""DD-PPO (plugins/ppo, issue 25 item 4): the weighted all-reduce gives a single learner's
update on the concatenated batch (two gloo processes), exact minibatch counts, config checks,
the plan, one in-process worker (a world of 1), on Ray the same weights on every worker after
every round (hashed on the workers), preemption of a straggler, a lost worker re-forming the
group, conformance (checkpoint round trip), and the tuned config on CartPole-v1 (slow)."""
import multiprocessing as mp
import os
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from flowkit_ppo import DDPPOConfig, min_fragments, num_minibatches
from flowkit_ppo.ddppo import DDPPO, DDPPOPolicy, ProcessGroup

import flowkit
from flowkit.config import ConfigError, section_object
from flowkit.core import batch as sb
from flowkit.core.learner import Learner
from flowkit.engine import build_plan, load_config, setup
from flowkit.testing import KillWorkers, check_algorithm, local_overrides

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARTPOLE = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2)


def _policy(seed=0, **kw):
    _, cfg = load_config(["algo=ddppo", "env=CartPole-v1", "runtime.backend=local", "runtime.num_workers=1",
                          "ddppo.normalize_advantages=none", "ddppo.max_grad_norm=0.5",
                          *[f"ddppo.{k}={v}" for k, v in kw.items()]])
    return DDPPOPolicy(*CARTPOLE, section_object(cfg, "ddppo", DDPPOConfig), cfg.model, "cpu", seed)


def _batch(n, seed):
    """A PPO train batch of ``n`` CartPole-shaped rows (random, fixed by ``seed``)."""
    rng = np.random.default_rng(seed)
    pol = _policy()
    obs = rng.normal(size=(n, 4)).astype(np.float32)
    actions, extras = pol.compute_actions_encoded(obs, None, True)
    adv = rng.normal(size=n).astype(np.float32)
    return sb.SampleBatch({sb.OBS: obs, sb.ACTIONS: actions, **extras, sb.ADVANTAGES: adv,
                           sb.VALUE_TARGETS: (extras[sb.VF_PREDS] + adv).astype(np.float32)})


def _learn(pol, b, reducer=None, epochs=3):
    lr = Learner("t", {"default": pol}, rng=np.random.default_rng(0), num_epochs=epochs, num_minibatches=1,
                 reducer=reducer)
    return lr.update(sb.MultiAgentBatch({"default": b}, len(b), len(b)))


def _rank_main(rank, port, rows, out):
    torch.set_num_threads(1)
    group = ProcessGroup("127.0.0.1", port, rank, 2, 0, "gloo", 60.0)
    pol = _policy()
    pol.group = group
    full = _batch(sum(rows), 1)
    start = sum(rows[:rank])
    _learn(pol, full.slice(start, start + rows[rank]), group.allreduce_mean)
    out.put((rank, pol._flat.detach().numpy().copy(), pol.weights_hash(), float(pol.kl_coeff)))
    group.close()


# ---- the all-reduce ------------------------------------------------------------------------------
@pytest.mark.slow
def test_allreduce_gives_the_single_learner_update_on_the_concatenated_batch():
    """Two gloo processes, one with 40 rows and one with 24: three epochs of one minibatch each,
    every gradient all-reduced with the row weights, end on the weights that one learner reaches
    on the 64 rows together (PPO's loss is a mean; clipping to max_grad_norm and Adam follow the
    reduced gradient), and both workers hold the very same bytes."""
    import datetime

    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=60), wait_for_workers=False)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, store.port, (40, 24), out)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict((r, rest) for r, *rest in (out.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(30)
    single = _policy()
    res = _learn(single, _batch(64, 1))
    assert res["num_updates"] == 3
    want = single._flat.detach().numpy()
    np.testing.assert_allclose(got[0][0], want, atol=2e-6)
    assert got[0][1] == got[1][1]  # the same bytes on both workers
    assert not np.allclose(want, _policy()._flat.detach().numpy())  # the update moved the weights


def test_allreduce_weights_by_rows():
    """The reducer's arithmetic: sum_w n_w x_w / sum_w n_w, here with a group of one."""
    class One(ProcessGroup):
        def __init__(self):
            self.allreduce_s = 0.0
    import torch.distributed as dist
    calls = []
    orig = dist.all_reduce
    try:
        dist.all_reduce = lambda buf: calls.append(buf.clone())  # a world of 1: the sum is the buffer itself
        x = One().allreduce_mean(torch.tensor([2.0, -4.0]), 3)
    finally:
        dist.all_reduce = orig
    np.testing.assert_allclose(calls[0].numpy(), [6.0, -12.0, 3.0])
    np.testing.assert_allclose(x.numpy(), [2.0, -4.0])


def test_num_minibatches_are_exact_whatever_the_batch():
    """num_minibatches=3 on 10 rows: 3 minibatches of 3, 4, 3 rows per epoch (rows given to the
    reducer), where minibatch_size would make 4."""
    pol, seen = _policy(), []
    lr = Learner("t", {"default": pol}, num_epochs=2, num_minibatches=3, reducer=lambda g, n: seen.append(n) or g)
    out = lr.update(sb.MultiAgentBatch({"default": _batch(10, 0)}, 10, 10))
    assert seen == [3, 4, 3, 3, 4, 3] and out["num_updates"] == 6
    with pytest.raises(ValueError, match="has 2 rows for 3 minibatches"):
        lr.update(sb.MultiAgentBatch({"default": _batch(2, 0)}, 2, 2))


# ---- config and plan -----------------------------------------------------------------------------
def test_config_checks():
    def check(*kw):
        setup(*reversed(load_config(["algo=ddppo", "env=CartPole-v1", *kw])))
    with pytest.raises(ConfigError, match=r"ddppo on runtime.backend=local runs one worker .* runtime.num_workers=2"):
        check("runtime.backend=local", "runtime.num_workers=2")
    with pytest.raises(ConfigError, match=r"ddppo.minibatch_size=1 makes 256 minibatches of a full worker batch "
                                          r"\(256 rows\), more than the rows of a preempted one \(64"):
        check("runtime.num_envs_per_worker=4", "runtime.rollout_fragment_length=16", "ddppo.minibatch_size=1")
    with pytest.raises(ConfigError, match=r"model.normalize_obs=true is not supported by ddppo: its workers"):
        check("model.normalize_obs=true")
    with pytest.raises(ConfigError, match=r"ddppo.lr_schedule=linear needs a horizon"):
        check("ddppo.lr_schedule=linear")
    _, cfg = load_config(["algo=ddppo", "env=CartPole-v1", "runtime.num_envs_per_worker=4",
                          "runtime.rollout_fragment_length=16", "ddppo.fragments_per_round=5",
                          "ddppo.minibatch_size=100", "ddppo.min_rollout_frac=0.25"])
    c = section_object(cfg, "ddppo", DDPPOConfig)
    assert num_minibatches(c, cfg) == 4 and min_fragments(c) == 2  # ceil(320 / 100); ceil(1.25)


def test_plan_shows_the_shape_and_starts_nothing():
    pm, cfg = load_config(["algo=ddppo", "env=CartPole-v1", "runtime.num_workers=2"])
    ctx = setup(cfg, pm)
    text = build_plan(ctx).to_text()
    assert "ParallelTrainRounds(2 workers: sample <= 4 fragments, preempted at 0.6 of the workers; PPO loss, " \
           "num_epochs=10, num_minibatches=32, gradients all-reduced (gloo))" in text
    assert "AccountRound" in text and not ctx.workers.started
    assert ctx.stateful["ddppo/rendezvous"].address is None  # no TCPStore yet


# ---- runs ------------------------------------------------------------------------------------------
def _overrides(run_dir, *extra, env="env=CartPole-v1"):
    return local_overrides(str(run_dir), "algo=ddppo", env, "seed=0", "runtime.num_workers=1",
                           "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=16",
                           "ddppo.fragments_per_round=2", "ddppo.minibatch_size=16", "ddppo.num_epochs=2",
                           "evaluation.interval=0", *extra)


def test_one_in_process_worker_trains_and_resumes(tmp_path):
    """runtime.backend=local: one worker, no process group. Every sampled step is trained, 2
    epochs x 4 minibatches per round; the driver's policy holds the worker's weights; a run
    resumed from its checkpoint continues from the saved weights and Adam state."""
    res = flowkit.train(_overrides(tmp_path / "a", "stop.iterations=3", "run.min_iter_env_steps=0"), verbose=False)
    m = res.metrics
    assert m["env_steps_sampled"] == m["env_steps_trained"] == 3 * 64
    assert m["num_updates"] == 3 * 2 * 4 and m["learner/default/num_workers"] == 1
    assert m["learner/default/preempted_workers"] == 0 and m["learner/default/allreduce_time_s"] == 0
    algo = flowkit.Algorithm.from_checkpoint(res.checkpoint)
    pol = algo.get_policy()
    assert pol.num_updates == 24 and pol.get_state()["optimizer"]["state"][0]["step"] == 24
    resumed = flowkit.train([f"resume={res.checkpoint}", "stop.iterations=4", "run.reporters=[csv,checkpoint]"],
                            verbose=False)
    assert resumed.metrics["num_updates"] == 32 and resumed.metrics["env_steps_sampled"] == 4 * 64
    after = flowkit.Algorithm.from_checkpoint(resumed.checkpoint).get_policy()
    assert after.get_state()["optimizer"]["state"][0]["step"] == 32


@pytest.mark.parametrize("algo", [DDPPO])
def test_conformance_config_plan_actions_checkpoint(algo, tmp_path):
    out = check_algorithm(algo, ["ddppo.minibatch_size=16", "ddppo.fragments_per_round=2"],
                          checks=["config", "plan", "actions", "checkpoint"], tmp_dir=str(tmp_path))
    assert "ParallelTrainRounds(1 workers" in out["plan"]


@pytest.mark.slow
def test_conformance_backends_and_learn(ray_session, tmp_path):
    out = check_algorithm(DDPPO, ["ddppo.minibatch_size=16", "ddppo.fragments_per_round=2"], checks=["backends", "learn"],
                          tmp_dir=str(tmp_path))
    assert out["learn_return"] >= 7.0


def _worker_hashes(worker):
    """On a worker: the hashes of its learner copy, of its acting copy (the same weights) and its pid."""
    wl = worker._ddppo
    acting = next(iter(worker.policies.values()))
    probe = DDPPOPolicy(acting.observation_space, acting.action_space, acting.config, acting.model_config)
    probe.set_weights(acting.get_weights())
    return wl.policy.weights_hash(), probe.weights_hash(), wl.group.generation if wl.group else None


class _Hashes:
    def __init__(self):
        self.rounds, self.ctx, self.at_end = [], None, None

    def flowkit_on_train_result(self, result, ctx):
        self.rounds.append(ctx.info.get("ddppo/weights_hashes"))

    def flowkit_on_train_end(self, ctx):
        self.ctx = ctx
        self.at_end = ctx.workers.foreach_worker("apply", _worker_hashes)


def _ray(run_dir, *extra, env="env=CartPole-v1"):
    return _overrides(run_dir, "runtime.backend=ray", "runtime.num_workers=2", "runtime.num_cpus_per_worker=0.5",
                      "run.min_iter_env_steps=0", *extra, env=env)


@pytest.mark.ray
@pytest.mark.slow
def test_two_ray_workers_hold_the_same_weights_after_every_round(ray_session, tmp_path):
    """2 Ray workers, gradients all-reduced over gloo: after every round both workers' learner
    copies hash the same (reported by the workers), and at the end the learner and acting copies
    of both workers and the driver's policy (worker 0's state, checkpointed) are the same weights."""
    grab = _Hashes()
    res = flowkit.train(_ray(tmp_path, "stop.iterations=4"), plugins=[grab], verbose=False)
    assert len(grab.rounds) == 4 and all(len(h) == 2 and h[0] == h[1] for h in grab.rounds)
    assert len({h[0] for h in grab.rounds}) == 4  # the weights moved every round
    (l0, a0, g0), (l1, a1, g1) = grab.at_end
    assert l0 == l1 == a0 == a1 == grab.rounds[-1][0] and g0 == g1 == 0
    pol = flowkit.Algorithm.from_checkpoint(res.checkpoint).get_policy()
    assert pol.weights_hash() == l0
    m = res.metrics
    assert m["env_steps_trained"] == m["env_steps_sampled"] == 4 * 2 * 64 and m["num_updates"] == 4 * 2 * 4
    assert m["learner/default/allreduce_time_s"] > 0 and m["learner/default/num_workers"] == 2


@pytest.mark.ray
@pytest.mark.slow
def test_a_straggler_is_preempted(ray_session, tmp_path):
    """Worker 1 steps slowly (a sleep per step); with sync_frac 0.5 it stops once worker 0 has
    its 4 fragments, after its first (min_rollout_frac 0.25), and both learn on their unequal
    batches: the same number of gradient steps, the same weights."""
    grab = _Hashes()
    res = flowkit.train(_ray(tmp_path, "env.kwargs.delay=0.01", "ddppo.fragments_per_round=4", "ddppo.sync_frac=0.5",
                             "ddppo.min_rollout_frac=0.25", "stop.iterations=2", env="env.factory=envs:slow_worker"),
                        plugins=[grab], verbose=False)
    m = res.metrics
    assert m["learner/default/preempted_workers"] == 1
    assert m["learner/default/rows_min"] < m["learner/default/rows_max"] == 4 * 32
    assert all(h[0] == h[1] for h in grab.rounds)


@pytest.mark.slow  # 18-40 s (a worker process is killed and rebuilt)
@pytest.mark.ray
def test_a_lost_worker_reforms_the_group(ray_session, tmp_path):
    """Worker 1's process is killed after round 2: its round fails, worker 0's all-reduce gives
    the round up, worker 1 is rebuilt, and the next round forms generation 1 with the driver's
    state on both; training goes on with identical weights."""
    grab, kill = _Hashes(), KillWorkers(every_env_steps=2 * 2 * 64, worker_index=1, max_kills=1)
    res = flowkit.train(_ray(tmp_path, "stop.iterations=6", "ddppo.collective_timeout_s=30"),
                        plugins=[grab, kill], verbose=False)
    m = res.metrics
    assert len(kill.kills) == 1 and m["num_worker_restarts"] == 1
    assert m["learner/default/aborted_rounds"] >= 1 and m["learner/default/generation"] == 1
    trained = [h for h in grab.rounds if h is not None]
    assert all(h[0] == h[1] for h in trained)
    (l0, _, g0), (l1, _, g1) = grab.at_end
    assert l0 == l1 and g0 == g1 == 1


# ---- learning --------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.ray
def test_learns_cartpole_with_the_tuned_config(ray_session, tmp_path):
    """configs/ddppo/CartPole-v1.yaml (2 Ray workers) reaches 475 within 100k env steps, seed 0."""
    t0 = time.perf_counter()
    res = flowkit.train(local_overrides(str(tmp_path), "runtime.backend=ray", "seed=0", "evaluation.interval=0",
                                        "runtime.num_cpus_per_worker=0.5"),
                        config_file=os.path.join(REPO, "configs", "ddppo", "CartPole-v1.yaml"), verbose=False)
    assert res.metrics["episode_return_mean"] >= 475, (res.metrics, time.perf_counter() - t0)
    assert res.metrics["env_steps_sampled"] <= 100_000
