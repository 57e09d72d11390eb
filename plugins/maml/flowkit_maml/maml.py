"""MAML (Finn, Abbeel, Levine 2017, "Model-Agnostic Meta-Learning for Fast Adaptation of Deep
Networks", arXiv 1703.03400, algorithm 3) with the PPO-style outer objective of RLlib's MAML,
as a flowkit plugin: the workers adapt, the driver takes the meta-gradient.

One meta step (the plan's shape; core's ``WorkerRounds`` sends each worker its
:class:`AdaptToTasks`):
    the driver draws ``num_workers x tasks_per_worker`` tasks from the env's task distribution
    (:class:`flowkit.core.TaskSettableEnv`, seeded by the meta step) and sends each worker its
    share; for each task T_i a worker sets the task, samples D_i^0 with theta, and for
    k = 0 .. K-1 (K = ``inner_steps``) takes one policy-gradient step and samples again:
        theta_i^{k+1} = theta_i^k - alpha grad L_in(theta_i^k; D_i^k)               (alpha = inner_lr)
        L_in(theta; D) = -mean_D(log pi_theta(a|s) * A)                             (A standardised per D)
    then restores theta and sends D_i^0 .. D_i^K up (GAE advantages, lambda = ``gae_lambda``,
    computed on the worker as for PPO). Only the post-adaptation episodes (D^K) count as the
    run's episodes (``episode_return_mean``).
The driver rebuilds theta_i^K(theta) from the same D_i^0 .. D_i^{K-1} with the same function,
differentiably (second order: the inner gradients stay in the graph; ``first_order``: they
are constants, FOMAML), and takes ``outer_steps`` Adam steps on the meta-loss
        L(theta) = mean_i [ L_clip(theta_i^K(theta); D_i^K) + vf_coef L_vf - ent_coef H + kl_coeff KL ]
where L_clip is PPO's clipped surrogate with ratio pi_{theta_i^K}(a|s) / pi_old(a|s), pi_old
the adapted policy that sampled D_i^K (ratio 1 at the first step), and KL = KL(pi_old ||
pi_{theta_i^K}) on D_i^K. The meta-batch is one SampleBatch of every task's rows, told apart
by the columns ``task_index`` and ``adaptation_step``, so the core Learner takes the steps
(:meth:`MAMLPolicy.loss` is the meta-loss) and ``SyncWeights`` sends theta back.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.func import functional_call

import flowkit
from flowkit.config import ConfigError
from flowkit.core import ActorCriticPolicy, EnvContext, clipped_surrogate, derive_seed, standardized
from flowkit.core import batch as sb
from flowkit.core.ops import SyncWeights, TrainOneStep, WorkerRounds
from flowkit.core.policy import loss_stats
from flowkit_maml import MAML_REF

Params = Dict[str, torch.Tensor]


def inner_update(loss_fn: Any, params: Params, lr: float, create_graph: bool) -> Params:
    """One inner gradient step: ``{name: p - lr * d loss_fn(params) / d p}`` (a parameter the
    loss does not reach is kept). ``create_graph``: the gradient stays differentiable (second
    order MAML); otherwise it is a constant (the result still depends on ``params`` through
    ``p``: first order)."""
    names = list(params)
    grads = torch.autograd.grad(loss_fn(params), [params[n] for n in names], create_graph=create_graph,
                                allow_unused=True)
    return {n: params[n] if g is None else params[n] - lr * g for n, g in zip(names, grads)}


def linear_baseline_advantages(b: sb.SampleBatch, gamma: float, gae_lambda: float) -> sb.SampleBatch:
    """A copy of ``b`` (trajectory pieces of one task) whose ``advantages`` use the MAML paper's
    baseline instead of the value network's: rllab's LinearFeatureBaseline (Duan et al. 2016,
    arXiv 1604.06778, as used by Finn et al. 2017), a ridge fit ``y ~ w . f(s_t, t)`` of the
    discounted returns to the end of each piece (no bootstrap: the time features tell how much is
    left), features ``f = [o, o^2, t/100, (t/100)^2, (t/100)^3, 1]`` (``o`` the observation
    clipped to +-10, float64), regularisation 1e-5 (times 10 until the solution is finite).
    Advantages: GAE (:func:`compute_gae`) over the fitted values, 0 after each piece's end.
    ``value_targets`` (the value network's) are kept."""
    from flowkit.core.returns import bootstrap_rows, compute_gae, next_values

    out = sb.SampleBatch(b)
    if len(out) == 0:
        return out
    cont, _ = bootstrap_rows(out)
    r = np.asarray(out[sb.REWARDS], np.float32)
    zeros = np.zeros_like(r)
    y, _ = compute_gae(r, zeros, zeros, cont, gamma, 1.0)  # discounted reward sums to each piece's end
    o = np.clip(np.asarray(out[sb.OBS], np.float64).reshape(len(out), -1), -10, 10)
    t = np.asarray(out[sb.T], np.float64).reshape(-1, 1) / 100.0
    f = np.concatenate([o, o * o, t, t * t, t ** 3, np.ones_like(t)], axis=1)
    w, reg = None, 1e-5
    for _ in range(5):
        w = np.linalg.solve(f.T @ f + reg * np.eye(f.shape[1]), f.T @ y.astype(np.float64))
        if np.isfinite(w).all():
            break
        reg *= 10
    v = (f @ w).astype(np.float32)
    no_boot = np.zeros(0, np.int64)  # nothing bootstraps: the fit predicts returns to each piece's end
    out[sb.ADVANTAGES], _ = compute_gae(r, v, next_values(v, cont, no_boot, None), cont, gamma, gae_lambda)
    return out


# ---- the policy --------------------------------------------------------------------------------
class MAMLPolicy(ActorCriticPolicy):
    """An actor-critic (separate policy and value MLPs, acting through the numpy mirror) whose
    :meth:`loss` is MAML's meta-loss over a meta-batch, and whose :meth:`adapt` takes the inner
    step on a worker. Workers keep the torch policy (they adapt)."""

    worker_gae = True
    train_columns = (sb.OBS, sb.ACTIONS, sb.ACTION_LOGP, sb.ADVANTAGES, sb.VALUE_TARGETS, sb.ACTION_DIST_INPUTS,
                     sb.ACTION_MASK, sb.TASK_INDEX, sb.ADAPTATION_STEP)

    def worker_policy_class(self):
        return None  # the workers take inner gradient steps: they keep torch

    def forward_with(self, params: Params, obs: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(dist_inputs, values)`` of the model with ``params`` in place of its parameters."""
        return functional_call(self.model, params, (obs,))

    def inner_loss(self, params: Params, b: Dict[str, torch.Tensor]) -> torch.Tensor:
        """The inner (adaptation) objective on rows ``b``: ``-mean(log pi(a|s) * A)``, A standardised."""
        inputs, _ = self.forward_with(params, b[sb.OBS])
        logp = self.dist.logp(inputs, b[sb.ACTIONS], b.get(sb.ACTION_MASK))
        return -(logp * standardized(b[sb.ADVANTAGES])).mean()

    def adapted(self, params: Params, b: Dict[str, torch.Tensor], create_graph: bool) -> Params:
        """theta' = theta - inner_lr grad L_in(theta; b)."""
        return inner_update(lambda p: self.inner_loss(p, b), params, float(self.config.inner_lr), create_graph)

    @torch.no_grad()
    def _load(self, params: Params) -> None:
        for n, p in self.model.named_parameters():
            p.copy_(params[n])

    def adapt(self, batch: sb.SampleBatch) -> None:
        """The inner step on a worker: the policy's own parameters become theta' for ``batch``
        (in place: its numpy mirror acts with them at once)."""
        with torch.enable_grad():
            new = self.adapted(dict(self.model.named_parameters()), self.prepare_batch(batch), create_graph=False)
        self._load({n: p.detach() for n, p in new.items()})

    def outer_loss(self, params: Params, b: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """PPO's objective on post-adaptation rows ``b`` under the adapted ``params``:
        ``(loss, [pg_loss, vf_loss, entropy, kl, clip_frac])``."""
        cfg = self.config
        mask = b.get(sb.ACTION_MASK)
        inputs, values = self.forward_with(params, b[sb.OBS])
        logp, entropy = self.dist.logp_entropy(inputs, b[sb.ACTIONS], mask, entropy_grad=cfg.ent_coef != 0)
        ratio = torch.exp(logp - b[sb.ACTION_LOGP])
        pg_loss = clipped_surrogate(ratio, standardized(b[sb.ADVANTAGES]), cfg.clip_param)
        vf_loss = 0.5 * (values - b[sb.VALUE_TARGETS]).pow(2).mean()
        entropy = entropy.mean()
        kl = self.dist.kl(b[sb.ACTION_DIST_INPUTS], inputs, mask).mean()
        loss = pg_loss + cfg.vf_coef * vf_loss - cfg.ent_coef * entropy + cfg.kl_coeff * kl
        with torch.no_grad():
            clip_frac = ((ratio - 1.0).abs() > cfg.clip_param).float().mean()
        return loss, [pg_loss, vf_loss, entropy, kl, clip_frac]

    def loss(self, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, float]]:
        """MAML's meta-loss over a meta-batch (rows of every task and adaptation step; see the
        module docstring): the mean over tasks of :meth:`outer_loss` at theta_i^K(theta)."""
        task, step = batch[sb.TASK_INDEX], batch[sb.ADAPTATION_STEP]
        last = int(step.max())
        theta = dict(self.model.named_parameters())
        losses, terms = [], []
        for t in torch.unique(task).tolist():
            in_task = task == t
            params = theta
            for k in range(last):
                rows = in_task & (step == k)
                params = self.adapted(params, {c: v[rows] for c, v in batch.items()},
                                      create_graph=not self.config.first_order)
            rows = in_task & (step == last)
            loss, st = self.outer_loss(params, {c: v[rows] for c, v in batch.items()})
            losses.append(loss)
            terms.append(torch.stack(st))
        meta = torch.stack(losses).mean()
        pg_loss, vf_loss, entropy, kl, clip_frac = torch.stack(terms).mean(0)
        return meta, loss_stats(pg_loss=pg_loss, vf_loss=vf_loss, entropy=entropy, kl=kl, clip_frac=clip_frac,
                                meta_loss=meta)


# ---- the worker's request ----------------------------------------------------------------------
@dataclass
class AdaptToTasks:
    """One worker's share of a meta step (``RolloutWorker.apply(request)``): for each task, set
    it (:meth:`RolloutWorker.set_task`: new episodes in every sub-env), sample one fragment,
    and ``inner_steps`` times adapt (:meth:`MAMLPolicy.adapt`) and sample new episodes; then
    restore the parameters the worker was sent. Returns ``tasks``, per task the fragments of
    each adaptation step (``[[MultiAgentBatch] * (inner_steps + 1)] * len(tasks)``), with
    ``env_steps`` and ``agent_steps`` (all of them) and ``episodes`` (the post-adaptation ones:
    the run's episodes)."""
    tasks: List[Any]
    inner_steps: int

    name = "AdaptToTasks"

    def __call__(self, worker: Any) -> Dict[str, Any]:
        pid, pol = next(iter(worker.policies.items()))
        if not isinstance(pol, MAMLPolicy):
            raise ConfigError(f"maml: rollout worker {worker.index} holds a {type(pol).__name__}, not a MAMLPolicy")
        theta = pol.get_weights()
        out = []
        try:
            for task in self.tasks:
                steps = []
                for k in range(self.inner_steps + 1):
                    worker.set_task(task)
                    steps.append(worker.sample())
                    if pol.config.baseline == "linear":
                        steps[-1].policy_batches[pid] = linear_baseline_advantages(
                            steps[-1].policy_batches[pid], float(pol.config.gamma), float(pol.config.gae_lambda))
                    if k < self.inner_steps:
                        pol.adapt(steps[-1].policy_batches[pid])
                pol.set_weights(theta)
                out.append(steps)
        finally:
            pol.set_weights(theta)
        return {"tasks": out, "env_steps": sum(b.env_steps for steps in out for b in steps),
                "agent_steps": sum(b.agent_steps for steps in out for b in steps),
                "episodes": [e for steps in out for e in steps[-1].episodes]}


# ---- the driver's operators --------------------------------------------------------------------
def meta_batch(results: List[Dict[str, Any]], pid: str, inner_steps: int) -> sb.MultiAgentBatch:
    """A meta step's worker results (:class:`AdaptToTasks`, in worker order) -> one
    MultiAgentBatch of every row, with the columns ``task_index`` (the task's position in the
    meta step) and ``adaptation_step``; the mean episode return of each adaptation step goes
    into ``meta["adaptation"]`` (reported by the plan's AdaptationMetrics)."""
    last = int(inner_steps)
    rows: List[sb.SampleBatch] = []
    returns: List[List[float]] = [[] for _ in range(last + 1)]
    for steps in (steps for r in results for steps in r["tasks"]):
        i = len(rows) // (last + 1)
        for k, b in enumerate(steps):
            pb = b.policy_batches[pid]
            n = len(pb)
            rows.append(sb.SampleBatch({**pb, sb.TASK_INDEX: np.full(n, i, np.int64),
                                        sb.ADAPTATION_STEP: np.full(n, k, np.int64)}))
            returns[k] += [e["return"] for e in b.episodes]
    means = [float(np.mean(r)) if r else float("nan") for r in returns]
    adaptation = {f"return_mean_step_{k}": m for k, m in enumerate(means)}
    adaptation.update(adaptation_delta=means[-1] - means[0], num_tasks=len(rows) // (last + 1))
    return sb.MultiAgentBatch({pid: sb.concat_samples(rows)}, sum(r["env_steps"] for r in results),
                              sum(r["agent_steps"] for r in results), [], -1, {"adaptation": adaptation})


# ---- the algorithm -----------------------------------------------------------------------------
class MAML(flowkit.Algorithm, ref=MAML_REF):
    """MAML: tasks to the workers (core's ``WorkerRounds`` of :class:`AdaptToTasks`) ->
    adaptation on the workers -> :func:`meta_batch` -> the meta-update (TrainOneStep,
    ``outer_steps`` Adam steps on :meth:`MAMLPolicy.loss`) -> SyncWeights. It consumes no
    rollouts."""

    policy_class = MAMLPolicy
    consumes_rollouts = False

    def __init__(self, run_config: Any, config: Any = None):
        super().__init__(run_config, config)
        self._task_env: Any = None
        self._drawn: Optional[Tuple[int, List[Any]]] = None

    def tasks(self, meta_step: int, n: int) -> List[Any]:
        """``n`` tasks of meta step ``meta_step``, drawn once per step by the driver's copy of
        the env after ``reset(seed=derive_seed(seed, "maml", "tasks", meta_step))``: the same
        tasks on either backend and after a resume."""
        from omegaconf import OmegaConf

        from flowkit.core import env_name, make_env, task_env
        if self._drawn is None or self._drawn[0] != meta_step or len(self._drawn[1]) != n:
            cfg = self.run_config
            if self._task_env is None:
                env_cfg = OmegaConf.to_container(cfg.env, resolve=True)
                self._task_env = make_env(env_cfg, EnvContext(-1, 0, 1, 0, derive_seed(int(cfg.seed), "maml", "tasks")))
            self._task_env.reset(seed=derive_seed(int(cfg.seed), "maml", "tasks", meta_step))
            self._drawn = (meta_step, list(task_env(self._task_env, env_name(cfg.env)).sample_tasks(n)))
        return self._drawn[1]

    def adaptation_requests(self, meta_step: int, world: int) -> List[AdaptToTasks]:
        """Each of ``world`` workers' :class:`AdaptToTasks`: its ``tasks_per_worker`` of the meta step's tasks."""
        k = int(self.config.tasks_per_worker)
        tasks = self.tasks(meta_step, k * world)
        return [AdaptToTasks(tasks[i * k:(i + 1) * k], int(self.config.inner_steps)) for i in range(world)]

    def training_flow(self, experiences, ctx, learner):
        pid, c = self.only_policy(ctx, learner), self.config
        n = max(1, int(self.run_config.runtime.num_workers))
        order = "first-order" if c.first_order else "second-order"

        def adaptation_metrics(out: Dict[str, Any]) -> Dict[str, Any]:
            """The meta step's returns by adaptation step (``return_mean_step_<k>``, ``adaptation_delta``
            = last - first, ``num_tasks``) into the policy's learner stats; counts the meta step."""
            ctx.metrics.learner_stats.setdefault(pid, {}).update(out["batch"].meta["adaptation"])
            ctx.counters["meta_updates"] += 1
            return out
        rounds = WorkerRounds(ctx, lambda world: self.adaptation_requests(int(ctx.counters["meta_updates"]), world),
                              f"ParallelAdaptation({n} workers x {c.tasks_per_worker} tasks: sample, {c.inner_steps} "
                              f"inner step(s) of lr {c.inner_lr:g}, sample)")
        return (rounds.for_each(lambda results: meta_batch(results, pid, c.inner_steps),
                                f"MetaBatch(tasks x {c.inner_steps + 1} adaptation steps; post-adaptation episodes "
                                "reported)")
                .for_each(TrainOneStep(ctx, learner, num_epochs=c.outer_steps), f"MetaUpdate({order}, "
                          f"{c.outer_steps} Adam steps on the clipped surrogate after adaptation)")
                .for_each(adaptation_metrics, "AdaptationMetrics(returns before and after adaptation)")
                .for_each(SyncWeights(ctx, learner)))


# ---- evaluation: returns before and after adaptation --------------------------------------------
def adaptation_returns(worker: Any, weights: Dict[str, np.ndarray], tasks: Sequence[Any],
                       inner_steps: int) -> np.ndarray:
    """Mean episode return of ``weights`` on each task before and after each inner step:
    ``float64[len(tasks), inner_steps + 1]``, measured as the workers measure it (the same
    :class:`AdaptToTasks`, the worker's ``maml.inner_lr``) on ``worker``, an in-process
    RolloutWorker of a MAML run (its policy takes ``weights``: any actor-critic of the same
    network, e.g. a PPO policy's, for a baseline)."""
    pid, pol = next(iter(worker.policies.items()))
    pol.set_weights(weights)
    out = AdaptToTasks(list(tasks), int(inner_steps))(worker)["tasks"]
    return np.array([[np.mean([e["return"] for e in b.episodes]) for b in steps] for steps in out])
