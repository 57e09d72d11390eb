"""Issue 6, part 5: bad input never becomes a traceback: env outputs that break their
declared space, random config overrides and YAML files, and the CLI's exit status."""
import os
import re
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flowkit
from flowkit.testing import local_overrides
from flowkit.config import ConfigError, make_schema_class, schema_keys
from flowkit.engine import describe_plan, load_config


class _BadObsEnv(gym.Env):
    """Box(-1, 1, (3,)) float32 declared; ``obs_fn(t)`` is what it really returns."""

    def __init__(self, obs_fn):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.obs_fn, self.t = obs_fn, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.obs_fn(0), {}

    def step(self, action):
        self.t += 1
        return self.obs_fn(self.t), 1.0, self.t >= 5, False, {}


def wrong_shape_env():
    return _BadObsEnv(lambda t: np.zeros(4, np.float32))


def wrong_dtype_env():
    return _BadObsEnv(lambda t: np.array(["a", "b", "c"]))


def out_of_space_env():
    """In the space at reset, out of it at step 1 (obs[2] = 7.5 > high 1)."""
    return _BadObsEnv(lambda t: np.array([0.0, 0.5, 7.5 if t else 0.0], np.float32))


def text_obs_env():
    env = _BadObsEnv(lambda t: "abc")
    env.observation_space = gym.spaces.Text(5)
    return env


def tuple_action_env():
    env = _BadObsEnv(lambda t: np.zeros(3, np.float32))
    env.action_space = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(3)))
    return env


# ---- env outputs ----------------------------------------------------------------------------


@pytest.mark.parametrize("factory,where,expected,received", [
    ("wrong_shape_env", "observation from reset()", "Box(shape=(3,), dtype=float32, low=-1, high=1)",
     "array(shape=(4,), dtype=float32"),
    ("wrong_dtype_env", "observation from reset()", "Box(shape=(3,), dtype=float32",
     "array(shape=(3,), dtype=<U1, values=['a', 'b', 'c'])"),
    ("out_of_space_env", "observation from step()", "high=1) (values out of bounds)",
     "array(shape=(3,), dtype=float32, values=[0. , 0.5, 7.5])"),
])
def test_bad_env_output_names_env_agent_key_expected_received(run_dir, factory, where, expected, received):
    with pytest.raises(flowkit.EnvError) as ei:
        flowkit.train(local_overrides(run_dir, f"env.factory=test_bad_input:{factory}", "runtime.num_workers=1",
                                      "runtime.num_envs_per_worker=2", "stop.iterations=1"))
    msg = str(ei.value)
    assert msg.startswith(f"env 'test_bad_input:{factory}' (worker 0, sub-env 0) returned a bad {where}: "
                          "at `obs` expected ")
    assert expected in msg and f"received {received}" in msg


# ---- config: property-based ------------------------------------------------------------------
_PM, _ = load_config(["env=CartPole-v1"])
KEYS = sorted(schema_keys(make_schema_class(_PM.config_sections())))
SAFE = [k for k in KEYS if k not in ("run.dir", "resume", "env.id", "env.factory", "plugins", "runtime.address")]


def _typo(k: str, i: int) -> str:
    i %= len(k)
    return k[:i] + k[i + 1:] if i % 2 else k[:i] + "x" + k[i:]


small_int = st.integers(-3, 300).map(str)
value = st.one_of(small_int, st.floats(-1e3, 1e3, allow_nan=False).map(repr),
                  st.sampled_from(["null", "true", "false", "abc", "1e-5", "1e4", "[1,2]", "[]", "{a: 1}", "[", "'",
                                   "{", "nan", "inf", "-inf", "~", "ppo", "dqn", "impala", "local", "ray", "x: [",
                                   "CartPole-v1", "[64, 64]", "relu", "\t", "", "0x10", "1_000"]),
                  st.text(max_size=8))
key = st.one_of(st.sampled_from(SAFE), st.builds(_typo, st.sampled_from(SAFE), st.integers(0, 40)),
                st.text("abcdefghijklmnopqrstuvwxyz._-0123", min_size=1, max_size=12))
override = st.one_of(st.builds(lambda k, v: f"{k}={v}", key, value), st.text(max_size=10))


def _check(overrides, config_file=None):
    try:
        describe_plan(["env=CartPole-v1", "runtime.backend=local", *overrides], config_file)
    except ConfigError as e:
        msg = str(e)
        if config_file:  # a key of the file (`key` or key=value), or the file itself
            assert re.search(r"`[^`]+`|[\w.]+=", msg) or config_file in msg, msg
            return
        keys = [o.split("=", 1)[0].strip() for o in overrides]
        named = keys + [repr(k) for k in keys] + [repr(o) for o in overrides]
        assert any(n and n in msg for n in named), f"{msg!r} names none of {overrides}"


@settings(max_examples=50, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.lists(override, min_size=1, max_size=3))
@pytest.mark.slow
def test_random_overrides_succeed_or_raise_config_error_naming_the_key(overrides):
    _check(overrides)


yaml_value = st.one_of(st.integers(-3, 300), st.floats(-1e3, 1e3, allow_nan=False), st.booleans(), st.none(),
                       st.text(max_size=6), st.lists(st.integers(1, 64), max_size=3))
yaml_doc = st.dictionaries(st.sampled_from(SAFE + ["ppo", "runtime", "nope", "env"]), yaml_value, max_size=4).map(
    lambda d: yaml.safe_dump(_nest(d)))


def _nest(flat):
    out = {}
    for k, v in flat.items():
        d = out
        *head, last = k.split(".")
        for h in head:
            d = d.setdefault(h, {}) if isinstance(d.get(h, {}), dict) else {}
        d[last] = v
    return out


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.one_of(yaml_doc, st.text(max_size=40)))
@pytest.mark.slow
def test_random_yaml_files_succeed_or_raise_config_error(tmp_path_factory, text):
    path = str(tmp_path_factory.mktemp("yaml") / "c.yaml")
    with open(path, "w") as f:
        f.write(text)
    _check([], path)


@pytest.mark.parametrize("args,says", [
    (["-c", "{CFG}"], "bad.yaml' is not valid YAML: line 2, column 1: did not find expected node content"),
])
def test_cli_config_error_exit_2_without_traceback(tmp_path, args, says):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("ppo: [\n")
    args = [a.replace("{CFG}", str(cfg)) for a in args]
    out = subprocess.run([sys.executable, "-m", "flowkit.cli", "train", "--dry-run", "env=CartPole-v1", *args],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert out.returncode == 2
    assert out.stderr.startswith("flowkit: config error: ") and says in out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1  # one line


@pytest.mark.parametrize("algo,factory,says", [
    (algo, "text_obs_env", "observation space Text(1, 5, charset=") for algo in ("ppo", "dqn", "es")] + [
    (algo, "tuple_action_env", "action space Tuple(Discrete(2), Discrete(3)) is not supported") for algo in ("ppo", "es")])
def test_a_space_no_algorithm_takes_is_a_config_error(tmp_path, capsys, algo, factory, says):
    """Issue 28 rerun: every algorithm on a Text observation space or a Tuple action space
    ended in a SpaceError traceback (from the policy's encoder or action distribution)."""
    from flowkit.cli import main
    rc = main(["train", "--no-tuned", f"algo={algo}", f"env.factory=test_bad_input:{factory}",
               *local_overrides(str(tmp_path / "run"), "runtime.num_workers=1", "stop.iterations=1")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"flowkit: config error: policy 'default' ({algo}) cannot be built for the env's "
                          "spaces: ") and says in err, err


def test_a_usage_error_is_one_line(capsys):
    """Issue 28 rerun: argparse printed the whole usage (12 lines for `flowkit nope`) before its
    error; now one line, exit 2, with where the usage is."""
    from flowkit.cli import main
    with pytest.raises(SystemExit) as ei:
        main(["nope"])
    err = capsys.readouterr().err
    assert ei.value.code == 2 and err.count("\n") == 1 and "--help)" in err, err
    assert err.startswith("flowkit: error: argument command: invalid choice: 'nope'"), err


@pytest.mark.parametrize("args,says", [
    (["plot", "run", "x=nope"], "flowkit plot: error: x='nope' must be 'env_steps' or 'time'"),
    (["plot"], "flowkit plot: error: give one or more run folders (RUN_DIR...)"),
    (["tune", "mode=best", "seed=range(2)"], "flowkit tune: error: mode='best' must be 'max' or 'min'"),
    (["tune", "num_samples=abc", "seed=range(2)"],
     "flowkit tune: error: `num_samples` must be an int, got the text 'abc'\n"),  # (no quotes to drop: a newcomer's find)
    (["tune", "-c"], "flowkit tune: error: -c needs a FILE (flowkit tune -c FILE)"),
    (["plot", "run", "metrc=x"], "flowkit plot: error: unknown config key `metrc`; did you mean `metric`?"),
    (["export", "run", "--format", "onnx", "--out=p.onnx"], "flowkit export: error: unrecognised options --format "
     "--out: settings are key=value words, not --options; write format=onnx out=p.onnx"),
    # a misspelt real flag is pointed to that flag, not told to be a key=value (a newcomer's find)
    (["train", "--no_tuned", "algo=ppo"], "flowkit: error: unrecognised option --no_tuned: did you mean --no-tuned?"),
    (["train", "--dryrun"], "flowkit: error: unrecognised option --dryrun: did you mean --dry-run?"),
    (["evaluate", "run", "--trust_config"],
     "flowkit evaluate: error: unrecognised option --trust_config: did you mean --trust-config?"),
])
def test_a_commands_bad_setting_is_one_line(capsys, args, says):
    """Issue 49 item 6: every command's settings are key=value words through one runner; a bad
    one (or an old --option) is one line naming the key, exit 2."""
    from flowkit.cli import main
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(says), err


def test_no_command_prints_the_usage_and_says_why_it_fails(capsys):
    """Issue 28 rerun: a bare `flowkit` exited 2 with nothing on stderr."""
    from flowkit.cli import main
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out.startswith("usage:\n  flowkit train") and "default and doc: flowkit train --help" in out
    assert "ppo.clip_param" not in out  # the key reference is `flowkit train --help`'s
    assert err == ("flowkit: error: no command given (train, plan, plugins, evaluate, export, record, plot or tune; "
                   "the usage is above)\n")
