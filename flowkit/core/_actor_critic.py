"""The actor-critic policy base (PPO, IMPALA; A2C, APPO): an :class:`ActorCritic` network,
acting through its numpy mirror on CPU workers (torch otherwise), V(s) for bootstrapping
and GAE postprocessing. A new actor-critic algorithm subclasses it and writes its loss."""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
import torch
from torch import nn

from flowkit.core import batch as sb
from flowkit.core._numpy_model import (
    ActorCriticActing,
    NumpyActorCriticPolicy,
    NumpyNet,
    numpy_layout,
)
from flowkit.core.models import ActorCritic, sde_std
from flowkit.core.policy import Policy, to_tensor
from flowkit.core.recurrent import RecurrentActorCritic, RecurrentStep, step
from flowkit.core.returns import bootstrap_rows, next_values, vtrace


def clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, clip: float) -> torch.Tensor:
    """PPO's clipped surrogate loss (Schulman et al. 2017, arXiv 1707.06347, eq. 7), to
    minimise: ``-mean(min(r * A, clip(r, 1 - clip, 1 + clip) * A))``.

    Args: ratio, advantages: float32[B]; clip: epsilon. Returns a scalar tensor."""
    return -torch.min(advantages * ratio, advantages * torch.clamp(ratio, 1 - clip, 1 + clip)).mean()


def standardized(x: torch.Tensor) -> torch.Tensor:
    """Advantage standardisation, ``(x - mean(x)) / std(x)`` (population std) over a minibatch
    (float32[B]), as PPO's implementations do (Engstrom et al. 2020, arXiv 2005.12729, section 3):
    only centred when the std is below 1e-8, unchanged below 2 rows."""
    if x.shape[0] < 2:
        return x
    c = x - x.mean()
    s = c.std(unbiased=False)
    return c / s if s >= 1e-8 else c


def adapt_kl_coeff(kl_coeff: float, kl: float, kl_target: float) -> float:
    """The adaptive KL-penalty coefficient, by RLlib's rule: times 1.5 when the measured ``kl``
    exceeds ``2 * kl_target``, times 0.5 below ``kl_target / 2``. This is a milder variant of
    the PPO paper's rule (Schulman et al. 2017, section 4: halve below ``kl_target / 1.5``,
    double above ``1.5 * kl_target``); the tuned configs were measured with this one."""
    if kl > 2.0 * kl_target:
        return kl_coeff * 1.5
    return kl_coeff * 0.5 if kl < 0.5 * kl_target else kl_coeff

_WORKER_SIDE = ("compute_actions_encoded", "compute_actions", "postprocess_trajectory", "add_gae", "compute_values",
                "bootstrap_values",
                "_extras", "_act_numpy", "_compute_actions_torch", "make_model", "numpy_model", "set_weights")


class ActorCriticPolicy(ActorCriticActing, Policy):
    """A :class:`Policy` over an :class:`ActorCritic` model.

    Acting (:meth:`compute_actions_encoded`) stores ``action_logp`` per row and, when
    :attr:`store_values` is set, ``vf_preds`` (V(s) at sampling time) and
    ``action_dist_inputs``. :meth:`add_gae` computes advantages on the worker (as
    :meth:`postprocess_trajectory` when :attr:`worker_gae` is set).

    Config fields read: ``lr``, ``log_std_init``, optionally ``adam_eps`` (or ``optimizer_eps``),
    ``normalize_observations`` (the same switch as ``model.normalize_obs``: either turns it on,
    :func:`flowkit.config.normalize_obs_on`), ``normalize_rewards`` (:meth:`normalize_rewards`), ``use_sde``
    and ``sde_sample_freq`` (:meth:`sde_noise`); ``gamma`` and ``gae_lambda`` for :meth:`add_gae`.

    Attributes:
        store_values: acting evaluates the value network and stores ``vf_preds`` and
            ``action_dist_inputs`` (PPO); False acts with the policy network only (IMPALA).
        worker_gae: postprocess with :meth:`add_gae` (PPO); False: batches unchanged.
        twin: evaluate separate policy and value MLPs as one :class:`TwinMLP`.
    """

    store_values = True
    twin = True
    model: Any  # an ActorCritic, or the network of model.class

    def __init__(self, observation_space, action_space, config, model_config=None, device="cpu",
                 seed=0, inference_only=False):
        super().__init__(observation_space, action_space, config, model_config, device, seed, inference_only)
        torch.manual_seed(seed)
        self.model = self.make_model().to(self.device)
        self._np_model: Optional[NumpyNet] = None
        self._np_checked = False
        self._ret_acc: Dict[Tuple[int, int], float] = {}  # running discounted return per live (episode, agent)
        self._sde_w: Optional[torch.Tensor] = None  # gSDE exploration matrices and the steps since drawn
        self._sde_steps = 0
        if not inference_only:
            self.optimizer = self.make_optimizer(config.lr, getattr(config, "optimizer_eps", getattr(config, "adam_eps", 1e-8)))

    def make_model(self) -> Any:
        """The network (override for a custom model; the numpy mirror then steps aside): an
        :class:`ActorCritic`, or with ``model.recurrent`` a :class:`~flowkit.core.RecurrentActorCritic`."""
        from flowkit.config import ConfigError, normalize_obs_on
        mc, cfg = self.model_config, self.config

        def on(key: str) -> bool:
            return bool(getattr(cfg, key, False))
        # model.normalize_obs or the section's normalize_observations (PPO's): one switch, either turns it on
        norm = normalize_obs_on(mc, cfg, "normalize_observations")
        if mc.recurrent and on("use_sde"):
            raise ConfigError("use_sde=true does not combine with model.recurrent (gSDE's features are per "
                              "observation); turn one of them off")
        model = self.build_model(
            RecurrentActorCritic(self.encoder, self.dist, mc, norm, cfg.log_std_init,
                                 normalize_rewards=on("normalize_rewards")) if mc.recurrent else
            ActorCritic(self.encoder, self.dist, mc, norm, cfg.log_std_init, twin=self.twin,
                        normalize_rewards=on("normalize_rewards"), use_sde=on("use_sde"), sde_expln=on("use_expln"),
                        sde_learn_features=on("learn_features")))
        norm_key = "model.normalize_obs" if mc.normalize_obs else "normalize_observations"
        for key, attr, want in ((norm_key, "obs_rms", norm), ("normalize_rewards", "ret_rms", on("normalize_rewards")),
                                ("use_sde", "sde_log_std", on("use_sde"))):
            if want and getattr(model, attr, None) is None:
                raise ConfigError(f"{key}=true needs the model's `{attr}`: model.class={mc.get('class')!r} has none")
        return model

    def model_policy(self, x: torch.Tensor) -> torch.Tensor:
        """dist_inputs of the model: its ``policy`` method, else ``forward(x)[0]``."""
        return self.model.policy(x) if hasattr(self.model, "policy") else self.model(x)[0]

    def model_value(self, x: torch.Tensor) -> torch.Tensor:
        """V(x) of the model: its ``value`` method, else ``forward(x)[1]``."""
        return self.model.value(x) if hasattr(self.model, "value") else self.model(x)[1]

    def numpy_model(self) -> Optional[NumpyNet]:
        """The :class:`NumpyNet` mirror of ``self.model`` used for acting on CPU (an MLP
        actor-critic, recurrent or not), or None (another network, ``model.numpy_inference=false``,
        or not on CPU)."""
        if not self._np_checked:
            self._np_checked = True
            if self.device.type == "cpu" and self.model_config.numpy_inference:
                self._np_model = NumpyNet.build(self.model, self.dist)
        return self._np_model

    def action_model(self) -> nn.Module:
        """The policy network alone (see :meth:`Policy.action_model`); recurrent: one step,
        ``(obs float32[B, *shape], state float32[B, S]) -> (dist_inputs, state_out)``."""
        return RecurrentStep(self.model) if self.is_recurrent else _PolicyNet(self.model)

    def worker_policy_class(self) -> Optional[Callable[..., Any]]:
        """A :class:`NumpyActorCriticPolicy` (torch-free) when this policy acts through its
        numpy mirror with :class:`ActorCriticPolicy`'s own acting, values and postprocessing
        (a subclass that overrides any of them keeps torch on the workers)."""
        cls = type(self)
        mc = self.model_config
        if any(getattr(cls, m) is not getattr(ActorCriticPolicy, m) for m in _WORKER_SIDE) or (
                not mc.numpy_inference or self.is_recurrent
                or getattr(self.model, "ret_rms", None) is not None):
            return None
        lay = numpy_layout(self.model, self.dist)
        return None if lay is None else functools.partial(
            NumpyActorCriticPolicy, layout=lay, store_values=self.store_values, worker_gae=self.worker_gae,
            weights=self.get_weights())

    # -- acting (worker) --
    def compute_actions_encoded(self, obs, mask=None, explore=True, state=None):
        if mask is not None:
            self.check_mask(mask)
        if (state is not None) != self.is_recurrent:
            raise ValueError("a recurrent policy acts with state= (float32[B, S], from initial_state(B)); "
                             "a feed-forward one without it")
        state = None if state is None else np.ascontiguousarray(state, np.float32)
        npm = self.numpy_model()
        if npm is not None:  # the same network in numpy (cheaper per call on a few rows)
            return self._act_numpy(npm, obs, mask, explore, state)
        return self._compute_actions_torch(obs, mask, explore, state)

    @torch.inference_mode()
    def _compute_actions_torch(self, obs, mask=None, explore=True, state=None):
        x = torch.from_numpy(obs)
        if getattr(self.model, "sde_log_std", None) is not None:  # gSDE: a = mean + z(s) @ W, W held between draws
            sde_in, sde_v, z = self.model.forward_latent(x)
            a = sde_in[:, :self.dist.dim]
            if explore:
                a = a + torch.bmm(z.unsqueeze(1), self.sde_noise(len(x))).squeeze(1)
            return a.numpy(), self._extras(self.dist.logp(sde_in, a).numpy(), sde_v.numpy(), sde_in.numpy())
        if state is not None:  # one step of the recurrent network from state float32[B, S]
            inputs, value, s_out = step(self.model, x, torch.from_numpy(state))
        else:
            inputs, value = self.model(x) if self.store_values else (self.model_policy(x), None)
        a, logp = self.dist.sample_logp(inputs, None if mask is None else torch.from_numpy(mask), explore, self.generator)
        extras = self._extras(logp.numpy(), None if value is None else value.numpy(), inputs.numpy())
        if state is not None:
            extras.update({sb.STATE_IN: state, sb.STATE_OUT: s_out.numpy()})
        return a.numpy(), extras

    def sde_noise(self, n: int) -> torch.Tensor:
        """gSDE's exploration matrices W float32[n, h, k], one per row (sub-env), entries
        ~ N(0, std^2), std = exp(sde_log_std) (expln with ``use_expln``): drawn anew every ``sde_sample_freq`` calls (env steps),
        when ``n`` changes, and when new weights arrive (``sde_sample_freq=-1``: only then,
        i.e. once per rollout fragment; Stable-Baselines3 draws at the start of each rollout
        too). Rows are sub-envs in order, so gSDE suits single-agent vector envs."""
        freq = int(self.config.sde_sample_freq)
        if self._sde_w is None or self._sde_w.shape[0] != n or (freq > 0 and self._sde_steps % freq == 0):
            assert self.model.sde_log_std is not None
            std = sde_std(self.model.sde_log_std.detach(), bool(self.config.use_expln))
            self._sde_w = torch.randn((n, *std.shape), generator=self.generator) * std
            self._sde_steps = 0
        self._sde_steps += 1
        return self._sde_w

    def set_weights(self, weights: Dict[str, np.ndarray]) -> None:
        super().set_weights(weights)
        self._sde_w = None  # gSDE: a new rollout draws new exploration matrices

    @torch.inference_mode()
    def compute_values(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) for encoded observations float32[B, *shape] -> float32[B]."""
        return self.model_value(torch.from_numpy(np.ascontiguousarray(obs, self.encoder.dtype))).numpy()

    @torch.inference_mode()
    def bootstrap_values(self, batch: sb.SampleBatch, rows: np.ndarray) -> np.ndarray:
        """V(``next_obs``) of ``rows``; recurrent: from the state after each row's step (one
        step from its ``state_in`` on its ``obs``, then the value of ``next_obs``)."""
        if not self.is_recurrent:
            return super().bootstrap_values(batch, rows)
        t = {k: torch.from_numpy(np.ascontiguousarray(np.asarray(batch[k])[rows])) for k in
             (sb.OBS, sb.NEXT_OBS, sb.STATE_IN)}
        return self.recurrent_bootstrap(t[sb.OBS], t[sb.STATE_IN], t[sb.NEXT_OBS]).numpy()

    def recurrent_bootstrap(self, obs: torch.Tensor, state_in: torch.Tensor, next_obs: torch.Tensor) -> torch.Tensor:
        """float32[k]: V(next_obs) of a recurrent model after the step on ``obs`` from ``state_in``
        (the value a row that ends a piece without terminating bootstraps from)."""
        s1 = step(self.model, obs, state_in)[-1]
        return step(self.model, next_obs, s1)[1]

    # -- returns --
    def add_gae(self, batch: sb.SampleBatch, gae_lambda: Optional[float] = None) -> sb.SampleBatch:
        """:meth:`ActorCriticActing.add_gae`, after :meth:`normalize_rewards` when the model
        keeps return statistics (``normalize_rewards``; such a model has no numpy worker copy)."""
        if getattr(self.model, "ret_rms", None) is not None and len(batch):
            batch = self.normalize_rewards(batch)
        return super().add_gae(batch, gae_lambda)

    # -- reward and observation normalisation --
    def normalize_rewards(self, batch: sb.SampleBatch) -> sb.SampleBatch:
        """Reward normalisation as Stable-Baselines3's ``VecNormalize(norm_reward=True)`` (worker).

        Per (episode, agent) the raw rewards accumulate into the discounted return
        ``R_t = gamma * R_{t-1} + r_t`` (carried across fragment cuts on this worker, restarted
        when the episode terminates or is truncated), stored as ``discounted_returns``; the
        learner's running variance of R (``model.ret_rms``, reaching the worker with the
        weights; :meth:`update_normalizers`) scales the rewards:
        ``rewards = clip(r_t / sqrt(var(R) + 1e-8), -10, 10)``. Returns a new batch; the
        episode returns reported by the runner stay raw. As in SB3 the per-episode running
        sums are not checkpointed (a resumed run restarts them at 0); the statistics are.
        """
        rms = self.model.ret_rms
        assert rms is not None, "normalize_rewards needs a model built with normalize_rewards=True"
        out = sb.SampleBatch(batch)
        r = np.asarray(out[sb.REWARDS], np.float64)
        ends, _ = sb.trajectory_ends(out)
        done = np.asarray(out[sb.TERMINATEDS], bool) | np.asarray(out[sb.TRUNCATEDS], bool)
        eps = np.asarray(out[sb.EPS_ID]).tolist() if sb.EPS_ID in out else [0] * len(r)
        agent = np.asarray(out[sb.AGENT_INDEX]).tolist() if sb.AGENT_INDEX in out else [0] * len(r)
        rets = np.empty_like(r)
        gamma, acc = float(self.config.gamma), 0.0
        for t, rt in enumerate(r.tolist()):
            if t == 0 or ends[t - 1]:
                acc = self._ret_acc.pop((eps[t], agent[t]), 0.0)
            rets[t] = acc = gamma * acc + rt
            if ends[t] and not done[t]:  # a fragment cut: the episode goes on in the next fragment
                self._ret_acc[(eps[t], agent[t])] = acc
        out[sb.DISCOUNTED_RETURNS] = rets.astype(np.float32)
        out[sb.REWARDS] = rms.scale(r).astype(np.float32)
        return out

    def on_train_batch_end(self, batch: Dict[str, torch.Tensor]) -> Dict[str, float]:
        """The running statistics take the train batch in (:meth:`update_normalizers`); PPO,
        IMPALA and APPO call that from their own."""
        self.update_normalizers(batch)
        return {}

    @torch.no_grad()
    def update_normalizers(self, batch: Dict[str, torch.Tensor]) -> None:
        """Learner, once per train batch: update the running observation statistics from
        ``obs`` and the discounted-return statistics from ``discounted_returns`` (when on)."""
        obs_rms, ret_rms = getattr(self.model, "obs_rms", None), getattr(self.model, "ret_rms", None)
        if obs_rms is not None:
            obs_rms.update(batch[sb.OBS].float())
        if ret_rms is not None and sb.DISCOUNTED_RETURNS in batch:
            ret_rms.update(batch[sb.DISCOUNTED_RETURNS].float())

    # -- V-trace (learner; IMPALA, APPO) --
    def prepare_vtrace_batch(self, batch: sb.SampleBatch) -> Dict[str, torch.Tensor]:
        """Tensors for a V-trace loss: the acting columns plus ``nextnonterminal`` (float[L])
        and ``boot_idx``/``boot_obs`` (rows that bootstrap from V(next_obs): truncations and
        cuts); a recurrent policy's ``state_in`` and ``seq_lens`` too."""
        cont, boot = bootstrap_rows(batch)
        cols = {k: batch[k] for k in (sb.OBS, sb.ACTIONS, sb.ACTION_LOGP, sb.REWARDS, sb.ACTION_MASK) if k in batch}
        cols.update(nextnonterminal=cont, boot_idx=boot, boot_obs=np.asarray(batch[sb.NEXT_OBS])[boot])
        out = {k: to_tensor(v, self.device) for k, v in cols.items()}
        out.update(self.sequence_columns(batch))
        return out

    @torch.no_grad()
    def vtrace_targets(self, batch: Dict[str, torch.Tensor], log_rhos: torch.Tensor,
                       values: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(vs, pg_advantages)`` float32[L] of :func:`vtrace` for a batch from
        :meth:`prepare_vtrace_batch`, per trajectory: V(x_{t+1}) is the next row's value inside
        a trajectory, 0 after a termination and V(next_obs) after a truncation or a cut (the
        only extra forward pass). Config fields read: ``gamma``, ``clip_rho_threshold``,
        ``clip_c_threshold``, ``clip_pg_rho_threshold``, ``vtrace_lambda``."""
        cfg = self.config
        cont, boot_idx = batch["nextnonterminal"].cpu().numpy(), batch["boot_idx"].cpu().numpy()
        v = values.cpu().numpy()
        if not len(boot_idx):
            boot_v = np.zeros(0, np.float32)
        elif self.is_recurrent:
            bi = batch["boot_idx"]
            boot_v = self.recurrent_bootstrap(batch[sb.OBS][bi], batch[sb.STATE_IN][bi], batch["boot_obs"]).cpu().numpy()
        else:
            boot_v = self.model_value(batch["boot_obs"]).cpu().numpy()
        vs, pg_adv = vtrace(log_rhos.cpu().numpy(), batch[sb.REWARDS].cpu().numpy(), v,
                            next_values(v, cont, boot_idx, boot_v), cont, cfg.gamma, cfg.clip_rho_threshold,
                            cfg.clip_c_threshold, cfg.clip_pg_rho_threshold, cfg.vtrace_lambda)
        return torch.as_tensor(vs, device=self.device), torch.as_tensor(pg_adv, device=self.device)


class _PolicyNet(nn.Module):
    """``ActorCritic.policy`` as a module: encoded observations -> distribution inputs."""

    def __init__(self, model: ActorCritic):
        super().__init__()
        self.model = model

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.model.policy(obs) if hasattr(self.model, "policy") else self.model(obs)[0]


