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


@pytest.mark.parametrize("algo", ["bc", "marwil"])
def test_offline_resume_is_exact(tmp_path, match_dataset, algo):
    base = ["env.factory=flowkit.testing.envs:match", f"algo={algo}", f"input.dataset={match_dataset}", "seed=0",
            f"{algo}.train_batch_size=64", "input.shuffle_buffer_size=300", "evaluation.interval=0"]
    whole = flowkit.train(local_overrides(str(tmp_path / "whole"), *base, "stop.env_steps=2560"), verbose=False)
    flowkit.train(local_overrides(str(tmp_path / "part"), *base, "stop.env_steps=1280"), verbose=False)
    resumed = flowkit.train([f"resume={tmp_path / 'part'}", "stop.env_steps=2560"], verbose=False)
    # 2,000 rows an epoch: 31 batches of 64, one of 16, then 9 of the second epoch
    assert whole.metrics["env_steps_trained"] == resumed.metrics["env_steps_trained"] == 2576
    a = flowkit.Algorithm.from_checkpoint(whole.run_dir).get_policy().get_state()
    b = flowkit.Algorithm.from_checkpoint(resumed.run_dir).get_policy().get_state()
    for k in a["weights"]:
        np.testing.assert_array_equal(a["weights"][k], b["weights"][k], err_msg=k)
    if algo == "marwil":
        assert a["ma_sqd_adv_norm"] == b["ma_sqd_adv_norm"]


@pytest.mark.parametrize("algo", ["bc", "marwil", "cql_dqn"])
def test_conformance(tmp_path, match_dataset, algo):
    from flowkit_offline import BC, CQLDQN, MARWIL

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
    from flowkit_offline import BC
    from offline_envs import TargetExpert

    from flowkit.testing import check_algorithm
    from flowkit.testing.envs import BOX
    path = str(tmp_path / "target-v0")
    record_episodes(TargetExpert(), {"factory": BOX.factory}, path, steps=2000, seed=0)
    out = check_algorithm(BC, [f"input.dataset={path}", "bc.train_batch_size=64"], env=BOX, checks=("learn",),
                          learn_env_steps=8000, tmp_dir=str(tmp_path))
    assert out["learn_return"] >= BOX.solved  # 6.4 of 8; random play about 2.7
