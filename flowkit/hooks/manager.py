"""The plugin manager: built-ins, the ``flowkit`` entry points, ``plugins=[...]`` from the
config, and objects registered in code; ``check_pending()`` so a misspelt hook fails."""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence

import pluggy

from flowkit.config import Sections
from flowkit.core.algorithm import AlgorithmRef
from flowkit.core.names import plugin_entry_points
from flowkit.core.presets import register_presets
from flowkit.hooks import specs

hookimpl = pluggy.HookimplMarker("flowkit")
_REGISTERED: List[Any] = []  # objects registered in code (driver only)


class Reporter:
    """Base of the built-in reporters (optional for user ones): a ``name`` for
    ``run.reporters``; hooks are plain ``flowkit_*`` methods. Built with no arguments, once per
    run; ``flowkit_on_run_start`` gives it the run folder, the config and the kept rows.
    ``flowkit_on_train_end`` may come without a ``flowkit_on_run_start`` (a failed start).
    A reporter is registered as plugin ``reporter:<name>`` before the plan is built, so it may
    wrap ``flowkit_build_plan`` and keep state across a resume (``flowkit_state_dict``)."""
    name = ""

    @classmethod
    def validate_config(cls, config: Any) -> None:
        """Raise :class:`flowkit.ConfigError` if this reporter cannot run with ``config``
        (checked before anything starts, when the reporter is in ``run.reporters``)."""


class PluginError(RuntimeError):
    """A plugin failed to load or misbehaved; the message names it (and its distribution)."""


class Algorithms(Mapping):
    """``{name: Algorithm class or AlgorithmRef}`` whose refs are imported on first lookup."""

    def __init__(self, algos: Dict[str, Any]):
        self._algos = dict(algos)

    def __getitem__(self, name: str) -> Any:
        a = self._algos[name]
        if isinstance(a, AlgorithmRef):
            try:
                a = self._algos[name] = a.load()
            except ImportError as e:
                raise PluginError(f"algorithm {name!r}: {e}") from e
        return a

    def __contains__(self, name: object) -> bool:
        return name in self._algos

    def __iter__(self) -> Iterator[str]:
        return iter(self._algos)

    def __len__(self) -> int:
        return len(self._algos)


class PluginManager(pluggy.PluginManager):
    """pluggy's manager, where an undecorated ``flowkit_*`` method also counts as a hookimpl
    (so a subclass overriding a decorated method keeps the hook, as pytest does)."""

    def __init__(self):
        super().__init__("flowkit")
        self.add_hookspecs(specs)
        self.dists: Dict[str, str] = {}  # plugin name -> "dist version"
        self._registry: Dict[str, Any] = {}  # registration results, until the next (un)register
        self.owner: Dict[str, str] = {}  # algorithm or reporter name -> plugin name

    def register(self, plugin: Any, name: Optional[str] = None) -> Optional[str]:
        self._registry.clear()
        return super().register(plugin, name)

    def unregister(self, plugin: Any = None, name: Optional[str] = None) -> Any:
        self._registry.clear()
        return super().unregister(plugin, name)

    def parse_hookimpl_opts(self, plugin, name):
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith("flowkit_") and inspect.isroutine(getattr(plugin, name, None)):
            return {}
        return opts

    def load_modules(self, modules: Sequence[str], where: str = "`plugins`") -> None:
        """Import and register each of ``modules`` not registered yet, named after it (then
        call :meth:`check_hooks`); a module already registered under another name (an
        installed plugin's entry point, e.g. ``plugins=[flowkit_ppo]``) is left as it is.

        Raises:
            PluginError: a module that does not import, or implements no flowkit hook (named, with
                ``where`` it was listed).
        """
        for mod in modules:
            if self.get_plugin(mod) is None:
                try:
                    obj = importlib.import_module(mod)
                except Exception as e:
                    hint = ("; install its distribution (pip install -e FOLDER) or put the folder holding it on "
                            "PYTHONPATH") if isinstance(e, ModuleNotFoundError) and e.name == mod.split(".")[0] else ""
                    raise PluginError(f"plugin module {mod!r} (from {where}) failed to import: "
                                      f"{type(e).__name__}: {e}{hint}") from e
                if self.is_registered(obj):  # (pluggy: "already registered under a different name")
                    continue
                self.register(obj, name=mod)
                if not self.get_hookcallers(obj):
                    self.unregister(obj)
                    raise PluginError(f"plugin module {mod!r} (from {where}) implements no flowkit hook "
                                      "(a plugin defines flowkit_* functions, e.g. flowkit_add_algorithms)")

    def check_hooks(self) -> None:
        """``check_pending()``, an unknown ``flowkit_*`` hook name raised as a PluginError."""
        try:
            self.check_pending()
        except pluggy.PluginValidationError as e:
            raise PluginError(f"unknown hook: {e}") from None

    def algorithms(self, load: bool = True) -> Mapping[str, Any]:
        """``{name: Algorithm class}``, each class imported when it is first looked up (a run
        imports only the algorithms it uses: a broken plugin it does not use stays unloaded);
        a name contributed twice is an error naming both. ``load=False``: as contributed (an
        :class:`AlgorithmRef` stays one: no torch)."""
        algos = self._named("algorithm", self.hook.flowkit_add_algorithms)
        if load and "loaded" not in self._registry:
            self._registry["loaded"] = Algorithms(algos)
        return self._registry["loaded"] if load else algos

    def _named(self, kind: str, hook: Any) -> Dict[str, Any]:
        if kind in self._registry:
            return self._registry[kind]
        out: Dict[str, Any] = {}
        owner: Dict[str, str] = {}
        for impl in hook.get_hookimpls():
            for cls in impl.function() or []:
                name = getattr(cls, "name", None)
                if not name:
                    raise PluginError(f"plugin {impl.plugin_name!r} returned {cls!r} without a `name`")
                if name in out and out[name] is not cls:
                    raise PluginError(f"{kind} {name!r} is contributed twice: by plugin "
                                      f"{owner[name]!r} and by plugin {impl.plugin_name!r}")
                out[name], owner[name] = cls, impl.plugin_name
        self._registry[kind] = out
        self.owner.update(owner)
        return out

    def env_presets(self) -> Dict[str, Any]:
        """``{name: EnvPreset}`` from ``flowkit_add_env_presets``; a name contributed twice is
        an error naming both plugins."""
        return self._named("env preset", self.hook.flowkit_add_env_presets)

    def reporters(self) -> Dict[str, type]:
        """``{name: reporter class}`` from ``flowkit_add_reporters``; a name contributed
        twice is an error naming both plugins."""
        return self._named("reporter", self.hook.flowkit_add_reporters)

    def config_sections(self) -> Dict[str, type]:
        """Algorithm sections (keyed by algorithm name, named in its ``algorithms``: a
        :class:`flowkit.config.Sections`) plus plugin sections."""
        if "section" in self._registry:
            return self._registry["section"]
        algos = self.algorithms(load=False)
        secs = Sections({name: cls.config_class for name, cls in algos.items() if cls.config_class is not None}, algos)
        for d in self.hook.flowkit_add_config_sections():
            for k, v in (d or {}).items():
                if k in secs and secs[k] is not v:
                    raise PluginError(f"config section {k!r} is contributed twice")
                secs[k] = v
        self._registry["section"] = secs
        return secs

    def state_dict(self) -> Dict[str, Any]:
        states = {impl.plugin_name: impl.function() for impl in self.hook.flowkit_state_dict.get_hookimpls()}
        return {name: st for name, st in states.items() if st is not None}

    def load_state_dict(self, states: Dict[str, Any]) -> None:
        for impl in self.hook.flowkit_load_state_dict.get_hookimpls():
            if impl.plugin_name in states:
                impl.function(state=states[impl.plugin_name])


def get_plugin_manager(plugin_modules: Sequence[str] = (), include_registered: bool = True,
                       extra: Sequence[Any] = ()) -> PluginManager:
    """Build a plugin manager.

    Args:
        plugin_modules: importable module paths from the config (``plugins=[...]``).
        include_registered: add objects registered in code with :func:`register`.
        extra: further plugin objects.
    Raises:
        PluginError: a module or entry point that does not import (naming it and its
            distribution), or an unknown ``flowkit_*`` hook name.
    """
    pm = PluginManager()
    pm.load_modules(("flowkit.builtin", "flowkit.reporters"), "flowkit's built-ins")
    for ep in plugin_entry_points():
        if pm.get_plugin(ep.name) is not None or pm.is_blocked(ep.name):
            continue
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist else "unknown distribution"
        try:
            obj = ep.load()
        except Exception as e:
            raise PluginError(f"plugin {ep.name!r} from distribution {dist} failed to load: "
                              f"{type(e).__name__}: {e}") from e
        pm.register(obj, name=ep.name)
        pm.dists[ep.name] = dist
    pm.load_modules(plugin_modules)
    for obj in list(extra) + (list(_REGISTERED) if include_registered else []):
        if not pm.is_registered(obj):
            pm.register(obj)
    pm.check_hooks()
    register_presets(pm.env_presets().values())  # (make_env finds them by name in this process)
    return pm


def worker_plugin_manager(plugin_modules: Sequence[str]) -> PluginManager:
    """A rollout worker's plugin manager (the ``make_pm`` of :class:`flowkit.core.WorkerSet`):
    importable plugins only; objects registered in code stay on the driver."""
    return get_plugin_manager(plugin_modules, include_registered=False)


def lazy_attrs(home: Dict[str, str]) -> Any:
    """A module ``__getattr__`` (PEP 562) importing each name of ``home`` (name -> module) on
    first use: a plugin's entry-point module keeps torch out (``__getattr__ =
    lazy_attrs({"MyAlgo": "my_pkg.algo"})``)."""
    def __getattr__(name: str) -> Any:
        if name in home:
            return getattr(importlib.import_module(home[name]), name)
        raise AttributeError(f"module has no attribute {name!r}")
    return __getattr__


def register(obj: Any) -> Any:
    """Register a plugin object in code (driver; workers only on the local backend)."""
    if obj not in _REGISTERED:
        _REGISTERED.append(obj)
    return obj


def unregister(obj: Any) -> None:
    """Undo :func:`register` (a no-op for an object not registered)."""
    if obj in _REGISTERED:
        _REGISTERED.remove(obj)
