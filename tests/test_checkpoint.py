"""Checkpoints are data (issue 15, part 5): state.pt holds plain data loaded with
``weights_only=True``; classes are named by their registered names; config.yaml holds only
the sections a run uses; a pickle payload is refused, never run."""
import os
import pickle
import shutil
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

import flowkit
from flowkit.testing import local_overrides
from flowkit.checkpoint import (RunFolderError, find_checkpoint, from_plain, load_state, space_from_dict,
                                space_to_dict, to_plain)
from flowkit.core import batch as sb
from flowkit.engine import load_config, setup

HERE = os.path.dirname(os.path.abspath(__file__))
TINY_PPO = ["runtime.num_workers=1", "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=16",
            "ppo.minibatch_size=16", "ppo.num_epochs=1"]
OBS = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, -2.0], [-0.3, 0.95, 7.0]], np.float32)


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    """A tiny PPO run on Pendulum (Box actions: compute_actions gives floats to compare)
    made while an unrelated algorithm (``my_ppo``) is registered in code."""
    import ckpt_algos as plugin
    flowkit.register(plugin)
    try:
        run_dir = str(tmp_path_factory.mktemp("ppo") / "run")
        res = flowkit.train(local_overrides(run_dir, "algo=ppo", "env=Pendulum-v1", *TINY_PPO, "stop.iterations=2"))
        assert "my_ppo" not in res.config and "ppo" in res.config  # a config holds its run's algorithm sections
    finally:
        flowkit.unregister(plugin)
    return res


# ---- plain data ---------------------------------------------------------------------------------
def test_plain_data_round_trip_and_objects_refused():
    st = {"a": np.arange(6, dtype=np.uint32).reshape(2, 3), "b": (1, 2.5, "x", None, True),
          "c": [np.float32(1.5), np.int64(3), np.bool_(True)], "d": {0: torch.ones(2)},
          "rng": np.random.default_rng(1).bit_generator.state, "e": np.zeros((0, 4), np.float16)}
    plain = to_plain(st)
    back = from_plain(plain)
    assert back["a"].dtype == np.uint32 and np.array_equal(back["a"], st["a"])
    assert back["b"] == (1, 2.5, "x", None, True) and back["c"] == [1.5, 3, True]
    assert type(back["c"][1]) is int and torch.equal(back["d"][0], torch.ones(2))
    assert back["rng"] == st["rng"] and back["e"].shape == (0, 4) and back["e"].dtype == np.float16
    with pytest.raises(TypeError, match=r"state\['x'\]\[1\] is a flowkit.core.batch.SampleBatch"):
        to_plain({"x": [1, sb.SampleBatch({"obs": np.zeros(2)})]})
    with pytest.raises(TypeError, match=r"state\['s'\] is a builtins.set"):
        to_plain({"s": {1, 2}})


def test_spaces_are_stored_as_descriptions():
    s = gym.spaces
    spaces = [s.Box(-1.0, 2.0, (3, 2)), s.Box(np.array([0, -1], np.float64), np.array([1, 5], np.float64), dtype=np.float64),
              s.Discrete(5, start=-2), s.MultiDiscrete([3, 4]), s.MultiBinary(4), s.MultiBinary([2, 3]),
              s.Dict({"z": s.Discrete(2), "a": s.Box(0, 1, (2,))}, sort_keys=False),
              s.Tuple([s.Discrete(3), s.Box(0, 255, (2, 2), np.uint8)])]
    for sp in spaces:
        d = from_plain(torch.load(_saved(to_plain(space_to_dict(sp))), weights_only=True))
        back = space_from_dict(d)
        assert back == sp and type(back) is type(sp) and str(back) == str(sp)
    assert list(space_from_dict(space_to_dict(spaces[6])).spaces) == ["z", "a"]  # key order kept
    with pytest.raises(TypeError, match="Text space"):
        space_to_dict(s.Text(5))


def _saved(obj):
    import io
    b = io.BytesIO()
    torch.save(obj, b)
    b.seek(0)
    return b


# ---- state.pt and config.yaml -------------------------------------------------------------------
def test_state_is_plain_data_and_config_holds_only_used_sections(ppo_run):
    path = os.path.join(ppo_run.checkpoint, "state.pt")
    raw = torch.load(path, weights_only=True, map_location="cpu")  # no object inside
    assert raw["format"] == 2
    spec = raw["policy_specs"]["default"]
    assert spec["algo"] == "ppo" and spec["observation_space"]["type"] == "Box"
    assert spec["config"]["num_epochs"] == 1
    for f in (os.path.join(ppo_run.checkpoint, "config.yaml"), os.path.join(ppo_run.run_dir, "config.yaml")):
        text = open(f).read()
        assert "\nppo:" in text
        for other in ("dqn:", "impala:", "random:", "my_ppo:", "multiagent:"):
            assert f"\n{other}" not in text, (f, other)
    # my_ppo is no longer registered: the checkpoint still loads and resumes
    algo = flowkit.Algorithm.from_checkpoint(ppo_run.run_dir)
    assert algo.compute_actions(OBS[0]).shape == (1,)


def test_resume_after_the_unrelated_algorithm_is_gone(ppo_run, tmp_path):
    run = str(tmp_path / "copy")
    shutil.copytree(ppo_run.run_dir, run)
    res = flowkit.train(["resume=" + run, "stop.iterations=3", "run.reporters=[csv,checkpoint,evaluation]"])
    assert res.metrics["iteration"] == 3 and res.metrics["env_steps_sampled"] == 96


def test_resume_of_a_run_whose_stop_condition_was_met_trains_nothing(ppo_run, tmp_path):
    run = str(tmp_path / "copy")
    shutil.copytree(ppo_run.run_dir, run)
    before = sorted(os.listdir(os.path.join(run, "checkpoints")))
    res = flowkit.train(["resume=" + run])  # its config: stop.iterations=2, reached
    assert res.stop_reason == "stop.iterations=2 already reached at the checkpoint; nothing trained"
    assert res.metrics["iteration"] == 2 and len(res.history) == 2
    assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == before


@pytest.mark.slow
def test_fresh_process_loads_through_the_entry_point_with_the_same_actions(ppo_run, tmp_path):
    parent = flowkit.Algorithm.from_checkpoint(ppo_run.run_dir).compute_actions(OBS, explore=False)
    out = str(tmp_path / "actions.npy")
    code = ("import sys, numpy as np, flowkit\n"
            f"algo = flowkit.Algorithm.from_checkpoint({ppo_run.run_dir!r})\n"
            "assert not [m for m in sys.modules if m.startswith(('test_', 'conftest', 'ckpt_'))]\n"
            "assert type(algo).__module__.startswith('flowkit_ppo'), type(algo)\n"
            f"np.save({out!r}, algo.compute_actions(np.array({OBS.tolist()!r}, np.float32), explore=False))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    child = np.load(out)
    assert child.dtype == parent.dtype and np.array_equal(child, parent)


# ---- refused: payloads, old checkpoints, missing algorithms ---------------------------------------
class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant(run: str, marker: str, raw_pickle: bool) -> str:
    """Replace the state.pt of every checkpoint of ``run`` with a payload."""
    ck_root = os.path.join(run, "checkpoints")
    for d in os.listdir(ck_root):
        path = os.path.join(ck_root, d, "state.pt")
        evil = {"format": 2, "iteration": 99, "x": _Payload(marker)}
        if raw_pickle:
            with open(path, "wb") as f:
                pickle.dump(evil, f)
        else:
            torch.save(evil, path)
    return path


@pytest.mark.parametrize("raw_pickle", [False, True])
def test_a_pickle_payload_in_state_pt_is_refused_not_run(ppo_run, tmp_path, raw_pickle):
    run = str(tmp_path / "run")
    shutil.copytree(ppo_run.run_dir, run)
    marker = str(tmp_path / "PWNED")
    path = _plant(run, marker, raw_pickle)
    ck = os.path.dirname(path)
    attempts = {
        "resume": lambda: flowkit.train(["resume=" + run, "stop.iterations=3", "run.reporters=[csv,plot,checkpoint,evaluation]"]),
        "from_checkpoint": lambda: flowkit.Algorithm.from_checkpoint(run),
        "from_checkpoint(folder)": lambda: flowkit.Algorithm.from_checkpoint(ck),
        "find_checkpoint": lambda: find_checkpoint(run),
        "load_state": lambda: load_state(path),
        "multiagent checkpoint": lambda: setup(*reversed(load_config(local_overrides(
            str(tmp_path / "ma"), "env.factory=ma_envs:ScoutTankEnv", "multiagent.mapping.scout=scout_pol",
            "multiagent.mapping.tank=tank_pol", f"multiagent.policies.tank_pol.checkpoint={run}")))),
    }
    for what, fn in attempts.items():
        with pytest.raises(flowkit.ConfigError) as e:
            fn()
        msg = str(e.value)
        assert path in msg and "refused" in msg and "\n" not in msg, (what, msg)
        assert not os.path.exists(marker), what
    with pytest.raises(flowkit.ConfigError, match="refused"):  # the CLI path of `flowkit plan`
        flowkit.describe_plan(["env.factory=ma_envs:ScoutTankEnv", "multiagent.mapping.scout=scout_pol",
                               "multiagent.mapping.tank=tank_pol", f"multiagent.eval_opponents.tank_pol={run}"])
    assert not os.path.exists(marker)
    pickle.loads(pickle.dumps(_Payload(marker)))  # the payload is real: unpickling runs it
    assert os.path.exists(marker)


def test_an_old_checkpoint_is_refused_naming_the_file(ppo_run, tmp_path):
    run = str(tmp_path / "run")
    shutil.copytree(ppo_run.run_dir, run)
    ck = find_checkpoint(run)
    path = os.path.join(ck, "state.pt")
    st = torch.load(path, weights_only=True)
    st["format"] = 1
    torch.save(st, path)
    with pytest.raises(RunFolderError, match=r"in format 1, not 2") as e:
        flowkit.Algorithm.from_checkpoint(run)
    assert path in str(e.value)
    from flowkit.core.workers import PolicySpec  # format 1 pickled spec objects
    st["policy_specs"] = {"default": PolicySpec(object, gym.spaces.Discrete(2), gym.spaces.Discrete(2), None, "ppo")}
    torch.save(st, path)
    with pytest.raises(RunFolderError, match=r"refused: it holds pickled objects.*PolicySpec") as e:
        flowkit.train(["resume=" + run, "stop.iterations=3", "run.reporters=[csv,plot,checkpoint,evaluation]"])
    assert path in str(e.value)


@pytest.mark.slow
def test_an_algorithm_that_is_not_registered_fails_in_one_line(tmp_path):
    run = str(tmp_path / "run")
    res = flowkit.train(local_overrides(run, "plugins=[ckpt_algos]", "algo=my_ppo", "env=Pendulum-v1",
                                        *[o.replace("ppo.", "my_ppo.") for o in TINY_PPO], "stop.iterations=1"))
    text = open(os.path.join(res.checkpoint, "config.yaml")).read()
    assert "\nmy_ppo:" in text and "\nppo:" not in text and "ckpt_algos" in text
    # the config names the plugin module: a fresh process that trusts the run folder imports it and loads
    code = (f"import flowkit; a = flowkit.Algorithm.from_checkpoint({run!r}, trust_config=True); "
            "print(type(a).__name__, type(a.get_policy()).__name__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env())
    assert proc.returncode == 0 and proc.stdout.split() == ["MyPPO", "PPOPolicy"], proc.stderr[-3000:]
    # so does resume, without naming the module again
    res2 = flowkit.train(["resume=" + run, "stop.iterations=2", "run.reporters=[csv,checkpoint,evaluation]"],
                         trust_config=True)
    assert res2.metrics["iteration"] == 2 and res2.config.algo == "my_ppo"
    text = open(os.path.join(res2.checkpoint, "config.yaml")).read()
    # a checkpoint whose config does not name the module: one line naming the algorithm and the fixes
    cfg = os.path.join(res2.checkpoint, "config.yaml")
    with open(cfg, "w") as f:
        f.write(text.replace("- ckpt_algos", "").replace("plugins:\n", "plugins: []\n"))
    for fn in (lambda: flowkit.Algorithm.from_checkpoint(run, trust_config=True),
               lambda: flowkit.train(["resume=" + run, "stop.iterations=2", "run.reporters=[csv,plot,checkpoint,evaluation]"],
                                     trust_config=True)):
        with pytest.raises(RunFolderError) as e:
            fn()
        msg = str(e.value)
        assert "\n" not in msg and "'my_ppo'" in msg and "module `ckpt_algos`" in msg, msg
        assert "entry-point group `flowkit`" in msg and "plugins=[module]" in msg and "flowkit.register" in msg
    # the class itself in hand: no registration needed
    from ckpt_algos import MyPPO
    algo = MyPPO.from_checkpoint(run)
    assert type(algo) is MyPPO and algo.compute_actions(OBS[0]).shape == (1,)


def test_impala_replay_state_is_plain_and_exact():
    from flowkit.core.flow import FlowContext
    from flowkit_impala.impala import MixInReplay
    rep = MixInReplay(FlowContext(), 1.5, 4, seed=3)
    for i in range(3):
        b = sb.MultiAgentBatch({"default": sb.SampleBatch({"obs": np.full((2, 3), i, np.float32),
                                                          "t": np.arange(2)})}, 2, meta={"weights_version": i})
        rep(b)
    st = from_plain(torch.load(_saved(to_plain(rep.get_state())), weights_only=True))
    rep2 = MixInReplay(FlowContext(), 1.5, 4, seed=0)
    rep2.set_state(st)
    new = sb.MultiAgentBatch({"default": sb.SampleBatch({"obs": np.ones((2, 3), np.float32), "t": np.arange(2)})}, 2)
    out1, out2 = rep(new), rep2(new)
    assert len(out1) == len(out2) >= 2
    for a, b in zip(out1, out2):
        assert a.env_steps == b.env_steps and a.meta == b.meta
        assert all(np.array_equal(a["default"][k], b["default"][k]) and a["default"][k].dtype == b["default"][k].dtype
                   for k in a["default"])


def test_multiagent_checkpoint_names_every_policy_by_its_algorithm(tmp_path):
    run = str(tmp_path / "run")
    res = flowkit.train(local_overrides(run, "env.factory=ma_envs:TinyTurnGame", "runtime.num_workers=1",
                                        "runtime.num_envs_per_worker=1", "runtime.rollout_fragment_length=4",
                                        "multiagent.mapping.p0=learner", "multiagent.mapping.p1=opp",
                                        "multiagent.policies.opp.algo=random", "stop.iterations=1"))
    specs = torch.load(os.path.join(res.checkpoint, "state.pt"), weights_only=True)["policy_specs"]
    assert {p: d["algo"] for p, d in specs.items()} == {"learner": "ppo", "opp": "random"}
    assert specs["opp"]["extra"]["agents"] == ("p1",) and specs["opp"]["extra"]["trainable"] is False
    text = open(os.path.join(res.checkpoint, "config.yaml")).read()
    for used in ("ppo:", "random:", "multiagent:"):
        assert f"\n{used}" in text, used
    assert "\ndqn:" not in text and "\nimpala:" not in text
    algo = flowkit.Algorithm.from_checkpoint(run, trust_config=True)  # env.factory from the tests' folder
    assert {p: type(pol).__name__ for p, pol in algo.policies.items()} == {"learner": "PPOPolicy",
                                                                            "opp": "RandomPolicy"}


# ---- integrity (issue 13, part 7: the parts that live in this module) ------------------------------
def test_resume_skips_an_unreadable_checkpoint_naming_it(ppo_run, tmp_path):
    run = str(tmp_path / "run")
    shutil.copytree(ppo_run.run_dir, run)
    good = find_checkpoint(run)
    newer = os.path.join(run, "checkpoints", "iter_000009")
    shutil.copytree(good, newer)
    with open(os.path.join(newer, "state.pt"), "r+b") as f:  # truncated, as a full disk leaves it
        f.truncate(200)
    with pytest.warns(UserWarning, match=r"skipped an unreadable checkpoint: .*iter_000009/state.pt"):
        assert find_checkpoint(run) == good


def test_a_failed_checkpoint_write_names_the_folder_and_keeps_the_previous(tmp_path, monkeypatch):
    from flowkit.checkpoint import save_checkpoint
    from flowkit.engine import build_plan
    run = str(tmp_path / "run")
    pm, cfg = load_config(local_overrides(run, "algo=ppo", "env=CartPole-v1", *TINY_PPO))
    ctx = setup(cfg, pm, run)
    plan = build_plan(ctx)
    next(plan)
    ctx.iteration = 1
    first = save_checkpoint(ctx, run)

    def full_disk(*a, **k):
        raise RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file")
    monkeypatch.setattr(torch, "save", full_disk)
    ctx.iteration = 2
    with pytest.raises(OSError, match=r"cannot write checkpoint '.*iter_000002'.*earlier checkpoints are kept"):
        save_checkpoint(ctx, run)
    monkeypatch.undo()
    assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == ["iter_000001"]
    assert find_checkpoint(run) == first and load_state(first)["iteration"] == 1
    ctx.iteration = 1  # the same tag again replaces it
    assert save_checkpoint(ctx, run) == first and sorted(os.listdir(os.path.join(run, "checkpoints"))) == ["iter_000001"]
    ctx.shutdown()


def test_a_truncated_checkpoint_is_named_corrupt(tmp_path):
    """A state.pt cut short (a crash mid-copy) is reported as corrupt or truncated, not as a
    file of pickled objects."""
    import torch

    from flowkit.checkpoint import load_state
    full = str(tmp_path / "full.pt")
    torch.save({"format": 2, "w": torch.zeros(100)}, full)
    data = open(full, "rb").read()
    cut = str(tmp_path / "state.pt")
    open(cut, "wb").write(data[: len(data) // 2])
    with pytest.raises(RunFolderError, match=r"state\.pt' is corrupt or truncated"):
        load_state(cut)
