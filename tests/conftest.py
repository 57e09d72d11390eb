"""Shared fixtures: one Ray session for the whole suite (num_cpus=2), tmp run folders."""
import os
import warnings

import pytest

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
warnings.filterwarnings("ignore", category=DeprecationWarning)


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray cluster shared by every test that needs one; shut down at the end."""
    import ray

    from flowkit import _ray
    _ray.stop()  # a session a test's flowkit.train left: this one ships the test modules
    if not ray.is_initialized():
        here = os.path.dirname(os.path.abspath(__file__))
        path = os.pathsep.join([here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")])
        # test modules (envs, actors defined in tests) importable on Ray workers
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 configure_logging=True, logging_level="error",
                 runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray
    ray.shutdown()


@pytest.fixture
def run_dir(tmp_path):
    return str(tmp_path / "run")


def local_overrides(run_dir, *extra):
    """Overrides for a fast, quiet in-process run."""
    return ["runtime.backend=local", f"run.dir={run_dir}", "run.reporters=[csv,checkpoint,evaluation]",
            *extra]
