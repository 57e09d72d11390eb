"""flowkit's kit for testing flowkit and its plugins; also a pytest plugin.

Installed with flowkit, the pytest plugin (entry point ``pytest11``, named
``flowkit.testing``; ``pytest -p flowkit.testing`` where plugin autoloading is off) gives
these fixtures (:mod:`flowkit.testing.plugin`), each importing torch and Ray only when used:

- ``ray_session`` (session): one local Ray cluster (``num_cpus=2``) for every test that
  asks for it; the rootdir and the test folders are importable on its workers.
- ``run_dir``: a fresh run folder path under ``tmp_path``.
- ``discrete_env``, ``box_env``, ``masked_env``, ``turn_game``: the tiny deterministic envs
  of :mod:`flowkit.testing.envs` as :class:`~flowkit.testing.envs.TinyEnv` (``.override``
  is ``env.factory=...``, ``.make()`` builds one).
- ``hook_recorder``: a registered :class:`HookRecorder` (every hook call of the runs in the
  test, with its arguments); unregistered afterwards.

And for any test: :func:`check_algorithm` (the conformance check of an Algorithm class),
:func:`local_overrides`, and fault injection for reliability tests and benchmarks:
:class:`FlakyEnv`, :func:`flaky_env` (``env.factory=flowkit.testing:flaky_env``) and the
:class:`KillWorkers` plugin. This module imports neither pytest, torch nor Ray.
"""
from typing import TYPE_CHECKING, List

from flowkit.hooks.manager import lazy_attrs

if TYPE_CHECKING:
    from flowkit.testing._faults import FlakyEnv, KillWorkers, flaky_env  # noqa: I001
    from flowkit.testing.conformance import ConformanceError, check_algorithm
    from flowkit.testing.envs import TinyEnv
    from flowkit.testing.recorder import HookRecorder

pytest_plugins = ["flowkit.testing.plugin"]  # where this package is loaded as a pytest plugin

__all__ = ["ConformanceError", "FlakyEnv", "HookRecorder", "KillWorkers", "TinyEnv", "check_algorithm",
           "flaky_env", "local_overrides"]

__getattr__ = lazy_attrs({"FlakyEnv": "flowkit.testing._faults", "KillWorkers": "flowkit.testing._faults",
                          "flaky_env": "flowkit.testing._faults", "TinyEnv": "flowkit.testing.envs",
                          "HookRecorder": "flowkit.testing.recorder",
                          "ConformanceError": "flowkit.testing.conformance",
                          "check_algorithm": "flowkit.testing.conformance"})


def local_overrides(run_dir: str, *extra: str) -> List[str]:
    """Overrides for a fast, quiet in-process run (local backend, csv, checkpoint and
    evaluation reporters, no progress bar) writing to ``run_dir``, then ``extra``."""
    return ["runtime.backend=local", f"run.dir={run_dir}", "run.reporters=[csv,checkpoint,evaluation]", *extra]
