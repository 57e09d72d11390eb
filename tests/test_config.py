"""Config: cases C08, C09, C10; CLI exit statuses, --help, --dry-run, plan."""
import dataclasses
import os
import subprocess
import sys
import warnings

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

import flowkit
from flowkit.testing import local_overrides
from flowkit import ConfigError
from flowkit.config import Allowed, _unwrap_optional, make_schema_class, schema_allowed, schema_keys
from flowkit.engine import describe_plan, load_config, setup


def cfg_of(*overrides, file=None):
    return load_config(list(overrides), file)[1]


def validate(*overrides):
    pm, cfg = load_config(list(overrides))
    return setup(cfg, pm)


# ---- C08 -------------------------------------------------------------------------------------
def test_c08_minibatch_larger_than_train_batch_fails_naming_both():
    with pytest.raises(ConfigError) as ei:
        validate("env=CartPole-v1", "ppo.train_batch_size=4", "ppo.minibatch_size=16")
    msg = str(ei.value)
    assert "ppo.minibatch_size=16" in msg and "ppo.train_batch_size=4" in msg


def test_c08_minibatch_zero_fails():
    with pytest.raises(ConfigError, match=r"ppo.minibatch_size=0 must be >= 1"):
        validate("env=CartPole-v1", "ppo.minibatch_size=0")


def test_c08_uneven_train_batch_warns_and_reports_actual_size(run_dir):
    ov = local_overrides(run_dir, "env=CartPole-v1", "runtime.num_workers=3", "runtime.num_envs_per_worker=1",
                         "runtime.rollout_fragment_length=3", "ppo.train_batch_size=10", "ppo.minibatch_size=4",
                         "stop.iterations=2")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        res = flowkit.train(ov)
    assert any("each train batch will hold 18 env steps" in str(x.message) for x in w)
    assert all(r["learner/default/train_batch_size"] == 18 for r in res.history)
    assert res.metrics["env_steps_trained"] == 36


# ---- C09 -------------------------------------------------------------------------------------
def test_c09_override_types(run_dir):
    cfg = cfg_of("env=CartPole-v1", "ppo.lr=1e-5", "ppo.gamma=1", "stop.env_steps=1e4", "stop.iterations=null")
    assert cfg.ppo.lr == 1e-05 and isinstance(cfg.ppo.lr, float)
    assert cfg.ppo.gamma == 1.0 and isinstance(cfg.ppo.gamma, float)
    assert cfg.stop.env_steps == 10000 and isinstance(cfg.stop.env_steps, int)
    assert cfg.stop.iterations is None
    res = flowkit.train(local_overrides(run_dir, "env=CartPole-v1", "ppo.lr=1e-5", "ppo.gamma=1",
                                        "stop.env_steps=1e4", "stop.iterations=1", "runtime.num_envs_per_worker=2",
                                        "runtime.rollout_fragment_length=8"))
    saved = yaml.safe_load(open(os.path.join(res.run_dir, "config.yaml")))
    assert saved["ppo"]["lr"] == 1e-05 and saved["ppo"]["gamma"] == 1.0
    assert saved["stop"]["env_steps"] == 10000 and saved["evaluation"]["interval"] == 0
    assert saved["stop"]["time_s"] is None


def test_c09_bad_value_names_key_type_and_value():
    with pytest.raises(ConfigError) as ei:
        cfg_of("env=CartPole-v1", "ppo.lr=abc")
    assert "ppo.lr" in str(ei.value) and "float" in str(ei.value) and "abc" in str(ei.value)
    with pytest.raises(ConfigError, match=r"`stop.env_steps` must be an int, got 1.5"):
        cfg_of("stop.env_steps=1.5")


# ---- C10 -------------------------------------------------------------------------------------
def test_c10_misspelt_key_suggests_the_right_one():
    with pytest.raises(ConfigError, match=r"unknown config key `ppo.clip_parm`; did you mean `ppo.clip_param`\?"):
        cfg_of("env=CartPole-v1", "ppo.clip_parm=0.1")
    with pytest.raises(ConfigError, match=r"unknown config key `xppo.ent_coef`; did you mean `ppo.ent_coef`\?"):
        cfg_of("env=CartPole-v1", "xppo.ent_coef=0")  # an unknown section: the key given under it too
    # a section's key given bare points to the run's algorithm's section (--lr's hint says `lr=`)
    with pytest.raises(ConfigError, match=r"unknown config key `lr`; did you mean `ppo.lr`\?"):
        cfg_of("env=CartPole-v1", "lr=1e-3")
    with pytest.raises(ConfigError, match=r"unknown config key `lr`; did you mean `dqn.lr`\?"):
        cfg_of("algo=dqn", "env=CartPole-v1", "lr=1e-3")
    with pytest.raises(ConfigError, match=r"unknown config key `num_workers`; did you mean `runtime.num_workers`\?"):
        cfg_of("env=CartPole-v1", "num_workers=1")


def test_c10_two_keys_for_one_thing_name_both():
    with pytest.raises(ConfigError) as ei:
        cfg_of("env=CartPole-v1", "env.id=Acrobot-v1")
    assert "env=CartPole-v1" in str(ei.value) and "env.id=Acrobot-v1" in str(ei.value)


class SneakyPPOPlugin:
    @flowkit.hookimpl
    def flowkit_add_algorithms(self):
        from flowkit_ppo.ppo import PPO

        class Sneaky(PPO):
            name = "sneaky"

            def training_flow(self, experiences, ctx, learner):
                _ = self.config.learning_rate_that_does_not_exist
                return super().training_flow(experiences, ctx, learner)
        return [Sneaky]


def test_c10_plugin_reading_undeclared_key_fails_at_plan_time():
    plugin = SneakyPPOPlugin()
    flowkit.register(plugin)
    try:
        with pytest.raises(ConfigError, match="learning_rate_that_does_not_exist"):
            describe_plan(["algo=sneaky", "env=CartPole-v1"])
    finally:
        flowkit.unregister(plugin)


def test_unknown_algorithm_and_env_are_config_errors():
    with pytest.raises(ConfigError, match=r"algo='ppp' is not an installed algorithm.*did you mean `ppo`"):
        validate("algo=ppp", "env=CartPole-v1")
    with pytest.raises(ConfigError, match=r"env.id='NoSuchEnv-v0': cannot build the env"):
        validate("env=NoSuchEnv-v0")
    # a registered env that fails to build gives its own cause (not "an Atari game", ale-py installed or not)
    with pytest.raises(ConfigError, match=r"env.id='CartPole-v1': cannot build the env: TypeError.*'foo'"):
        validate("env=CartPole-v1", "env.kwargs.foo=1")


def test_yaml_file_then_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("env: Acrobot-v1\nppo:\n  lr: 1e-3\nruntime:\n  num_workers: 3\n")
    cfg = cfg_of("runtime.num_workers=1", file=str(f))
    assert cfg.env.id == "Acrobot-v1" and cfg.ppo.lr == 1e-3 and cfg.runtime.num_workers == 1
    f.write_text("ppo:\n  lrr: 1\n")
    with pytest.raises(ConfigError, match="ppo.lrr"):
        cfg_of(file=str(f))


# ---- CLI -------------------------------------------------------------------------------------
def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "flowkit.cli", *args], capture_output=True, text=True, timeout=120)


def test_cli_config_error_exit_2_short_message_no_traceback():
    p = run_cli("train", "env=CartPole-v1", "ppo.clip_parm=0.1")
    assert p.returncode == 2
    assert "did you mean `ppo.clip_param`" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.slow
def test_cli_dry_run_plan_plugins_help():
    p = run_cli("train", "--dry-run", "env=CartPole-v1")
    assert p.returncode == 0 and "config OK" in p.stdout and "TrainOneStep" in p.stdout and "flowchart LR" in p.stdout
    p = run_cli("plugins")
    assert p.returncode == 0 and "ppo" in p.stdout and "flowkit-ppo" in p.stdout and "random" in p.stdout
    p = run_cli("train", "--help")
    assert p.returncode == 0 and "ppo.clip_param (float, > 0, default 0.2)" in p.stdout and "runtime.num_workers" in p.stdout


# ---- composition, interpolation, --print-config (issue 11, part 4) --------------------------
def test_two_files_merge_in_order_then_overrides(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("env: Acrobot-v1\nppo:\n  lr: 1e-3\n  num_epochs: 3\nruntime:\n  num_workers: 3\n")
    b.write_text("ppo:\n  num_epochs: 5\nruntime:\n  num_workers: 2\n  num_envs_per_worker: 4\n")
    cfg = cfg_of("runtime.num_workers=1", file=[str(a), str(b)])
    assert (cfg.env.id, cfg.ppo.lr, cfg.ppo.num_epochs) == ("Acrobot-v1", 1e-3, 5)
    assert (cfg.runtime.num_workers, cfg.runtime.num_envs_per_worker) == (1, 4)
    assert cfg_of(file=[str(b), str(a)]).runtime.num_workers == 3  # the later file wins
    b.write_text("ppo:\n  lrr: 1\n")
    with pytest.raises(ConfigError, match=r"^unknown config key `ppo.lrr`; did you mean `ppo.lr`\?$"):
        cfg_of(file=[str(a), str(b)])


def test_interpolation_resolves_and_is_validated(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWKIT_TEST_SEED", "7")
    f = tmp_path / "c.yaml"
    f.write_text("ppo:\n  train_batch_size: 256\n  minibatch_size: ${ppo.train_batch_size}\n")
    cfg = cfg_of("env=CartPole-v1", "seed=${oc.env:FLOWKIT_TEST_SEED}", "ppo.train_batch_size=512", file=str(f))
    assert cfg.ppo.minibatch_size == 512 and cfg.seed == 7 and isinstance(cfg.seed, int)
    assert "${" not in OmegaConf.to_yaml(cfg)  # what a run saves is resolved
    with pytest.raises(ConfigError, match=r"^config key `ppo.minibatch_size`: Interpolation key 'ppo.nope' not found$"):
        cfg_of("ppo.minibatch_size=${ppo.nope}")
    with pytest.raises(ConfigError, match=r"^config key `seed`: .*FLOWKIT_NOT_SET"):
        cfg_of("seed=${oc.env:FLOWKIT_NOT_SET}")
    with pytest.raises(ConfigError, match=r"^ppo\.lr=0\.0 must be finite and > 0$"):  # ranges see the result
        cfg_of("ppo.lr=${ppo.ent_coef}")


def test_cli_print_config_prints_resolved_yaml_and_starts_nothing(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("env: CartPole-v1\nruntime:\n  num_workers: 3\n")
    b.write_text("ppo:\n  minibatch_size: ${ppo.num_epochs}\n")
    p = run_cli("train", "-c", str(a), "-c", str(b), "--print-config", "ppo.num_epochs=4", f"run.dir={tmp_path}/r")
    assert p.returncode == 0, p.stderr
    printed = yaml.safe_load(p.stdout)
    assert printed["env"]["id"] == "CartPole-v1" and printed["runtime"]["num_workers"] == 3
    assert printed["ppo"]["minibatch_size"] == 4 and printed["run"]["dir"] == f"{tmp_path}/r"
    assert not os.path.exists(f"{tmp_path}/r")
    # only the sections the run uses (issue 27 item 10: every installed algorithm's, 233 lines)
    assert "ppo" in printed and not {"dqn", "impala", "sac", "a2c", "multiagent"} & set(printed), sorted(printed)
    p = run_cli("train", "--print-config", "env=CartPole-v1", "ppo.lrr=1")
    assert p.returncode == 2 and p.stderr == "flowkit: config error: unknown config key `ppo.lrr`; did you mean `ppo.lr`?\n"


# ---- property: what --dry-run accepts runs -----------------------------------------------
_PM = load_config(["env=CartPole-v1"])[0]
_SCHEMA = make_schema_class(_PM.config_sections())
_ALLOWED = schema_allowed(_SCHEMA)
_SKIP = ("env.id", "env.factory", "env.kwargs", "runtime.backend", "runtime.address", "learner.device", "run.", "stop.",
         "resume", "plugins", "algo", "multiagent.", "random.", "runtime.sample_timeout_s", "runtime.start_timeout_s")


def _valid(key: str, tp) -> "st.SearchStrategy | None":
    """Small valid values of ``key`` as override text, or None for a key not drawn."""
    a, (base, opt) = _ALLOWED.get(key, Allowed()), _unwrap_optional(tp)
    if key.startswith(_SKIP):
        return None
    if a.choices is not None:
        vals = st.sampled_from(a.choices).map(str)
    elif base is bool:
        vals = st.sampled_from(["true", "false"])
    elif base is int:
        lo = int(a.ge if a.ge is not None else a.gt + 1 if a.gt is not None else 0)
        vals = st.integers(lo, lo + 3).map(str)
    elif base is float:
        lo = float(a.ge if a.ge is not None else a.gt + 1e-3 if a.gt is not None else 0.0)
        vals = st.floats(lo, min(lo + 1.0, a.le if a.le is not None else lo + 1.0)).map(repr)
    elif key == "model.hidden_sizes":
        vals = st.lists(st.integers(1, 8), min_size=1, max_size=2).map(lambda xs: f"[{','.join(map(str, xs))}]")
    else:
        return None
    return st.one_of(vals, st.just("null")) if opt else vals


_DRAWN = {k: s for k, (tp, _, _) in schema_keys(_SCHEMA).items() if (s := _valid(k, tp)) is not None}


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(algo=st.sampled_from(["ppo", "dqn", "impala"]), data=st.data())
@pytest.mark.slow
def test_every_config_dry_run_accepts_runs_one_iteration(tmp_path_factory, algo, data):
    """Any few keys with values valid on their own: if ``--dry-run`` (describe_plan) accepts the
    config, a one-iteration local run starts and ends without a ConfigError."""
    keys = [k for k in _DRAWN if "." not in k or k.split(".")[0] not in ("ppo", "dqn", "impala") or k.startswith(algo)]
    chosen = data.draw(st.lists(st.sampled_from(keys), min_size=1, max_size=4, unique=True), label="keys")
    run_dir = str(tmp_path_factory.mktemp("prop") / "run")
    ov = ["env=CartPole-v1", f"algo={algo}", "runtime.num_workers=1", "runtime.num_envs_per_worker=2",
          "runtime.rollout_fragment_length=8", "ppo.train_batch_size=16", "ppo.minibatch_size=8",
          "impala.train_batch_size=16", "dqn.learning_starts=0", "stop.iterations=1", "evaluation.episodes=1",
          *[f"{k}={data.draw(_DRAWN[k], label=k)}" for k in chosen]]
    try:
        describe_plan(ov)
    except ConfigError:
        assume(False)  # several valid values that do not fit together: refused before anything starts
    res = flowkit.train(local_overrides(run_dir, *ov))
    assert res.metrics["iteration"] == 1


# ---- issue 28 item 3: sizes, container types, duplicates --------------------------------------
@pytest.mark.parametrize("override,message", [
    ("runtime.num_envs_per_worker=1e9", r"runtime.num_envs_per_worker=1000000000 must be in \[1, 4096\]"),
    ("runtime.rollout_fragment_length=1e12", r"runtime.rollout_fragment_length=1000000000000 must be in \[1, 16777216\]"),
    ("runtime.num_workers=1e6", r"runtime.num_workers=1000000 must be in \[0, 1024\]"),
    ("ppo.train_batch_size=1e9", r"ppo.train_batch_size=1000000000 must be in \[1, 16777216\]"),
    ("evaluation.episodes=1e9", r"evaluation.episodes=1000000000 must be in \[1, 100000\]"),
    ("runtime.async_requests_per_worker=1e9", r"async_requests_per_worker=1000000000 must be in \[1, 64\]"),
    ("runtime.num_envs_per_worker=4000 runtime.rollout_fragment_length=10000",
     r"runtime.num_workers=2 x num_envs_per_worker=4000 x rollout_fragment_length=10000 = 80000000 env steps "
     r"is over flowkit's limit of 16777216"),
    ("model.hidden_sizes={}", r"`model.hidden_sizes` must be a list, got \{\}"),
    ("model.hidden_sizes=[[64]]", r"`model.hidden_sizes\[0\]` must be an int, got \[64\]"),
    ("env.kwargs=[1,2]", r"`env.kwargs` must be a mapping, got \[1, 2\]"),
    ("multiagent.policies=[a]", r"`multiagent.policies` must be a mapping, got \['a'\]"),
    ("ppo=5", r"^`ppo` is a config section: give a mapping of its keys \(e.g. `ppo.<key>=value`\), got 5$"),
    ("model.hidden_sizes.a=1", r"^`model.hidden_sizes` must be a list, got \{'a': 1\}$"),
    ("run.reporters=[csv,progress,csv]", r"run.reporters: 'csv' listed more than once"),
])
def test_sizes_and_container_types_are_one_line_config_errors(override, message):
    """Each hung, exhausted memory or ended in a TypeError/pluggy traceback before (issue 28 item 3)."""
    with pytest.raises(ConfigError, match=message):
        validate("env=CartPole-v1", "runtime.num_workers=2", "runtime.num_envs_per_worker=2",
                 "runtime.rollout_fragment_length=64", *override.split())


def test_a_plugin_module_without_hooks_is_refused():
    with pytest.raises(flowkit.PluginError, match=r"plugin module 'os' \(from `plugins`\) implements no flowkit hook"):
        validate("env=CartPole-v1", "plugins=[os]")


def test_minibatch_larger_than_a_round_warns_that_an_epoch_is_one_step():
    with pytest.warns(UserWarning, match=r"ppo.minibatch_size=1000 is larger than one sampling round.* = 256\): "
                                         r"each epoch is one step over the whole round"):
        validate("env=CartPole-v1", "runtime.num_workers=2", "runtime.num_envs_per_worker=2",
                 "runtime.rollout_fragment_length=64", "ppo.minibatch_size=1000")


@pytest.mark.parametrize("algo,env,message", [
    ("dqn", "Pendulum-v1", "policy 'default': DQN needs a Discrete action space, got Box(-2.0, 2.0, (1,), float32) "
                           "(use an algorithm for Box actions, e.g. ppo)"),
    ("td3", "CartPole-v1", "policy 'default': TD3 needs a Box action space, got Discrete(2) "
                           "(use an algorithm for Discrete actions, e.g. dqn or ppo)"),
])
def test_an_action_space_the_algorithm_refuses_is_reported_before_ray_starts(tmp_path, monkeypatch, capsys,
                                                                              algo, env, message):
    """Issue 27 item 10: the mismatch came after Ray's start-up (~12 s); the AlgorithmRef's
    declared action_spaces are checked before, with the same words as at set-up."""
    from flowkit import _ray
    from flowkit.cli import main
    monkeypatch.setattr(_ray, "start", lambda *a, **k: pytest.fail("Ray started before the action-space check"))
    assert main(["train", f"algo={algo}", f"env={env}", f"run.dir={tmp_path}/r", "--no-tuned"]) == 2
    assert capsys.readouterr().err.strip() == f"flowkit: config error: {message}"
    with pytest.raises(ConfigError) as ei:  # the same words at set-up (flowkit.train, no CLI)
        validate(f"algo={algo}", f"env={env}")
    assert str(ei.value) == message


def test_a_section_the_run_does_not_use_is_an_error_for_a_variant_and_a_warning_otherwise(tmp_path):
    """Issue 27 item 5: `-c configs/ppo/CartPole-v1.yaml algo=ppo_l2` (a registered subclass of
    PPO) trained with ppo_l2's default lr 3e-4: the file's `ppo:` section was ignored."""
    from flowkit_ppo.ppo import PPO

    from flowkit.config import check_run, check_unused_sections

    class PPOL2(PPO):
        name = "ppo_l2"

    plugin = type("P", (), {"flowkit_add_algorithms": flowkit.hookimpl(lambda self: [PPOL2])})()
    flowkit.register(plugin)
    try:
        tuned = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "ppo",
                             "CartPole-v1.yaml")
        with pytest.raises(ConfigError, match=r"^config section `ppo` \(ppo\.lr=0\.001\) is not used by this run, "
                           r"which trains with algo=ppo_l2; `ppo_l2` takes the same settings: give them as "
                           r"`ppo_l2\.\*`"):
            check_run(*reversed(load_config(["algo=ppo_l2"], tuned)))
        pm, cfg = load_config(["algo=ppo_l2", "env=CartPole-v1", "ppo_l2.lr=1e-3"])  # its own section: used
        check_run(cfg, pm)
        assert cfg.ppo_l2.lr == 1e-3
        # another algorithm's section (a base file shared by runs of several algorithms): a warning
        pm, cfg = load_config(["algo=ppo", "env=CartPole-v1", "dqn.lr=0.01"])
        check_run(cfg, pm)
        assert check_unused_sections(cfg, pm.algorithms(load=False), pm.config_sections()) == [
            "config section `dqn` (dqn.lr=0.01) is not used by this run, which trains with algo=ppo: it has no effect"]
        # a multi-agent run uses every policy's algorithm
        pm, cfg = load_config(["env.factory=pettingzoo.classic.tictactoe_v3:env", "multiagent.policies.a.algo=dqn",
                               "dqn.lr=0.01"])
        check_run(cfg, pm)
        assert cfg.dqn.lr == 0.01 and check_unused_sections(cfg, pm.algorithms(load=False), pm.config_sections()) == []
    finally:
        flowkit.unregister(plugin)


@pytest.mark.parametrize("algo,extra,message", [
    ("a3c", [], "policy 'default': model.normalize_obs=true is not supported by a3c: its gradients are computed on "
                "the workers and the learner never sees the observations to keep their running statistics; use a2c "
                "(the same loss, synchronous), which keeps them, or remove model.normalize_obs"),
    ("ddppo", [], "policy 'default': model.normalize_obs=true is not supported by ddppo: its workers would each keep "
                  "running observation statistics of their own (and their weights would differ); use ppo with "
                  "ppo.normalize_observations=true, or remove model.normalize_obs"),
    ("r2d2", ["model.recurrent=lstm"], "policy 'default': model.normalize_obs=true is not supported by r2d2: its "
                                       "replayed sequences and stored recurrent states are not normalised; use dqn, "
                                       "or a recurrent actor-critic (ppo, a2c, impala or appo with model.recurrent), "
                                       "which keep the statistics, or remove model.normalize_obs"),
    ("random", [], "policy 'default': model.normalize_obs=true is not supported by random: it has no network and "
                   "keeps no observation statistics; in a multi-agent run set "
                   "multiagent.policies.<id>.model.normalize_obs=false for its policies, or remove model.normalize_obs"),
    ("ars", ["ars.normalize_observations=false"], "policy 'default': model.normalize_obs=true contradicts "
                                                  "ars.normalize_observations=false: the two keys are one switch "
                                                  "(either turns observation normalisation on); remove one of them"),
])
def test_model_normalize_obs_an_algorithm_cannot_honour_is_refused_before_ray_starts(tmp_path, monkeypatch, capsys,
                                                                                     algo, extra, message):
    """model.normalize_obs=true was silently ignored by the algorithms that keep no statistics:
    each algorithm declares it (Algorithm.normalize_obs), checked before Ray and at set-up."""
    from flowkit import _ray
    from flowkit.cli import main
    monkeypatch.setattr(_ray, "start", lambda *a, **k: pytest.fail("Ray started before the check"))
    args = [f"algo={algo}", "env=CartPole-v1", "model.normalize_obs=true", *extra]
    assert main(["train", *args, f"run.dir={tmp_path}/r", "--no-tuned"]) == 2
    assert capsys.readouterr().err.strip() == f"flowkit: config error: {message}"
    with pytest.raises(ConfigError) as ei:  # the same words at set-up (flowkit.train, no CLI)
        validate(*args)
    assert str(ei.value) == message


def test_a_sections_combination_checks_are_one_table():
    """Issue 49 item 6: a config class's ``validate`` is a table of (condition, message) rows:
    the first error row that holds is raised, else the warning rows that hold are returned."""
    from flowkit.config import config_checks
    assert config_checks([(False, "e1")], [(True, "w1"), (0, "w2"), (3, "w3")]) == ["w1", "w3"]
    with pytest.raises(ConfigError, match="^e2$"):
        config_checks([(False, "e1"), (True, "e2"), (True, "e3")], [(True, "w1")])


def test_every_installed_algorithm_is_declared_once_and_its_class_takes_the_declaration():
    """One declaration per algorithm (issue 49 item 1): the torch-free AlgorithmRef read before
    Ray starts is what the class carries at set-up (``class PPO(Algorithm, ref=PPO_REF)``), and
    model.normalize_obs is honoured or refused by every algorithm `flowkit plugins` lists; a
    class that does not take the ref naming it is refused when it is loaded."""
    from flowkit_ppo import PPOConfig

    from flowkit.config import normalize_obs_on
    pm, _ = load_config(["env=CartPole-v1"])
    refs = pm.algorithms(load=False)
    honour = {n: r.normalize_obs for n, r in refs.items()}
    assert {n for n, v in honour.items() if not v} >= {"a3c", "ddppo", "r2d2", "random"}
    assert {n for n, v in honour.items() if v} >= {"ppo", "a2c", "impala", "appo", "dqn", "sac", "td3", "es", "ars",
                                                   "maml", "bc", "marwil", "cql_dqn", "cql_sac"}
    for name, ref in refs.items():
        cls = pm.algorithms()[name]
        assert [getattr(cls, f.name) for f in dataclasses.fields(ref) if f.name != "target"] == \
            [getattr(ref, f.name) for f in dataclasses.fields(ref) if f.name != "target"], name
        assert ref.normalize_obs or ref.normalize_obs_refusal, name
    with pytest.raises(ImportError, match="flowkit_ppo.ppo:PPO is named 'ppo', not 'ppo2'"):
        flowkit.AlgorithmRef("ppo2", PPOConfig, "flowkit_ppo.ppo:PPO").load()
    # PPO's own key and model.normalize_obs: one switch, either turns it on
    on, off = PPOConfig(normalize_observations=True), PPOConfig()  # (the section as policies hold it)
    model_on, model_off = OmegaConf.create({"normalize_obs": True}), OmegaConf.create({"normalize_obs": False})
    assert normalize_obs_on(model_off, on, "normalize_observations")
    assert normalize_obs_on(model_on, off, "normalize_observations")
    assert not normalize_obs_on(model_off, off, "normalize_observations")
    assert not normalize_obs_on(model_off, on, "")


@pytest.mark.parametrize("args,yaml_text,message", [
    (["stop.env_steps=1.5e3"], None,
     "`stop.env_steps` must be an int, got 1.5e3 (a float; a count in e-notation has a whole mantissa: 1e5, 15e2)"),
    (["stop.env_steps=1500.0"], None,
     "`stop.env_steps` must be an int, got 1500.0 (a float; a count in e-notation has a whole mantissa: 1e5, 15e2)"),
    ([], 'model:\n  hidden_sizes: ["64", "64"]\n',
     "`model.hidden_sizes[0]` must be an int, got the text '64' (write it without quotes)"),
    ([], 'ppo:\n  lr: "1e-3"\n', "`ppo.lr` must be a float, got the text '1e-3' (write it without quotes)"),
    (["multiagent.mapping.agent_*=prey"], None,
     "multiagent.mapping: env 'CartPole-v1' is a single-agent env, not a PettingZoo game: it has no agents to map "
     "to policies"),
])
def test_a_number_given_as_text_or_a_float_for_a_count_or_a_mapping_without_agents_is_refused(
        tmp_path, monkeypatch, capsys, args, yaml_text, message):
    """Issue 48 item 17: `stop.env_steps=1.5e3`, `model.hidden_sizes: ["64", "64"]` and
    `multiagent.mapping.*` on a single-agent env were taken without a word (1500, [64, 64], ignored)."""
    from flowkit.cli import main
    files = []
    if yaml_text is not None:
        (tmp_path / "c.yaml").write_text(yaml_text)
        files = ["-c", str(tmp_path / "c.yaml")]
    rc = main(["train", *files, "algo=ppo", "env=CartPole-v1", "runtime.backend=local", "stop.env_steps=100", *args,
               f"run.dir={tmp_path}/r", "--no-tuned"])
    assert rc == 2 and capsys.readouterr().err.strip().splitlines()[-1] == f"flowkit: config error: {message}"
    assert not os.path.exists(tmp_path / "r")


def test_counts_in_e_notation_and_interpolated_numbers_are_still_taken():
    _, cfg = load_config(["env=CartPole-v1", "stop.env_steps=1e5", "ppo.train_batch_size=${ppo.minibatch_size}",
                          "ppo.lr=2.5e-4"])
    assert cfg.stop.env_steps == 100_000 and cfg.ppo.train_batch_size == cfg.ppo.minibatch_size
    assert cfg.ppo.lr == 2.5e-4


def test_a_config_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path, capsys):
    """Issue 48 item 17: `-c FIFO` with no writer blocked in open() for ever."""
    from flowkit.cli import main
    os.mkfifo(tmp_path / "c.yaml")
    assert main(["train", "-c", str(tmp_path / "c.yaml"), "--print-config"]) == 2
    assert capsys.readouterr().err.strip() == (f"flowkit: config error: config file '{tmp_path / 'c.yaml'}' is not a "
                                               "regular file (a pipe, a device or a socket); give a YAML file")


def test_a_config_holds_the_sections_its_run_uses_or_sets_and_an_absent_one_reads_as_its_defaults():
    """Issue 48 item 15 (start-up): OmegaConf builds a node per key, so a config holds the core
    sections, every plugin section, and only the algorithm sections its run uses (``algo``,
    ``multiagent.policies.<id>.algo``), a source sets or an interpolation names."""
    from flowkit.config import held_sections, section_object
    secs = _PM.config_sections()
    assert {"dqn", "ppo", "sac"} <= secs.algorithms and not {"multiagent", "input"} & secs.algorithms
    cfg = load_config(["env=CartPole-v1"])[1]
    algo_sections = sorted(k for k in cfg if k in secs.algorithms)
    assert algo_sections == ["ppo"] and "multiagent" in cfg and "input" in cfg
    cfg = load_config(["env=CartPole-v1", "algo=dqn", "sac.lr=0.5", "ppo.gamma=${a2c.gamma}"])[1]
    assert sorted(k for k in cfg if k in secs.algorithms) == ["a2c", "dqn", "ppo", "sac"] and cfg.ppo.gamma == 0.99
    layers = [{"algo": "dqn"}, {"multiagent": {"policies": {"a": {"algo": "impala"}, "b": None}}}]
    assert sorted(k for k in held_sections(layers, secs) if k in secs.algorithms) == ["dqn", "impala"]
    assert set(held_sections([{"algo": "${oc.env:ALGO}"}], secs)) == set(secs)  # known once resolved: all
    # a section left out reads as its defaults (a policy whose algorithm comes from its checkpoint)
    assert section_object(cfg, "td3", secs["td3"]) == secs["td3"]() and "td3" not in cfg
    # and the key list of an error still names every installed section
    with pytest.raises(ConfigError, match=r"^unknown config key `td4\.lr`; did you mean `td3\.lr`\?$"):
        load_config(["env=CartPole-v1", "td4.lr=1"])
