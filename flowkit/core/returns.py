"""Returns and advantages shared by the actor-critic algorithms: GAE (PPO, A2C) and V-trace
(IMPALA, APPO), over flat sequences of trajectory pieces as rollout workers produce them (rows
of one piece contiguous, pieces ending where :func:`flowkit.core.batch.trajectory_ends` says).
Numpy in, float32 numpy out.
"""
from __future__ import annotations

from typing import Mapping, Optional, Tuple

import numpy as np

from flowkit.core import batch as sb

__all__ = ["bootstrap_rows", "compute_gae", "next_values", "vtrace"]


def bootstrap_rows(batch: Mapping[str, np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    """Where the pieces of ``batch`` end and which ends bootstrap.

    Returns:
        ``(nextnonterminal float32[L], boot_idx int64[k])``: 0 where a piece ends
        (terminated, truncated or cut), and the rows that end without terminating, whose
        V(s_{t+1}) is V(``next_obs``).
    """
    ends, term = sb.trajectory_ends(batch)
    return (~ends).astype(np.float32), np.flatnonzero(ends & ~term)


def next_values(values: np.ndarray, nextnonterminal: np.ndarray, boot_idx: np.ndarray,
                boot_values: Optional[np.ndarray]) -> np.ndarray:
    """V(s_{t+1}) per row: the next row's value inside a piece, 0 after a termination,
    ``boot_values`` (V(final / next observation)) at truncations and cuts.

    Args:
        values: float32[L], V(s_t). nextnonterminal: float32[L]; boot_idx: int[k] (see
            :func:`bootstrap_rows`). boot_values: float32[k] (None when k is 0).
    Returns:
        float32[L].
    """
    v = np.asarray(values, np.float32)
    nv = np.zeros_like(v)
    nv[:-1] = np.where(nextnonterminal[:-1] > 0, v[1:], np.float32(0.0))
    if len(boot_idx):
        nv[boot_idx] = boot_values
    return nv


def compute_gae(rewards: np.ndarray, values: np.ndarray, next_values: np.ndarray,
                nextnonterminal: np.ndarray, gamma: float, gae_lambda: float) -> Tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimation (Schulman et al. 2016, arXiv 1506.02438, eq. 16) over
    a flat sequence of trajectory pieces, backwards::

        delta_t    = r_t + gamma * V(s_{t+1}) - V(s_t)
        lastgaelam = delta_t + gamma * lambda * nextnonterminal_t * lastgaelam

    Args:
        rewards: float32[L].
        values: float32[L], V(s_t).
        next_values: float32[L], V(s_{t+1}): 0 after a termination, V(final observation) after
            a truncation or a fragment cut (see :func:`next_values`).
        nextnonterminal: float32[L], 0 where the trajectory ends (terminated, truncated, cut).
        gamma: discount. gae_lambda: GAE lambda.
    Returns:
        ``(advantages, value_targets)``, float32[L]; ``value_targets = advantages + values``.
    """
    n = len(rewards)
    adv = [0.0] * n
    r, v, nv, nn_ = rewards.tolist(), values.tolist(), next_values.tolist(), nextnonterminal.tolist()
    gl = gamma * gae_lambda
    lastgaelam = 0.0
    for t in range(n - 1, -1, -1):
        adv[t] = lastgaelam = r[t] + gamma * nv[t] - v[t] + gl * nn_[t] * lastgaelam  # delta_t + ...
    a = np.asarray(adv, np.float32)
    return a, a + np.asarray(values, np.float32)


def vtrace(log_rhos: np.ndarray, rewards: np.ndarray, values: np.ndarray, next_values: np.ndarray,
           nextnonterminal: np.ndarray, gamma: float, clip_rho_threshold: float = 1.0,
           clip_c_threshold: float = 1.0, clip_pg_rho_threshold: float = 1.0,
           vtrace_lambda: float = 1.0) -> Tuple[np.ndarray, np.ndarray]:
    """V-trace targets and policy-gradient advantages over a flat sequence of trajectory
    pieces (Espeholt et al. 2018, arXiv 1802.01561, eq. 1 and section 4.2), backwards::

        rho_t   = min(rho_bar, pi/mu),  c_t = lambda * min(c_bar, pi/mu)
        delta_t = rho_t * (r_t + gamma * V(x_{t+1}) - V(x_t))
        v_t - V(x_t) = delta_t + gamma * c_t * nextnonterminal_t * (v_{t+1} - V(x_{t+1}))
        A_t     = min(rho_pg_bar, pi/mu) * (r_t + gamma * v_{t+1} - V(x_t))

    where v_{t+1} = V(x_{t+1}) at the end of a piece. Computed in float64.

    Args:
        log_rhos: float[L], log pi(a_t|x_t) - log mu(a_t|x_t).
        rewards: float[L]. values: float[L], V(x_t).
        next_values: float[L], V(x_{t+1}): 0 after a termination, V(final observation) after
            a truncation or a fragment cut.
        nextnonterminal: float[L], 1 where row t+1 continues row t's trajectory, 0 where it
            ends (terminated, truncated or cut) -- the recursion restarts there.
    Returns:
        ``(vs, pg_advantages)``, float32[L].
    """
    rhos = np.exp(np.asarray(log_rhos, np.float64))
    cs = vtrace_lambda * np.minimum(clip_c_threshold, rhos)
    r, v, nv, cont = (np.asarray(x, np.float64) for x in (rewards, values, next_values, nextnonterminal))
    deltas = np.minimum(clip_rho_threshold, rhos) * (r + gamma * nv - v)
    n = len(r)
    vs_minus_v = [0.0] * n
    d, gc = deltas.tolist(), (gamma * cs * cont).tolist()
    acc = 0.0
    for t in range(n - 1, -1, -1):
        vs_minus_v[t] = acc = d[t] + gc[t] * acc
    vs = np.asarray(vs_minus_v) + v
    vs_next = nv.copy()                     # v_{t+1} = V(x_{t+1}) where the piece ends
    vs_next[:-1] = np.where(cont[:-1] > 0, vs[1:], nv[:-1])
    pg_adv = np.minimum(clip_pg_rho_threshold, rhos) * (r + gamma * vs_next - v)
    return vs.astype(np.float32), pg_adv.astype(np.float32)
