"""run.output (issue 26): a training run's sampled experience written as a Minari dataset."""
from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("minari")

from offline_envs import EchoEnv  # noqa: E402

import flowkit  # noqa: E402
from flowkit.testing import local_overrides  # noqa: E402

ECHO = "env.factory=offline_envs:echo"


def _train(tmp_path, *extra, name="run"):
    return flowkit.train(local_overrides(str(tmp_path / name), "evaluation.interval=0", *extra), verbose=False)


def _check_echo_episodes(ds, box=False):
    """Every episode of an EchoEnv dataset as the env played it (see EchoEnv): its length and
    flags from its index k, t counting from 0, the action the env received echoed in the next
    observation, the reward t + k / 10; returns the k of each episode."""
    ks = []
    for ep in ds.iterate_episodes():
        k = int(ep.observations[0, 0])
        n = 1 + k % 4
        assert len(ep) == n, (k, len(ep))
        np.testing.assert_array_equal(ep.observations[:, 0], k)
        np.testing.assert_array_equal(ep.observations[:, 1], np.arange(n + 1))
        assert ep.observations[0, 2] == 0.0
        np.testing.assert_array_equal(ep.observations[1:, 2], np.asarray(ep.actions, np.float32).reshape(-1))
        assert ep.terminations.tolist() == [False] * (n - 1) + [k % 2 == 1]
        assert ep.truncations.tolist() == [False] * (n - 1) + [k % 2 == 0]
        np.testing.assert_allclose(ep.rewards, np.arange(1, n + 1) + k / 10)
        ks.append(k)
    return ks


@pytest.mark.parametrize("autoreset", ["next_step", "same_step"])
def test_run_output_keeps_episode_boundaries_and_flags_exactly(tmp_path, monkeypatch, autoreset):
    # 2 workers x 3 sub-envs, fragments of 7 steps: episodes of 1-4 steps span fragments and end
    # out of order; each comes back whole, with the env's own terminated / truncated (same_step:
    # the final observation comes from info["final_obs"])
    import minari
    out = tmp_path / "echo-run-v0"
    res = _train(tmp_path, "algo=random", ECHO, "runtime.num_envs_per_worker=3", "runtime.rollout_fragment_length=7",
                 "stop.env_steps=400", f"run.output={out}", f"env.autoreset_mode={autoreset}")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    ds = minari.load_dataset("echo-run-v0")  # Minari's own API
    assert ds.observation_space == EchoEnv().observation_space and ds.action_space == EchoEnv().action_space
    ks = _check_echo_episodes(ds)
    # each of the 6 sub-envs plays k = 0, 1, 2, ... : every k up to a sub-env's last finished one
    counts = np.bincount(ks)
    assert counts[0] == 6 and (np.diff(counts) <= 0).all() and len(ks) == ds.total_episodes
    sampled = res.metrics["env_steps_sampled"]
    assert ds.total_steps == sum(1 + k % 4 for k in ks)
    assert 0 <= sampled - ds.total_steps < 6 * 4  # only the 6 running episodes (< 4 steps each) are left out
    state = flowkit.checkpoint.load_state(os.path.join(res.checkpoint, "state.pt"))
    assert state["stateful"]["run/output"] == {"episodes": ds.total_episodes, "steps": ds.total_steps}


def test_run_output_records_box_actions_as_the_env_received_them(tmp_path):
    # PPO's Gaussian draws (std 1 in [-1, 1] units) are scaled to [-0.5, 0.5] and clipped by to_env:
    # the dataset holds the clipped values the env echoed, not the draws of the sample batch
    import minari
    out = str(tmp_path / "box-v0")
    _train(tmp_path, "algo=ppo", "env.factory=offline_envs:echo", "env.kwargs.box=true", "seed=1",
           "runtime.num_workers=1", "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=32",
           "ppo.minibatch_size=32", "stop.env_steps=128", f"run.output={out}")
    ds = minari.MinariDataset(os.path.join(out, "data"))
    assert ds.action_space == EchoEnv(box=True).action_space
    _check_echo_episodes(ds, box=True)
    acts = np.concatenate([ep.actions for ep in ds.iterate_episodes()]).reshape(-1)
    assert acts.dtype == np.float32 and acts.min() >= -0.5 and acts.max() <= 0.5
    clipped = np.isin(acts, [-0.5, 0.5]).mean()
    assert 0.2 < clipped < 0.5, clipped  # |N(0, 1)| > 1: 32 % of the draws
    assert len(np.unique(acts)) > len(acts) // 2  # the rest as drawn


def test_run_output_records_discrete_observations_not_their_one_hot(tmp_path):
    import minari
    out = str(tmp_path / "disc-v0")
    _train(tmp_path, "algo=random", ECHO, "env.kwargs.discrete_obs=true", "runtime.num_envs_per_worker=2",
           "runtime.rollout_fragment_length=5", "stop.env_steps=60", f"run.output={out}")
    ds = minari.MinariDataset(os.path.join(out, "data"))
    assert ds.observation_space == EchoEnv(discrete_obs=True).observation_space
    eps = list(ds.iterate_episodes())
    assert len(eps) >= 8
    for ep in eps:  # the step index as the env gave it (ints), one more observation than steps
        assert ep.observations.dtype == np.int64 and ep.observations.shape == (len(ep) + 1,)
        np.testing.assert_array_equal(ep.observations, np.arange(len(ep) + 1))
    assert sorted({len(ep) for ep in eps}) == [1, 2, 3, 4]


def _cli(capsys, tmp_path, *args, name="run"):
    from flowkit.cli import main
    rc = main(["train", "runtime.backend=local", f"run.dir={tmp_path / name}", "run.reporters=[csv,checkpoint]",
               "stop.env_steps=64", *args])
    return rc, capsys.readouterr().err


def test_run_output_config_errors(tmp_path, capsys):
    base = ("algo=random", ECHO)
    existing = tmp_path / "have-v0"
    assert _cli(capsys, tmp_path, *base, f"run.output={existing}", name="first")[0] == 0
    rc, err = _cli(capsys, tmp_path, *base, f"run.output={existing}")
    assert rc == 2 and err.count("\n") == 1 and "a dataset is already there (run.output_append=true" in err, err
    assert not (tmp_path / "run").exists()  # nothing started
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "notes.txt").write_text("x")
    rc, err = _cli(capsys, tmp_path, *base, f"run.output={tmp_path / 'stuff'}")
    assert rc == 2 and "holds files but no dataset" in err and err.count("\n") == 1, err
    (tmp_path / "afile").write_text("x")
    rc, err = _cli(capsys, tmp_path, *base, f"run.output={tmp_path / 'afile' / 'd-v0'}")
    assert rc == 2 and "is a file" in err and err.count("\n") == 1, err
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        rc, err = _cli(capsys, tmp_path, *base, f"run.output={ro / 'd-v0'}")
        ro.chmod(0o700)
        assert rc == 2 and "is not writable" in err and err.count("\n") == 1, err
    rc, err = _cli(capsys, tmp_path, "algo=random", "env.factory=flowkit.testing.envs:turn_game",
                   f"run.output={tmp_path / 'ma-v0'}")
    assert rc == 2 and "run.output supports single-agent envs" in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()
    # run.output_append=true adds to it (same spaces); other spaces are refused
    before = flowkit.datasets.open_dataset(str(existing)).total_episodes
    assert _cli(capsys, tmp_path, *base, f"run.output={existing}", "run.output_append=true", name="second")[0] == 0
    assert flowkit.datasets.open_dataset(str(existing)).total_episodes > before
    rc, err = _cli(capsys, tmp_path, "algo=random", "env=CartPole-v1", f"run.output={existing}",
                   "run.output_append=true")
    assert rc == 2 and "is not the observation space" in err and err.count("\n") == 1, err


def test_run_output_needs_rollouts(tmp_path, capsys):
    from offline_envs import MatchExpert

    from flowkit.datasets import record_episodes
    data = str(tmp_path / "match-v0")
    record_episodes(MatchExpert(), {"factory": "flowkit.testing.envs:match"}, data, steps=100, seed=0)
    rc, err = _cli(capsys, tmp_path, "algo=bc", "env.factory=flowkit.testing.envs:match", f"input.dataset={data}",
                   f"run.output={tmp_path / 'out-v0'}")
    assert rc == 2 and "takes no sample batches from rollout workers" in err and err.count("\n") == 1, err


def test_resumed_run_cuts_the_dataset_back_to_its_checkpoint_and_appends(tmp_path):
    from flowkit.datasets import DatasetWriter, open_dataset
    out = str(tmp_path / "res-v0")
    base = ("algo=random", ECHO, "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=6",
            f"run.output={out}", "random.report_every_env_steps=24")
    part = _train(tmp_path, *base, "stop.env_steps=96")
    at_ckpt = open_dataset(out).total_episodes
    # a run killed after its checkpoint had written more episodes: k = 999 marks them
    w = DatasetWriter(out, EchoEnv().observation_space, EchoEnv().action_space, append=True)
    w.add(None, np.array([[999, 0, 0], [999, 1, 1]], np.float32), np.array([1]), [1.0], [True], [False])
    w.flush()
    assert open_dataset(out).total_episodes == at_ckpt + 1
    res = flowkit.train([f"resume={part.run_dir}", "stop.env_steps=192"], verbose=False, trust_config=True)
    ds = open_dataset(out)
    ks = _check_echo_episodes(ds)
    assert 999 not in ks and ds.total_episodes > at_ckpt
    state = flowkit.checkpoint.load_state(os.path.join(res.checkpoint, "state.pt"))
    assert state["stateful"]["run/output"] == {"episodes": ds.total_episodes, "steps": ds.total_steps}


@pytest.mark.ray
def test_run_output_on_ray_workers(ray_session, tmp_path):
    import minari
    out = str(tmp_path / "ray-v0")
    res = flowkit.train(["runtime.backend=ray", "runtime.num_workers=2", "runtime.num_envs_per_worker=3",
                         "runtime.rollout_fragment_length=7", f"run.dir={tmp_path / 'run'}", "run.reporters=[csv]",
                         "algo=random", ECHO, "stop.env_steps=300", f"run.output={out}"], verbose=False)
    ds = minari.MinariDataset(os.path.join(out, "data"))
    ks = _check_echo_episodes(ds)
    assert np.bincount(ks)[0] == 6 and 0 <= res.metrics["env_steps_sampled"] - ds.total_steps < 24


# ---- online and offline: input.dataset with input.mix -------------------------------------------
def test_replay_mix_takes_its_share_of_every_batch():
    import collections
    from types import SimpleNamespace

    from flowkit.core import batch as sb
    from flowkit.core.flow import NOT_READY
    from flowkit.core.replay import MultiAgentReplayBuffer, Replay, ReplayMix

    def rows(n, mark, **extra):
        return sb.SampleBatch({sb.OBS: np.full((n, 2), mark, np.float32), sb.ACTIONS: np.zeros(n, np.int64), **extra})
    buf = MultiAgentReplayBuffer(100, prioritized=True, seed=0)
    buf.add(sb.MultiAgentBatch({"default": rows(40, 0.0, action_logp=np.zeros(40, np.float32))}, 40))
    sizes = iter([2, 2, 1])  # the source may hand out fewer rows (the end of a pass over a dataset)
    mix = ReplayMix(lambda k: (sb.MultiAgentBatch({"default": rows(next(sizes), 1.0)}, k) for _ in range(3)), 0.25,
                    "source").bind(8)
    assert mix.rows == 2
    ctx = SimpleNamespace(counters=collections.Counter(env_steps_sampled=40), timers=collections.defaultdict(
        lambda: __import__("contextlib").nullcontext()))
    flow = Replay(ctx, buf, 8, 0, mix=mix)
    assert "mix=0.25 of 2 rows" in flow.name and flow.parents[0].name == "source"
    got = [next(flow) for _ in range(3)]
    assert all(b is not NOT_READY and len(b["default"]) == 8 for b in got)
    for b, k in zip(got, [2, 2, 1]):
        pb = b["default"]
        np.testing.assert_array_equal(pb[sb.OBS][:, 0], [0.0] * (8 - k) + [1.0] * k)  # replayed, then the source's
        assert (pb[sb.BATCH_INDEXES][8 - k:] == -1).all() and (pb[sb.BATCH_INDEXES][:8 - k] >= 0).all()
        assert pb[sb.PRIO_WEIGHTS][8 - k:].tolist() == [1.0] * k
        assert "action_logp" not in pb  # only the columns both sources have
    assert ctx.counters["dataset_rows_replayed"] == 5
    pb = got[2]["default"]  # new priorities reach the replayed rows only
    buf.update_priorities({"default": (pb[sb.BATCH_INDEXES], np.full(8, 3.0, np.float32))})
    p = buf.buffer("default").sampler.probabilities(40)
    assert np.isclose(p[pb[sb.BATCH_INDEXES][:7]], p.max()).all() and p.max() > p.min()


@pytest.fixture(scope="module")
def expert_cartpole(tmp_path_factory):
    from offline_envs import CartPoleExpert

    from flowkit.datasets import record_episodes
    path = str(tmp_path_factory.mktemp("mix") / "expert-v0")
    record_episodes(CartPoleExpert(), {"id": "CartPole-v1"}, path, steps=2048, seed=0)
    return path


def test_dqn_with_input_mix_draws_half_of_each_batch_from_the_dataset(tmp_path, expert_cartpole):
    res = _train(tmp_path, "algo=dqn", "env=CartPole-v1", f"input.dataset={expert_cartpole}", "input.mix=0.5",
                 "runtime.num_workers=1", "runtime.num_envs_per_worker=4", "runtime.rollout_fragment_length=16",
                 "dqn.train_batch_size=32", "dqn.learning_starts=64", "dqn.training_intensity=4",
                 "stop.env_steps=640")
    m = res.metrics
    assert m["num_updates"] >= 8 and m["env_steps_sampled"] == 640  # sampled counts live env steps only
    assert m["dataset_rows_replayed"] == 16 * m["num_updates"] and m["env_steps_trained"] == 32 * m["num_updates"]
    reader = flowkit.checkpoint.load_state(os.path.join(res.checkpoint, "state.pt"))["stateful"]["offline/reader"]
    assert reader == {"epoch": 0, "batches": m["num_updates"]}  # 2,048 rows: 128 batches of 16 an epoch


def test_input_mix_errors(tmp_path, capsys, expert_cartpole):
    data = f"input.dataset={expert_cartpole}"
    for args, words in ((("algo=ppo", data, "input.mix=0.5"), "input.mix=0.5: algo=ppo has no replay buffer"),
                        (("algo=bc", data, "input.mix=0.5"), "input.mix=0.5: algo=bc learns from the dataset alone"),
                        (("algo=dqn", "input.mix=0.5"), "input.mix=0.5 needs input.dataset"),
                        (("algo=r2d2", data, "input.mix=0.5"), "algo=r2d2 replays sequences of a recurrent network"),
                        (("algo=dqn", data), "off-policy ones that replay, e.g. dqn or sac, mix it"),
                        (("algo=dqn", data, "input.mix=1.0"), "input.mix")):
        rc, err = _cli(capsys, tmp_path, "env=CartPole-v1", *args, name="run-" + args[0])
        assert rc == 2 and words in err and err.count("\n") == 1, (args, err)


def test_run_output_of_a_native_vector_env(tmp_path):
    # CartPole's own vectorized implementation (one numpy step for all sub-envs): episodes end
    # terminated (the pole fell) before 500 steps, or truncated at 500, once each
    import minari
    out = str(tmp_path / "cp-v0")
    res = _train(tmp_path, "algo=random", "env=CartPole-v1", "runtime.num_workers=1", "runtime.num_envs_per_worker=4",
                 "runtime.rollout_fragment_length=25", "stop.env_steps=400", f"run.output={out}")
    ds = minari.MinariDataset(os.path.join(out, "data"))
    assert ds.total_episodes >= 10 and 0 <= res.metrics["env_steps_sampled"] - ds.total_steps < 4 * 500
    for ep in ds.iterate_episodes():
        assert ep.observations.shape == (len(ep) + 1, 4) and ep.observations.dtype == np.float32
        assert ep.terminations.tolist() == [False] * (len(ep) - 1) + [len(ep) < 500]
        assert not ep.truncations.any() or len(ep) == 500
        assert abs(ep.observations[-1, 2]) > 0.2095 or abs(ep.observations[-1, 0]) > 2.4  # it fell: the final obs
        assert (np.abs(ep.observations[:-1, 2]) <= 0.2095).all()  # not before


def test_input_mix_with_two_readers(tmp_path, expert_cartpole):
    res = _train(tmp_path, "algo=dqn", "env=CartPole-v1", f"input.dataset={expert_cartpole}", "input.mix=0.5",
                 "input.num_readers=2", "runtime.num_workers=1", "runtime.num_envs_per_worker=4",
                 "runtime.rollout_fragment_length=16", "dqn.train_batch_size=32", "dqn.learning_starts=64",
                 "dqn.training_intensity=4", "stop.env_steps=640")
    m = res.metrics
    assert m["num_updates"] >= 8 and m["dataset_rows_replayed"] == 16 * m["num_updates"]
    reader = flowkit.checkpoint.load_state(os.path.join(res.checkpoint, "state.pt"))["stateful"]["offline/reader"]
    n = m["num_updates"]  # one batch of 16 rows per update, from the two readers in turn
    assert reader == {"shards": [{"epoch": 0, "batches": (n + 1) // 2}, {"epoch": 0, "batches": n // 2}],
                      "next_shard": n % 2}


def test_input_mix_reader_resumes_where_it_stopped(tmp_path, expert_cartpole):
    base = ("algo=dqn", "env=CartPole-v1", f"input.dataset={expert_cartpole}", "input.mix=0.5", "runtime.num_workers=1",
            "runtime.num_envs_per_worker=4", "runtime.rollout_fragment_length=16", "dqn.train_batch_size=32",
            "dqn.learning_starts=64", "dqn.training_intensity=4", "run.min_iter_env_steps=64")
    part = _train(tmp_path, *base, "stop.env_steps=320", name="part")
    res = flowkit.train([f"resume={part.run_dir}", "stop.env_steps=640"], verbose=False)
    m = res.metrics
    reader = flowkit.checkpoint.load_state(os.path.join(res.checkpoint, "state.pt"))["stateful"]["offline/reader"]
    # the reader went on from its checkpointed position: one batch of 16 dataset rows per update, all run long
    assert reader == {"epoch": 0, "batches": m["num_updates"]} and m["dataset_rows_replayed"] == 16 * m["num_updates"]
    assert m["num_updates"] > part.metrics["num_updates"] > 0
