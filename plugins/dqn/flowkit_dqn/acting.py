"""DQN's acting side, without torch: exploration schedules, n-step returns, epsilon-greedy
acting (:class:`DQNActing`, the base of :class:`~flowkit_dqn.dqn.DQNPolicy`) and
:class:`NumpyDQNPolicy`, the copy a Ray rollout worker builds instead of an MLP DQNPolicy
(the worker process then never imports torch). See :mod:`flowkit_dqn.dqn` for the math."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from flowkit.core import Acting, NumpyPolicy
from flowkit.core import batch as sb


# ---- exploration schedules ----------------------------------------------------------------
def epsilon_at(cfg: Any, env_steps: int) -> float:
    """Linear schedule: ``initial_epsilon`` -> ``final_epsilon`` over ``epsilon_timesteps``
    env steps sampled, constant after."""
    if cfg.epsilon_timesteps <= 0:
        return float(cfg.final_epsilon)
    frac = min(1.0, env_steps / cfg.epsilon_timesteps)
    return float(cfg.initial_epsilon + frac * (cfg.final_epsilon - cfg.initial_epsilon))


def apex_epsilon(worker_index: int, num_workers: int, base: float = 0.4, alpha: float = 7.0) -> float:
    """Ape-X's fixed per-worker epsilon (Horgan et al. 2018, section 4.1):
    ``base^(1 + alpha * i / (N - 1))``; ``base`` when N == 1."""
    return float(base if num_workers <= 1 else base ** (1.0 + alpha * max(worker_index, 0) / (num_workers - 1)))


# ---- n-step returns and targets -----------------------------------------------------------------
def compute_n_step(rewards: np.ndarray, ends: np.ndarray, gamma: float,
                   n: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n-step discounted returns over a flat sequence of trajectory pieces.

    Args:
        rewards: float32[L]. ends: bool[L], True where a piece ends (terminated, truncated or
            cut; the last row must be True). gamma: discount. n: window length >= 1.
    Returns:
        ``(returns float32[L], last int64[L], n_steps int64[L])``: the window of row ``t``
        covers rows ``t .. last[t]`` (``n_steps = last - t + 1 <= n``), never past a piece end.
    """
    L = len(rewards)
    r, ends, t = np.asarray(rewards, np.float64), np.asarray(ends, bool), np.arange(L)
    ret, last, active = np.zeros(L, np.float64), t.copy(), np.ones(L, bool)
    for i in range(n):
        idx = np.minimum(t + i, L - 1)
        ret += np.where(active, (gamma ** i) * r[idx], 0.0)
        last = np.where(active, idx, last)
        active = active & ~ends[idx] & (t + i + 1 < L)
    return ret.astype(np.float32), last.astype(np.int64), (last - t + 1).astype(np.int64)


# ---- acting ------------------------------------------------------------------------------------
class DQNActing(Acting):
    """Epsilon-greedy acting over :meth:`q_values` (legal actions only) and the n-step
    postprocessing: what a DQN policy does on a rollout worker. ``epsilon`` is set from
    outside (DQN's ``UpdateExploration`` and a new worker's first, through
    :meth:`set_exploration_state`)."""
    epsilon: float
    config: Any
    np_random: np.random.Generator

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q-values float32[B, num_actions] of encoded observations float32[B, *shape]."""
        raise NotImplementedError

    def exploration_state(self) -> Dict[str, Any]:
        """``{"epsilon": float}``: sent to the workers before their first sample (a resumed
        run's workers go on at the checkpoint's epsilon, not ``initial_epsilon``)."""
        return {"epsilon": float(self.epsilon)}

    def set_exploration_state(self, state: Mapping[str, Any]) -> None:
        self.epsilon = float(state.get("epsilon", self.epsilon))

    def compute_actions_encoded(self, obs, mask=None, explore=True):
        return self.epsilon_greedy(self.q_values(obs), mask, explore), {}

    def epsilon_greedy(self, q: np.ndarray, mask: Optional[np.ndarray] = None, explore: bool = True) -> np.ndarray:
        """Actions int64[B] from Q-values float32[B, A]: the argmax over legal actions (``mask``
        int8[B, A], None: all legal), replaced with probability ``epsilon`` (when ``explore``)
        by a uniform draw over the legal actions.

        Raises:
            ValueError: a row of ``mask`` allows no action."""
        if mask is not None:
            self.check_mask(mask)
            legal = mask.astype(bool)
            q = np.where(legal, q, -np.inf)
        actions = q.argmax(1)
        if explore and self.epsilon > 0:
            u = self.np_random.random(q.shape[0])
            scores = self.np_random.random(q.shape)
            if mask is not None:
                scores = np.where(legal, scores, -1.0)
            actions = np.where(u < self.epsilon, scores.argmax(1), actions)
        return actions.astype(np.int64)

    def postprocess_trajectory(self, batch: sb.SampleBatch) -> sb.SampleBatch:
        """Add ``n_steps`` and, for ``n_step > 1``, fold rewards into n-step returns with
        next_obs / terminated / truncated / next_action_mask taken from the window's last row."""
        out = sb.SampleBatch(batch)
        L = len(out)
        n = int(self.config.n_step)
        if L == 0 or n == 1:
            out[sb.N_STEPS] = np.ones(L, np.int64)
            return out
        ends, term = sb.trajectory_ends(out)
        ret, last, steps = compute_n_step(np.asarray(out[sb.REWARDS]), ends, self.config.gamma, n)
        out[sb.REWARDS] = ret
        for k in (sb.NEXT_OBS, sb.TERMINATEDS, sb.TRUNCATEDS, sb.NEXT_ACTION_MASK):
            if k in out:
                out[k] = np.asarray(out[k])[last]
        out[sb.N_STEPS] = steps
        return out


class NumpyDQNPolicy(DQNActing, NumpyPolicy):
    """The :class:`~flowkit.core.NumpyPolicy` of an MLP :class:`~flowkit_dqn.dqn.DQNPolicy` on a
    Ray rollout worker: ``layout`` the QNetwork's layer description, ending in ``q_head``, or in
    ``value_head`` and ``advantage_head`` combined as V + A - mean(A)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.num_actions, self.epsilon = self.dist.num_outputs, float(self.config.initial_epsilon)
        self.td_error: Optional[np.ndarray] = None

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        out = self.net.forward(obs)
        if "q_head" in out:
            return out["q_head"]
        a = out["advantage_head"]
        return out["value_head"] + a - a.mean(-1, keepdims=True)
