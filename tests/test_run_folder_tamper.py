"""Issue 28, items 2 and 7: every tampered or unreadable part of a run folder is one line naming
the file and what is wrong, never a traceback (exit 1: a damaged run; exit 2: what the user
gave), through `flowkit evaluate`, `export` and `train resume=`; checkpoint contents checked on
load (layout, spaces bounded before allocation, weight shapes, finiteness, the algorithm the
run names); a truncated state.pt is reported as truncated wherever it is cut; a killed
writer's temporary files are removed on the next start."""
import os
import shutil

import numpy as np
import pytest
import torch

import flowkit
from flowkit.checkpoint import RunFolderError, digest, find_checkpoint, load_state
from flowkit.cli import main
from flowkit.testing import local_overrides

TINY = ["algo=ppo", "env.factory=flowkit.testing.envs:match", "runtime.num_workers=1",
        "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=8", "ppo.train_batch_size=16",
        "ppo.minibatch_size=8", "ppo.num_epochs=1", "stop.iterations=1"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    run = str(tmp_path_factory.mktemp("tamper") / "run")
    flowkit.train(local_overrides(run, *TINY), verbose=False)
    return run


def _state(run, change, keep_digest=False):
    """Change the newest state.pt; its digest rewritten to match (a crafted file) unless
    ``keep_digest`` (bytes flipped on disk)."""
    path = os.path.join(find_checkpoint(run), "state.pt")
    st = torch.load(path, weights_only=True)
    change(st)
    if not keep_digest and isinstance(st.get("policies"), dict):
        st["digests"] = {"policies": digest(st["policies"])}
    torch.save(st, path)


def _weights(st):
    return st["policies"]["default"]["weights"]


def _text(name, text):
    def tamper(run):
        with open(os.path.join(find_checkpoint(run), name), "w") as f:
            f.write(text)
    return tamper


def _set_space(d):
    return lambda run: _state(run, lambda st: st["policy_specs"]["default"].__setitem__("observation_space", d))


def _nan(st):
    w = _weights(st)["twin.w0"]["__ndarray__"]
    w[0, 0] = float("nan")


def _wrong_shape(st):
    _weights(st)["twin.w0"] = {"__ndarray__": torch.zeros(3, 3)}


TAMPERS = {  # name: (tamper, exit of evaluate/export, exit of resume (0: resume rebuilds it from the env), the line)
    "no config.yaml": (lambda run: os.remove(os.path.join(find_checkpoint(run), "config.yaml")), 1, 1,
                       "config.yaml' does not exist"),
    "invalid YAML": (_text("config.yaml", "algo: [ppo\n"), 1, 1, "config.yaml' is not valid YAML: line 2, column 1"),
    "a !!python tag": (_text("config.yaml", "algo: !!python/object/apply:os.system ['echo pwned']\n"), 1, 1,
                       "config.yaml' is not valid YAML: line 1, column 7: could not determine a constructor"),
    "a list at the top": (_text("config.yaml", "- 1\n"), 1, 1, "config.yaml' must hold a mapping at the top"),
    "an empty config.yaml": (_text("config.yaml", ""), 1, 1, "config.yaml: `algo` is missing, not an algorithm name"),
    "an unknown key": (lambda run: open(os.path.join(find_checkpoint(run), "config.yaml"), "a").write("nope: 1\n"),
                       1, 2, "unknown config key `nope`"),
    "iteration not an int": (lambda run: _state(run, lambda st: st.__setitem__("iteration", "abc")), 1, 1,
                             "state.pt' is damaged: `iteration` is 'abc', not an int >= 0"),
    "no policies": (lambda run: _state(run, lambda st: st.pop("policies")), 1, 1,
                    "state.pt' is damaged: `policies` is missing"),
    "a negative Discrete n": (_set_space({"type": "Discrete", "n": -3, "start": 0, "dtype": "int64"}), 1, 0,
                              "Discrete n -3: ints >= 1 expected"),
    "a 100000x100000 mask": (_set_space({"type": "MultiBinary", "n": [100000, 100000]}), 1, 0,
                             "a MultiBinary space of 10000000000 elements (at most 16777216)"),
    "weights of the wrong shape": (lambda run: _state(run, _wrong_shape), 1, 2, "does not fit"),
    "NaN weights": (lambda run: _state(run, _nan), 1, 1,
                    "state.pt' is damaged: policy 'default' weight 'twin.w0' holds 1 non-finite values"),
    "another algorithm's state": (lambda run: _state(run, lambda st: st["policy_specs"]["default"].__setitem__(
        "algo", "dqn")), 1, 2, "was trained by 'dqn'"),
    "an empty state.pt": (_text("state.pt", ""), 1, 1, "state.pt' is corrupt or truncated (0 bytes"),
}
SURFACES = {"evaluate": lambda run, tmp: ["evaluate", run, "episodes=1"],
            "export": lambda run, tmp: ["export", run, "format=torchscript", f"out={tmp / 'p.pt'}"],
            "resume": lambda run, tmp: ["train", f"resume={run}", "stop.iterations=2"]}


@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize("case", TAMPERS)
def test_a_tampered_run_folder_is_one_line(tiny_run, tmp_path, capsys, case, surface):
    tamper, code, resume_code, says = TAMPERS[case]
    run = str(tmp_path / "run")
    shutil.copytree(tiny_run, run)
    tamper(run)
    capsys.readouterr()
    rc = main(SURFACES[surface](run, tmp_path))
    err = capsys.readouterr().err.strip()
    assert rc == (resume_code if surface == "resume" else code), err
    if rc == 0:  # the spaces a resume uses come from the env, not from state.pt
        return
    assert "\n" not in err and says in err, err
    if surface == "resume":  # a damaged run folder is an error (exit 1), what the user gave a config error (2)
        assert err.startswith("flowkit: config error: " if rc == 2 else "flowkit: error: "), err
    if surface == "resume" and case != "weights of the wrong shape":
        assert not os.path.exists(os.path.join(run, "checkpoints", "iter_000002"))


@pytest.mark.parametrize("content,says", [(b"\x00\xff\xfe\x89PNG\x00\x00" * 64, "not a UTF-8 text file"),
                                          (b"iteration,x\n1," + b"a" * 200000 + b"\n", "not a metrics.csv"),
                                          (None, "larger than a run's metrics.csv may be")])
def test_a_binary_or_oversized_metrics_csv_on_resume_is_one_line(tiny_run, tmp_path, capsys, monkeypatch,
                                                                 content, says):
    run = str(tmp_path / "run")
    shutil.copytree(tiny_run, run)
    if content is None:
        monkeypatch.setattr("flowkit.reporters.MAX_METRICS_BYTES", 64)
    else:
        with open(os.path.join(run, "metrics.csv"), "wb") as f:
            f.write(content)
    capsys.readouterr()
    rc = main(["train", f"resume={run}", "stop.iterations=2"])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and "\n" not in err and f"{run}/metrics.csv: " in err and says in err, err


def test_a_truncated_state_pt_is_named_truncated_wherever_it_is_cut(tiny_run, tmp_path):
    """(Before: a cut in the archive's central directory, or an empty file, was reported as a
    file of pickled objects.)"""
    data = open(os.path.join(find_checkpoint(tiny_run), "state.pt"), "rb").read()
    cut = str(tmp_path / "state.pt")
    for n in [0, 1, 100, len(data) // 2, len(data) - 300, len(data) - 100, len(data) - 10, len(data) - 1]:
        with open(cut, "wb") as f:
            f.write(data[:n])
        with pytest.raises(RunFolderError, match=r"state\.pt' is corrupt or truncated") as e:
            load_state(cut)
        assert e.value.exit_status == 1, n


def test_a_state_without_its_policies_does_not_resume_from_fresh_weights(tiny_run, tmp_path, capsys):
    run = str(tmp_path / "run")
    shutil.copytree(tiny_run, run)

    def drop(st):
        st["policies"], st["policy_specs"] = {}, {}
    _state(run, drop)
    capsys.readouterr()
    assert main(["train", f"resume={run}", "stop.iterations=2"]) == 1
    err = capsys.readouterr().err.strip()
    assert "holds no state for policy 'default'" in err and "\n" not in err, err


def test_a_checkpoint_of_another_run_in_the_run_folder_is_refused(tiny_run, tmp_path, capsys):
    """A whole checkpoint folder (state.pt and config.yaml) of a DQN run copied among a PPO
    run's: (before) resume silently turned the run into DQN."""
    run = str(tmp_path / "run")
    shutil.copytree(tiny_run, run)
    ck = find_checkpoint(run)
    cfg = os.path.join(ck, "config.yaml")
    text = open(cfg).read()
    assert "algo: ppo" in text
    with open(cfg, "w") as f:
        f.write(text.replace("algo: ppo", "algo: dqn"))
    for argv in (["train", f"resume={run}", "stop.iterations=2"], ["evaluate", run, "episodes=1"]):
        capsys.readouterr()
        assert main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert "does not belong to its run folder: its config.yaml says algo='dqn'" in err and "\n" not in err, err


def test_a_killed_writers_temporary_files_are_removed_on_the_next_start(tiny_run, tmp_path):
    run = str(tmp_path / "run")
    shutil.copytree(tiny_run, run)
    left = [os.path.join(run, "checkpoints", ".tmp-abc123"), os.path.join(run, "checkpoints", ".tmp-old-x")]
    for d in left:
        os.makedirs(d)
        open(os.path.join(d, "state.pt"), "wb").write(b"PK\x03\x04half")
    open(os.path.join(run, "metrics.csv.tmp"), "w").write("iteration\n1\n")
    open(os.path.join(run, ".config.yaml.tmp-999"), "w").write("algo: ppo\n")
    left.append(os.path.join(run, ".config.yaml.tmp-999"))
    res = flowkit.train([f"resume={run}", "stop.iterations=2", "checkpoint.at_end=false",
                         "checkpoint.every_iters=100"], verbose=False)
    assert res.metrics["iteration"] == 2
    assert not any(os.path.exists(p) for p in left + [os.path.join(run, "metrics.csv.tmp")])
    assert np.isfinite(res.metrics["episode_return_mean"])


def test_flipped_bytes_in_the_weights_are_found_by_the_digest(tiny_run, tmp_path, capsys):
    """(Before: weights pushed to 2.4e24 by flipped bytes were evaluated and exported, exit 0.)"""
    run = str(tmp_path / "run")
    shutil.copytree(tiny_run, run)
    assert "digests" in torch.load(os.path.join(find_checkpoint(run), "state.pt"), weights_only=True)

    def flip(st):
        _weights(st)["twin.w0"]["__ndarray__"][0, 0] = 2.4e24  # the digest written with it is kept
    _state(run, flip, keep_digest=True)
    for argv in (["evaluate", run, "episodes=1"], ["export", run, "format=onnx", f"out={tmp_path / 'p.onnx'}"],
                 ["train", f"resume={run}", "stop.iterations=2"]):
        capsys.readouterr()
        assert main(argv) == 1, argv
        err = capsys.readouterr().err.strip()
        assert "state.pt' is damaged: its policies do not match the digest written with them" in err, err
    assert not os.path.exists(str(tmp_path / "p.onnx"))


def test_a_full_disk_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    from flowkit._outputs import OutputError, write_text
    path = str(tmp_path / "result.json")
    write_text(path, '{"iteration": 1}')

    def full(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OutputError, match=r"cannot write .*result.json: No space left"):
        write_text(path, '{"iteration": 2}')
    assert open(path).read() == '{"iteration": 1}' and os.listdir(str(tmp_path)) == ["result.json"]