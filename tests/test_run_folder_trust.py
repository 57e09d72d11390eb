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
           "oc.env": {"env.kwargs": {"render_mode": "${oc.env:FK_SECRET}"}},
           "this:": {"env.factory": "this:"}}  # importing `this` prints the Zen of Python
COMMANDS = {"evaluate": ["evaluate", "{run}", "episodes=1"], "export": ["export", "{run}", "format=torchscript"],
            "resume": ["train", "resume={run}", "stop.iterations=2"], "record": ["record", "{run}", "episodes=1",
                                                                                 "out={tmp}/ds"], "plot": ["plot", "{run}", "out={tmp}/p.png"]}


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
    assert "s3cr3t-value" not in out and "Traceback" not in out and "Beautiful is better" not in out, out
    if command == "plot":
        assert p.returncode == 0, out
        assert "s3cr3t-value" not in open(str(tmp_path / "p.csv")).read()
        return
    assert p.returncode == 2, out
    line = p.stderr.strip()
    assert "\n" not in line, line
    if attack in ("os:system", "this:"):
        assert f"`env.factory` names {attack.rstrip(':')!r}" in line and "--trust-config" in line, line
    else:
        assert "`env.kwargs.render_mode` holds the interpolation '${oc.env:FK_SECRET}'" in line, line


# Issue 48, item 1: every form of a name reaches the one resolver's gate. `evilpkg` (a package)
# and `evilplugin` leave a marker when imported; `mod:` (an empty attribute) was imported before.
FORMS = {"env.factory": ["evilplugin:", "evilplugin", "evilpkg.sub", "evilpkg.sub:", "evilpkg.sub:make",
                         "evilplugin:Net.build", " evilplugin: "],
         "model.class": ["evilplugin:", "evilplugin", "evilpkg.sub", "evilpkg.sub:Net"],
         "env.id": ["evilplugin:Evil-v0", "evilpkg.sub:Evil-v0"],
         "ppo.note": ["evilpkg.sub:"]}  # any other key: `mod:` and `mod:attr` count too
CASES = [(k, v) for k, vs in FORMS.items() for v in vs]


@pytest.fixture
def evil(lib, tmp_path, monkeypatch):
    """A package ``evilpkg`` (and module ``evilplugin``) whose import writes a marker file."""
    pkg = os.path.join(lib, "evilpkg")
    os.makedirs(pkg, exist_ok=True)
    for name in ("__init__.py", "sub.py"):
        with open(os.path.join(pkg, name), "w") as f:
            f.write(LIB["evilplugin.py"])
    marker = str(tmp_path / "IMPORTED")
    monkeypatch.setenv("FK_MARKER", marker)
    for m in ("evilplugin", "evilpkg", "evilpkg.sub"):
        sys.modules.pop(m, None)
    yield marker
    assert not os.path.exists(marker) and not {"evilplugin", "evilpkg", "evilpkg.sub"} & set(sys.modules)


def _commands(run, tmp_path):
    from flowkit.cli import main
    out = str(tmp_path / "out")
    return {"evaluate": lambda: main(["evaluate", run, "episodes=1"]),
            "export": lambda: main(["export", run, "format=torchscript", f"out={out}" + ".pt"]),
            "record": lambda: main(["record", run, "episodes=1", f"out={out}"]),
            "resume": lambda: main(["train", f"resume={run}", "stop.iterations=2"]),
            "from_checkpoint": lambda: flowkit.Algorithm.from_checkpoint(run)}


@pytest.mark.parametrize("key,value", CASES, ids=[f"{k}={v.strip()}" for k, v in CASES])
def test_c48_every_form_of_a_name_is_refused_before_any_import(untrusted_run, tmp_path, evil, key, value, capsys):
    run = _copy(untrusted_run, tmp_path, **{key: value, "env.factory": "flowkit.testing.envs:match"}
                if key != "env.factory" else {key: value})
    if key == "env.id":
        run = _copy(run, tmp_path / "noid", **{"env.factory": None})
    shown = value.strip()[:-1] if value.strip().endswith(":") else value.strip()
    if key == "env.id":
        shown = value.partition(":")[0]
    for name, fn in _commands(run, tmp_path).items():
        if name == "from_checkpoint":
            with pytest.raises(UntrustedConfigError, match=re.escape(f"`{key}` names {shown!r}")):
                fn()
            continue
        assert fn() == 2, name
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and f"`{key}` names {shown!r}" in err and "it was not imported" in err, (name, err)
    assert flowkit.cli.main(["plot", run, f"out={tmp_path / 'p.png'}"]) == 0  # plot reads no callable


def test_c48_a_multiagent_opponent_naming_a_module_form_is_refused(untrusted_run, tmp_path, evil):
    from flowkit.engine import load_config, setup
    pytest.importorskip("pettingzoo")
    for value in ("evilplugin:", "evilpkg.sub"):
        run = _copy(untrusted_run, tmp_path / value.replace(":", "_"))
        state = os.path.join(find_checkpoint(run), "state.pt")
        st = torch.load(state, weights_only=True)
        st["policy_specs"]["default"]["model"] = {"class": value}
        torch.save(st, state)
        with pytest.raises(UntrustedConfigError, match=re.escape(f"`policy_specs.default.model.class` names "
                                                                 f"{value.rstrip(':')!r}")):
            setup(*reversed(load_config(local_overrides(
                str(tmp_path / "ma"), "env.factory=flowkit.testing.envs:turn_game", "multiagent.mapping.p0=me",
                "multiagent.mapping.p1=opp", f"multiagent.policies.opp.checkpoint={run}"))))


@pytest.mark.parametrize("key,value", [("env.factory", "evilplugin:"), ("env.factory", "evilpkg.sub"),
                                       ("model.class", "evilplugin"), ("model.class", "evilpkg.sub")])
def test_c48_the_resolver_takes_module_attr_only_even_with_consent(untrusted_run, tmp_path, evil, key, value):
    """Consent does not widen the form: ``mod``, ``mod:`` and ``mod.attr`` are a config error
    from the one resolver, raised before anything is imported."""
    from flowkit.core.names import resolve
    with pytest.raises(flowkit.ConfigError, match=re.escape(f"{key}={value!r} must be of the form module:attr")):
        resolve(value, key)
    run = _copy(untrusted_run, tmp_path, **{key: value, "env.factory": "flowkit.testing.envs:match"}
                if key != "env.factory" else {key: value})
    with pytest.raises(flowkit.ConfigError, match=re.escape(f"{key}={value!r} must ")):  # (model.class: its pattern)
        flowkit.train([f"resume={run}", "stop.iterations=2"], verbose=False, trust_config=True)
