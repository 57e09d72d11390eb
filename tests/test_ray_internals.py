"""flowkit/_ray.py's start-up patches (``_local_patches``) replace or wrap private Ray code:
``Node.start_ray_processes``/``start_api_server``/``start_monitor`` and
``services.start_ray_process``, and rewrite the raylet's agent command flags. These tests fail
loudly, naming what moved, when an installed Ray no longer has what the patches rely on; Ray is
pinned below the next minor version in pyproject.toml (raise the pin only after these pass)."""
from __future__ import annotations

import importlib.metadata as md
import inspect
import os
import tomllib

from packaging.requirements import Requirement

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_installed_ray_is_within_the_pinned_versions():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    req = next(Requirement(d) for d in deps if Requirement(d).name == "ray")
    assert any(s.operator == "<" for s in req.specifier), f"pyproject.toml: {req} has no upper bound"
    assert req.specifier.contains(md.version("ray")), f"installed ray {md.version('ray')} is outside {req}"


def _params(fn) -> list:
    return list(inspect.signature(fn).parameters)


def test_the_private_ray_startup_code_the_patches_replace_is_as_patched():
    import ray
    from ray._private import node, parameter, ray_constants, services, utils

    from flowkit import _ray
    assert _params(node.Node.start_ray_processes) == ["self"], "Node.start_ray_processes(self) changed"
    assert _params(node.Node.start_monitor) == ["self"], "Node.start_monitor(self) changed"
    api = inspect.signature(node.Node.start_api_server).parameters
    assert all(p.kind is p.KEYWORD_ONLY for n, p in api.items() if n != "self"), "Node.start_api_server: not keyword-only"
    assert _params(services.start_ray_process)[:2] == ["command", "process_type"], \
        "services.start_ray_process(command, process_type, ...) changed"
    assert callable(node.Node._get_unused_port) and "self._ray_params" in inspect.getsource(node.Node.__init__)
    ports = {"runtime_env_agent_port", "metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port"}
    assert ports <= set(_params(parameter.RayParams)), f"RayParams lacks {ports - set(_params(parameter.RayParams))}"
    for name in ("PROCESS_TYPE_RAYLET", "PROCESS_TYPE_LOG_MONITOR", "ENABLE_RAY_CLUSTER"):
        assert hasattr(ray_constants, name), f"ray_constants.{name} is gone"
    raylet = inspect.getsource(services.start_raylet)
    for flag in ("--dashboard_agent_command=", "--runtime_env_agent_command="):
        assert flag in raylet, f"the raylet is no longer given {flag}"
    assert hasattr(ray._raylet, "persist_port") and callable(utils.get_dashboard_dependency_error)
    # every patch targets an attribute that exists, and is a function where the original is one
    for obj, attr, repl in _ray._local_patches():
        assert attr in obj.__dict__, f"{obj.__name__}.{attr} is gone"
        assert callable(repl) == callable(obj.__dict__[attr]), f"{obj.__name__}.{attr}: not replaced in kind"
    assert {a for _, a, _ in _ray._local_patches()} >= {"start_api_server", "start_monitor", "start_ray_process"}
