"""REINFORCE with a baseline: the policy (network, returns, loss) and the algorithm (its
dataflow fragment). Sutton & Barto (2018), section 13.4:
``loss = -mean(log pi(a_t | s_t) * (G_t - b))`` with ``G_t`` the discounted return-to-go and
``b`` a running mean of the returns."""
from __future__ import annotations

import numpy as np
import torch

from flowkit import Algorithm, Policy
from flowkit.core import batch as sb
from flowkit.core import bootstrap_rows, build_mlp, compute_gae, loss_stats, next_values
from flowkit.core.ops import ConcatBatches, SyncWeights, TrainOneStep
from flowkit_reinforce import REINFORCE_REF

RETURNS = "returns"


class ReinforcePolicy(Policy):
    """An MLP over the encoded observation to the action distribution's inputs.

    State beyond the network and the optimizer: ``baseline`` (float), a :attr:`state_attrs`
    entry, so :meth:`get_state` saves it and a resumed run goes on with the same baseline."""

    model: torch.nn.Sequential
    state_attrs = ("baseline",)

    def __init__(self, observation_space, action_space, config, model_config=None, device="cpu", seed=0,
                 inference_only=False):
        super().__init__(observation_space, action_space, config, model_config, device, seed, inference_only)
        torch.manual_seed(seed)
        hidden, act = list(self.model_config.hidden_sizes), self.model_config.activation
        self.model = build_mlp(self.encoder.shape[0], hidden, act, self.dist.num_outputs, 0.01).to(self.device)
        self.baseline = 0.0
        if not inference_only:
            self.optimizer = self.make_optimizer(config.lr)

    @torch.inference_mode()
    def compute_actions_encoded(self, obs, mask=None, explore=True):
        inputs = self.model(torch.from_numpy(obs))
        m = None if mask is None else torch.from_numpy(mask)
        actions, logp = self.dist.sample_logp(inputs, m, explore, self.generator)
        return actions.numpy(), {sb.ACTION_LOGP: logp.numpy()}

    def postprocess_trajectory(self, batch):
        """Discounted returns-to-go per trajectory piece (a cut piece bootstraps from 0)."""
        out = sb.SampleBatch(batch)
        r = np.asarray(out[sb.REWARDS], np.float32)
        zeros = np.zeros_like(r)
        cont, boot = bootstrap_rows(out)
        _, out[RETURNS] = compute_gae(r, zeros, next_values(zeros, cont, boot, np.zeros(len(boot), np.float32)),
                                      cont, self.config.gamma, 1.0)
        return out

    def loss(self, batch):
        logp = self.dist.logp(self.model(batch[sb.OBS]), batch[sb.ACTIONS])
        loss = -(logp * (batch[RETURNS] - self.baseline)).mean()
        return loss, loss_stats(policy_loss=loss)

    def on_train_batch_end(self, batch):
        self.baseline += self.config.baseline_rate * (float(batch[RETURNS].mean()) - self.baseline)
        return {"baseline": self.baseline}


class Reinforce(Algorithm, ref=REINFORCE_REF):
    """Collect ``train_batch_size`` env steps, take one policy-gradient step, send the new
    weights to every worker (on-policy, bulk-synchronous)."""

    policy_class = ReinforcePolicy

    def training_flow(self, experiences, ctx, learner):
        return (experiences.combine(ConcatBatches(self.config.train_batch_size))
                .for_each(TrainOneStep(ctx, learner, 1, None))
                .for_each(SyncWeights(ctx, learner)))
