"""The one table of hidden-layer activations (config key ``model.activation``): for each name
the ``torch.nn`` module class, the ``torch.nn.functional`` function and, where numpy has an
exact equivalent, the in-place numpy function of the torch-free acting path (None: that
activation is acted on with torch). The names are :data:`flowkit.config.ACTIVATIONS` (config
lists them for ``--help`` without importing this module); the table is checked against them at
import. This module imports no torch: the torch objects are looked up on first use."""
from __future__ import annotations

from typing import Any, Callable, Dict, NamedTuple, Optional

import numpy as np

from flowkit.config import ACTIVATIONS as NAMES


def _np_relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0, out=x)


class Activation(NamedTuple):
    module: str  # class name in torch.nn, e.g. "Tanh"
    numpy: Optional[Callable[[np.ndarray], np.ndarray]]  # float32[...] -> same shape (may work in place)


ACTIVATIONS: Dict[str, Activation] = {
    "tanh": Activation("Tanh", np.tanh), "relu": Activation("ReLU", _np_relu),
    "elu": Activation("ELU", None), "gelu": Activation("GELU", None), "silu": Activation("SiLU", None)}
if tuple(ACTIVATIONS) != NAMES:
    raise ImportError(f"flowkit.config.ACTIVATIONS {NAMES} and flowkit.core.activations {tuple(ACTIVATIONS)} disagree")


def _get(name: str) -> Activation:
    if name not in ACTIVATIONS:
        raise ValueError(f"model.activation={name!r} is not one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def torch_module(name: str) -> Any:
    """A new ``torch.nn`` module of activation ``name``; ValueError naming ``model.activation``
    if it is not in the table."""
    from torch import nn
    return getattr(nn, _get(name).module)()


def torch_function(name: str) -> Callable[..., Any]:
    """The ``torch.nn.functional`` function of activation ``name`` (the same object on every
    call); ValueError as :func:`torch_module`."""
    from torch.nn import functional
    _get(name)
    return getattr(functional, name)


def has_numpy(name: str) -> bool:
    """Whether activation ``name`` is in the table and has a numpy function."""
    return name in ACTIVATIONS and ACTIVATIONS[name].numpy is not None


def numpy_function(name: str) -> Callable[[np.ndarray], np.ndarray]:
    """The numpy function of activation ``name``; ValueError naming ``model.activation`` if
    it has none (see :func:`has_numpy`)."""
    fn = _get(name).numpy
    if fn is None:
        raise ValueError(f"model.activation={name!r} has no numpy function (those with one: "
                         f"{sorted(n for n in ACTIVATIONS if has_numpy(n))})")
    return fn
