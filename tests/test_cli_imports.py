"""Issue 12, part 3: CLI commands that train nothing (``train --help``, ``plugins``, a config
error, also of ``plan`` and ``--dry-run``) import neither torch nor Ray: the plugins' metadata (config sections, descriptions)
is torch-free, the Algorithm classes are imported when a run builds them."""
import json
import subprocess
import sys

import pytest

import flowkit

CHECK = ("import json, sys\nfrom flowkit.cli import main\nrc = main(sys.argv[1:])\n"
         "print('\\nMODULES ' + json.dumps({'rc': rc, 'torch': 'torch' in sys.modules, 'ray': 'ray' in sys.modules}))")


@pytest.mark.parametrize("args,rc,text", [(["train", "--help"], 0, "ppo.clip_param"),
                                          (["plugins"], 0, "ppo: Proximal Policy Optimization"),
                                          (["train", "ppo.lr=-1"], 2, "ppo.lr=-1.0 must be finite and > 0"),
                                          (["plan", "ppo.clip_parm=0.1"], 2, "did you mean `ppo.clip_param`"),
                                          (["train", "algo=ppx"], 2, "did you mean `ppo`"),
                                          (["train", "env=Nope-v0", "runtime.backend=ray"], 2, "Environment `Nope`"),
                                          (["train", "env=CartPole-v1", "runtime.backend=ray", "runtime.num_workers=1000"], 2,
                                           "needs 1000 CPUs"),
                                          (["plot", "no/such/runs"], 2, "no run folder"),
                                          # cross-field and run-level checks (issue 12, part 3)
                                          (["train", "env=CartPole-v1", "env.factory=gymnasium:make"], 2,
                                           "give exactly one of env.id"),
                                          (["train", "runtime.backend=ray"], 2, "give exactly one of env.id"),
                                          (["train", "--no-tuned", "env=CartPole-v1", "runtime.backend=ray", "ppo.train_batch_size=64",
                                            "ppo.minibatch_size=128"], 2, "ppo.minibatch_size=128 is larger than"),
                                          (["train", "--no-tuned", "--dry-run", "env=CartPole-v1", "ppo.sde_sample_freq=0"], 2,
                                           "ppo.sde_sample_freq=0: use -1"),
                                          (["plan", "--no-tuned", "algo=a2c", "env=CartPole-v1", "a2c.lr_schedule=linear"], 2,
                                           "a2c.lr_schedule=linear needs a horizon"),
                                          (["train", "--no-tuned", "algo=dqn", "env=CartPole-v1", "runtime.backend=ray",
                                            "dqn.buffer_size=10"], 2, "dqn.train_batch_size=32 is larger than"),
                                          (["train", "--no-tuned", "algo=td3", "env=Pendulum-v1", "td3.buffer_size=10"], 2,
                                           "td3.train_batch_size=256 is larger than td3.buffer_size=10"),
                                          (["train", "--no-tuned", "algo=appo", "env=CartPole-v1", "runtime.backend=ray",
                                            "appo.lr_schedule=linear"], 2, "appo.lr_schedule=linear needs a horizon"),
                                          (["train", "env=CartPole-v1", "runtime.backend=ray", "run.reporters=[nope]"], 2,
                                           "unknown reporter 'nope'"),
                                          # issue 27 item 10: --version; an option for a key=value gets the hint
                                          (["--version"], 0, f"flowkit {flowkit.__version__}\n"),
                                          (["-V"], 0, f"flowkit {flowkit.__version__}\n"),
                                          (["evaluate", "no/such/run", "--episodes", "5"], 2, "write episodes=5"),
                                          (["train", "env=CartPole-v1", "--stop.env_steps=100"], 2,
                                           "write stop.env_steps=100"),
                                          (["train", "configs/ppo/CartPole-v1.yaml"], 2,
                                           "a config file goes after -c: `flowkit train -c FILE"),
                                          # a newcomer's tries (2026-12-06)
                                          (["train", "--lr", "1e-3"], 2, "write ppo.lr=1e-3"),
                                          (["train", "algo=dqn", "--lr=1e-3"], 2, "write dqn.lr=1e-3"),
                                          (["train", "--num_workers", "3"], 2, "write runtime.num_workers=3"),
                                          (["train", "algo=PPO", "env=CartPole-v1"], 2, "did you mean `ppo`"),
                                          (["train"], 2, "e.g. `flowkit train algo=ppo env=CartPole-v1`"),
                                          (["train", "--print-config", "stop.env_steps=1e5"], 2,
                                           "give exactly one of env.id"),
                                          (["train", "env=CartPole-v1", "run.reporters=[progress,csv"], 2,
                                           "must be a list, e.g. run.reporters=[progress,csv,plot,checkpoint,"),
                                          (["train", "algo=ppo", "env=ALE/Pong-v5", "runtime.backend=ray"], 2,
                                           "env.id='ALE/Pong-v5' is an Atari game: give it with env.preset=atari"),
                                          # a registered non-Atari env that fails to build is not "an Atari game"
                                          (["train", "algo=sac", "env=Hopper-v5", "env.kwargs.foo=1", "runtime.backend=ray"],
                                           2, "env.id='Hopper-v5': cannot build the env: TypeError"),
                                          (["--help"], 0, "Every config key with its type, allowed values, default "
                                                          "and doc: flowkit train --help"),
                                          (["tune", "seed=range(2)", "--episodes", "5", "mode=min"], 2,
                                           "unrecognised option --episodes: settings are key=value words, not "
                                           "--options; write episodes=5")])
def test_cli_without_training_imports_neither_torch_nor_ray(args, rc, text):
    p = subprocess.run([sys.executable, "-c", CHECK, *args], capture_output=True, text=True, timeout=120)
    out = json.loads(p.stdout.rsplit("MODULES ", 1)[1])
    assert out == {"rc": rc, "torch": False, "ray": False}, p.stderr[-2000:]
    assert text in p.stdout + p.stderr
    if rc == 2:
        assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_the_commands_warnings_are_one_line(tmp_path):
    """flowkit's own warnings through the command: `flowkit: warning: ...`, not Python's
    file:line form with a line of flowkit's source under it."""
    p = subprocess.run([sys.executable, "-m", "flowkit", "train", "env=CartPole-v1", "dqn.lr=1e-3", "stop.env_steps=64",
                        "runtime.backend=local", "runtime.num_workers=1", "runtime.num_envs_per_worker=1",
                        "run.reporters=[csv]", f"run.dir={tmp_path / 'run'}"],
                       capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr[-2000:]
    assert ("flowkit: warning: config section `dqn` (dqn.lr=0.001) is not used by this run, which trains with "
            "algo=ppo: it has no effect\n") in p.stderr
    assert "UserWarning" not in p.stderr and ".py:" not in p.stderr, p.stderr


def test_a_run_is_prepared_without_numpy_unless_it_records(tmp_path):
    """Issue 48 item 15: the checks before Ray starts load the dataset writer (and numpy with
    it) only for a run with ``run.output``; its checks still run there."""
    code = ("import sys\nfrom flowkit._prepare import prepare\nfrom flowkit import ConfigError\n"
            f"prepare(['env=CartPole-v1', 'runtime.backend=local', 'run.dir={tmp_path / 'a'}'])\n"
            "print('LOADED', 'flowkit.datasets' in sys.modules, 'numpy' in sys.modules)\n"
            f"open('{tmp_path / 'file'}', 'w').close()\n"
            f"try:\n    prepare(['env=CartPole-v1', 'runtime.backend=local', 'run.dir={tmp_path / 'b'}', "
            f"'run.output={tmp_path / 'file'}'])\nexcept ConfigError as e:\n    print('ERR', e)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "LOADED False False\n" in p.stdout, p.stderr[-2000:]
    assert f"ERR run.output= {str(tmp_path / 'file')!r} is a file, not a folder" in p.stdout, p.stderr[-2000:]


def test_train_raises_a_config_error_before_ray_starts():
    """``flowkit.train`` (torch is loaded with the engine) checks what needs no env before Ray."""
    code = ("import sys, flowkit\ntry:\n    flowkit.train(['env=CartPole-v1', 'runtime.backend=ray', 'algo=dqn',"
            " 'dqn.buffer_size=10'])\nexcept flowkit.ConfigError as e:\n    print('ERR', e, 'ray' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "ERR dqn.train_batch_size=32 is larger than dqn.buffer_size=10 False" in p.stdout, p.stderr[-2000:]


def test_an_algorithm_registered_as_a_class_or_a_ref():
    """Plugin authors may return the Algorithm class itself (loaded as it is) or an
    AlgorithmRef (its section without torch, the class imported on demand)."""
    from flowkit_ppo.ppo import PPO
    from flowkit_ppo import PPOConfig

    import flowkit

    class Plugin:
        @flowkit.hookimpl
        def flowkit_add_algorithms(self):
            return [type("Mine", (PPO,), {"name": "mine"})]

    pm = flowkit.get_plugin_manager(extra=[Plugin()])
    lazy = pm.algorithms(load=False)
    assert isinstance(lazy["ppo"], flowkit.AlgorithmRef) and lazy["mine"].name == "mine"
    assert pm.config_sections()["mine"] is PPOConfig
    algos = pm.algorithms()
    assert algos["ppo"] is PPO and algos["mine"].__mro__[1] is PPO
    bad = flowkit.get_plugin_manager(extra=[type("P", (), {"flowkit_add_algorithms": staticmethod(
        lambda: [flowkit.AlgorithmRef("nope", None, "flowkit_ppo.nothere:X")])})()])
    with pytest.raises(flowkit.PluginError, match="'nope': flowkit_ppo.nothere:X failed to import"):
        bad.algorithms()["nope"]  # imported when looked up: a run that does not use it never fails on it


def test_plugins_lists_every_plugin_and_what_it_contributes():
    """Issue 11, part 5: the multi-agent plugin (no algorithm) is listed too, with its config
    section, env runner and hooks; reporters and the built-in env runner appear."""
    p = subprocess.run([sys.executable, "-c", CHECK, "plugins"], capture_output=True, text=True, timeout=120)
    out = p.stdout
    assert json.loads(out.rsplit("MODULES ", 1)[1]) == {"rc": 0, "torch": False, "ray": False}
    ma = out.split("multiagent  [flowkit-multiagent", 1)[1].split("\n\n")[0]
    assert "config      multiagent.*:" in ma and "env runner  PettingZoo Parallel and AEC envs" in ma
    assert "hooks       flowkit_build_plan, flowkit_make_policy_specs" in ma
    assert "env runner  Gymnasium envs" in out and "reporter    csv: " in out
    assert "algorithm   dqn: Deep Q-Networks" in out


def test_plugins_prints_whole_first_sentences_without_rst_backticks(capsys):
    from flowkit.cli import main
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "``" not in out
    assert ("reporter    checkpoint: `checkpoint.every_iters` (after the row is written), `checkpoint.at_end` and the "
            "crash checkpoint; each calls `save_checkpoint` (which calls `flowkit_on_checkpoint`).\n") in out
    assert "algorithm   impala: asynchronous actor-learner with V-trace (Espeholt et al. 2018).\n" in out


def test_python_dash_m_flowkit_is_the_flowkit_command():
    """``python -m flowkit`` runs the same command line as the ``flowkit`` script: a bad
    subcommand is one line and exit 2; ``plugins`` lists the built-in algorithms."""
    p = subprocess.run([sys.executable, "-m", "flowkit", "nope"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "nope" in p.stderr, p.stderr
    p = subprocess.run([sys.executable, "-m", "flowkit", "plugins"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "ppo" in p.stdout and "maml" in p.stdout, p.stdout + p.stderr


def test_flowkit_train_builds_and_checks_the_run_once(monkeypatch, tmp_path):
    """Issue 22 item 2: one prepare(), shared by the CLI and flowkit.train: a `flowkit train`
    builds the plugin manager and the config once and checks the config and the CPUs once (they
    were built twice and checked three times: by the CLI, by train and by setup)."""
    import collections

    import flowkit._guard
    import flowkit._prepare
    import flowkit.config
    import flowkit.hooks
    from flowkit.cli import main
    calls: collections.Counter = collections.Counter()

    def count(mod, name):
        real = getattr(mod, name)

        def wrapper(*a, **k):
            calls[name] += 1
            return real(*a, **k)
        monkeypatch.setattr(mod, name, wrapper)
    for mod in (flowkit.config, flowkit._prepare):
        count(mod, "build_config")
        count(mod, "check_run")
    for mod in (flowkit._guard, flowkit._prepare):
        count(mod, "check_cpus")
    for mod in (flowkit.hooks, flowkit._prepare):
        count(mod, "get_plugin_manager")
    rc = main(["train", "--no-tuned", "algo=ppo", "env=CartPole-v1", "runtime.backend=local", "stop.iterations=1",
               "ppo.num_epochs=1", f"run.dir={tmp_path}/run", "run.reporters=[csv,checkpoint]"])
    assert rc == 0
    assert dict(calls) == {"build_config": 1, "check_run": 1, "check_cpus": 1, "get_plugin_manager": 1}


def test_a_single_agent_run_loads_no_pettingzoo(tmp_path):
    """Issue 48 item 15: the multi-agent plugin's hooks answer for a Gymnasium env without
    loading PettingZoo, its runners or VMAS (0.1-0.3 s of every rollout worker's start-up);
    a PettingZoo game still gets its runner."""
    code = ("import sys, flowkit\n"
            f"flowkit.train(['env=CartPole-v1', 'runtime.backend=local', 'stop.env_steps=64', 'run.reporters=[csv]', "
            f"'run.dir={tmp_path / 'a'}'], verbose=False)\n"
            "print('LOADED', sorted(m for m in ('pettingzoo', 'vmas', 'flowkit_multiagent.runners') if m in sys.modules))\n"
            "from mpe2 import simple_spread_v3\n"
            "from flowkit_multiagent import flowkit_make_env_runner\n"
            "print('RUNNER', flowkit_make_env_runner(simple_spread_v3.parallel_env(), None, None, None).__name__)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "LOADED []\n" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    assert "RUNNER ParallelEnvRunner\n" in p.stdout, p.stderr[-2000:]


def test_train_plan_and_plugins_read_their_words_as_every_command_does(tmp_path, capsys):
    """Issue 49 item 6: train, plan and plugins take their words through the one runner of every
    command (no argparse): flags given before the command, ``--config=FILE`` and ``-c FILE`` work as
    they did; a word that is no command is one line naming it."""
    from flowkit.cli import main
    (tmp_path / "c.yaml").write_text("env: CartPole-v1\nppo:\n  lr: 0.01\n")
    assert main(["--print-config", "train", f"--config={tmp_path / 'c.yaml'}", "--no-tuned", "seed=3"]) == 0
    out = capsys.readouterr().out
    assert "\n  lr: 0.01\n" in out and "\n  id: CartPole-v1\n" in out and "\nseed: 3\n" in out, out
    assert main(["plugins", "-c", str(tmp_path / "c.yaml")]) == 0
    assert "algorithm   ppo: " in capsys.readouterr().out
    assert main(["train", "-c", "--no-tuned"]) == 2
    assert capsys.readouterr().err == "flowkit: error: -c needs a FILE (flowkit train -c FILE)\n"
    with pytest.raises(SystemExit) as ei:
        main(["--no-tuned", "trian"])
    assert ei.value.code == 2 and capsys.readouterr().err == (
        "flowkit: error: argument command: invalid choice: 'trian' (choose from 'train', 'plan', 'plugins', "
        "'evaluate', 'export', 'record', 'plot', 'tune') (usage: flowkit --help)\n")
