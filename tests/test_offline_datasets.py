"""Datasets that must not reach training (issue 48): contents that contradict the dataset's spaces
or themselves, corrupt values and bytes, each refused before the run folder is made with one line
naming the dataset, the episode and the field; flowkit record's signals, caps and output paths;
datasets made by Minari's own DataCollector."""
from __future__ import annotations

import json
import os
import shutil
import signal

import numpy as np
import pytest

pytest.importorskip("minari")
pytest.importorskip("flowkit_offline")

import h5py  # noqa: E402
from offline_envs import BoundaryPolicy, CartPoleExpert  # noqa: E402

import flowkit  # noqa: E402
from flowkit._guard import Interrupted  # noqa: E402
from flowkit.cli import exit_status, main  # noqa: E402
from flowkit.config import ConfigError  # noqa: E402
from flowkit.datasets import (  # noqa: E402
    COLUMNS_DIR,
    DatasetWriter,
    check_contents,
    open_dataset,
    record_episodes,
)
from flowkit.testing import local_overrides  # noqa: E402

BOUNDARY = {"factory": "offline_envs:boundary"}
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """600 steps of the scripted CartPole expert on 3 sub-envs: 3 episodes of 200 steps (cut)."""
    path = str(tmp_path_factory.mktemp("datasets") / "base-v0")
    res = record_episodes(CartPoleExpert(), {"id": "CartPole-v1"}, path, steps=600, seed=0, num_envs=3)
    assert res["episodes"] == 3 and [len(e) for e in open_dataset(path).iterate_episodes()] == [200] * 3
    return path


def _damaged(tmp_path, base, what):
    """A copy of ``base`` whose episode 1 (or every episode) is damaged as ``what`` says, at its
    step (or observation) 100."""
    path = str(tmp_path / "ds")
    shutil.copytree(base, path)
    with h5py.File(os.path.join(path, "data", "main_data.hdf5"), "a") as f:
        g = f["episode_1"]

        def put(key, data):  # rewritten without flowkit's checksums, as another tool would
            del g[key]
            g.create_dataset(key, data=data)
            g.attrs.pop("flowkit_sha256", None)
        obs, act, rew = g["observations"][()], g["actions"][()], g["rewards"][()]
        if what == "obs_width3":
            put("observations", obs[:, :3])
        elif what == "obs_strings":
            put("observations", obs.astype("S12"))
        elif what in ("actions_7", "actions_-1"):
            act[100] = int(what.split("_")[1])
            put("actions", act)
        elif what == "actions_one_short":
            put("actions", act[:-1])
        elif what == "actions_float":
            put("actions", act + 0.25)
        elif what == "obs_nan":
            obs[100, 1] = np.nan
            put("observations", obs)
        elif what == "rewards_nan":
            rew[100] = np.nan
            put("rewards", rew)
        elif what == "all_terminal":  # rewritten (no checksum: as Minari's own writers leave a dataset)
            for k in f:
                t = f[k]["terminations"][()]
                del f[k]["terminations"]
                f[k].create_dataset("terminations", data=np.ones_like(t))
                f[k].attrs.pop("flowkit_sha256", None)
        elif what == "flip":  # 64 bytes inverted in the middle of episode 1's observations, in place
            d = g["observations"]
            chunk = d.id.get_chunk_info(0)
            mid = chunk.byte_offset + chunk.size // 2
    if what == "flip":
        with open(os.path.join(path, "data", "main_data.hdf5"), "r+b") as fh:
            fh.seek(mid)
            b = fh.read(64)
            fh.seek(mid)
            fh.write(bytes(x ^ 0xFF for x in b))
    return path


def _train(tmp_path, capsys, path, algo):
    mix = ["input.mix=0.5", "dqn.learning_starts=32"] if algo == "dqn" else []
    rc = main(["train", "--no-tuned", f"algo={algo}", "env=CartPole-v1", f"input.dataset={path}", *mix,
               "runtime.backend=local", f"run.dir={tmp_path / 'run'}", "stop.env_steps=256"])
    return rc, capsys.readouterr().err


BOX4 = "Box((4,), float32)"


@pytest.mark.parametrize("algo", ["bc", "dqn"])  # dqn: input.mix=0.5, the dataset mixed into its replay
@pytest.mark.parametrize("what,says", [
    ("obs_width3", f"episode 1: observations of shape (3,) per row, not (4,) (numbers of {BOX4})"),
    ("obs_strings", f"episode 1: observations are |S12 values, not numbers of {BOX4}"),
    ("actions_7", "episode 1, step 100: actions = 7 is outside [0, 1] (Discrete(2))"),
    ("actions_-1", "episode 1, step 100: actions = -1 is outside [0, 1] (Discrete(2))"),
    ("actions_one_short", "episode 1: actions hold 199 rows for its 200 steps (200 expected: one per step)"),
])
def test_contradictory_dataset_is_one_line_before_the_run_folder(tmp_path, capsys, base, what, says, algo):
    """Issue 48 item 2: these passed the load check, then crashed training after the run folder
    was made (61-73-line tracebacks), or trained on (DQN with input.mix)."""
    path = _damaged(tmp_path, base, what)
    rc, err = _train(tmp_path, capsys, path, algo)
    assert (rc, err) == (2, f"flowkit: config error: input.dataset={path!r}: {says}\n")
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("what,algo,says", [
    ("flip", "bc", "main_data.hdf5: episode 1's observations are not what flowkit wrote (their sha256 differs: the "
                   "file was changed or damaged since)"),
    ("actions_float", "bc", "episode 1: actions are float64 values, not whole numbers of Discrete(2)"),
    ("all_terminal", "bc", "episode 0, step 0: terminated, but the episode goes on to 200 steps (an episode ends at "
                           "its first terminated or truncated step)"),
    ("obs_nan", "dqn", "episode 1, observation 100: observations[1] = nan is not finite"),
    ("rewards_nan", "dqn", "episode 1, step 100: rewards = nan is not finite"),
])
def test_corrupt_dataset_is_one_line_before_the_run_folder(tmp_path, capsys, base, what, algo, says):
    """Issue 48 item 3: these were accepted silently (the NaNs in the input.mix path)."""
    path = _damaged(tmp_path, base, what)
    rc, err = _train(tmp_path, capsys, path, algo)
    assert (rc, err) == (2, f"flowkit: config error: input.dataset={path!r}: {says}\n")
    assert not os.path.exists(tmp_path / "run")


def test_values_are_checked_at_every_load_not_only_when_the_copy_is_written(tmp_path, base):
    # the columnar copy is flowkit's cache; a NaN written into it later is found on the next load
    path = str(tmp_path / "ds")
    shutil.copytree(base, path)
    check_contents(path, open_dataset(path))  # writes the copy, checks it
    col = np.load(os.path.join(path, COLUMNS_DIR, "c3.npy"), mmap_mode="r+")
    assert col.shape == (603, 4)  # c3: observations (rewards, terminations, truncations come first)
    col[205, 2] = np.nan  # episode 1's observation 4 (episode 0 holds rows 0-200)
    col.flush()
    del col
    with pytest.raises(ConfigError, match=r"episode 1, observation 4: observations\[2\] = nan is not finite$"):
        check_contents(path, open_dataset(path))


def test_legitimate_datasets_pass(tmp_path):
    # one-step episodes each terminated; a dataset without flowkit's checksums (as Minari's own
    # writers leave it); both checked through the columnar copy and through Minari
    from gymnasium import spaces
    path = str(tmp_path / "bandit-v0")
    w = DatasetWriter(path, spaces.Box(-1.0, 1.0, (2,), np.float32), spaces.Discrete(3))
    for i in range(5):
        w.add(i, [np.zeros(2, np.float32), np.ones(2, np.float32)], [i % 3], [1.0], [True], [False])
    w.close()
    with h5py.File(os.path.join(path, "data", "main_data.hdf5"), "a") as f:
        assert sorted(json.loads(f["episode_0"].attrs["flowkit_sha256"])) == [  # written with each episode
            "actions", "observations", "rewards", "terminations", "truncations"]
        for k in ("episode_3", "episode_4"):
            del f[k].attrs["flowkit_sha256"]
    for columns in (True, False):
        check_contents(path, open_dataset(path), columns=columns)


def test_a_minari_datacollector_dataset_trains(tmp_path, monkeypatch):
    """Issue 48 item 5: a dataset written by Minari 0.5.4's own DataCollector (Pendulum-v1, two
    episodes of random actions, the second cut at 5 steps: tests/data/minari; made with
    minari[create], whose jax flowkit does not install) passes the checks, by its Minari id."""
    root = tmp_path / "minari"
    shutil.copytree(os.path.join(HERE, "data", "minari"), root)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    ds = open_dataset("pendulum/datacollector-v0")
    assert (ds.total_episodes, ds.total_steps) == (2, 205)
    res = flowkit.train(local_overrides(str(tmp_path / "run"), "algo=bc", "env=Pendulum-v1",
                                        "input.dataset=pendulum/datacollector-v0", "stop.env_steps=512",
                                        "evaluation.interval=0"), verbose=False)
    assert res.metrics["env_steps_trained"] >= 512


def test_docs_say_how_datacollector_datasets_are_made():
    """Issue 48 item 5: docs/offline.md said DataCollector datasets work, but the set-up cannot
    make them (its DataCollector needs jax: `minari[create]`, about 380 MB installed)."""
    with open(os.path.join(HERE, "..", "docs", "offline.md"), encoding="utf-8") as f:
        text = " ".join(f.read().split())
    assert "pip install 'minari[create]'" in text and "jax" in text
    assert "reading them needs only what the set-up installs" in text


# ---- flowkit record ---------------------------------------------------------------------------
class _SignalAt(BoundaryPolicy):
    """BoundaryPolicy that sends this process SIGTERM on its ``at``-th call (one call a step;
    SIGTERM: SIGINT and SIGHUP stay ignored where the tests run in the background or under nohup)."""

    def __init__(self, at):
        self.at, self.calls = at, 0

    def compute_actions(self, obs, explore=False):
        self.calls += 1
        if self.calls == self.at:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().compute_actions(obs, explore)


def test_record_keeps_the_finished_episodes_on_a_signal(tmp_path):
    """Issue 48 item 4: SIGTERM left a dataset of 0 episodes and a 0-byte HDF5 file (the
    episodes that had ended were dropped; a rerun had to delete it)."""
    out = str(tmp_path / "d-v0")
    # one sub-env, seeds 0, 1, 2, ...: episodes of 2, 3, 4, 5 steps; the 11th step is episode 3's second
    with pytest.raises(Interrupted) as e:
        record_episodes(_SignalAt(11), BOUNDARY, out, episodes=100_000, seed=0, num_envs=1)
    assert e.value.reason == (f"interrupted (SIGTERM); {out!r} holds 3 episodes, 9 steps (the episodes that ended "
                              "before it)")
    assert exit_status(e.value.reason) == 143
    ds = open_dataset(out)
    check_contents(out, ds)
    assert [len(ep) for ep in ds.iterate_episodes()] == [2, 3, 4]
    # a signal before any episode ended: nothing is left behind, the same command runs again
    out2 = str(tmp_path / "e-v0")
    with pytest.raises(Interrupted) as e:
        record_episodes(_SignalAt(2), BOUNDARY, out2, episodes=10, seed=0, num_envs=1)
    assert e.value.reason == f"interrupted (SIGTERM); no episode had ended: nothing written ({out2!r} removed)"
    assert not os.path.exists(out2)
    assert record_episodes(BoundaryPolicy(), BOUNDARY, out2, episodes=2, seed=0)["episodes"] == 2


def test_a_signal_during_a_write_waits_until_it_is_done(tmp_path):
    # the episodes being written when SIGTERM comes are written whole (with their checksums), then it is raised
    from gymnasium import spaces

    from flowkit._guard import GUARD
    w = DatasetWriter(str(tmp_path / "w-v0"), spaces.Box(-1.0, 1.0, (2,), np.float32), spaces.Discrete(3))
    w.add(0, [np.zeros(2, np.float32)] * 3, [0, 1], [1.0, 2.0], [False, True], [False, False])
    write = w.storage.update_episodes

    def signalled(episodes):
        os.kill(os.getpid(), signal.SIGTERM)
        return write(episodes)
    w.storage.update_episodes = signalled
    with GUARD.running(), pytest.raises(Interrupted, match=r"^interrupted \(SIGTERM\)$"):
        w.flush()
    assert w.close() == (1, 2)  # written once, not again by the close that follows a signal
    ds = open_dataset(str(tmp_path / "w-v0"))
    assert (ds.total_episodes, ds.total_steps) == (1, 2)
    check_contents(str(tmp_path / "w-v0"), ds)


@pytest.mark.parametrize("arg,says", [("episodes=1e12", "episodes=1000000000000 must be in [1, 100000]"),
                                      ("steps=1e15", "steps=1000000000000000 must be in [1, 100000000]"),
                                      ("num_envs=5000", "num_envs=5000 must be in [1, 4096]")])
def test_record_caps_its_counts(arg, says, tmp_path, capsys):
    """Issue 48 item 4: episodes=1e12 and steps=1e15 were accepted (evaluate caps episodes at 100,000)."""
    from flowkit.cli import main
    assert main(["record", str(tmp_path), arg]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and says in err, err


def test_record_out_that_cannot_be_made_is_one_line(tmp_path, capsys):
    """Issue 48 item 4: `out=/proc/x` was a traceback (the folder looks writable to root)."""
    run = str(tmp_path / "run")
    flowkit.train(local_overrides(run, "algo=random", "env=CartPole-v1", "stop.env_steps=64",
                                  "evaluation.interval=0"), verbose=False)
    assert main(["record", run, "steps=10", "out=/proc/x/d-v0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flowkit record: error: out='/proc/x/d-v0': cannot create the dataset there (") \
        and err.count("\n") == 1, err
