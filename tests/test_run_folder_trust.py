"""Issue 28, item 1: a run folder is data; its callables need your consent. Reading a run
folder (evaluate, export, plot, resume, a multi-agent `checkpoint=` opponent,
Algorithm.from_checkpoint) never imports or calls a callable its config names unless an
installed flowkit plugin provides it, the user passes --trust-config / trust_config=True, or
gives the same key again; `${...}` interpolations in a loaded config are refused."""
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

import flowkit
from flowkit._trust import UntrustedConfigError, is_trusted
from flowkit.checkpoint import find_checkpoint
from flowkit.evaluation import evaluate
from flowkit.testing import local_overrides

FLOWKIT = [sys.executable, "-m", "flowkit.cli"]
TINY = ["algo=ppo", "runtime.num_workers=1", "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=16",
        "ppo.train_batch_size=32", "ppo.minibatch_size=16", "ppo.num_epochs=1", "stop.iterations=1"]
LIB = {"trustmods.py": "import gymnasium as gym\n\n\ndef cartpole(**kw):\n    return gym.make('CartPole-v1', **kw)\n",
       # importing it leaves a marker: the proof that a refused config imported nothing
       "evilplugin.py": "import os\nopen(os.environ.get('FK_MARKER', os.devnull), 'w').write('imported')\n"}


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("lib")
    for name, text in LIB.items():
        (d / name).write_text(text)
    sys.path.insert(0, str(d))
    yield str(d)
    sys.path.remove(str(d))


@pytest.fixture(scope="module")
def untrusted_run(lib, tmp_path_factory):
    """A tiny PPO run whose env comes from a factory no flowkit plugin provides."""
    run = str(tmp_path_factory.mktemp("trust") / "run")
    flowkit.train(local_overrides(run, "env.factory=trustmods:cartpole", *TINY), verbose=False)
    return run


def _copy(run, tmp_path, **edits):
    """A copy of ``run`` with ``edits`` ({dotted key: value}) in every config.yaml."""
    dst = str(tmp_path / "copy")
    shutil.copytree(run, dst)
    for root, _, names in os.walk(dst):
        if "config.yaml" in names:
            path = os.path.join(root, "config.yaml")
            with open(path) as f:
                cfg = yaml.safe_load(f)
            for key, v in edits.items():
                node = cfg
                *parents, last = key.split(".")
                for p in parents:
                    node = node.setdefault(p, {})
                node[last] = v
            with open(path, "w") as f:
                yaml.safe_dump(cfg, f)
    return dst


def test_python_api_refuses_an_untrusted_factory_and_consent_allows_it(untrusted_run):
    for fn in (lambda **kw: flowkit.Algorithm.from_checkpoint(untrusted_run, **kw),
               lambda **kw: evaluate(untrusted_run, episodes=1, **kw)):
        with pytest.raises(UntrustedConfigError) as e:
            fn()
        msg = str(e.value)
        assert "\n" not in msg and "`env.factory` names 'trustmods:cartpole'" in msg and "--trust-config" in msg, msg
        assert os.path.join(find_checkpoint(untrusted_run), "config.yaml") in msg
    algo = flowkit.Algorithm.from_checkpoint(untrusted_run, trust_config=True)
    assert algo.compute_actions([[0.0, 0.0, 0.0, 0.0]]).shape == (1,)
    assert evaluate(untrusted_run, episodes=1, trust_config=True)["episodes"] == 1


def test_resume_needs_consent_the_same_value_again_or_trust_config(untrusted_run, tmp_path):
    run = _copy(untrusted_run, tmp_path)
    with pytest.raises(UntrustedConfigError, match=r"`env.factory` names 'trustmods:cartpole'"):
        flowkit.train([f"resume={run}", "stop.iterations=2"], verbose=False)
    assert flowkit.train([f"resume={run}", "stop.iterations=2", "env.factory=trustmods:cartpole"],
                         verbose=False).metrics["iteration"] == 2
    assert flowkit.train([f"resume={run}", "stop.iterations=3"], verbose=False,
                         trust_config=True).metrics["iteration"] == 3


def test_plugins_and_model_class_are_refused_before_anything_is_imported(untrusted_run, tmp_path, monkeypatch):
    marker = str(tmp_path / "IMPORTED")
    monkeypatch.setenv("FK_MARKER", marker)
    sys.modules.pop("evilplugin", None)
    for key, value, shown in (("plugins", ["evilplugin"], "`plugins[0]` names 'evilplugin'"),
                              ("model.class", "evilplugin:Net", "`model.class` names 'evilplugin:Net'")):
        run = _copy(untrusted_run, tmp_path / key, **{key: value, "env.factory": "flowkit.testing.envs:match"})
        for fn in (lambda: flowkit.Algorithm.from_checkpoint(run),
                   lambda: flowkit.train([f"resume={run}", "stop.iterations=2"], verbose=False)):
            with pytest.raises(UntrustedConfigError, match=re.escape(shown)):
                fn()
        assert not os.path.exists(marker) and "evilplugin" not in sys.modules


def test_a_multiagent_opponent_checkpoint_naming_a_model_class_is_refused(untrusted_run, tmp_path, monkeypatch):
    from flowkit.engine import load_config, setup
    marker = str(tmp_path / "IMPORTED")
    monkeypatch.setenv("FK_MARKER", marker)
    sys.modules.pop("evilplugin", None)
    run = _copy(untrusted_run, tmp_path)
    state = os.path.join(find_checkpoint(run), "state.pt")
    st = torch.load(state, weights_only=True)
    st["policy_specs"]["default"]["model"] = {"class": "evilplugin:Net"}
    torch.save(st, state)
    pytest.importorskip("pettingzoo")
    with pytest.raises(UntrustedConfigError, match=r"state.pt: `policy_specs.default.model.class` names 'evilplugin:Net'"):
        setup(*reversed(load_config(local_overrides(
            str(tmp_path / "ma"), "env.factory=flowkit.testing.envs:turn_game", "multiagent.mapping.p0=me",
            "multiagent.mapping.p1=opp", f"multiagent.policies.opp.checkpoint={run}"))))
    assert not os.path.exists(marker) and "evilplugin" not in sys.modules


def test_what_installed_plugins_provide_is_trusted():
    flowkit.get_plugin_manager()
    assert is_trusted("flowkit.testing.envs:match") and is_trusted("flowkit.testing:flaky_env")
    assert is_trusted("pettingzoo.classic.tictactoe_v3:env") and is_trusted("mpe2.simple_tag_v3:parallel_env")
    assert is_trusted("flowkit_multiagent:")  # a plugin module
    for bad in ("os:system", "flowkit_ppo:os.system", "flowkit_multiagent.specs:os.system", "subprocess:run",
                "pettingzoo.utils:save_observation", "flowkit_ppo_evil:x", "flowkit.cli:main"):
        assert not is_trusted(bad), bad


ATTACKS = {"os:system": {"env.factory": "os:system", "env.kwargs": {"command": "touch {marker}"}},
           "oc.env": {"env.kwargs": {"render_mode": "${oc.env:FK_SECRET}"}}}
COMMANDS = {"evaluate": ["evaluate", "{run}", "episodes=1"], "export": ["export", "{run}", "--format", "torchscript"],
            "resume": ["train", "resume={run}", "stop.iterations=2"], "plot": ["plot", "{run}", "--out", "{tmp}/p.png"]}


@pytest.mark.parametrize("attack", ATTACKS)
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.slow
def test_security_a_tampered_run_folder_runs_nothing(untrusted_run, tmp_path, attack, command):
    """The acceptance test: a config naming os:system (which would write a marker file) or an
    ${oc.env:...} interpolation, through evaluate, export, resume and plot: no marker, the
    secret never printed; evaluate, export and resume refuse in one line (exit 2); plot never
    calls a config's callables nor resolves it."""
    marker = str(tmp_path / "PWNED")
    edits = {k: ({kk: vv.replace("{marker}", marker) for kk, vv in v.items()} if isinstance(v, dict) else v)
             for k, v in ATTACKS[attack].items()}
    run = _copy(untrusted_run, tmp_path, **edits)
    args = [a.format(run=run, tmp=tmp_path) for a in COMMANDS[command]]
    env = dict(os.environ, FK_SECRET="s3cr3t-value", MPLBACKEND="Agg")
    p = subprocess.run(FLOWKIT + args, capture_output=True, text=True, timeout=300, env=env, cwd=str(tmp_path))
    out = p.stdout + p.stderr
    assert not os.path.exists(marker), out
    assert "s3cr3t-value" not in out and "Traceback" not in out, out
    if command == "plot":
        assert p.returncode == 0, out
        assert "s3cr3t-value" not in open(str(tmp_path / "p.csv")).read()
        return
    assert p.returncode == 2, out
    line = p.stderr.strip()
    assert "\n" not in line, line
    if attack == "os:system":
        assert "`env.factory` names 'os:system'" in line and "--trust-config" in line, line
    else:
        assert "`env.kwargs.render_mode` holds the interpolation '${oc.env:FK_SECRET}'" in line, line
