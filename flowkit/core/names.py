"""Config values that name code, and the one resolver that imports them.

A config names code in three places, and only there (:data:`CODE_KEYS`):

- ``env.factory`` and ``model.class`` (also a policy's own ``...model.class``): ``module:attr``,
  ``attr`` possibly dotted (``pkg.envs:Maker.build``);
- ``env.id`` of the form ``module:Id-v0``: Gymnasium imports ``module`` to register ``Id-v0``;
- each ``plugins`` item: a module name.

:func:`resolve` is the only way flowkit turns a ``module:attr`` value into an object, and it
accepts that one form: ``module:``, ``module``, ``module.attr`` or an empty attribute is a
:class:`flowkit.ConfigError` naming the key, raised before anything is imported. The run-folder
trust rule (:mod:`flowkit._trust`) reads the same keys with :func:`code_values`, every form
counted, so a value that could reach an import is one the rule has seen. Torch-free.
"""
from __future__ import annotations

import functools
import importlib
import re
from typing import Any, Iterator, Tuple

from flowkit.config import ConfigError

_NAME = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_STRICT = re.compile(rf"({_NAME}):({_NAME})")
LOOSE = re.compile(rf"{_NAME}:(?:{_NAME})?")
"""Any other string value of this shape (``mod:`` or ``mod:attr``) is counted as naming code
by the trust rule too, whatever its key (a plugin's own key may resolve it)."""
CODE_KEYS = ("env.factory", "env.id", "model.class", "plugins")
"""The keys whose values name code (``model.class`` also under any prefix)."""


def is_code_key(key: str) -> bool:
    """Whether the dotted ``key`` (list items as ``key[i]``) names code (:data:`CODE_KEYS`)."""
    key = re.sub(r"\[\d+\]$", "", key)
    return key in CODE_KEYS or key.endswith(".model.class")


def module_of(value: str, key: str) -> str:
    """The module a code value names, the part that an import would run: ``mod`` of
    ``mod:attr``, of ``mod:`` and of a Gymnasium ``mod:Id-v0``; a ``plugins`` item or a value
    without ``:`` is itself a module name (``venv.__main__`` as ``model.class`` would import it)."""
    return value.partition(":")[0].strip() if ":" in value else value.strip()


def leaves(data: Any, prefix: str = "") -> Iterator[Tuple[str, Any]]:
    """``(dotted key, value)`` of every leaf of plain data (list items as ``key[i]``)."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from leaves(v, f"{prefix}{k}.")
    elif isinstance(data, (list, tuple)):
        for i, v in enumerate(data):
            yield from leaves(v, f"{prefix[:-1]}[{i}].")
    else:
        yield prefix[:-1], data


def code_values(data: Any) -> Iterator[Tuple[str, str]]:
    """``(dotted key, value)`` for every value of a plain-data config that names code: each
    non-empty string at a :func:`is_code_key` key, in any form (``env.id`` only with a ``:``),
    and every other string of the form ``mod:`` or ``mod:attr`` (:data:`LOOSE`)."""
    for key, v in leaves(data):
        if not isinstance(v, str) or not v.strip():
            continue
        v = v.strip()
        if (":" in v) if key == "env.id" else (is_code_key(key) or LOOSE.fullmatch(v)):
            yield key, v


def split(value: Any, key: str) -> Tuple[str, str]:
    """``(module, attr)`` of a ``module:attr`` value.

    Raises:
        ConfigError: any other form (``mod``, ``mod:``, ``mod.attr``, spaces, not a string),
            naming ``key``; nothing is imported.
    """
    m = _STRICT.fullmatch(value.strip()) if isinstance(value, str) else None
    if m is None:
        raise ConfigError(f"{key}={value!r} must be of the form module:attr (a module path, a colon, then the name "
                          "of an object in it); nothing was imported")
    return m.group(1), m.group(2)


def resolve(value: Any, key: str) -> Any:
    """The object ``module:attr`` names (``attr`` dotted: attributes in turn): the one place
    flowkit imports code a config value names.

    Raises:
        ConfigError: not of the form ``module:attr`` (nothing imported), or the module does
            not import or has no such attribute (one line: the key, the value, the error).
    """
    module, attr = split(value, key)
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as e:
        raise ConfigError(f"{key}={value!r} does not import: {type(e).__name__}: {e}") from None
    return obj


__all__ = ["CODE_KEYS", "LOOSE", "code_values", "is_code_key", "leaves", "module_of", "plugin_entry_points", "resolve",
           "split"]


@functools.lru_cache(maxsize=None)
def plugin_entry_points() -> Tuple[Any, ...]:
    """The installed ``flowkit`` entry points (``importlib.metadata.EntryPoint``; ``.module``
    is the plugin's module), read once per process: importlib.metadata's scan of the installed
    distributions costs start-up time."""
    import importlib.metadata as md
    return tuple(md.entry_points(group="flowkit"))
