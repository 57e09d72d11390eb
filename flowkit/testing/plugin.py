"""flowkit's pytest plugin: the fixtures listed in :mod:`flowkit.testing` (loaded through the
``pytest11`` entry point ``flowkit.testing``). Torch and Ray are imported by the fixtures
that need them, when a test uses them."""
from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Any, Iterator

import pytest

from flowkit.testing import envs


@pytest.fixture(scope="session")
def ray_session(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A local Ray cluster (``num_cpus=2``) shared by every test that needs one; shut down at
    the end of the session. The rootdir, the folders on ``sys.path`` under it (test folders)
    and ``$PYTHONPATH`` are importable on its workers (envs and actors defined in tests)."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    import ray

    from flowkit import _ray
    _ray.stop()  # a session a test's flowkit.train left: this one ships the test modules
    if not ray.is_initialized():
        root = str(request.config.rootpath)
        here = [p for p in sys.path if p and os.path.isdir(p) and os.path.abspath(p).startswith(root)]
        path = os.pathsep.join(dict.fromkeys([*here, root, os.environ.get("PYTHONPATH", "")]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                     configure_logging=True, logging_level=logging.ERROR,
                     runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray
    ray.shutdown()


@pytest.fixture
def run_dir(tmp_path: Any) -> str:
    """A run folder path (not created) under ``tmp_path``."""
    return str(tmp_path / "run")


@pytest.fixture
def discrete_env() -> envs.TinyEnv:
    """:func:`flowkit.testing.envs.match`: Discrete observations and actions."""
    return envs.DISCRETE


@pytest.fixture
def box_env() -> envs.TinyEnv:
    """:func:`flowkit.testing.envs.target`: Box observations and actions."""
    return envs.BOX


@pytest.fixture
def masked_env() -> envs.TinyEnv:
    """:func:`flowkit.testing.envs.masked_match`: Dict observations with an action mask."""
    return envs.MASKED


@pytest.fixture
def turn_game() -> envs.TinyEnv:
    """:func:`flowkit.testing.envs.turn_game`: a two-player PettingZoo AEC game (skips the
    test when pettingzoo is not installed)."""
    pytest.importorskip("pettingzoo")
    return envs.TURN_GAME


@pytest.fixture
def hook_recorder() -> Iterator[Any]:
    """A :class:`~flowkit.testing.HookRecorder` registered for the test (every run in it
    records into ``.calls``), unregistered afterwards."""
    import flowkit
    from flowkit.testing.recorder import HookRecorder
    rec = HookRecorder()
    flowkit.register(rec)
    try:
        yield rec
    finally:
        flowkit.unregister(rec)
