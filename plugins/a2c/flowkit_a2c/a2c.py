"""A2C and A3C (Mnih et al. 2016, "Asynchronous Methods for Deep Reinforcement Learning",
arXiv 1602.01783) as a flowkit plugin: one actor-critic loss, two plans.

Math, top to bottom (returns are computed on the workers by core's ``compute_gae``):
    n-step returns (``returns=nstep``; paper, section 4 and algorithm S3): each row's return
    runs to the end of its trajectory piece (at most ``runtime.rollout_fragment_length``
    steps) and bootstraps there,
        R_t = r_t + gamma * R_{t+1},    R at the end of a piece = V(s_next) (0 if terminated)
        A_t = R_t - V(s_t)              (the advantage of eq. 2: sum_i gamma^i r_{t+i}
                                         + gamma^k V(s_{t+k}) - V(s_t), k <= t_max)
    which is GAE (Schulman et al. 2016, arXiv 1506.02438, eq. 16) with lambda = 1;
    ``returns=gae`` uses ``gae_lambda``. value_targets = A + V(s).
    Loss (the gradients of algorithm S3, as one loss; means over the rows):
        pg_loss  = -mean(log pi(a_t|s_t) * A_t)               (A_t a constant)
        vf_loss  = 0.5 * mean((V(s_t) - value_targets_t)^2)
        entropy  = mean(H(pi(.|s_t)))                         (the bonus of section 5.1)
        loss     = pg_loss + vf_coef * vf_loss - ent_coef * entropy
    Optimizer: RMSprop, g <- alpha g + (1 - alpha) grad^2, w <- w - lr grad / (sqrt(g) + eps)
    (section 4, "shared RMSProp": one set of statistics on the driver), or Adam; the gradient
    is clipped to global norm ``max_grad_norm``.

A2C (synchronous): bulk-sync rollouts -> [ConcatBatches] -> one gradient step per train batch
(TrainOneStep) -> SyncWeights(to all workers).
A3C (asynchronous, the paper's algorithm S3): each worker samples a fragment with its copy of
the weights and computes the gradient on it (``rollout_mode=async_gradients``); the driver
applies gradients as they arrive (ApplyGradients) and sends the new weights only to the
worker whose gradient it just applied, with that worker's next request (SyncWeights to the
source). On the local backend the same plan runs one worker at a time.
"""
import flowkit
from flowkit.core import ActorCriticPolicy, loss_stats
from flowkit.core import batch as sb
from flowkit.core.ops import ApplyGradients, ConcatBatches, SyncWeights, TrainOneStep
from flowkit_a2c import A2C_REF, A3C_REF


# ---- the policy ------------------------------------------------------------------------------
class A2CPolicy(ActorCriticPolicy):
    """The actor-critic of A2C and A3C (acting and returns from :class:`ActorCriticPolicy`;
    RMSprop or Adam from the config's ``optimizer``). Override :meth:`loss` to make a variant."""

    train_columns = (sb.OBS, sb.ACTIONS, sb.ADVANTAGES, sb.VALUE_TARGETS, sb.ACTION_MASK)

    def postprocess_trajectory(self, batch: sb.SampleBatch) -> sb.SampleBatch:
        """Add ``advantages`` and ``value_targets`` (n-step returns or GAE, see the module
        docstring)."""
        return self.add_gae(batch, 1.0 if self.config.returns == "nstep" else None)

    def loss(self, batch):
        """``(loss, stats)`` of one train batch (tensors, see the module docstring)."""
        cfg = self.config
        inputs, values = self.model_forward(batch)
        logp, entropy = self.dist.logp_entropy(inputs, batch[sb.ACTIONS], batch.get(sb.ACTION_MASK),
                                               entropy_grad=cfg.ent_coef != 0)
        adv = batch[sb.ADVANTAGES]
        if cfg.normalize_advantages and adv.shape[0] >= 2:
            adv = (adv - adv.mean()) / (adv.std(unbiased=False) + 1e-8)
        pg_loss = -(logp * adv).mean()
        vf_loss = 0.5 * (values - batch[sb.VALUE_TARGETS]).pow(2).mean()
        loss = pg_loss + cfg.vf_coef * vf_loss - cfg.ent_coef * entropy.mean()
        return loss, loss_stats(pg_loss=pg_loss, vf_loss=vf_loss, entropy=entropy.mean(), total_loss=loss)


# ---- the algorithms --------------------------------------------------------------------------
class A2C(flowkit.Algorithm, ref=A2C_REF):
    """A2C: bulk-sync rollouts -> [ConcatBatches] -> TrainOneStep (one gradient step) ->
    SyncWeights(to all workers)."""

    policy_class = A2CPolicy

    def training_flow(self, experiences, ctx, learner):
        flow = experiences
        if self.config.train_batch_size is not None:
            flow = flow.combine(ConcatBatches(self.config.train_batch_size))
        return flow.for_each(TrainOneStep(ctx, learner)).for_each(SyncWeights(ctx, learner))


class A3C(flowkit.Algorithm, ref=A3C_REF):
    """A3C: gradients from the workers (async) -> ApplyGradients -> SyncWeights(to the worker
    whose gradient was applied, with its next request)."""

    policy_class, rollout_mode = A2CPolicy, "async_gradients"

    def training_flow(self, experiences, ctx, learner):
        return (experiences.for_each(ApplyGradients(ctx, learner))
                .for_each(SyncWeights(ctx, learner, to="source", with_next_sample=True)).drop_source())
