"""Project-local test set-up. The shared fixtures (``ray_session``, ``run_dir``, the tiny envs,
``hook_recorder``) come from flowkit's pytest plugin, :mod:`flowkit.testing`."""
import os
import warnings

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
warnings.filterwarnings("ignore", category=DeprecationWarning)


def __getattr__(name):
    """``from conftest import local_overrides`` (tests written before it moved) still works."""
    if name == "local_overrides":
        from flowkit.testing import local_overrides
        return local_overrides
    raise AttributeError(name)


def pytest_configure(config):
    """Load the plugin where flowkit was installed before it declared its pytest11 entry point."""
    if not config.pluginmanager.has_plugin("flowkit.testing"):
        config.pluginmanager.import_plugin("flowkit.testing")
