"""Target networks (DQN, APPO, SAC, TD3): a frozen copy of some online modules that follows
them by a hard copy or by Polyak averaging, and travels with the policy's state."""
from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

__all__ = ["TargetNetwork", "flat_parameters"]


def flat_parameters(module: nn.Module, device: Any = "cpu",
                    trainable_only: bool = True) -> Tuple[List[nn.Parameter], torch.Tensor]:
    """Move the parameters of ``module`` (those with ``requires_grad`` when ``trainable_only``)
    into one flat buffer, in ``module.parameters()`` order: each becomes a view of it.
    Returns ``(params, flat)``; an op on ``flat`` (an optimizer step, a Polyak average) acts on
    all of them at once."""
    params = [p for p in module.parameters() if p.requires_grad or not trainable_only]
    flat = torch.zeros(sum(p.numel() for p in params), device=device, dtype=params[0].dtype)
    off = 0
    for p in params:
        n = p.numel()
        flat[off:off + n].copy_(p.data.reshape(-1))
        p.data = flat[off:off + n].view_as(p)
        off += n
    return params, flat


class TargetNetwork:
    """A copy of ``online`` with no gradients, never sent to the workers, moved by :meth:`update`.

    Args:
        online: the module(s) it follows (a ``ModuleDict`` for several parts).
        tau: None: :meth:`update` copies the online weights (buffers too: DQN, APPO); else
            Polyak averaging ``target <- target + tau * (online - target)`` of the parameters
            (Lillicrap et al. 2016, arXiv 1509.02971, section 7: SAC, TD3).
        online_flat: with ``tau``, ``online``'s parameters as one flat tensor in
            ``online.parameters()`` order (a segment of the policy's flat buffer): the target's
            parameters are made views of one flat buffer too, so an update is one ``lerp_``.

    ``module`` is the copy (call it as the online one); :meth:`get_state` / :meth:`set_state`
    give and load its state dict as ``{name: np.ndarray}`` (exact resume).
    """

    def __init__(self, online: nn.Module, tau: Optional[float] = None, online_flat: Optional[torch.Tensor] = None):
        self.online, self.tau, self.online_flat = online, tau, online_flat
        self.module = copy.deepcopy(online).requires_grad_(False)
        self.flat: Optional[torch.Tensor] = None
        if online_flat is not None:
            self.flat = flat_parameters(self.module, online_flat.device, trainable_only=False)[1]
            assert torch.equal(self.flat, online_flat), "online_flat must hold online's parameters, in order"

    @torch.no_grad()
    def update(self) -> None:
        """Hard copy (``tau`` None) or one Polyak step towards the online weights."""
        if self.tau is None:
            self.module.load_state_dict(self.online.state_dict())
        elif self.flat is not None and self.online_flat is not None:
            self.flat.lerp_(self.online_flat, self.tau)
        else:
            for t, o in zip(self.module.parameters(), self.online.parameters(), strict=True):
                t.lerp_(o, self.tau)

    def __getitem__(self, name: str) -> nn.Module:
        """The copy of part ``name`` of a ``ModuleDict`` (``target["critic"]``)."""
        return self.module[name]  # type: ignore[index]

    def get_state(self) -> Dict[str, np.ndarray]:
        return {k: v.detach().cpu().numpy().copy() for k, v in self.module.state_dict().items()}

    def set_state(self, state: Dict[str, np.ndarray]) -> None:
        self.module.load_state_dict({k: torch.as_tensor(np.array(v)) for k, v in state.items()})
