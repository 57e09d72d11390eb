"""A run folder is data; its callables need your consent.

Reading a run folder (``flowkit evaluate``, ``flowkit export``, ``resume=``, a multi-agent
``checkpoint=`` opponent, :meth:`Algorithm.from_checkpoint`) reads its ``config.yaml`` with
:func:`read_run_config`: plain YAML (no ``!!python`` tags), and no ``${...}`` interpolation
(``${oc.env:HOME}`` would read your environment). :func:`check_config_callables` then lets
through only the callables that installed flowkit plugins vouch for:

- ``module:attr`` whose module is, or lies below, a module of the ``flowkit`` entry-point
  group (``flowkit_ppo``, ``flowkit_multiagent``, ...) or ``flowkit.testing``, and whose
  object, once resolved, is defined there too (``flowkit_x.y:os.system`` is refused);
- ``module:attr`` matching a pattern an entry-point module lists in
  ``FLOWKIT_TRUSTED_CALLABLES`` (regular expressions over the whole ``module:attr`` text; the
  multiagent plugin lists PettingZoo's and MPE2's env constructors).

Any other callable -- ``env.factory``, ``model.class`` (also a policy's own), a ``plugins``
module, the module of an ``env.id`` of the form ``module:Id``, any other ``module:`` or
``module:attr`` value; at the keys that name code, every form (``mod``, ``mod:``,
``mod.attr``), as :func:`flowkit.core.names.code_values` finds them for the one resolver,
:func:`flowkit.core.names.resolve` -- is refused with one line naming the key, the value and the three ways to consent:
``--trust-config`` (evaluate, export, ``train resume=``), ``trust_config=True`` in Python,
or the same key given again on the command line. Nothing named by the folder is imported
before that check. Torch-free.
"""
from __future__ import annotations

import importlib
import os
import re
from typing import Any, Collection, Dict, List, Optional, Tuple

from flowkit.config import ConfigError, read_yaml
from flowkit.core.names import code_values, leaves, module_of, plugin_entry_points, resolve

TESTING = "flowkit.testing"
CONSENT = ("a run folder is data: its callables run only with your consent (--trust-config, "
           "trust_config=True in Python, or give the same value again on the command line)")
_MAX_BYTES = 1 << 20  # a config.yaml is a few KB


class RunFolderError(ConfigError):
    """A run folder's or checkpoint's file that cannot be used as it is (unreadable, not plain
    YAML or plain data, an interpolation, not format 2, naming an algorithm that is not
    registered): one line naming the file and what is wrong. Importable from
    :mod:`flowkit.checkpoint` too. ``exit_status``: 1 for a damaged file (``damaged``), 2 for
    one refused for what the user gave or did not consent to (the CLI's exit status)."""

    def __init__(self, msg: str, damaged: bool = True):
        super().__init__(msg)
        self.exit_status = 1 if damaged else 2


class UntrustedConfigError(ConfigError):
    """A run folder's config names a callable the user did not consent to (one line naming
    the key and the callable)."""


def read_run_config(path: str) -> Dict[str, Any]:
    """The ``config.yaml`` of a checkpoint or run folder (``path``: the file or its folder)
    as plain data, read with :func:`flowkit.config.read_yaml` (OmegaConf's safe YAML loader);
    nothing in it is resolved or run.

    Raises:
        RunFolderError: no such file, unreadable, over 1 MiB, not UTF-8, not YAML (a
            ``!!python`` tag included), not a mapping, no ``algo`` name (an empty file), or a
            value holding a ``${...}`` interpolation (the key named).
    """
    if os.path.isdir(path):
        path = os.path.join(path, "config.yaml")
    data = read_yaml(path, RunFolderError, _MAX_BYTES)
    if not isinstance(data.get("algo"), str) or not data["algo"]:  # every run's config names its algorithm
        raise RunFolderError(f"{path}: `algo` is {'missing' if 'algo' not in data else repr(data['algo'])}, "
                             "not an algorithm name (a run's config.yaml names the algorithm it trained)")
    for key, v in leaves(data):
        if isinstance(v, str) and "${" in v:
            raise RunFolderError(f"{path}: `{key}` holds the interpolation {v!r}; interpolations in a run "
                                 "folder's config are not resolved (they could read your environment or files)",
                                 damaged=False)
    return data


def callables_named(data: Dict[str, Any]) -> List[Tuple[str, str]]:
    """``[(key, callable)]`` a config names, as :func:`flowkit.core.names.code_values` finds
    them (the resolver's own keys, every form): each ``plugins`` module, the module of an
    ``env.id`` of the form ``module:Id`` (as ``module:``), each ``env.factory`` and
    ``model.class`` (a policy's own too) whatever its form, and every other string value of
    the form ``module:`` or ``module:attr``."""
    return [(k, module_of(v, k) + ":" if k == "env.id" else v) for k, v in code_values(data)]


def _entry_modules() -> Tuple[List[str], List[str]]:
    """(modules of the ``flowkit`` entry points and flowkit.testing, the patterns they list)."""
    mods, patterns = [TESTING], []
    for ep in plugin_entry_points():
        mods.append(mod := ep.module)
        try:  # (installed code, loaded by the plugin manager already)
            obj = importlib.import_module(mod)
        except Exception:  # a broken plugin vouches for nothing (the plugin manager names it)
            continue
        patterns += [p for p in getattr(obj, "FLOWKIT_TRUSTED_CALLABLES", ()) if isinstance(p, str)]
    return mods, patterns


def _below(module: str, roots: Collection[str]) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots)


def is_trusted(value: str) -> bool:
    """Whether an installed flowkit plugin vouches for the callable ``value`` (``module:attr``,
    or ``module:`` or ``module`` for a module): see the module docstring. Imports only modules below an
    entry-point module or flowkit.testing (installed code), to see where the object is defined."""
    roots, patterns = _entry_modules()
    if any(re.fullmatch(p, value) for p in patterns):
        return True
    module, _, attr = value.partition(":")
    if not _below(module.strip(), roots):
        return False
    if not attr:
        return True  # a module below an entry point's (installed code)
    try:
        obj = resolve(value, "value")
    except ConfigError:
        return False  # not there, or not of the resolver's form: refused as not provided
    home = getattr(obj, "__module__", None)
    return isinstance(home, str) and _below(home, roots)


def check_config_callables(data: Dict[str, Any], where: str, trust: bool = False,
                           confirmed: Optional[Dict[str, Any]] = None, allowed: Collection[str] = ()) -> None:
    """Refuse the first callable of ``data`` (a run folder's config, plain data) that no
    installed flowkit plugin vouches for (:func:`is_trusted`), unless ``trust``, the user
    gave that key again (``confirmed``: the user's own config as a nested dict: a key there
    is the user's value, or the same one confirmed) or the value is in ``allowed`` (the
    callables of a config the user gave or consented to).

    Raises:
        UntrustedConfigError: one line naming ``where`` (the file), the key and the callable.
    """
    if trust:
        return
    mine = {re.sub(r"\[\d+\]", "", k) for k, _ in leaves(confirmed or {})}
    for key, value in callables_named(data):
        if re.sub(r"\[\d+\]", "", key) in mine or value in allowed or is_trusted(value):
            continue
        shown = value[:-1] if value.endswith(":") else value
        raise UntrustedConfigError(f"{where}: `{key}` names {shown!r}, which no installed flowkit plugin provides; "
                                   f"it was not imported: {CONSENT}")


__all__ = ["CONSENT", "RunFolderError", "UntrustedConfigError", "callables_named", "check_config_callables",
           "is_trusted", "read_run_config"]
