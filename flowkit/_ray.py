"""flowkit owns ``ray.init``: one Ray session per process, started in a background thread by
:func:`start` (before torch loads), joined by :func:`wait`, reused by later runs and ended by
:func:`stop` (also at exit). A session the caller started with ``ray.init`` is used as it is.

- ``runtime.address`` unset: a new local cluster on the loopback interface, without the
  processes a run never uses, its agents started late and at low priority (:func:`_local_patches`).
- ``runtime.address=auto|HOST:PORT``: attach (token authentication when a token is found); no
  answer within ``CONNECT_TIMEOUT_S``, or a head that wants a missing token, is a ConfigError.
- Workers import flowkit and the plugins in use from where the driver did (:func:`_job_config`):
  Ray puts the driver's current folder first on its workers' import path, and a folder there
  named ``flowkit`` (the parent folder of a clone holds one) would be imported instead.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

CONNECT_TIMEOUT_S = 15.0
LOCAL_START_TIMEOUT_S = 120.0  # the most a new local session may take to come up (runtime.start_timeout_s if lower)
AGENT_DELAY_S = 10.0  # how much later than the raylet a local session's agents start (see _local_patches)
NICE = 19  # the CPU priority of the Ray processes a run does not wait for (Ray runs its workers at 15)
_S: Dict[str, Any] = {"thread": None, "error": None, "key": None, "atexit": False, "prestarted": None, "limit": None,
                      "cancel": threading.Event(), "ready": threading.Event()}
_USER_AUTH = os.environ.get("RAY_AUTH_MODE")  # the user's choice, before flowkit sets it per session


def start(cfg: Any, prestart: bool = False) -> None:
    """Start (or reuse) the Ray session ``cfg`` needs, in the background; a no-op for the
    local backend and when the caller's own Ray session is up. ``prestart``: once a new local
    session is up, also create ``cfg``'s rollout workers as far as they can be built before
    the run's policies are known (:func:`flowkit.core.workers.prestart`; the run takes them
    with :func:`take_prestarted`)."""
    if cfg.runtime.backend != "ray":
        return
    addr = cfg.runtime.address or None
    runtime_env = _runtime_env(cfg) if addr else None
    key = (addr, repr(runtime_env))
    if _S["thread"] is not None:
        if _S["key"] == key:
            return  # starting or up: reused
        stop()
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return
    # per session, never left over from an earlier one; like Ray, ~/.ray/auth_token (which
    # Ray writes for any new local cluster) only counts for address=auto
    os.environ["RAY_AUTH_MODE"] = _USER_AUTH or ("token" if addr and _has_token(addr == "auto") else "disabled")
    # the driver's SIGTERM/SIGINT stay flowkit's (a clean stop, exit 143/130): without this, Ray's
    # C++ failure handler, installed while ray.init runs in its thread, takes a signal that
    # arrives then and aborts the process (exit -6, the run's files unwritten)
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    kw: Dict[str, Any] = {"include_dashboard": False, "log_to_driver": True, "configure_logging": True,
                          "logging_level": "warning", "address": addr or "local",
                          "job_config": _job_config(cfg), "runtime_env": runtime_env}  # (None: Ray's default)
    import ray  # noqa: F401  (here, not in the thread: the GIL would share it with torch's import)
    lean_serializers()
    _S["cancel"].clear()
    _S["ready"].clear()
    _S.update(key=key, error=None, limit=min(LOCAL_START_TIMEOUT_S, float(cfg.runtime.start_timeout_s)),
              thread=threading.Thread(target=_init, args=(kw, cfg if prestart and not addr else None),
                                      name="flowkit-ray-init", daemon=True))
    _S["thread"].start()


SERIALIZER_ADDONS = ("pydantic", "starlette", "pyarrow")  # what Ray's serialization_addons.apply imports


def lean_serializers() -> None:
    """Ray's serialization context (one per process and job, made at its first (de)serialization)
    imports pydantic, starlette and pyarrow to register serializers for some of their types
    (``ray.util.serialization_addons.apply``): 0.17 s of CPU per process, in the driver's Ray
    thread while torch imports and in each rollout worker before its first sample (2026-12-07).
    flowkit sends no object of theirs. After this call, the contexts this process makes register
    them only when one of those modules is already imported (an object of theirs exists only
    then). Called by :func:`start` (flowkit's sessions, not the caller's own) and by ``import
    flowkit`` in a Ray worker process; once per process.

    What it saves (``bench/startup.py --no-sb3 --env-steps 5000 --seeds 0 --repeats 7``, alternating,
    2 cores at a load of 10-13, 2026-12-07): CPU of the driver and Ray's processes to the first
    sample 3.66 s against 4.10 s (main before it; median of 5); command to first sample 5.12 s
    against 9931a2a's 5.77 s and 7.76 s against main's 8.13 s (6 of 7 pairs faster in each)."""
    from ray.util import serialization_addons as addons
    full = addons.apply
    if getattr(full, "__wrapped__", None) is not None:
        return

    def apply(context: Any) -> None:
        if any(m in sys.modules for m in SERIALIZER_ADDONS):
            full(context)
    apply.__wrapped__ = full  # type: ignore[attr-defined]
    addons.apply = apply


def _plugin_tops(cfg: Any) -> List[str]:
    """``flowkit`` and the top-level modules of the plugins in use (entry points, ``plugins``)."""
    from flowkit.core.names import plugin_entry_points
    tops = [ep.module.split(".")[0] for ep in plugin_entry_points()]
    return list(dict.fromkeys(["flowkit", *tops, *(str(p).split(".")[0] for p in cfg.plugins)]))


def _location(name: str) -> Optional[str]:
    """Where the top-level module ``name`` is imported from, without importing it: a package's
    folder, a module's file (None: not found, or no location, as a namespace package)."""
    import importlib.util
    spec = None
    with contextlib.suppress(Exception):  # (a module already imported, flowkit: its own spec)
        spec = importlib.util.find_spec(name)
    if spec is None or not spec.has_location or not spec.origin:
        return None
    return os.path.dirname(spec.origin) if spec.submodule_search_locations is not None else spec.origin


def _runtime_env(cfg: Any) -> Dict[str, Any]:
    """Ship flowkit and the plugins in use to a cluster's workers (py_modules)."""
    return {"py_modules": sorted({p for p in map(_location, _plugin_tops(cfg)) if p})}


class _FirstOnWorkers(list):
    """Ray's ``JobConfig._py_driver_sys_path``: folders each worker inserts at position 0 of its
    ``sys.path``, in order. The folders Ray adds itself while it starts (the driver's script
    folder and current folder, with ``extend``) go before the ones given here, which therefore
    come first on the workers' import path."""

    def extend(self, paths: Any) -> None:
        self[:0] = list(paths)


def _import_roots(cfg: Any, cwd: str) -> List[str]:
    """The folders the driver imports flowkit and the plugins (entry points, ``plugins``) from,
    for those of them that the folder ``cwd`` also holds under the same name (a folder or a
    ``.py`` file) without being the one in use: the parent folder of a clone holds a
    ``flowkit`` folder that is a namespace package (no ``__init__.py``), which a worker with
    ``cwd`` first on its import path would import. Reads no module that is not yet imported."""
    roots: List[str] = []
    for name in _plugin_tops(cfg):
        here = [os.path.join(cwd, name + ext) for ext in ("", ".py") if os.path.lexists(os.path.join(cwd, name + ext))]
        used = _location(name) if here else None
        # (the current folder's is the one in use: a checkout's root)
        if used and not any(os.path.realpath(h) == os.path.realpath(used) for h in here):
            roots.append(os.path.dirname(used))
    return list(dict.fromkeys(roots))


def _job_config(cfg: Any) -> Any:
    """The session's ``JobConfig``: the folders of :func:`_import_roots` for the current folder
    go first on the workers' import path, before the current folder Ray puts there."""
    from ray.job_config import JobConfig
    jc = JobConfig()
    jc._py_driver_sys_path = _FirstOnWorkers(_import_roots(cfg, os.path.abspath(os.curdir)))
    return jc


def external() -> bool:
    """Whether Ray was started in this process by the caller (not by flowkit)."""
    ray = sys.modules.get("ray")
    return _S["thread"] is None and ray is not None and getattr(ray, "is_initialized", bool)()


def _has_token(home: bool) -> bool:
    return bool(os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")) or (
        home and os.path.isfile(os.path.expanduser("~/.ray/auth_token")))


def _init(kw: Dict[str, Any], prestart_cfg: Any) -> None:
    """The session's thread: Ray's local processes die with the thread that started them
    (PR_SET_PDEATHSIG), so it lives until :func:`stop`, which it ends with ``ray.shutdown``."""
    _connect(kw)
    if _S["error"] is None and prestart_cfg is not None:
        from flowkit.core.workers import prestart
        from flowkit.hooks.manager import worker_plugin_manager
        with contextlib.suppress(Exception):  # (the run then creates its workers itself)
            _S["prestarted"] = prestart(prestart_cfg, worker_plugin_manager)
    _S["ready"].set()
    if _S["error"] is None:
        _S["cancel"].wait()
        import ray
        ray.shutdown()


def _connect(kw: Dict[str, Any]) -> None:
    from flowkit.config import ConfigError
    addr = kw["address"]
    try:
        import ray
        if not _S["atexit"]:  # after Ray's own (atexit runs last first): no 0.5 s exit sleep
            _S["atexit"] = atexit.register(stop)
        logging.getLogger("ray._private.worker").addFilter(lambda r: "SIGTERM handler" not in r.getMessage())
        if addr != "local":
            gcs = addr
            if addr == "auto":
                from ray._private.services import get_ray_address_from_environment
                gcs = get_ray_address_from_environment("auto", None)
            _probe(gcs, f"runtime.address={addr!r}")
        patches = _local_patches() if addr == "local" else []
        saved = [(obj, k, obj.__dict__[k]) for obj, k, _ in patches]
        try:  # only while this ray.init runs: a later session in this process is unaffected
            for obj, k, f in patches:
                setattr(obj, k, f)
            ray.init(**kw)
        finally:
            for obj, k, f in saved:
                setattr(obj, k, f)
    except BaseException as e:
        msg = str(e).split("\n")[0]
        if addr == "local":
            _S["error"] = RayStartError(f"Ray could not start a local cluster: {type(e).__name__}: {msg} (is memory, "
                                        "/dev/shm or /tmp short? see Ray's logs under /tmp/ray)")
        elif any(w in f"{e} {e.__cause__}".lower() for w in ("auth", "token")):
            _S["error"] = ConfigError(
                f"runtime.address={addr!r}: the cluster wants a Ray auth token: set RAY_AUTH_TOKEN (or "
                "RAY_AUTH_TOKEN_PATH, or RAY_AUTH_MODE=token with the head's token in ~/.ray/auth_token)")
        else:
            _S["error"] = e if isinstance(e, ConfigError) else ConfigError(
                f"runtime.address={addr!r}: cannot attach to a Ray cluster: {type(e).__name__}: {msg}")


def _local_patches() -> List[Tuple[Any, str, Any]]:
    """``(object, attribute, replacement)`` for a new local node: on the loopback address (all its
    servers bind to it), no dashboard / job API server
    and no autoscaler monitor; the raylet registers without waiting for its agents (a minimal
    Ray: their ports are given, -1 where the minimal dashboard agent serves nothing, as it would
    write itself); its processes in a session of their own (a signal to the driver's process
    group, as Slurm and systemd send one, is the driver's to act on: the GCS and the raylet
    stay up while the run, or a sweep's trials, stop cleanly; they still die with the thread
    that started them); the log monitor and the agents at a lower CPU priority (``nice``): the run's
    start-up (torch, the workers) goes first, they are not needed before the first sample. Where
    the raylet does not wait for them, the agents also start ``AGENT_DELAY_S`` later (through
    :func:`_later`): at nice 19 they still took about 1 s of CPU from a 2-core run's first 2.4 s,
    and they serve nothing a local run uses (metrics export, runtime envs, the dashboard).

    What they save (issue 22; ``bench/startup.py``'s flowkit run, seeds 0-2, patched and
    unpatched alternating, median of 9, Ray 2.60, a 2-core machine under a load of 5-9): the
    command to first sample 10.8 s against 17.5 s, the whole process 20.8 s against 27.1 s
    (the patched side faster in 8 of 9 pairs); ``ray.init`` itself 0.1-0.2 s against 3-6 s.
    Issue 49 measured them again (the same runs, seeds 0-2, alternating, a load of 27-37): the
    command to first sample 25.0 s patched against 36.8 s (1.47x), to ``ray.init``'s end 23.2 s
    against 30.9 s: kept. Issue 49 item 4, 2026-12-07 (``bench/kept_speedups.py``: the same
    runs in fresh processes, seeds by repeat, alternating, a load of 18-46): first sample 17.0 s
    patched against 39.5 s unpatched (2.3x, median of 3); the agents' ``AGENT_DELAY_S`` alone
    (the patches with a delay of 0 against 10 s, median of 7): 19.7 s against 17.0 s (1.15x): kept.
    They rely on private Ray code, hence the pin in pyproject.toml (``ray<2.61``) and
    tests/test_ray_internals.py, which fails when that code changes."""
    import ray
    from ray._private import node, ray_constants, services, utils

    def ports(self: Any) -> Any:
        p = self._ray_params
        p.runtime_env_agent_port = p.runtime_env_agent_port or self._get_unused_port()
        p.metrics_agent_port = p.metrics_export_port = p.dashboard_agent_listen_port = -1
        return start_ray_processes(self)

    def process(command: List[str], process_type: str, *args: Any, **kw: Any) -> Any:
        if process_type == ray_constants.PROCESS_TYPE_RAYLET:
            if given:  # (--undefok: a raylet without the flag ignores it)
                command = command + ["--dashboard_agent_listen_port=-1", "--undefok=dashboard_agent_listen_port"]
            prefix = later if given else f"{nice} -n {NICE} " if nice else ""
            command = [re.sub(r"^(--(?:dashboard|runtime_env)_agent_command=)", lambda m: m[1] + prefix, c)
                       for c in command]
        info = start_ray_process(command, process_type, *args, **kw)
        if process_type == ray_constants.PROCESS_TYPE_LOG_MONITOR:
            with contextlib.suppress(Exception):
                os.setpriority(os.PRIO_PROCESS, info.process.pid, NICE)
        return info

    start_ray_processes, start_ray_process = node.Node.start_ray_processes, services.start_ray_process
    # Ray >= 2.5x: the raylet waits for the ports its agents write (1-2 s of their start-up)
    given = hasattr(ray._raylet, "persist_port") and utils.get_dashboard_dependency_error() is not None
    nice = shutil.which("nice")
    later = subprocess.list2cmdline([sys.executable, "-S", os.path.abspath(__file__), f"{AGENT_DELAY_S:g}", str(NICE)]) + " "
    class OwnSession(services.ConsolePopen):
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, start_new_session=True, **kw)

    # (ENABLE_RAY_CLUSTER off: Ray takes the loopback address as the new node's; all its servers bind to it)
    return [(ray_constants, "ENABLE_RAY_CLUSTER", False),
            (node.Node, "start_api_server", lambda self, **kw: setattr(self, "_webui_url", None)),
            (node.Node, "start_monitor", lambda self: None), (services, "start_ray_process", process),
            (services, "ConsolePopen", OwnSession)] + (
        [(node.Node, "start_ray_processes", ports)] if given else [])


def _probe(gcs: str, what: str) -> None:
    """Bounded wait for a TCP answer at ``HOST:PORT`` (Ray itself retries for minutes)."""
    from flowkit.config import ConfigError
    host, _, port = gcs.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"{what}: expected auto or HOST:PORT")
    end = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=2.0) as s:
                _check_grpc(s, gcs, what)
            return
        except OSError as e:
            if time.monotonic() > end:
                raise ConfigError(f"{what}: no Ray cluster answers at {gcs} within {CONNECT_TIMEOUT_S:g} s "
                                  f"({e.strerror or e})") from None
            if _S["cancel"].wait(0.5):
                raise ConfigError(f"{what}: cancelled") from None


def _check_grpc(s: socket.socket, gcs: str, what: str) -> None:
    """Check that what answers at ``gcs`` (socket ``s``) speaks gRPC as a Ray head's GCS does
    (HTTP/2: its first frame is SETTINGS, type 4); otherwise (a web server such as the dashboard's port 8265, a
    closed connection) a :class:`~flowkit.ConfigError` now, where Ray would retry for 30 s.
    Skipped with ``RAY_USE_TLS`` (the GCS then answers only to TLS); a server that says nothing
    within 2 s is left to Ray."""
    from flowkit.config import ConfigError
    if os.environ.get("RAY_USE_TLS", "0").lower() not in ("0", "false", ""):
        return
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # preface + SETTINGS
    try:
        head = s.recv(9)
    except OSError:
        return
    if len(head) < 4 or head[3] != 4:
        raise ConfigError(f"{what}: {gcs} answers, but not as a Ray head's GCS (gRPC): another service, such as "
                          "the dashboard (port 8265)? Use the address `ray start --head` prints (port 6379 by default)")


class RayStartError(RuntimeError):
    """A new local Ray session failed or did not come up within its deadline (one line)."""


def wait() -> None:
    """Block until the session started by :func:`start` is up (interruptible by signals).

    Raises:
        ConfigError: ``runtime.address`` cannot be attached to.
        RayStartError: a new local session failed (its object store could not be created, a
            process died) or was not up within ``LOCAL_START_TIMEOUT_S`` (120 s; lower
            ``runtime.start_timeout_s`` lowers it): Ray's own start waits without a bound.
    """
    if _S["thread"] is None:
        return
    t0, addr = time.monotonic(), _S["key"][0]
    while not _S["ready"].wait(0.1):
        if not addr and time.monotonic() > t0 + _S["limit"]:
            _S["cancel"].set()  # (the thread, stuck in ray.init, is left; Ray's processes die with this one)
            _S.update(thread=None, error=None, key=None, prestarted=None)
            raise RayStartError(f"Ray did not start a local cluster within {_S['limit']:g} s (is memory, /dev/shm or "
                                "/tmp short? see Ray's logs under /tmp/ray); runtime.backend=local runs without Ray")
        if addr and time.monotonic() > t0 + 2 * CONNECT_TIMEOUT_S:  # an address that answers but is no Ray head
            from flowkit.config import ConfigError
            stop()
            raise ConfigError(f"runtime.address={addr!r}: Ray did not connect within {2 * CONNECT_TIMEOUT_S:g} s "
                              "(is a Ray head listening there?)")
    err = _S["error"]
    if err is not None:
        _S.update(thread=None, error=None, key=None)
        raise err


def take_prestarted() -> Any:
    """The workers :func:`start` prestarted (``(key, handles)``, for
    :attr:`flowkit.core.workers.WorkerSet.prestarted`), or None; given out once (the WorkerSet
    kills those it does not use)."""
    p, _S["prestarted"] = _S["prestarted"], None
    return p


def stop() -> None:
    """Shut down flowkit's Ray session (none: a no-op); a session the caller started stays.
    A local session still starting is waited for and shut down (no Ray process is left)."""
    t, key, _S["thread"], _S["key"], _S["prestarted"] = _S["thread"], _S["key"], None, None, None
    if t is not None:
        _S["cancel"].set()
        local = key is not None and not key[0]  # an attach still retrying is left behind (daemon)
        t.join(None if _S["ready"].is_set() else 60.0 if local else 1.0)


def _later(argv: List[str]) -> None:
    """``python -S _ray.py SECONDS NICE COMMAND...``: exec ``COMMAND`` after ``SECONDS`` at
    CPU priority ``NICE`` (the same process, so its parent, the raylet, sees its agent start);
    nothing if the parent has exited by then (a session shorter than the delay)."""
    delay, niceness, command = float(argv[0]), int(argv[1]), argv[2:]
    os.setpriority(os.PRIO_PROCESS, 0, niceness)
    parent, end = os.getppid(), time.monotonic() + delay
    while time.monotonic() < end:
        time.sleep(0.25)
        if os.getppid() != parent:
            return
    os.execvp(command[0], command)


if __name__ == "__main__":  # (run with -S by the raylet: standard library only)
    _later(sys.argv[1:])
