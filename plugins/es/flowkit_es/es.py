"""ES (Salimans, Ho, Chen, Sidor, Sutskever 2017, "Evolution Strategies as a Scalable
Alternative to Reinforcement Learning", arXiv 1703.03864) and ARS (Mania, Guy, Recht 2018,
"Simple random search provides a competitive approach to reinforcement learning", arXiv
1803.07055) as a flowkit plugin: no gradients, no experience batches.

One round, both algorithms (the plan's shape; the workers' side is
:class:`flowkit_es.evaluate.EvaluatePerturbations`):
    every worker gets theta (float32[P]), draws n noise indexes i_k and evaluates the
    antithetic pair theta + sigma eps_k, theta - sigma eps_k (eps_k = noise[i_k:i_k + P], one
    env seed per pair) for whole episodes, plus ``eval_episodes`` with theta itself; it returns
    only (i_k, r+_k, r-_k, lengths). Every episode counts as env steps; the unperturbed ones
    are the run's episodes (``episode_return_mean``).

ES (paper, algorithm 2 with mirrored sampling, section 2.2; fitness shaping, appendix):
    F = centred_ranks(r) over all 2n returns, in [-0.5, 0.5] (ties share their mean rank)
    g = 1 / (2 n sigma) * sum_k (F+_k - F-_k) eps_k        (estimates grad E[F(theta + sigma eps)])
    Adam on the flat parameter vector, descending  -g + l2_coeff * theta.
ARS V2-t (paper, algorithm 1, lines 5-8):
    states normalised: x' = (x - mu) / sqrt(var + 1e-8), mu and var the running statistics of
    the states of all perturbed episodes so far (merged from the workers after each round);
    policy a = M x' (a linear map, no bias, M = 0 at the start);
    keep the b directions with the largest max(r+_k, r-_k); sigma_R = std of their 2b returns
    M <- M + alpha / (b sigma_R) * sum_{k in top b} (r+_k - r-_k) delta_k.
Actions are deterministic (the argmax of the outputs; Box: the outputs through ActionDist).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np
import torch
from torch import nn

import flowkit
from flowkit.config import ConfigError, normalize_obs_on
from flowkit.core import build_mlp, derive_seed
from flowkit.core.learner import NonFiniteError
from flowkit.core.ops import WorkerRounds, record_training
from flowkit.core.policy import FlatAdam, flat_parameters
from flowkit_es import ARS_REF, ES_REF
from flowkit_es.evaluate import EvaluatePerturbations, Layout, NoiseTable, forward, greedy


# ---- the math (numpy) ------------------------------------------------------------------------
def centered_ranks(x: np.ndarray) -> np.ndarray:
    """ES's fitness shaping: the rank of each entry of ``x`` among all (0 = lowest, tied
    entries share their mean rank) scaled to [-0.5, 0.5]: ``rank / (x.size - 1) - 0.5``.
    Same shape as ``x``, float64; zeros when ``x`` has one entry."""
    x = np.asarray(x, np.float64)
    if x.size < 2:
        return np.zeros_like(x)
    _, inv, counts = np.unique(x.reshape(-1), return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts  # rank of the first of each distinct value
    ranks = (first + (counts - 1) / 2.0)[inv]
    return (ranks / (x.size - 1) - 0.5).reshape(x.shape)


def es_gradient(shaped: np.ndarray, eps: np.ndarray, sigma: float) -> np.ndarray:
    """The antithetic ES estimate of the gradient of E[F(theta + sigma eps)]:
    ``1 / (2 n sigma) * sum_k (shaped[k, 0] - shaped[k, 1]) * eps[k]``.

    Args:
        shaped: float[n, 2] fitness of the + and - member of each pair.
        eps: float32[n, P] the pairs' noise.
    Returns: float64[P].
    """
    n = shaped.shape[0]
    return (shaped[:, 0] - shaped[:, 1]) @ eps.astype(np.float64) / (2.0 * n * sigma)


def ars_step(returns: np.ndarray, eps: np.ndarray, top: int, step_size: float) -> tuple:
    """ARS V2-t's step on M (flat): ``alpha / (b sigma_R) * sum_{k in top b} (r+_k - r-_k) delta_k``.

    Args:
        returns: float[n, 2] the returns of M + nu delta_k and M - nu delta_k.
        eps: float32[n, P] the directions delta_k.
        top: b (at most n).
    Returns: ``(step float64[P], sigma_R, chosen int64[b])``; the step is zero when the
    chosen returns are all equal (sigma_R = 0).
    """
    b = min(int(top), returns.shape[0])
    chosen = np.argsort(-returns.max(1), kind="stable")[:b]
    r = returns[chosen]
    sigma_r = float(r.std())
    if sigma_r < 1e-12:
        return np.zeros(eps.shape[1]), sigma_r, chosen
    return step_size / (b * sigma_r) * ((r[:, 0] - r[:, 1]) @ eps[chosen].astype(np.float64)), sigma_r, chosen


def merge_moments(count: float, mean: np.ndarray, var: np.ndarray, n: int, s: np.ndarray, ss: np.ndarray) -> tuple:
    """Running ``(count, mean, var)`` merged with a batch given as ``n`` rows, their sum ``s``
    and sum of squares ``ss`` (Chan et al.'s parallel update); float64."""
    if n == 0:
        return count, mean, var
    bm = s / n
    bv = np.maximum(ss / n - bm * bm, 0.0)
    tot = count + n
    delta = bm - mean
    return tot, mean + delta * n / tot, (var * count + bv * n + delta * delta * count * n / tot) / tot


# ---- the policies ----------------------------------------------------------------------------
class PerturbationModel(nn.Module):
    """Observation normalisation (buffers ``obs_mean``, ``obs_var`` float32[d], ``obs_count``
    float64) then ``net``: ``forward(obs float32[B, d]) -> float32[B, k]`` (the action
    outputs). With the statistics untouched (mean 0, var 1) the normalisation is the identity."""
    obs_mean: torch.Tensor
    obs_var: torch.Tensor
    obs_count: torch.Tensor

    def __init__(self, in_dim: int, net: nn.Module):
        super().__init__()
        self.register_buffer("obs_mean", torch.zeros(in_dim))
        self.register_buffer("obs_var", torch.ones(in_dim))
        self.register_buffer("obs_count", torch.tensor(0.0, dtype=torch.float64))
        self.net = net

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net((obs - self.obs_mean) / torch.sqrt(self.obs_var + 1e-8))


class ESPolicy(flowkit.Policy):
    """ES's policy: an MLP (``model.hidden_sizes``, ``model.activation`` tanh or relu; the
    orthogonal init of flowkit's ``build_mlp``) from encoded observations to action outputs,
    acting deterministically (:func:`flowkit_es.evaluate.greedy`). Its parameters are one flat
    float32 vector (``self._flat``, the Linear layers' in order); the learner copy holds Adam
    over it. Acting runs in numpy (:func:`flowkit_es.evaluate.forward`)."""

    model: PerturbationModel

    def __init__(self, observation_space, action_space, config, model_config=None, device="cpu", seed=0,
                 inference_only=False):
        super().__init__(observation_space, action_space, config, model_config, device, seed, inference_only)
        d = int(np.prod(self.encoder.shape))
        self.activation = str(self.model_config.activation)
        torch.manual_seed(seed)  # the initial network from the policy's seed, as the other policies
        self.model = PerturbationModel(d, self.make_net(d)).to(self.device)
        self._params, self._flat = flat_parameters(self.model, self.device)
        self.layout: Layout = tuple((m.out_features, m.in_features, m.bias is not None)
                                    for m in self.model.net.modules() if isinstance(m, nn.Linear))
        self.optimizer = self.make_adam() if not inference_only else None
        # the normalisation switch: model.normalize_obs or the section's normalize_observations
        self.normalize = normalize_obs_on(self.model_config, config, "normalize_observations")

    def make_net(self, d: int) -> nn.Module:
        return build_mlp(d, list(self.model_config.hidden_sizes), self.activation, self.dist.num_outputs, out_gain=0.01)

    def make_adam(self) -> Optional[FlatAdam]:
        return FlatAdam(self._flat, self.config.lr)

    @property
    def theta(self) -> np.ndarray:
        """A copy of the flat parameters, float32[P]."""
        return self._flat.detach().cpu().numpy().copy()

    def obs_mean_std(self) -> tuple:
        """``(mean, sqrt(var + 1e-8))`` of the observation normalisation, float32[d] each."""
        m = self.model
        return (m.obs_mean.cpu().numpy().copy(),
                torch.sqrt(m.obs_var + 1e-8).cpu().numpy().astype(np.float32))

    def compute_actions_encoded(self, obs, mask=None, explore=True):
        """Deterministic actions of the current parameters (``explore`` is ignored: ES and
        ARS explore in parameter space)."""
        mean, std = self.obs_mean_std()
        x = (np.asarray(obs, np.float32).reshape(len(obs), -1) - mean) / std
        z = forward(self._flat.detach().cpu().numpy(), self.layout, self.activation, x)
        return greedy(self.dist.kind, list(getattr(self.dist, "nvec", [])), z, mask), {}

    def set_theta(self, theta: np.ndarray, obs_mean: np.ndarray, obs_std: np.ndarray) -> None:
        """Hold ``theta`` (float32[P]) and the normalisation ``(x - obs_mean) / obs_std`` as the
        policy's own (a worker, after a round: it then acts, e.g. in ``evaluate``, with the
        parameters it was last sent)."""
        m = self.model
        with torch.no_grad():
            # theta may be a read-only view of Ray's object store: copied, not wrapped
            self._flat.copy_(torch.tensor(np.asarray(theta), dtype=self._flat.dtype))
            m.obs_mean.copy_(torch.tensor(np.asarray(obs_mean), dtype=m.obs_mean.dtype))
            m.obs_var.copy_(torch.as_tensor(np.square(obs_std.astype(np.float64)) - 1e-8, dtype=m.obs_var.dtype))

    def merge_obs_stats(self, results: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """Merge the encoded observations the workers counted in a round (``obs_count``, their
        sum ``obs_sum`` and sum of squares ``obs_sumsq`` per result) into the normalisation
        statistics, used from the next round on (the plan's MergeObservationStats). Returns
        ``results``."""
        m, (n, s, ss) = self.model, (sum(r[k] for r in results) for k in ("obs_count", "obs_sum", "obs_sumsq"))
        c, mean, var = merge_moments(float(m.obs_count), m.obs_mean.double().cpu().numpy(),
                                     m.obs_var.double().cpu().numpy(), n, s, ss)
        with torch.no_grad():
            m.obs_count.fill_(c)
            m.obs_mean.copy_(torch.as_tensor(mean))
            m.obs_var.copy_(torch.as_tensor(var))
        return results

    def loss(self, batch):
        raise RuntimeError(f"{type(self).__name__} has no loss: ES and ARS estimate their update from returns")


class ARSPolicy(ESPolicy):
    """ARS's policy: a linear map ``M`` (no bias, zeros at the start) of the normalised
    observations; no optimizer (ARS's step is its own)."""

    def make_net(self, d: int) -> nn.Module:
        lin = nn.Linear(d, self.dist.num_outputs, bias=False)
        nn.init.zeros_(lin.weight)
        return nn.Sequential(lin)

    def make_adam(self) -> Optional[FlatAdam]:
        return None


# ---- the operators ---------------------------------------------------------------------------
class _Update:
    """Base of :class:`ESUpdate` and :class:`ARSUpdate`: gathers the round, applies
    :meth:`step`, counts the update (and the perturbed episodes in ``episodes_total``: core's
    ``WorkerRounds`` counts the unperturbed ones, the run's episodes). Output: ``{"stats":
    {policy_id: stats}, "num_updates": 1}``."""

    def __init__(self, ctx: Any, learner: Any, pid: str, noise: NoiseTable, config: Any):
        self.ctx, self.learner, self.pid, self.noise, self.config = ctx, learner, pid, noise, config
        self.policy: ESPolicy = learner.policies[pid]

    def step(self, returns: np.ndarray, eps: np.ndarray) -> Dict[str, float]:
        raise NotImplementedError

    def __call__(self, results: List[Dict[str, Any]]) -> Dict[str, Any]:
        ctx, pol = self.ctx, self.policy
        idx = np.concatenate([r["noise_indexes"] for r in results])
        returns = np.concatenate([r["returns"] for r in results])
        lengths = np.concatenate([r["lengths"] for r in results])
        with ctx.timers["learn"], self.learner.lock:
            stats = self.step(returns, self.noise.rows(idx, pol._flat.numel()))
            if not torch.isfinite(pol._flat).all():
                raise NonFiniteError(f"policy {self.pid!r}: non-finite parameters at update {pol.num_updates + 1}")
            pol.num_updates += 1
            self.learner.num_updates += 1
        stats.update(perturbed_return_mean=float(returns.mean()), perturbed_return_max=float(returns.max()),
                     num_pairs=int(len(idx)), theta_norm=float(pol._flat.norm()))
        ctx.counters["episodes_total"] += int(lengths.size)
        return record_training(ctx, {self.pid: stats}, int(lengths.sum()), int(lengths.sum()), 1)


class ESUpdate(_Update):
    """Centred ranks -> antithetic gradient estimate -> Adam step on theta (with L2)."""

    @property
    def name(self) -> str:
        return f"ESUpdate(centred ranks, Adam lr={self.config.lr}, l2={self.config.l2_coeff})"

    def step(self, returns: np.ndarray, eps: np.ndarray) -> Dict[str, float]:
        pol = self.policy
        g = es_gradient(centered_ranks(returns), eps, float(self.config.sigma))
        flat = pol._flat
        flat.grad = (torch.as_tensor(-g, dtype=flat.dtype) + float(self.config.l2_coeff) * flat.detach()).to(flat.device)
        assert pol.optimizer is not None
        pol.optimizer.step()
        flat.grad = None
        return {"grad_norm": float(np.linalg.norm(g))}


class ARSUpdate(_Update):
    """Top-b directions -> M += alpha / (b sigma_R) * sum (r+ - r-) delta."""

    @property
    def name(self) -> str:
        top = self.config.top_directions
        return f"ARSUpdate(top {top if top is not None else 'all'} directions, step size {self.config.step_size})"

    def step(self, returns: np.ndarray, eps: np.ndarray) -> Dict[str, float]:
        top = self.config.top_directions or len(returns)
        d, sigma_r, chosen = ars_step(returns, eps, top, float(self.config.step_size))
        with torch.no_grad():
            self.policy._flat.add_(torch.as_tensor(d, dtype=self.policy._flat.dtype))
        return {"sigma_r": sigma_r, "step_norm": float(np.linalg.norm(d)), "top_directions": int(len(chosen))}


# ---- the algorithms --------------------------------------------------------------------------
class _PerturbationAlgorithm(flowkit.Algorithm):
    """What ES and ARS share: the noise table, the evaluation requests and the plan.

    Plan: ParallelEvaluations (core's ``WorkerRounds`` of :class:`EvaluatePerturbations`
    requests, bulk-synchronous) -> [MergeObservationStats] -> the update. It consumes no
    rollouts: no worker samples fragments."""

    consumes_rollouts = False
    update_class: type = _Update
    per_worker_key = ""

    def __init__(self, run_config: Any, config: Any = None):
        super().__init__(run_config, config)
        self._noise: Optional[NoiseTable] = None

    @classmethod
    def check_spaces(cls, policy_id: str, observation_space: Any, action_space: Any) -> None:
        from flowkit.core import ObsEncoder
        if ObsEncoder(observation_space).is_image:
            raise ConfigError(f"policy {policy_id!r}: {cls.name} has no CNN; image observations "
                              f"({observation_space}) are not supported")

    def noise_table(self) -> NoiseTable:
        """The run's noise table (drawn on first use)."""
        if self._noise is None:
            c = self.config
            seed = c.noise_seed if c.noise_seed is not None else derive_seed(int(self.run_config.seed), "noise")
            self._noise = NoiseTable(int(c.noise_size), int(seed))
        return self._noise

    def evaluations(self, ctx: Any, policy: ESPolicy, num_pairs: int, world: int) -> List[EvaluatePerturbations]:
        """The round's request for each of ``world`` workers: theta and the normalisation as
        they are now; the round's seed from the run's seed and the policy's update count, so a
        resumed run draws what it would have."""
        c = self.config
        mean, std = policy.obs_mean_std()
        seed = derive_seed(int(ctx.config.seed), self.name, "round", policy.num_updates)
        return [EvaluatePerturbations(self.noise_table().handle(ctx.workers.backend), policy.theta, policy.layout,
                                      policy.activation, mean, std, float(c.sigma), num_pairs, int(c.eval_episodes),
                                      seed, policy.normalize)] * world

    def training_flow(self, experiences, ctx, learner):
        pid, c = self.only_policy(ctx, learner), self.config
        k, pol = int(getattr(c, self.per_worker_key)), learner.policies[pid]
        flow = WorkerRounds(ctx, lambda n: self.evaluations(ctx, pol, k, n),
                            f"ParallelEvaluations({k} antithetic pairs + {c.eval_episodes} unperturbed "
                            f"episodes per worker, noise table {c.noise_size})")
        if pol.normalize:  # model.normalize_obs or <name>.normalize_observations
            flow = flow.for_each(pol.merge_obs_stats, "MergeObservationStats")
        return flow.for_each(self.update_class(ctx, learner, pid, self.noise_table(), c))


class ES(_PerturbationAlgorithm, ref=ES_REF):
    """ES: antithetic pairs on the workers -> centred ranks -> Adam (see the module docstring)."""

    policy_class = ESPolicy
    update_class, per_worker_key = ESUpdate, "pairs_per_worker"


class ARS(_PerturbationAlgorithm, ref=ARS_REF):
    """ARS V2-t: directions on the workers -> state statistics -> top-b step (see the module
    docstring)."""

    policy_class = ARSPolicy
    update_class, per_worker_key = ARSUpdate, "directions_per_worker"
