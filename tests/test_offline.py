"""Offline RL (issue 26): flowkit record, datasets as a source (input.dataset), BC and MARWIL."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

pytest.importorskip("minari")
pytest.importorskip("flowkit_offline")

from offline_envs import BoundaryEnv, BoundaryPolicy, CartPoleExpert, MatchAntiExpert, MatchExpert  # noqa: E402

import flowkit  # noqa: E402
from flowkit.datasets import DatasetWriter, open_dataset, record_episodes  # noqa: E402
from flowkit.export import export_policy  # noqa: E402
from flowkit.testing import local_overrides  # noqa: E402

BOUNDARY = {"factory": "offline_envs:boundary"}


def _episodes(path):
    """Every episode of the dataset at ``path`` through Minari's own reader, with its seed."""
    ds = open_dataset(path)
    seeds = [m.get("seed") for m in ds.storage.get_episode_metadata(range(ds.total_episodes))]
    return ds, list(ds.iterate_episodes()), seeds


def test_record_keeps_episode_boundaries_and_truncation_flags(tmp_path):
    # 3 sub-envs, 9 episodes of 2-6 steps: they end out of order; each must come back whole
    res = record_episodes(BoundaryPolicy(), BOUNDARY, str(tmp_path / "b-v0"), episodes=9, seed=10, num_envs=3)
    ds, eps, seeds = _episodes(res["path"])
    assert res["episodes"] == 9 and sorted(seeds) == list(range(10, 19))
    for ep, s in zip(eps, seeds):
        n = 2 + s % 5
        assert len(ep) == n
        np.testing.assert_array_equal(ep.observations, [[s, t] for t in range(n + 1)])
        np.testing.assert_array_equal(ep.actions, [(s + t) % 3 for t in range(n)])
        np.testing.assert_allclose(ep.rewards, [(s + t) % 3 + 0.5 * (t + 1) for t in range(n)])
        assert ep.terminations.tolist() == [False] * (n - 1) + [s % 2 == 1]
        assert ep.truncations.tolist() == [False] * (n - 1) + [s % 2 == 0]
    assert ds.total_steps == sum(2 + s % 5 for s in range(10, 19))


def test_record_steps_is_exact_and_cut_episodes_are_truncated(tmp_path):
    res = record_episodes(BoundaryPolicy(), BOUNDARY, str(tmp_path / "s-v0"), steps=23, seed=0, num_envs=4)
    ds, eps, seeds = _episodes(res["path"])
    assert ds.total_steps == 23 == sum(len(e) for e in eps)
    cut = 0
    for ep, s in zip(eps, seeds):
        full = 2 + s % 5
        np.testing.assert_array_equal(ep.observations[:, 1], np.arange(len(ep) + 1))
        assert ep.truncations[-1] or ep.terminations[-1]
        assert not ep.truncations[:-1].any() and not ep.terminations[:-1].any()
        if len(ep) < full:  # cut by steps=23: truncated, never terminated
            cut += 1
            assert ep.truncations[-1] and not ep.terminations[-1]
    assert 1 <= cut <= 4  # the episodes running on the 4 sub-envs at the 23rd step


def test_recorded_dataset_opens_with_minaris_api(tmp_path, monkeypatch):
    import minari
    res = record_episodes(BoundaryPolicy(), BOUNDARY, str(tmp_path / "flowkit-boundary-v0"), episodes=4, seed=3)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    ds = minari.load_dataset("flowkit-boundary-v0")
    assert ds.id == "flowkit-boundary-v0" and ds.total_episodes == 4
    assert ds.observation_space == BoundaryEnv.observation_space and ds.action_space == BoundaryEnv.action_space
    same = minari.MinariDataset(os.path.join(res["path"], "data"))
    assert [len(e) for e in same.iterate_episodes()] == [len(e) for e in ds.iterate_episodes()]
    # append=true adds episodes to the same dataset
    record_episodes(BoundaryPolicy(), BOUNDARY, res["path"], episodes=2, seed=20, append=True)
    assert minari.load_dataset("flowkit-boundary-v0").total_episodes == 6


def test_record_to_a_relative_folder(tmp_path, monkeypatch):
    # Minari sizes its files by a path that a relative data folder doubled (FileNotFoundError on write)
    monkeypatch.chdir(tmp_path)
    record_episodes(BoundaryPolicy(), BOUNDARY, "rel/b-v0", episodes=2, seed=10)
    record_episodes(BoundaryPolicy(), BOUNDARY, "rel/b-v0", episodes=1, seed=20, append=True)
    assert open_dataset("rel/b-v0").total_episodes == 3


class _MaskedExpert:
    """The target of flowkit.testing's masked_match env (a Dict observation with an action mask)."""

    def compute_actions(self, obs, explore=False):
        return np.asarray(obs["observation"]).astype(np.int64).reshape(-1)


def _same_steps(a, b):
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same_steps(a[k], b[k])
    else:
        np.testing.assert_array_equal(a, b)
        assert np.asarray(a).dtype == np.asarray(b).dtype


@pytest.mark.parametrize("env,policy", [(BOUNDARY, BoundaryPolicy()),
                                        ({"factory": "flowkit.testing.envs:masked_match"}, _MaskedExpert())])
def test_columnar_copy_reads_what_minari_reads(tmp_path, env, policy):
    from flowkit.datasets import COLUMNS_DIR, ColumnStore, steps_of
    path = str(tmp_path / "d-v0")
    record_episodes(policy, env, path, episodes=9, seed=10, num_envs=3)
    store = ColumnStore.open(path)  # written on the first open, next to the dataset
    assert os.path.isfile(os.path.join(path, COLUMNS_DIR, "index.json"))
    ds = open_dataset(path)
    order = [4, 0, 8, 3]
    got, want = store.read(order), steps_of(list(ds.storage.get_episodes(order)))
    assert sorted(got) == sorted(want)
    for k in got:
        _same_steps(got[k], want[k])
    assert got["t"].tolist()[:3] == [0, 1, 2] and got["episode_ids"][0] == 4
    # append=true changes the dataset: the copy is written again on the next open
    record_episodes(policy, env, path, episodes=2, seed=50, append=True)
    store = ColumnStore.open(path)
    assert len(store.lengths) == 11
    _same_steps(store.read([10])["rewards"], steps_of(list(open_dataset(path).storage.get_episodes([10])))["rewards"])


def test_streamed_epoch_hands_out_every_row_once(tmp_path):
    # 40 episodes of 2-6 steps through a 25-row shuffle buffer: every (episode, t) once per epoch,
    # obs and next_obs from the right steps; BC's batches carry its train columns only
    import collections
    from types import SimpleNamespace

    from flowkit_offline import BCConfig
    from flowkit_offline.marwil import MARWILPolicy
    from flowkit_offline.reader import DatasetReader
    from omegaconf import OmegaConf
    path = str(tmp_path / "b-v0")
    res = record_episodes(BoundaryPolicy(), BOUNDARY, path, episodes=40, seed=0, num_envs=4)
    pol = MARWILPolicy(BoundaryEnv.observation_space, BoundaryEnv.action_space, BCConfig())
    ctx = SimpleNamespace(policies={"default": pol}, counters=collections.Counter(), mark=lambda _: None,
                          config=OmegaConf.create({"seed": 3, "env": {"id": "x", "factory": None}}))
    reader = DatasetReader(ctx, path, "default", 8, 25)
    batches = list(reader.epoch_batches(0))
    assert all(sorted(b) == ["actions", "obs"] for b in batches)
    assert [len(b) for b in batches[:-1]] == [8] * (len(batches) - 1) and sum(map(len, batches)) == res["steps"]
    pol.train_columns = None  # every column
    rows = [b for b in DatasetReader(ctx, path, "default", 8, 25).epoch_batches(0)]
    for a, b in zip(batches, rows):  # the same rows in the same order
        np.testing.assert_array_equal(a["obs"], b["obs"])
    obs = np.concatenate([b["obs"] for b in rows])
    nxt = np.concatenate([b["next_obs"] for b in rows])
    t = np.concatenate([b["t"] for b in rows])
    assert sorted(zip(obs[:, 0].tolist(), t.tolist())) == sorted((s, i) for s in range(40) for i in range(2 + s % 5))
    np.testing.assert_array_equal(obs[:, 1], t)
    np.testing.assert_array_equal(nxt[:, 1], t + 1)
    assert len({tuple(b["obs"][0]) for b in rows}) > 1  # shuffled: not in dataset order
    np.testing.assert_array_equal(np.concatenate([b["actions"] for b in rows]), (obs[:, 0] + t) % 3)


def _sharded(path, seed=3, k=2, backend="local", all_columns=True):
    """A ShardedReader of ``k`` shards over the BoundaryEnv dataset at ``path`` (batches of 8, a
    shuffle buffer of 25 rows in all), for a BC policy that keeps every column."""
    import collections
    from types import SimpleNamespace

    from flowkit_offline import BCConfig
    from flowkit_offline.marwil import MARWILPolicy
    from flowkit_offline.reader import ShardedReader
    from omegaconf import OmegaConf

    from flowkit.core.workers import PolicySpec

    class AllColumns(MARWILPolicy):
        train_columns = None

    spec = PolicySpec(AllColumns if all_columns else MARWILPolicy, BoundaryEnv.observation_space,
                      BoundaryEnv.action_space, BCConfig(), "bc")
    from flowkit.config import ModelConfig
    cfg = OmegaConf.create({"seed": seed, "env": {"id": "x", "factory": None}, "model": OmegaConf.structured(ModelConfig),
                            "runtime": {"backend": backend, "torch_threads": 1}})
    ctx = SimpleNamespace(policy_specs={"default": spec}, counters=collections.Counter(), mark=lambda _: None,
                          config=cfg)
    return ShardedReader(ctx, path, "default", 8, 25, k), ctx


def _take(reader, n):
    """``n`` batches of ``reader``: [(shard, SampleBatch, shard state after it)]."""
    out, it = [], iter(reader)
    for _ in range(n):
        i = reader.next_shard
        b = next(it)["default"]
        out.append((i, b, dict(reader.states[i])))
    return out


def test_sharded_readers_hand_out_every_row_of_an_epoch_once(tmp_path):
    # 2 readers over 40 episodes (episode j read by reader j % 2), 12-row buffers: together, the
    # batches of each reader's epoch 0 are every (episode, t) of the dataset once; round-robin
    path = str(tmp_path / "b-v0")
    res = record_episodes(BoundaryPolicy(), BOUNDARY, path, episodes=40, seed=0, num_envs=4)
    reader, ctx = _sharded(path)
    assert reader.buffer_size == 12
    got = _take(reader, res["steps"] // 8 + 8)  # 160 rows: 10 batches a shard per epoch, 14 taken
    assert [i for i, _, _ in got[:6]] == [0, 1, 0, 1, 0, 1]
    first = [b for _, b, st in got if st["epoch"] == 0]
    obs = np.concatenate([b["obs"] for b in first])
    t = np.concatenate([b["t"] for b in first])
    assert sorted(zip(obs[:, 0].tolist(), t.tolist())) == sorted((s, i) for s in range(40) for i in range(2 + s % 5))
    np.testing.assert_array_equal(obs[:, 1], t)
    np.testing.assert_array_equal(np.concatenate([b["next_obs"] for b in first])[:, 1], t + 1)
    for i, b, _ in got:  # each reader reads its own episodes only
        assert set((b["eps_id"] % 2).tolist()) == {i}
    assert ctx.counters["env_steps_sampled"] == sum(len(b) for _, b, _ in got)
    assert ctx.counters["dataset_epochs"] == 1 and all(st["epoch"] >= 1 for _, _, st in got[-2:])
    # same seed, same batches (in-process or not, the shards are deterministic); another seed, others
    again = _take(_sharded(path)[0], 10)
    other = _take(_sharded(path, seed=4)[0], 10)
    for (i, a, _), (j, b, _) in zip(got[:10], again):
        assert i == j
        np.testing.assert_array_equal(a["obs"], b["obs"])
    assert any(not np.array_equal(a["obs"], b["obs"]) for (_, a, _), (_, b, _) in zip(got[:10], other))


def test_sharded_reader_resumes_with_the_same_batches(tmp_path):
    path = str(tmp_path / "b-v0")
    record_episodes(BoundaryPolicy(), BOUNDARY, path, episodes=30, seed=0, num_envs=4)
    whole = _take(_sharded(path)[0], 40)  # past the end of the shards' first epochs
    part, _ = _sharded(path)
    _take(part, 23)
    state = part.get_state()
    assert state["next_shard"] == 1 and len(state["shards"]) == 2
    resumed, _ = _sharded(path)
    resumed.set_state(state)  # before its shards started, as a run's restore
    rest = _take(resumed, 17)
    part.set_state(state)  # and on started shards (their requests in flight dropped)
    rest2 = _take(part, 17)
    for (i, a, sa), (j, b, sb_), (k, c, _) in zip(whole[23:], rest, rest2):
        assert i == j == k and sa == sb_
        np.testing.assert_array_equal(a["obs"], b["obs"])
        np.testing.assert_array_equal(a["obs"], c["obs"])
    with pytest.raises(flowkit.ConfigError, match="input.num_readers=2"):
        _sharded(path, k=3)[0].set_state(state)


@pytest.mark.slow
def test_sharded_readers_on_ray_give_the_local_batches(ray_session, tmp_path):
    path = str(tmp_path / "b-v0")
    record_episodes(BoundaryPolicy(), BOUNDARY, path, episodes=30, seed=0, num_envs=4)
    remote, _ = _sharded(path, backend="ray", all_columns=False)
    try:
        got = _take(remote, 30)
        state = remote.get_state()
        remote.set_state({"shards": [{"epoch": 0, "batches": 3}, {"epoch": 0, "batches": 2}], "next_shard": 1})
        again = _take(remote, 4)
    finally:
        remote.stop()
    local = _take(_sharded(path, all_columns=False)[0], 30)
    assert state == {"shards": [dict(local[-2][2]), dict(local[-1][2])], "next_shard": 0}
    for (i, a, sa), (j, b, sb_) in zip(got, local):
        assert i == j and sa == sb_ and sorted(a) == ["actions", "obs"]
        np.testing.assert_array_equal(a["obs"], b["obs"])
        np.testing.assert_array_equal(a["actions"], b["actions"])
    for (i, a, _), (j, b, _) in zip(again, local[5:9]):  # shard 1's 3rd batch, shard 0's 4th, ...
        assert i == j
        np.testing.assert_array_equal(a["obs"], b["obs"])


def test_num_readers_config_errors(tmp_path, capsys, match_dataset):
    from flowkit.cli import main
    rc = main(["train", "algo=dqn", "env.factory=flowkit.testing.envs:match", "input.num_readers=2",
               "runtime.backend=local", f"run.dir={tmp_path / 'a'}", "stop.env_steps=100", "--no-tuned"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "input.num_readers=2 needs input.dataset" in err, err
    n = open_dataset(match_dataset).total_episodes
    rc = main(["train", "algo=bc", "env.factory=flowkit.testing.envs:match", f"input.dataset={match_dataset}",
               f"input.num_readers={n + 1}", "runtime.backend=local", f"run.dir={tmp_path / 'b'}",
               "stop.env_steps=100"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and f"holds {n} episodes, fewer than the readers" in err, err
    assert not os.path.exists(tmp_path / "b")


@pytest.fixture(scope="module")
def cartpole_dataset(tmp_path_factory):
    """10,000 transitions of the scripted CartPole expert (greedy)."""
    path = str(tmp_path_factory.mktemp("offline") / "cartpole-expert-v0")
    res = record_episodes(CartPoleExpert(), {"id": "CartPole-v1"}, path, steps=10_000, seed=0)
    assert res["return_mean"] >= 475  # the expert is one
    return path


def _bad(tmp_path, case, good):
    if case == "missing":
        return str(tmp_path / "nothing-here")
    if case == "not a dataset":
        os.makedirs(tmp_path / "folder")
        return str(tmp_path / "folder")
    if case == "empty":
        DatasetWriter(str(tmp_path / "empty-v0"), BoundaryEnv.observation_space, BoundaryEnv.action_space).flush()
        return str(tmp_path / "empty-v0")
    if case == "truncated":
        shutil.copytree(good, tmp_path / "cut-v0")
        f = tmp_path / "cut-v0" / "data" / "main_data.hdf5"
        os.truncate(f, os.path.getsize(f) // 2)
        return str(tmp_path / "cut-v0")
    return good  # spaces: a CartPole dataset for Pendulum


@pytest.mark.parametrize("case,words", [("missing", "no such dataset"), ("not a dataset", "not a dataset"),
                                        ("empty", "is empty"), ("truncated", "damaged or truncated"),
                                        ("spaces", "is not the observation space")])
def test_bad_datasets_are_one_line_config_errors(tmp_path, capsys, cartpole_dataset, case, words):
    from flowkit.cli import main
    path = _bad(tmp_path, case, cartpole_dataset)
    env = "Pendulum-v1" if case == "spaces" else "CartPole-v1"
    rc = main(["train", "algo=bc", f"env={env}", f"input.dataset={path}", "runtime.backend=local",
               f"run.dir={tmp_path / 'run'}", "stop.env_steps=100"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and words in err and f"input.dataset={path!r}" in err, err
    assert not os.path.exists(tmp_path / "run")  # nothing started


def test_dataset_needs_an_offline_algorithm_and_bc_needs_a_dataset(tmp_path, capsys, cartpole_dataset):
    from flowkit.cli import main
    assert main(["train", "algo=ppo", "env=CartPole-v1", f"input.dataset={cartpole_dataset}", "--no-tuned",
                 "runtime.backend=local", f"run.dir={tmp_path / 'a'}"]) == 2
    assert "algo=ppo learns from rollouts" in capsys.readouterr().err
    assert main(["train", "algo=bc", "env=CartPole-v1", "runtime.backend=local", f"run.dir={tmp_path / 'b'}"]) == 2
    assert "set input.dataset=PATH" in capsys.readouterr().err


def test_a_dataset_run_starts_no_rollout_workers(tmp_path, cartpole_dataset):
    # the plan says so through the WorkerSet's public `rollouts` (before: a WorkerSet subclass swapped
    # into ctx.workers, its private fields copied over)
    from flowkit.engine import build_plan, load_config, setup
    run_dir = str(tmp_path / "run")
    pm, cfg = load_config(local_overrides(run_dir, "algo=bc", "env=CartPole-v1", f"input.dataset={cartpole_dataset}"))
    ctx = setup(cfg, pm, run_dir)
    workers = ctx.workers
    try:
        assert workers.rollouts and workers.num_workers == 2
        build_plan(ctx)
        assert ctx.workers is workers and not workers.rollouts
        assert workers.actors == [] and workers.started  # start() made none
    finally:
        ctx.shutdown()


def test_bc_learns_cartpole_from_a_scripted_expert(tmp_path, cartpole_dataset):
    res = flowkit.train(local_overrides(str(tmp_path / "bc"), "algo=bc", "env=CartPole-v1", "seed=0",
                                        f"input.dataset={cartpole_dataset}", "stop.env_steps=40000", "bc.lr=3e-3",
                                        "evaluation.final=true", "evaluation.episodes=20"), verbose=False)
    assert res.metrics["env_steps_trained"] >= 40000  # 4 passes over the dataset
    assert res.metrics["evaluation_return_mean"] >= 475, res.metrics["evaluation_return_mean"]
    ev = flowkit.evaluation.evaluate(res.run_dir, episodes=5, seed=100)  # flowkit evaluate works on an offline run
    assert ev["episode_return_mean"] >= 475


def test_marwil_loss_weights_by_exponentiated_advantage():
    import torch
    from flowkit_offline import MARWILConfig
    from flowkit_offline.marwil import MARWILPolicy, returns_to_go
    from omegaconf import OmegaConf

    from flowkit.core import batch as sb
    np.testing.assert_allclose(returns_to_go(np.array([1.0, 2.0, 3.0]), 0.5), [1 + 0.5 * (2 + 0.5 * 3), 3.5, 3.0])
    cfg = MARWILConfig(beta=2.0, moving_average_sqd_adv_norm_start=4.0, moving_average_sqd_adv_norm_update_rate=0.5,
                       max_weight=None)
    env = BoundaryEnv()
    pol = MARWILPolicy(env.observation_space, env.action_space, cfg, OmegaConf.structured(flowkit.config.ModelConfig))
    obs = torch.tensor([[1.0, 0.0], [2.0, 1.0], [3.0, 2.0]])
    batch = {sb.OBS: obs, sb.ACTIONS: torch.tensor([0, 1, 2]), sb.VALUE_TARGETS: torch.tensor([1.0, -2.0, 5.0])}
    with torch.no_grad():
        logp = torch.log_softmax(pol.model_policy(obs), -1)[torch.arange(3), batch[sb.ACTIONS]]
        adv = batch[sb.VALUE_TARGETS] - pol.model_value(obs)
    c2 = 4.0 + 0.5 * (float(adv.pow(2).mean()) - 4.0)
    w = torch.exp(2.0 * adv / np.sqrt(c2))
    want = -(w * logp).mean() + 0.5 * adv.pow(2).mean()
    loss, st = pol.loss(batch)
    assert pol.ma_sqd_adv_norm == pytest.approx(c2)
    assert float(loss.detach()) == pytest.approx(float(want), rel=1e-5)
    assert st["weight_mean"] == pytest.approx(float(w.mean()), rel=1e-5)
    bc = MARWILPolicy(env.observation_space, env.action_space, MARWILConfig(beta=0.0))
    with torch.no_grad():
        want_bc = -torch.log_softmax(bc.model_policy(obs), -1)[torch.arange(3), batch[sb.ACTIONS]].mean()
    assert float(bc.loss(batch)[0].detach()) == pytest.approx(float(want_bc), rel=1e-6)


@pytest.fixture(scope="module")
def match_dataset(tmp_path_factory):
    """2,000 transitions of the best policy of flowkit.testing's match env, 30 % random actions."""
    path = str(tmp_path_factory.mktemp("offline") / "match-v0")
    record_episodes(MatchExpert(), {"factory": "flowkit.testing.envs:match"}, path, steps=2000, seed=0,
                    explore="epsilon", epsilon=0.3)
    return path


@pytest.mark.parametrize("algo,readers", [("bc", 0), ("marwil", 0), ("bc", 2)])
@pytest.mark.slow
def test_offline_resume_is_exact(tmp_path, match_dataset, algo, readers):
    base = ["env.factory=flowkit.testing.envs:match", f"algo={algo}", f"input.dataset={match_dataset}", "seed=0",
            f"{algo}.train_batch_size=64", "input.shuffle_buffer_size=300", "evaluation.interval=0",
            f"input.num_readers={readers}"]
    whole = flowkit.train(local_overrides(str(tmp_path / "whole"), *base, "stop.env_steps=2560"), verbose=False)
    flowkit.train(local_overrides(str(tmp_path / "part"), *base, "stop.env_steps=1280"), verbose=False)
    resumed = flowkit.train([f"resume={tmp_path / 'part'}", "stop.env_steps=2560"], verbose=False)
    # 2,000 rows an epoch: 31 batches of 64, one of 16, then 9 of the second epoch (2 readers: the
    # episodes, of 2 and 8 steps, alternate, so 1,000 rows each: 15 batches of 64 and one of 40
    # each, taken in turn, then 9 of the second epochs)
    assert whole.metrics["env_steps_trained"] == resumed.metrics["env_steps_trained"] == 2576
    a = flowkit.Algorithm.from_checkpoint(whole.run_dir).get_policy().get_state()
    b = flowkit.Algorithm.from_checkpoint(resumed.run_dir).get_policy().get_state()
    for k in a["weights"]:
        np.testing.assert_array_equal(a["weights"][k], b["weights"][k], err_msg=k)
    if algo == "marwil":
        assert a["ma_sqd_adv_norm"] == b["ma_sqd_adv_norm"]


@pytest.mark.parametrize("algo", ["bc", "marwil", "cql_dqn"])
def test_model_normalize_obs_statistics_take_in_the_datasets_rows(tmp_path, match_dataset, algo):
    """The offline algorithms declare model.normalize_obs honoured: each trained row once in obs_rms."""
    from flowkit.checkpoint import load_state
    res = flowkit.train(local_overrides(str(tmp_path), "env.factory=flowkit.testing.envs:match", f"algo={algo}",
                                        f"input.dataset={match_dataset}", "seed=0", f"{algo}.train_batch_size=64",
                                        "evaluation.interval=0", "model.normalize_obs=true", "stop.env_steps=256"),
                        verbose=False)
    w = load_state(res.checkpoint)["policies"]["default"]["weights"]
    assert float(w["obs_rms.count"]) == pytest.approx(res.metrics["env_steps_trained"], abs=1e-3)
    assert res.metrics["env_steps_trained"] >= 256 and not np.allclose(w["obs_rms.var"], 1.0)


@pytest.mark.parametrize("algo", ["bc", "marwil", "cql_dqn"])
def test_conformance(tmp_path, match_dataset, algo):
    from flowkit_offline.cql import CQLDQN
    from flowkit_offline.marwil import BC, MARWIL

    from flowkit.testing import check_algorithm
    out = check_algorithm({"bc": BC, "marwil": MARWIL, "cql_dqn": CQLDQN}[algo],
                          [f"input.dataset={match_dataset}", f"{algo}.train_batch_size=64"],
                          checks=("config", "plan", "checkpoint", "learn"), learn_env_steps=4000,
                          tmp_dir=str(tmp_path))
    assert "DatasetReader" in out["plan"] and out["learn_return"] >= 7.0


def test_flowkit_record_command_on_a_trained_run(tmp_path, capsys):
    from flowkit.cli import main
    run = str(tmp_path / "run")
    flowkit.train(local_overrides(run, "algo=random", "env.factory=offline_envs:boundary", "stop.env_steps=64",
                                  "evaluation.interval=0"), verbose=False)
    out = str(tmp_path / "rec-v0")
    # the run's env is the tests' own factory: a run folder is data, loading it takes consent
    assert main(["record", run, "steps=30", "seed=5", "explore=sample", f"out={out}"]) == 2
    assert "--trust-config" in capsys.readouterr().err
    assert main(["record", run, "steps=30", "seed=5", "explore=sample", f"out={out}", "--trust-config"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    ds, eps, seeds = _episodes(out)
    assert ds.total_steps == 30 and sorted(seeds) == list(range(5, 5 + len(seeds)))  # episode i: seed 5 + i
    assert main(["record", run, "steps=30", f"out={out}", "--trust-config"]) == 2  # a dataset is there
    assert "append=true" in capsys.readouterr().err
    assert main(["record", run, "episodes=3", f"out={out}", "append=true", "--trust-config"]) == 0
    assert open_dataset(out).total_steps == 30 + sum(2 + s % 5 for s in range(0, 3))  # the run's seed 0
    capsys.readouterr()
    # one step: no episode (2-6 steps) ends; the line says so instead of "return mean nan"
    assert main(["record", run, "steps=1", f"out={out}-1", "--trust-config"]) == 0
    assert "(greedy): no episode ended within these steps (the running ones are kept, cut there); the dataset holds 1 " \
        "episodes, 1 steps" in capsys.readouterr().out


@pytest.mark.parametrize("out,says", [("afile", "out= '{tmp}/afile' is a file, not a folder"),
                                      ("afile/d", "out= '{tmp}/afile/d': '{tmp}/afile' is a file, not a folder")])
def test_flowkit_record_checks_out_before_work(tmp_path, capsys, out, says):
    """Issue 28 rerun: `flowkit record out=FILE/d` ended in a NotADirectoryError traceback after
    loading the policy and building the envs."""
    from flowkit.cli import main
    (tmp_path / "afile").write_text("x")
    assert main(["record", str(tmp_path), "steps=3", f"out={tmp_path}/{out}"]) == 2  # before looking for a checkpoint
    assert capsys.readouterr().err == f"flowkit record: error: {says.format(tmp=tmp_path)}\n"


@pytest.mark.slow
def test_marwil_and_cql_beat_bc_on_a_mixed_dataset(tmp_path):
    # 30 % of the rows from the best policy of the match env, 70 % from the worst: BC copies the
    # majority (return near 0 of 8), MARWIL's advantage weights pick the rows that earned reward,
    # CQL's Q-values rank the dataset's actions by their return (with a small alpha: CQL(H)
    # alone would prefer the frequent action, by log(0.7 / 0.3) in Q)
    path = str(tmp_path / "mixed-v0")
    match = {"factory": "flowkit.testing.envs:match"}
    record_episodes(MatchExpert(), match, path, steps=600, seed=0)
    record_episodes(MatchAntiExpert(), match, path, steps=1400, seed=100, append=True)
    got = {}
    for algo, extra in (("bc", ()), ("marwil", ()), ("cql_dqn", ("cql_dqn.cql_alpha=0.2",))):
        res = flowkit.train(local_overrides(str(tmp_path / algo), f"algo={algo}", *extra,
                                            "env.factory=flowkit.testing.envs:match",
                                            f"input.dataset={path}", "seed=0", "stop.env_steps=20000",
                                            f"{algo}.train_batch_size=64",  # 312 steps: c^2 settles from 100
                                            "run.min_iter_env_steps=5000",
                                            "evaluation.final=true", "evaluation.episodes=20"), verbose=False)
        got[algo] = res.metrics["evaluation_return_mean"]
        policy = flowkit.Algorithm.from_checkpoint(res.run_dir).get_policy()  # exports as any trained policy
        export_policy(policy, "torchscript", str(tmp_path / f"{algo}.pt"), check=64)
    assert got["bc"] <= 2.0 and got["marwil"] >= 7.0 and got["cql_dqn"] >= 7.0, got


def test_bc_learns_box_actions(tmp_path):
    # Box actions go back from the env's bounds to the policy's sampled form (reader.sampled_actions)
    from flowkit_offline.marwil import BC
    from offline_envs import TargetExpert

    from flowkit.testing import check_algorithm
    from flowkit.testing.envs import BOX
    path = str(tmp_path / "target-v0")
    record_episodes(TargetExpert(), {"factory": BOX.factory}, path, steps=2000, seed=0)
    out = check_algorithm(BC, [f"input.dataset={path}", "bc.train_batch_size=64"], env=BOX, checks=("learn",),
                          learn_env_steps=8000, tmp_dir=str(tmp_path))
    assert out["learn_return"] >= BOX.solved  # 6.4 of 8; random play about 2.7


def test_cql_dqn_loss_term_by_term_on_a_hand_computed_batch():
    """CQL(H) on DQN (appendix F): Huber TD loss + cql_alpha * mean_t [log sum_a exp Q(s_t, a) -
    Q(s_t, a_t)], the log-sum-exp over the legal actions only; each term by hand."""
    import math

    import gymnasium as gym
    import torch
    from flowkit_offline import CQLDQNConfig
    from flowkit_offline.cql import CQLDQNPolicy
    from omegaconf import OmegaConf

    from flowkit.core import batch as sb
    mc = OmegaConf.create({"hidden_sizes": [], "activation": "relu", "shared_value_network": False})
    pol = CQLDQNPolicy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(3),
                       CQLDQNConfig(cql_alpha=2.0, gamma=0.9, dueling=False, double_q=False), mc, seed=0)
    # no hidden layer: Q = W s + b; Q(e1) = [1, 2, 0], Q(e2) = [0.5, -1, 3]
    pol.set_weights({"q_head.0.weight": np.array([[1.0, 0.5, 0.0], [2.0, -1.0, 0.0], [0.0, 3.0, 0.0]], np.float32),
                     "q_head.0.bias": np.zeros(3, np.float32)})
    pol.target.update()
    e1, e2 = [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]
    batch = {sb.OBS: torch.tensor([e1, e2]), sb.ACTIONS: torch.tensor([0, 2]), sb.REWARDS: torch.tensor([1.0, 0.0]),
             sb.TERMINATEDS: torch.tensor([False, True]), sb.NEXT_OBS: torch.tensor([e2, e1]),
             sb.N_STEPS: torch.tensor([1, 1]), sb.ACTION_MASK: torch.tensor([[1, 1, 1], [1, 0, 1]], dtype=torch.int8)}
    loss, st = pol.loss(batch)
    # TD: row 1: Q = 1, y = 1 + 0.9 * 3 = 3.7, Huber(2.7) = 2.2; row 2: Q = 3, y = 0 (terminal), Huber(3) = 2.5
    td = (2.2 + 2.5) / 2
    # the gap: row 1 over the three actions, row 2 over actions 0 and 2 (action 1 masked)
    gap = ((math.log(math.exp(1) + math.exp(2) + math.exp(0)) - 1) + (math.log(math.exp(0.5) + math.exp(3)) - 3)) / 2
    assert st["td_loss"] == pytest.approx(td, rel=1e-5)
    assert st["cql_loss"] == pytest.approx(gap, rel=1e-5)
    assert float(loss.detach()) == pytest.approx(td + 2.0 * gap, rel=1e-5) and st["loss"] == pytest.approx(td + 2.0 * gap, rel=1e-5)


# ---- CQL on SAC (Box actions) ----------------------------------------------------------------------
def _cql_sac_policy(**cfg):
    """A CQL-SAC policy on flowkit.testing's target env (obs and action in [-1, 1]^1), no hidden
    layers: each critic is Q_j(s, a) = w_j . [s, a] + b_j."""
    from flowkit_offline import CQLSACConfig
    from flowkit_offline.cql import CQLSACPolicy
    from omegaconf import OmegaConf

    from flowkit.testing.envs import TargetEnv
    env = TargetEnv()
    mc = OmegaConf.create({"hidden_sizes": [], "activation": "relu", "shared_value_network": False})
    return CQLSACPolicy(env.observation_space, env.action_space, CQLSACConfig(**cfg), mc)


def test_cql_gap_hand_computed():
    import math

    import torch
    from flowkit_offline.cql import cql_gap

    # one Q-function, two states, three sampled actions each
    q_data = torch.tensor([[2.0, -1.0]])
    q_s = torch.tensor([[[-1.0, 1.0, 3.0], [0.0, 0.0, 0.0]]])
    log_mu = torch.tensor([[-math.log(2.0), 0.5, -0.25], [0.0, 0.0, math.log(3.0)]])
    want = 0.5 * ((math.log(2 * math.exp(-1.0) + math.exp(0.5) + math.exp(3.25)) - 2.0)
                  + (math.log(2.0 + 1.0 / 3.0) + 1.0))
    assert cql_gap(q_data, q_s, log_mu).tolist() == pytest.approx([want], rel=1e-6)
    # temperature T: T logsumexp((Q - log mu) / T)
    want_t2 = 0.5 * ((2.0 * math.log(math.exp((-1.0 + math.log(2.0)) / 2) + math.exp(0.25) + math.exp(1.625)) - 2.0)
                     + (2.0 * math.log(2.0 + math.exp(-math.log(3.0) / 2)) + 1.0))
    assert cql_gap(q_data, q_s, log_mu, 2.0).tolist() == pytest.approx([want_t2], rel=1e-6)


def _hand_batch(pol, data_actions=(0.5, -1.0)):
    """Two rows; critics set to Q1 = s + 2a and Q2 = 1 - a, target critics to Q1' = 2s - a + 0.5
    and Q2' = s + a, the actor to mean(s) = 0.5 s + 0.1 and std 0.5, its standard normal draws
    fixed to (1, -2) at s' then (0.5, 0) at s, and the sampled actions of the log-sum-exp fixed
    to [-1, 0, 1] per state with proposal log-densities [-log 2, 0.5, -0.25]."""
    import math

    import torch

    from flowkit.core import batch as sb
    with torch.no_grad():
        for c, w1, b1, w2, b2 in ((pol.model.critic, [1.0, 2.0], 0.0, [0.0, -1.0], 1.0),
                                  (pol.target["critic"], [2.0, -1.0], 0.5, [1.0, 1.0], 0.0)):
            c.wa.copy_(torch.tensor([w1]))
            c.ba.fill_(b1)
            c.wb.copy_(torch.tensor([w2]))
            c.bb.fill_(b2)
        lin = pol.model.actor[0]
        lin.weight.copy_(torch.tensor([[0.5], [0.0]]))
        lin.bias.copy_(torch.tensor([0.1, math.log(0.5)]))
    draws = [torch.tensor([[1.0], [-2.0]]), torch.tensor([[0.5], [0.0]])]
    pol.noise = lambda like: draws.pop(0)
    a = torch.tensor([-1.0, 0.0, 1.0]).view(1, 3, 1).expand(2, 3, 1)
    log_mu = torch.tensor([-math.log(2.0), 0.5, -0.25]).expand(2, 3)
    pol.sampled_actions = lambda obs, next_obs: (a, log_mu)
    return {sb.OBS: torch.tensor([[1.0], [-0.5]]), sb.NEXT_OBS: torch.tensor([[0.2], [0.3]]),
            sb.ACTIONS: torch.tensor([[data_actions[0]], [data_actions[1]]]), sb.REWARDS: torch.tensor([1.0, 0.0]),
            sb.TERMINATEDS: torch.tensor([False, True])}


def _hand_gaps(data_actions=(0.5, -1.0)):
    """Each critic's gap mean_t [log sum_i exp(Q(s_t, a_i) - log mu_i) - Q(s_t, a_t)] on the
    batch of :func:`_hand_batch`."""
    import math

    def lse(qs):
        return math.log(sum(math.exp(q - m) for q, m in zip(qs, (-math.log(2.0), 0.5, -0.25))))
    obs = (1.0, -0.5)
    gap1 = sum(lse([s + 2 * a for a in (-1, 0, 1)]) - (s + 2 * d) for s, d in zip(obs, data_actions)) / 2
    gap2 = sum(lse([1 - a for a in (-1, 0, 1)]) - (1 - d) for d in data_actions) / 2
    return gap1, gap2


def _hand_sac_terms(gamma, alpha, backup_entropy, bc, data_actions):
    """The critic, actor and temperature losses of :func:`_hand_batch`, by hand (float64)."""
    import math

    def squashed(s, eps):  # the actor at s with draw eps: (a, log pi(a|s))
        u = 0.5 * s + 0.1 + 0.5 * eps
        return math.tanh(u), -0.5 * eps ** 2 - math.log(0.5) - 0.5 * math.log(2 * math.pi) - math.log(1 - math.tanh(u) ** 2)

    obs, nxt, rew, term = (1.0, -0.5), (0.2, 0.3), (1.0, 0.0), (0, 1)
    ys = []
    for s2, r, d, eps in zip(nxt, rew, term, (1.0, -2.0)):
        a2, lp2 = squashed(s2, eps)
        v = min(2 * s2 - a2 + 0.5, s2 + a2) - (alpha * lp2 if backup_entropy else 0.0)
        ys.append(r + gamma * (1 - d) * v)
    critic = 0.5 * (sum((s + 2 * a - y) ** 2 for s, a, y in zip(obs, data_actions, ys)) / 2
                    + sum((1 - a - y) ** 2 for a, y in zip(data_actions, ys)) / 2)
    actor = alpha_loss = 0.0
    for s, a_d, eps in zip(obs, data_actions, (0.5, 0.0)):
        a, lp = squashed(s, eps)
        if bc:  # beta-NLL of u = atanh(a_d) under N(0.5 s + 0.1, 0.5^2), weighted by the variance 0.25
            u = math.atanh(a_d)
            fit = -0.25 * (0.5 * ((u - 0.5 * s - 0.1) / 0.5) ** 2 + math.log(0.5) + 0.5 * math.log(2 * math.pi))
        else:
            fit = min(s + 2 * a, 1 - a)
        actor += (alpha * lp - fit) / 2
        alpha_loss += -math.log(alpha) * (lp - 1.0) / 2  # target entropy -dim(A) = -1
    return critic, actor, alpha_loss


@pytest.mark.parametrize("backup_entropy,bc_steps,data_actions", [(False, 0, (0.5, -1.0)), (True, 0, (0.5, -1.0)),
                                                                  (False, 1, (0.5, -0.8))])
def test_cql_sac_loss_term_by_term_on_a_hand_computed_batch(backup_entropy, bc_steps, data_actions):
    """Each term of the CQL-SAC loss against a hand computation: the Bellman target without the
    entropy term (the paper's eq. 3 backup; SAC's soft backup with backup_entropy), the critic,
    actor (or, for the first bc_steps, behavioural cloning) and temperature losses, and CQL(H)'s
    importance-sampled gap per critic times cql_alpha."""
    import math

    import torch
    gamma, alpha, cql_alpha = 0.9, 0.5, 3.0
    pol = _cql_sac_policy(cql_alpha=cql_alpha, gamma=gamma, initial_alpha=alpha, backup_entropy=backup_entropy,
                          bc_steps=bc_steps)
    loss, st = pol.loss(_hand_batch(pol, data_actions))
    critic, actor, alpha_loss = _hand_sac_terms(gamma, alpha, backup_entropy, bc_steps > 0, data_actions)
    gap1, gap2 = _hand_gaps(data_actions)
    assert st["critic_loss"] == pytest.approx(critic, rel=1e-5)
    assert st["actor_loss"] == pytest.approx(actor, rel=1e-5)
    assert st["alpha_loss"] == pytest.approx(alpha_loss, rel=1e-5) and st["alpha"] == pytest.approx(alpha)
    assert st["cql_gap"] == pytest.approx((gap1 + gap2) / 2, rel=1e-5)
    assert st["cql_loss"] == pytest.approx(cql_alpha * (gap1 + gap2), rel=1e-5)
    assert float(loss.detach()) == pytest.approx(critic + actor + alpha_loss + cql_alpha * (gap1 + gap2), rel=1e-5)
    # the penalty's gradient reaches the critics only: the actor's gradient is its own loss's
    grads = torch.autograd.grad(loss, list(pol.model.actor.parameters()))
    want = torch.autograd.grad(pol.sac_terms(_hand_batch(pol, data_actions))["actor_loss"],
                               list(pol.model.actor.parameters()))
    for w, h in zip(want, grads):
        torch.testing.assert_close(h, w)
    assert math.isfinite(float(loss.detach()))


def test_cql_sac_lagrangian_weight_moves_with_the_gap():
    import math

    import torch
    from flowkit_sac.sac import SACPolicy
    gap1, gap2 = _hand_gaps()
    for tau in (0.5, 3.0):  # the gaps are about 1.3-2.5: alpha' grows below them, shrinks above
        # with SAC's soft backup the rest of the loss is SAC's own
        pol = _cql_sac_policy(cql_alpha=2.0, lagrangian=True, target_action_gap=tau, backup_entropy=True)
        batch = _hand_batch(pol)
        sac_loss, _ = SACPolicy.loss(pol, batch)
        _hand_batch(pol)  # the same draws again
        loss, st = pol.loss(batch)
        log_ap = pol.log_alpha_prime
        assert float(log_ap.detach()) == pytest.approx(math.log(2.0)) and st["cql_alpha"] == pytest.approx(2.0)
        # critics: alpha' (gap_j - tau) summed; the multiplier: -alpha' mean_j (gap_j - tau)
        assert st["cql_loss"] == pytest.approx(2.0 * (gap1 + gap2 - 2 * tau), rel=1e-5)
        assert st["lagrange_loss"] == pytest.approx(-2.0 * ((gap1 + gap2) / 2 - tau), rel=1e-5)
        assert float((loss - sac_loss).detach()) == pytest.approx(st["cql_loss"] + st["lagrange_loss"], rel=1e-5)
        (grad,) = torch.autograd.grad(loss, [log_ap])
        assert float(grad) == pytest.approx(-2.0 * ((gap1 + gap2) / 2 - tau), rel=1e-5)  # d/d log alpha'


def test_cql_sac_samples_three_proposals_and_splits_the_optimizer():
    import math

    import torch
    from flowkit_sac.sac import squashed_gaussian
    pol = _cql_sac_policy(num_actions=4, actor_lr=1e-5, lr=2e-4)
    obs, next_obs = torch.tensor([[0.3], [-0.7]]), torch.tensor([[0.1], [0.9]])
    g = pol.generator.get_state()
    a, log_mu = pol.sampled_actions(obs, next_obs)
    assert a.shape == (2, 12, 1) and log_mu.shape == (2, 12)
    assert ((a >= -1) & (a <= 1)).all()
    torch.testing.assert_close(log_mu[:, :4], torch.full((2, 4), -math.log(2.0)))  # uniform on [-1, 1]: density 1/2
    # then 4 draws of pi(.|s) and 4 of pi(.|s'), with their own log-densities
    pol.generator.set_state(g)
    torch.rand(8, 1, generator=pol.generator)
    for k, o in enumerate((obs, next_obs)):
        o4 = o.repeat_interleave(4, 0)
        ak, lk = squashed_gaussian(pol.model.actor(o4), pol.noise(o4))
        torch.testing.assert_close(a[:, 4 + 4 * k:8 + 4 * k].reshape(8, 1), ak.detach())
        torch.testing.assert_close(log_mu[:, 4 + 4 * k:8 + 4 * k].reshape(8), lk.detach())
    # one Adam, three segments: critics and temperature at lr, the actor at actor_lr
    assert [g["lr"] for g in pol.optimizer.param_groups] == [2e-4, 1e-5, 2e-4]
    n_critic = sum(p.numel() for p in pol.model.critic.parameters())
    assert pol.optimizer.segments[0] == slice(0, n_critic)


def test_cql_sac_actor_takes_a_fresh_adam_when_the_warm_start_ends():
    """Issue 48 item 16: the warm start (``bc_steps``) and SAC's actor loss are two objectives;
    the first SAC step of the actor starts its Adam afresh (one step on its gradient g: step 1,
    m = 0.1 g, v = 0.001 g^2, a move of about actor_lr per weight), the critics' Adam goes on.
    With the cloning's moments kept, the small second moment of a fitted warm start made the
    first SAC steps several times actor_lr each, all one way, and lost the fit."""
    import torch

    from flowkit.core import batch as sb
    from flowkit.core.learner import Learner
    pol = _cql_sac_policy(num_actions=2, bc_steps=3, lr=1e-3, actor_lr=1e-3, tune_alpha=False)
    g = torch.Generator().manual_seed(0)

    def step() -> None:
        b = {sb.OBS: torch.rand(8, 1, generator=g) * 2 - 1, sb.NEXT_OBS: torch.rand(8, 1, generator=g) * 2 - 1,
             sb.ACTIONS: torch.rand(8, 1, generator=g) * 2 - 1, sb.REWARDS: torch.rand(8, generator=g),
             sb.TERMINATEDS: torch.zeros(8, dtype=torch.bool)}
        loss, _ = pol.loss(b)
        Learner.step(pol, loss)
        pol.num_updates += 1
    for _ in range(3):
        step()
    assert [float(pol.optimizer.state[i]["step"]) for i in (0, 1)] == [3.0, 3.0]
    step()  # the first step of SAC's actor loss
    critic, actor = pol.optimizer.state[0], pol.optimizer.state[1]
    grad = pol._flat.grad[pol.optimizer.segments[1]]
    assert float(critic["step"]) == 4.0 and float(actor["step"]) == 1.0
    torch.testing.assert_close(actor["exp_avg"], 0.1 * grad)
    torch.testing.assert_close(actor["exp_avg_sq"], 0.001 * grad.pow(2))
    step()
    assert float(actor["step"]) == 2.0  # once only


def test_cql_sac_warm_start_takes_bc_lr_then_the_actor_takes_actor_lr():
    """Issue 48 item 16: ``bc_lr`` is the actor's learning rate for the ``bc_steps`` warm start,
    ``actor_lr`` after it. Adam's first step moves every weight with a nonzero gradient by its
    learning rate (m_hat / sqrt(v_hat) = sign g), so the actor's largest move is 1e-3 on the
    first warm-start step and 1e-5 on the first SAC step (Adam restarted); the critics keep lr."""
    import torch

    from flowkit.core import batch as sb
    from flowkit.core.learner import Learner
    pol = _cql_sac_policy(num_actions=2, bc_steps=2, lr=2e-4, actor_lr=1e-5, bc_lr=1e-3, tune_alpha=False)
    g = torch.Generator().manual_seed(0)
    actor = pol.optimizer.segments[1]

    def step() -> float:
        b = {sb.OBS: torch.rand(8, 1, generator=g) * 2 - 1, sb.NEXT_OBS: torch.rand(8, 1, generator=g) * 2 - 1,
             sb.ACTIONS: torch.rand(8, 1, generator=g) * 2 - 1, sb.REWARDS: torch.rand(8, generator=g),
             sb.TERMINATEDS: torch.zeros(8, dtype=torch.bool)}
        before = pol._flat.detach()[actor].clone()
        loss, _ = pol.loss(b)
        Learner.step(pol, loss)
        pol.num_updates += 1
        return float((pol._flat.detach()[actor] - before).abs().max())
    assert step() == pytest.approx(1e-3, rel=1e-3)
    assert [g["lr"] for g in pol.optimizer.param_groups] == [2e-4, 1e-3]  # (no temperature segment: tune_alpha=false)
    step()
    assert step() == pytest.approx(1e-5, rel=1e-3)  # the first SAC step
    assert [g["lr"] for g in pol.optimizer.param_groups] == [2e-4, 1e-5]


@pytest.fixture(scope="module")
def box_mixed_dataset(tmp_path_factory):
    """2,000 transitions of flowkit.testing's target env: 30 % from the best policy (a = x),
    70 % from the worst (a = -x)."""
    from offline_envs import TargetExpert

    from flowkit.testing.envs import BOX

    class AntiTarget:
        def compute_actions(self, obs, explore=False):
            return -np.asarray(obs, np.float32).reshape(-1, 1)
    path = str(tmp_path_factory.mktemp("offline") / "box-mixed-v0")
    record_episodes(TargetExpert(), {"factory": BOX.factory}, path, steps=600, seed=0)
    record_episodes(AntiTarget(), {"factory": BOX.factory}, path, steps=1400, seed=100, append=True)
    return path


@pytest.mark.slow
def test_cql_sac_beats_bc_on_a_mixed_box_dataset(tmp_path, box_mixed_dataset):
    # 1,000 gradient steps each (75 s on a busy 2-core machine: slow). BC fits one Gaussian to both modes (a mean near -0.4 x: about 4 of 8); CQL's critics rank
    # a = x above a = -x and the actor follows them (8 of 8 at best)
    got = {}
    for algo, extra in (("bc", ()), ("cql_sac", ("cql_sac.cql_alpha=1.0", "cql_sac.actor_lr=1e-3",
                                                 "cql_sac.lr=1e-3", "cql_sac.num_actions=4"))):
        res = flowkit.train(local_overrides(str(tmp_path / algo), f"algo={algo}", *extra,
                                            "env.factory=flowkit.testing.envs:target", f"input.dataset={box_mixed_dataset}",
                                            "seed=0", "stop.env_steps=64000", f"{algo}.train_batch_size=64",
                                            "run.min_iter_env_steps=16000", "evaluation.final=true",
                                            "evaluation.episodes=20"), verbose=False)
        got[algo] = res.metrics["evaluation_return_mean"]
    assert got["bc"] <= 5.5 and got["cql_sac"] >= 7.0, got


def test_conformance_cql_sac(tmp_path, box_mixed_dataset):
    # its learning check is the test above (a few hundred gradient steps; the conformance run takes tens)
    from flowkit_offline.cql import CQLSAC

    from flowkit.testing import check_algorithm
    from flowkit.testing.envs import BOX
    out = check_algorithm(CQLSAC, [f"input.dataset={box_mixed_dataset}", "cql_sac.train_batch_size=64",
                                   "cql_sac.num_actions=2"], env=BOX, checks=("config", "plan", "checkpoint"),
                          learn_env_steps=2000, tmp_dir=str(tmp_path))
    assert "DatasetReader" in out["plan"] and "UpdateTargetNetwork" in out["plan"]
    policy = flowkit.Algorithm.from_checkpoint(str(tmp_path / "ckpt")).get_policy()  # exports as any trained policy
    assert policy.num_updates > 0
    export_policy(policy, "torchscript", str(tmp_path / "cql_sac.pt"), check=64)


@pytest.mark.parametrize("case,says", [
    ("50 MB", "its metadata.json is 47.7 MiB, over the 16 MiB a dataset's metadata (spaces, counts) may take"),
    ("a space not a string", "not a readable Minari dataset (AssertionError: metadata.json: `observation_space` must "
                             "be str)"),
])
def test_oversized_or_mistyped_dataset_metadata_is_one_line_with_its_reason(tmp_path, capsys, cartpole_dataset,
                                                                            case, says):
    """Issue 48 item 17: a metadata.json of 50 MB was refused with the reason `(AssertionError: )`."""
    import json

    from flowkit.cli import main
    shutil.copytree(cartpole_dataset, tmp_path / "ds")
    meta = tmp_path / "ds" / "data" / "metadata.json"
    m = json.loads(meta.read_text())
    if case == "50 MB":
        m["notes"] = "x" * 50_000_000
    else:
        m["observation_space"] = {"type": "Box", "shape": [4]}
    meta.write_text(json.dumps(m))
    rc = main(["train", "algo=bc", "env=CartPole-v1", f"input.dataset={tmp_path / 'ds'}", "runtime.backend=local",
               f"run.dir={tmp_path / 'run'}", "stop.env_steps=100"])
    err = capsys.readouterr().err
    assert rc == 2 and err == f"flowkit: config error: input.dataset='{tmp_path / 'ds'}': {says}\n"


def test_an_offline_run_evaluates_at_its_end_by_default_so_its_summary_has_a_return(tmp_path, capsys,
                                                                                    cartpole_dataset):
    """Issue 48 item 10: docs/offline.md's first command ended with `episode_return_mean=nan`, an
    offline run plays no episodes; evaluation.final (null) is on for runs without rollout workers."""
    base = ["algo=bc", "env=CartPole-v1", f"input.dataset={cartpole_dataset}", "stop.env_steps=512",
            "evaluation.episodes=2"]
    res = flowkit.train(local_overrides(str(tmp_path / "a"), *base))
    out = capsys.readouterr().out
    assert res.metrics["final_evaluation"] is True and res.metrics["evaluation_return_mean"] > 0
    assert f"evaluation_return_mean={res.metrics['evaluation_return_mean']:.4g}" in out and "=nan" not in out
    res = flowkit.train(local_overrides(str(tmp_path / "b"), *base, "evaluation.final=false"), verbose=False)
    assert "evaluation_return_mean" not in res.metrics
