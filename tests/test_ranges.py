"""Issue 13, parts 4-6 (config side): every config field declares its range or choices in
the schema (``F(..., gt=/ge=/lt=/le=/choices=)``, floats finite), one checker refuses a value
outside it with one line naming the full key, and the CLI turns every such case into exit 2."""
import os
import subprocess
import sys
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowkit.cli import main
from flowkit.config import (
    ACTIVATIONS,
    INT64_MAX,
    Allowed,
    ConfigError,
    _leaf_type,
    _unwrap_optional,
    build_config,
    make_schema_class,
    schema_allowed,
    schema_keys,
)
from flowkit.engine import load_config

_PM, _ = load_config(["env=CartPole-v1"])
SECTIONS = _PM.config_sections()  # every installed algorithm's and plugin's section
SCHEMA = make_schema_class(SECTIONS)
KEYS = schema_keys(SCHEMA)
ALLOWED = schema_allowed(SCHEMA)


def _kind(tp):
    """(leaf type, 'list' | 'dict' | None) of a schema type."""
    base, _ = _unwrap_optional(tp)
    origin = typing.get_origin(base)
    return _leaf_type(tp), ("list" if origin in (list, typing.List) else "dict" if origin in (dict, typing.Dict)
                            else None)


NUMERIC = sorted(k for k, (tp, _, _) in KEYS.items() if _kind(tp)[0] in (int, float))
CHOICE = sorted(k for k, a in ALLOWED.items() if a.choices is not None)


def test_reflection_finds_every_section_and_every_numeric_key_declares_a_range():
    for k in ("seed", "runtime.num_workers", "model.hidden_sizes", "ppo.lr", "ppo.max_grad_norm", "dqn.lr",
              "impala.lr", "random.report_every_env_steps", "multiagent.round_robin_weights"):
        assert k in NUMERIC, k
    assert len(NUMERIC) >= 80, len(NUMERIC)  # 81 when written
    for k in NUMERIC:
        a, leaf = ALLOWED[k], _kind(KEYS[k][0])[0]
        bounded = any(b is not None for b in (a.gt, a.ge, a.lt, a.le))
        # every int has a bound; a float without one must at least be finite
        assert bounded or (leaf is float and a.finite), f"{k} declares no range"
    for k in ("env.vectorization", "env.autoreset_mode", "runtime.backend", "model.activation",
              "ppo.lr_schedule", "ppo.clip_schedule", "ppo.normalize_advantages", "dqn.lr_schedule",
              "impala.rollout_mode"):
        assert k in CHOICE, k


def test_activation_registry_torch_module_function_and_numpy_agree():
    """config's choices are the registry's names; for each, the torch module, the functional
    form and (where one exists) the numpy function compute the same values."""
    import numpy as np
    import torch

    from flowkit.core.activations import ACTIVATIONS as TABLE
    from flowkit.core.activations import has_numpy, numpy_function, torch_function, torch_module
    assert tuple(TABLE) == ACTIVATIONS
    x = np.linspace(-3, 3, 61, dtype=np.float32)
    for name in ACTIVATIONS:
        want = torch_function(name)(torch.from_numpy(x.copy())).numpy()
        np.testing.assert_array_equal(torch_module(name)(torch.from_numpy(x.copy())).numpy(), want)
        if has_numpy(name):
            np.testing.assert_allclose(numpy_function(name)(x.copy()), want, atol=1e-6)
    assert {n for n in ACTIVATIONS if has_numpy(n)} == {"tanh", "relu"}
    with pytest.raises(ValueError, match="model.activation='gelu' has no numpy function"):
        numpy_function("gelu")
    with pytest.raises(ValueError, match="model.activation='swish' is not one of"):
        torch_module("swish")


# ---- property: an out-of-range value of any numeric key is refused, naming the key ---------
def _bad_values(a: Allowed, leaf) -> st.SearchStrategy:
    opts = []
    if leaf is int:
        if a.gt is not None:
            opts.append(st.integers(int(a.gt) - 10 ** 6, int(a.gt)))
        if a.ge is not None:
            opts.append(st.integers(int(a.ge) - 10 ** 6, int(a.ge) - 1))
        if a.lt is not None:
            opts.append(st.integers(int(a.lt), int(a.lt) + 10 ** 6))
        if a.le is not None:
            opts.append(st.integers(int(a.le) + 1, int(a.le) + 10 ** 6))
        else:  # ints must fit in 64 bits
            opts.append(st.integers(INT64_MAX + 1, 2 ** 80))
        return st.one_of(opts).map(str)
    if a.finite:
        opts.append(st.sampled_from([".nan", ".inf", "-.inf", "1e400", "-1e400"]))
    if a.gt is not None:
        opts.append(st.floats(a.gt - 1e6, a.gt).map(repr))
    if a.ge is not None:
        opts.append(st.floats(a.ge - 1e6, a.ge - 1e-6).map(repr))
    if a.lt is not None:
        opts.append(st.floats(a.lt, a.lt + 1e6).map(repr))
    if a.le is not None:
        opts.append(st.floats(a.le + 1e-6, a.le + 1e6).map(repr))
    return st.one_of(opts)


def _override(key: str, raw: str):
    """(override, the key the error must name) for a scalar, list-item or mapping-item key."""
    kind = _kind(KEYS[key][0])[1]
    if kind == "list":
        return f"{key}=[64, {raw}]", f"{key}[1]"
    if kind == "dict":
        return f"{key}.ppo={raw}", f"{key}.ppo"
    return f"{key}={raw}", key


@pytest.mark.parametrize("key", NUMERIC)
@settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_out_of_range_value_of_every_numeric_key_is_a_config_error_naming_it(key, data):
    raw = data.draw(_bad_values(ALLOWED[key], _kind(KEYS[key][0])[0]), label="value")
    override, named = _override(key, raw)
    with pytest.raises(ConfigError) as ei:
        load_config(["env=CartPole-v1", override], pm=_PM)
    msg = str(ei.value)
    assert msg.startswith(f"{named}=") and " must " in msg and "\n" not in msg, (override, msg)


@pytest.mark.parametrize("key", NUMERIC)
def test_every_numeric_key_is_drawn_and_its_bounds_are_accepted(key):
    """The bounds themselves (ge/le) and a value just inside gt/lt stay valid; a float key
    refuses NaN when it must be finite."""
    a, leaf = ALLOWED[key], _kind(KEYS[key][0])[0]
    step = 1 if leaf is int else 1e-3
    inside = [b for b in (a.ge, a.le) if b is not None]
    inside += [a.gt + step] if a.gt is not None else []
    inside += [a.lt - step] if a.lt is not None else []
    for v in inside:
        override, _ = _override(key, repr(int(v) if leaf is int else float(v)))
        build_config(["env=CartPole-v1", override], sections=SECTIONS)
    if leaf is float and a.finite:
        override, named = _override(key, ".nan")
        with pytest.raises(ConfigError, match="^" + named.replace(".", r"\.").replace("[", r"\[") + r"=nan must"):
            build_config(["env=CartPole-v1", override], sections=SECTIONS)


@pytest.mark.parametrize("key", CHOICE)
def test_every_choice_key_refuses_other_values_listing_the_choices(key):
    with pytest.raises(ConfigError) as ei:
        build_config(["env=CartPole-v1", f"{key}=nope"], sections=SECTIONS)
    assert str(ei.value).startswith(f"{key}='nope' must be ")
    assert all(repr(c) in str(ei.value) for c in ALLOWED[key].choices)
    for c in ALLOWED[key].choices:
        build_config(["env=CartPole-v1", "stop.env_steps=1000", f"{key}={c}"], sections=SECTIONS)


# ---- exact messages ----------------------------------------------------------------------
@pytest.mark.parametrize("override,message", [
    ("ppo.lr=.inf", "ppo.lr=inf must be finite and > 0"),
    ("ppo.lr=1e400", "ppo.lr=inf must be finite and > 0"),
    ("ppo.vf_coef=.nan", "ppo.vf_coef=nan must be finite and >= 0"),
    ("ppo.gamma=1.5", "ppo.gamma=1.5 must be in [0, 1]"),
    ("dqn.n_step=0", "dqn.n_step=0 must be > 0"),
    ("checkpoint.keep=99999999999999999999", "checkpoint.keep=99999999999999999999 must be >= 0 and fit "
                                             "in 64 bits ([-9223372036854775808, 9223372036854775807])"),
    ("runtime.num_workers=99999999999999999999", "runtime.num_workers=99999999999999999999 must be in [0, 1024]"),
    ("seed=4294967296", "seed=4294967296 must be in [0, 4294967295]"),
    ("model.hidden_sizes=[64,0]", "model.hidden_sizes[1]=0 must be >= 1"),
    ("model.activation=tan", "model.activation='tan' must be 'tanh', 'relu', 'elu', 'gelu' or 'silu'"),
    ("learner.device=gpu", "learner.device='gpu' must match cpu|cuda(:[0-9]+)?"),
    ("multiagent.round_robin_weights.ppo=0", "multiagent.round_robin_weights.ppo=0.0 must be finite and > 0"),
])
def test_exact_messages(override, message):
    with pytest.raises(ConfigError) as ei:
        build_config(["env=CartPole-v1", override], sections=SECTIONS)
    assert str(ei.value) == message


def test_per_policy_overrides_are_range_checked_naming_the_full_key():
    cfg = ["env.factory=pettingzoo.classic.tictactoe_v3:env", "multiagent.policies.p.algo=ppo",
           "runtime.backend=local"]
    from flowkit.engine import describe_plan
    with pytest.raises(ConfigError, match=r"^multiagent\.policies\.p\.config\.lr=-1\.0 must be finite and > 0$"):
        describe_plan(cfg + ["multiagent.policies.p.config.lr=-1"])


def test_help_shows_ranges_and_choices():
    from flowkit.config import help_text
    text = help_text(SECTIONS)
    assert "  ppo.lr (float, > 0, default 0.0003): Adam learning rate" in text
    assert "  ppo.gamma (float, in [0, 1], default 0.99)" in text
    assert "  env.vectorization (str, 'auto' or 'sync', default 'auto')" in text
    assert "  model.hidden_sizes (List[int], each >= 1, default [64, 64])" in text


# ---- the CLI: each case of issue 13 exits 2 with one line ----------------------------------
ISSUE_13 = [
    (["ppo.lr=.inf"], "ppo.lr=inf must be finite and > 0"),
    (["ppo.lr=1e400"], "ppo.lr=inf must be finite and > 0"),
    (["ppo.vf_coef=.nan"], "ppo.vf_coef=nan must be finite and >= 0"),
    (["ppo.ent_coef=.inf"], "ppo.ent_coef=inf must be finite and >= 0"),
    (["algo=dqn", "dqn.lr=.inf"], "dqn.lr=inf must be finite and > 0"),
    (["ppo.max_grad_norm=-1"], "ppo.max_grad_norm=-1.0 must be finite and > 0"),
    (["ppo.kl_coeff=-1"], "ppo.kl_coeff=-1.0 must be finite and >= 0"),
    (["ppo.vf_clip_param=-1"], "ppo.vf_clip_param=-1.0 must be finite and > 0"),
    (["checkpoint.every_iters=-1"], "checkpoint.every_iters=-1 must be >= 0"),
    (["checkpoint.keep=-1"], "checkpoint.keep=-1 must be >= 0"),
    (["stop.env_steps=-1"], "stop.env_steps=-1 must be >= 1"),
    (["evaluation.interval=-1"], "evaluation.interval=-1 must be >= 0"),
    (["env.check_spaces_steps=-1"], "env.check_spaces_steps=-1 must be >= 0"),
    (["env.max_episode_steps=0"], "env.max_episode_steps=0 must be >= 1"),
    (["seed=1180591620717411303424"], "seed=1180591620717411303424 must be in [0, 4294967295]"),
    (["plugins=notalist"], "`plugins` must be a list of module paths, e.g. plugins=[my_pkg.plugin], got 'notalist'"),
    (["env.vectorization=foo"], "env.vectorization='foo' must be 'auto' or 'sync'"),
]


@pytest.mark.parametrize("args,message", ISSUE_13, ids=[" ".join(a) for a, _ in ISSUE_13])
def test_cli_issue_13_cases_exit_2_with_one_line(capsys, args, message):
    assert main(["train", "env=CartPole-v1", "runtime.backend=local", *args]) == 2
    err = capsys.readouterr().err
    assert err == f"flowkit: config error: {message}\n"


@pytest.fixture
def bad_files(tmp_path):
    binary = tmp_path / "model.pt"
    binary.write_bytes(b"PK\x03\x04\x00\xff\xfe\x80binary")
    plugins = tmp_path / "plugins.yaml"
    plugins.write_text("plugins: notalist\n")
    null_key = tmp_path / "null_key.yaml"
    null_key.write_text("ppo:\n  null: 1\n")
    return {"dir": str(tmp_path), "binary": str(binary), "missing": str(tmp_path / "nope.yaml"),
            "plugins": str(plugins), "null_key": str(null_key)}


@pytest.mark.parametrize("which,message", [
    ("dir", "config file '{}' is a directory; give a YAML file"),
    ("binary", "config file '{}' is not a UTF-8 text file (byte 5: b'\\xff'); give a YAML file"),
    ("missing", "config file '{}' does not exist"),
    ("plugins", "`plugins` must be a list of module paths, e.g. plugins=[my_pkg.plugin], got 'notalist'"),
    ("null_key", "config file '{}' is not a config: Incompatible key type 'NoneType' (keys must be strings or ints)"),
])
def test_cli_bad_config_file_exit_2_with_one_line(capsys, bad_files, which, message):
    path = bad_files[which]
    assert main(["train", "-c", path, "env=CartPole-v1"]) == 2
    assert capsys.readouterr().err == f"flowkit: config error: {message.format(path)}\n"


def test_cli_subprocess_directory_as_config_no_traceback(tmp_path):
    out = subprocess.run([sys.executable, "-m", "flowkit.cli", "train", "-c", str(tmp_path), "env=CartPole-v1",
                          "ppo.lr=.nan"], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr == f"flowkit: config error: config file '{tmp_path}' is a directory; give a YAML file\n"


def test_train_api_refuses_before_anything_starts(tmp_path):
    import flowkit
    with pytest.raises(ConfigError, match=r"^ppo\.lr=nan must be finite and > 0$"):
        flowkit.train(["env=CartPole-v1", "runtime.backend=local", f"run.dir={tmp_path}/r", "ppo.lr=.nan"])
    assert not os.path.exists(f"{tmp_path}/r")
