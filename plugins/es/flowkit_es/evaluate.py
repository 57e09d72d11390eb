"""The worker side of ES and ARS (numpy only, no torch): the shared noise table, the numpy
form of the policies' networks and :class:`EvaluatePerturbations`, the request a rollout
worker runs for one round.

The noise table (Salimans et al. 2017, section 2.1, "shared noise table"): ``noise_size``
float32 N(0, 1) values drawn once from a seed. The driver puts it once in Ray's object store
(:meth:`NoiseTable.handle`); every request carries the same ``ObjectRef``, which each worker
process resolves once (:func:`noise_array`: a read-only, zero-copy view of the shared
memory) and reads by index: the perturbation of index ``i`` is ``noise[i:i + P]`` for a
parameter vector of ``P`` entries. On the local backend the handle is the array itself (the
same code path, no Ray). Workers send back only the indexes and the returns, never noise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from flowkit.core import mlp_forward
from flowkit.core.activations import numpy_function

Layout = Tuple[Tuple[int, int, bool], ...]  # per linear layer: (outputs, inputs, has bias)

_RESOLVED: Dict[str, np.ndarray] = {}  # a worker process's resolved noise tables, by ObjectRef


# ---- the noise table -------------------------------------------------------------------------
def make_noise(size: int, seed: int) -> np.ndarray:
    """``float32[size]`` standard normal values, the same for the same ``(size, seed)``."""
    return np.random.default_rng(int(seed)).standard_normal(int(size), dtype=np.float32)


class NoiseTable:
    """The driver's noise table: drawn on first use (``flowkit plan`` draws nothing), put in
    Ray's object store at most once.

    Args:
        size: entries (float32).
        seed: its seed.
    """

    def __init__(self, size: int, seed: int):
        self.size, self.seed = int(size), int(seed)
        self._array: Optional[np.ndarray] = None
        self._ref: Any = None
        self.num_puts = 0  # ray.put calls made (1 at most)

    @property
    def array(self) -> np.ndarray:
        if self._array is None:
            self._array = make_noise(self.size, self.seed)
        return self._array

    def handle(self, backend: str) -> Any:
        """What requests carry: the ``ObjectRef`` of the one ``ray.put`` (``backend="ray"``),
        or the array itself (local)."""
        if backend != "ray":
            return self.array
        if self._ref is None:
            import ray
            self._ref = ray.put(self.array)
            self.num_puts += 1
        return self._ref

    def rows(self, indexes: np.ndarray, dim: int) -> np.ndarray:
        """``float32[len(indexes), dim]``: row ``k`` is ``noise[indexes[k]:indexes[k] + dim]``."""
        return self.array[np.asarray(indexes, np.int64)[:, None] + np.arange(dim)]


def noise_array(handle: Any) -> np.ndarray:
    """The noise table a request's ``handle`` stands for: the array (local backend), or the
    object-store copy of a Ray ``ObjectRef``, fetched once per worker process."""
    if isinstance(handle, np.ndarray):
        return handle
    key = handle.hex()
    if key not in _RESOLVED:
        import ray
        _RESOLVED.clear()  # one run's table at a time
        _RESOLVED[key] = ray.get(handle)
    return _RESOLVED[key]


# ---- the networks in numpy -------------------------------------------------------------------
def unflatten(theta: np.ndarray, layout: Layout) -> List[Tuple[np.ndarray, Optional[np.ndarray]]]:
    """Views of flat parameters ``theta`` (float32[P], ``torch.nn.Linear`` order: each layer's
    weight [out, in] row-major, then its bias): ``(weight.T float32[in, out], bias or None)``
    per layer."""
    out, off = [], 0
    for o, i, bias in layout:
        w = theta[off:off + o * i].reshape(o, i).T
        off += o * i
        out.append((w, theta[off:off + o] if bias else None))
        off += o if bias else 0
    return out


def forward(theta: np.ndarray, layout: Layout, activation: str, x: np.ndarray,
            layers: Optional[List[Tuple[np.ndarray, Optional[np.ndarray]]]] = None) -> np.ndarray:
    """The MLP of flat parameters ``theta`` (see :func:`unflatten`; or its ``layers``, already
    unflattened) on ``x`` float32[B, in]: float32[B, out]; ``activation`` between layers,
    none after the last."""
    return mlp_forward(x, unflatten(theta, layout) if layers is None else layers, numpy_function(activation))


def greedy(kind: str, nvec: Sequence[int], z: np.ndarray, mask: Optional[np.ndarray] = None) -> np.ndarray:
    """The deterministic action of network outputs ``z`` float32[B, k] (ES and ARS act
    without sampling): Discrete the (masked) argmax (int64[B]), MultiDiscrete one argmax per
    part, MultiBinary ``z > 0``, Box ``z`` itself (the env gets it through
    ``ActionDist.to_env``). What ``flowkit export`` computes from the same outputs."""
    if kind == "cat":
        if mask is not None:
            z = np.where(mask == 0, np.finfo(np.float32).min, z)
        return z.argmax(-1).astype(np.int64)
    if kind == "multicat":
        return np.stack([p.argmax(-1) for p in np.split(z, np.cumsum(nvec)[:-1], axis=-1)], -1).astype(np.int64)
    if kind == "bern":
        return (z > 0).astype(np.int8)
    return z.astype(np.float32)


# ---- the request a worker runs ---------------------------------------------------------------
@dataclass
class EvaluatePerturbations:
    """One worker's share of a round (``RolloutWorker.apply(request)``): ``num_pairs``
    antithetic pairs, each two whole episodes with the parameters ``theta + sigma * eps`` and
    ``theta - sigma * eps`` from one env seed (``eps`` the noise table at an index drawn by this
    worker), then ``eval_episodes`` episodes with ``theta`` itself.

    Indexes and env seeds come from ``np.random.default_rng([seed, worker index])``: the same
    on either backend and after a worker restart. Observations are normalised with
    ``(x - obs_mean) / obs_std`` (float32[d]); with ``collect_obs_stats`` the perturbed
    episodes' encoded observations are summed (ARS V2's state statistics).

    Returns (plain data, no noise): ``noise_indexes`` int64[n], ``returns`` float64[n, 2]
    (column 0: +, 1: -), ``lengths`` int64[n, 2], ``env_steps`` and ``agent_steps`` (every
    episode's steps), ``episodes`` (the ``eval_episodes`` with theta: ``[{"return", "length"}]``),
    ``obs_count`` int, ``obs_sum`` and ``obs_sumsq`` float64[d], ``worker_index`` int.
    """
    noise: Any
    theta: np.ndarray
    layout: Layout
    activation: str
    obs_mean: np.ndarray
    obs_std: np.ndarray
    sigma: float
    num_pairs: int
    eval_episodes: int
    seed: int
    collect_obs_stats: bool = False

    name = "EvaluatePerturbations"

    def __call__(self, worker: Any) -> Dict[str, Any]:
        noise = noise_array(self.noise)
        theta, n, p = self.theta, self.num_pairs, self.theta.size
        if noise.size < p:
            raise ValueError(f"the noise table holds {noise.size} values, fewer than the policy's {p} parameters: "
                             "raise <algo>.noise_size")
        rng = np.random.default_rng([int(self.seed), int(worker.index) & 0xFFFFFFFF])
        idx = rng.integers(0, noise.size - p + 1, size=n, dtype=np.int64)
        seeds = rng.integers(0, 2 ** 31 - 1, size=n + self.eval_episodes)
        env, policy = _worker_env(worker), next(iter(worker.policies.values()))
        obs_rows: Optional[List[np.ndarray]] = [] if self.collect_obs_stats else None
        returns, lengths = np.zeros((n, 2)), np.zeros((n, 2), np.int64)
        for k in range(n):
            eps = noise[idx[k]:idx[k] + p]
            for j, sign in enumerate((1.0, -1.0)):
                params = (theta + np.float32(sign * self.sigma) * eps).astype(np.float32, copy=False)
                returns[k, j], lengths[k, j] = self.episode(env, policy, params, int(seeds[k]), obs_rows)
        ev = [self.episode(env, policy, theta, int(s), None) for s in seeds[n:]]
        policy.set_theta(theta, self.obs_mean, self.obs_std)  # the worker's policy acts with what it was sent
        d = int(self.obs_mean.size)
        x = np.concatenate(obs_rows) if obs_rows else np.zeros((0, d))
        steps = int(lengths.sum()) + sum(t for _, t in ev)
        return {"noise_indexes": idx, "returns": returns, "lengths": lengths,
                "env_steps": steps, "agent_steps": steps,
                "episodes": [{"return": float(g), "length": int(t)} for g, t in ev],
                "obs_count": int(len(x)), "obs_sum": x.sum(0, dtype=np.float64),
                "obs_sumsq": np.square(x, dtype=np.float64).sum(0), "worker_index": int(worker.index)}

    def episode(self, env: Any, policy: Any, params: np.ndarray, seed: int,
                obs_rows: Optional[List[np.ndarray]]) -> Tuple[float, int]:
        """One whole episode (until terminated or truncated) with ``params``: ``(return, length)``."""
        from flowkit.core import add_batch_axis
        dist, enc = policy.dist, policy.encoder
        nvec = list(getattr(dist, "nvec", []))
        layers = unflatten(params, self.layout)
        fast = enc.fast_box and dist.kind == "cat"  # Box observations, Discrete actions: no generic paths
        obs, _ = env.reset(seed=seed)
        total, t = 0.0, 0
        while True:
            if fast:
                x, mask = np.asarray(obs, np.float32).reshape(1, -1), None
            else:
                x, mask = enc(add_batch_axis(obs), 1)
            if obs_rows is not None:
                obs_rows.append(x)
            z = forward(params, self.layout, self.activation, (x - self.obs_mean) / self.obs_std, layers)
            if fast:
                action = int(z[0].argmax()) + dist.start
            else:
                action = dist.to_env(greedy(dist.kind, nvec, z, mask))[0]
            obs, r, terminated, truncated, _ = env.step(action)
            total += float(r)
            t += 1
            if terminated or truncated:
                return total, t


def _worker_env(worker: Any) -> Any:
    """The worker's evaluation env (built once, beside its env runner's, which ES leaves idle)."""
    env = getattr(worker, "_es_env", None)
    if env is None:
        import gymnasium as gym
        from omegaconf import OmegaConf

        from flowkit.core import EnvError, env_name, make_env
        env_cfg = OmegaConf.to_container(worker.config.env, resolve=True)
        env = make_env(env_cfg, worker.env_context)
        if not isinstance(env, gym.Env):
            raise EnvError(f"env {env_name(env_cfg)!r} is a {type(env).__name__}, not a Gymnasium env: ES and ARS "
                           "evaluate single-agent Gymnasium envs only")
        worker._es_env = env
    return env
