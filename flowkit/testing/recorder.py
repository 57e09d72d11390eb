"""The hook recorder: a plugin implementing every hookspec that records each call."""
from __future__ import annotations

import inspect
from typing import Any, Dict, List, Optional, Tuple

from flowkit.hooks import hookimpl, specs

HOOKS = sorted(n for n, f in vars(specs).items() if n.startswith("flowkit_") and inspect.isfunction(f))


class HookRecorder:
    """Implements every hookspec (built by reflection from :mod:`flowkit.hooks.specs`) and
    appends ``(hook name, {argument: value})`` to :attr:`calls` for each call. Returns None
    everywhere (a firstresult hook falls through to the next plugin; no checkpoint state).
    Register it (``flowkit.register(rec)``, or the ``hook_recorder`` fixture) and run.

    Hooks that run on workers are seen only on the local backend (``runtime.backend=local``).
    Override :meth:`_record` to record differently.
    """

    __name__ = "hook_recorder"  # the plugin's name (its checkpointed state, if any, is keyed by it)

    def __init__(self) -> None:
        self.calls: List[Tuple[str, Dict[str, Any]]] = []

    def names(self) -> List[str]:
        """The hook names called, in order."""
        return [n for n, _ in self.calls]

    def _record(self, name: str, kwargs: Dict[str, Any]) -> Optional[Any]:
        self.calls.append((name, kwargs))
        return None


for _name in HOOKS:  # a method per hook with the spec's argument names (pluggy passes by name)
    _args = list(inspect.signature(getattr(specs, _name)).parameters)
    _src = (f"def {_name}(self{''.join(', ' + a for a in _args)}):\n"
            f"    return self._record({_name!r}, dict({', '.join(f'{a}={a}' for a in _args)}))\n")
    _ns: Dict[str, Any] = {}
    exec(_src, _ns)
    setattr(HookRecorder, _name, hookimpl(_ns[_name]))
