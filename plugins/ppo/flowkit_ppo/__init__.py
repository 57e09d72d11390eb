"""flowkit-ppo: the PPO and DD-PPO algorithm plugin (entry point group ``flowkit``).

This module is the plugin's torch-free declaration (its config sections, their checks and the
algorithms' :class:`flowkit.AlgorithmRef`, what ``flowkit train --help``, ``flowkit plugins``
and the checks before torch loads read); the algorithms and their policies (torch) are in
:mod:`flowkit_ppo.ppo` and :mod:`flowkit_ppo.ddppo`, imported when a run uses them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Optional

import flowkit
from flowkit.config import MAX_BATCH_ROWS, F, LRConfig, config_checks, round_env_steps


@dataclass
class PPOLossConfig(LRConfig):
    """The keys of PPO's loss, its optimizer and its epochs (shared by ``ppo.*`` and ``ddppo.*``)."""
    lr: float = F(3e-4, "Adam learning rate", gt=0)
    gamma: float = F(0.99, "discount factor", ge=0, le=1)
    gae_lambda: float = F(0.95, "GAE lambda", ge=0, le=1)
    clip_param: float = F(0.2, "surrogate clip range epsilon", gt=0)
    clip_schedule: str = F("constant", "constant, or linear (to 0 at schedule_env_steps)", choices=("constant", "linear"))
    vf_clip_param: Optional[float] = F(None, "clip value updates to +-this around vf_preds (null: off)", gt=0)
    vf_coef: float = F(0.5, "value-loss coefficient", ge=0)
    ent_coef: float = F(0.0, "entropy bonus coefficient", ge=0)
    kl_coeff: float = F(0.0, "initial KL-penalty coefficient (0: no penalty, KL is only reported)", ge=0)
    kl_target: float = F(0.01, "target KL for the adaptive penalty", gt=0)
    num_epochs: int = F(10, "passes over each train batch", ge=1)
    minibatch_size: int = F(64, "rows per SGD minibatch", ge=1)
    max_grad_norm: Optional[float] = F(0.5, "clip the gradient norm (null: off)", gt=0)
    normalize_advantages: str = F("minibatch", "advantage standardisation: per minibatch, per train batch "
                                  "or none", choices=("minibatch", "batch", "none"))
    log_std_init: float = F(0.0, "initial log-std of the Gaussian (Box actions; with use_sde: of each entry of "
                            "gSDE's exploration matrix)", ge=-20, le=20)
    use_sde: bool = F(False, "generalized state-dependent exploration (gSDE, Raffin et al. 2021; Box actions): "
                      "noise z(s) @ W from the policy's last hidden layer z(s), W held between draws")
    sde_sample_freq: int = F(-1, "env steps between two draws of gSDE's exploration matrices "
                             "(-1: once per rollout fragment, when new weights arrive)", ge=-1)
    use_expln: bool = F(False, "gSDE: std of the exploration matrix's entries by expln(log_std) (exp below 0, "
                        "log1p(x) + 1 above: grows slowly) in place of exp (SB3's use_expln)")
    learn_features: bool = F(False, "gSDE: the loss trains the policy's last hidden layer through the std too "
                             "(SB3's learn_features; false: the features are detached there)")
    adam_eps: float = F(1e-5, "Adam epsilon", gt=0)


@dataclass
class PPOConfig(PPOLossConfig):
    """ppo: Proximal Policy Optimization (clipped surrogate, GAE)."""
    train_batch_size: Optional[int] = F(None, "env steps per train batch (null: one sampling round)", ge=1, le=MAX_BATCH_ROWS)
    normalize_observations: bool = F(False, "running mean/std observation normalisation: the same switch as "
                                            "model.normalize_obs (either key turns it on; neither alone turns it off)")
    normalize_rewards: bool = F(False, "divide rewards by a running std of discounted returns (as SB3's "
                                "VecNormalize norm_reward; clipped to +-10, statistics saved in checkpoints)")

    def validate(self, run_config: Any, n: str) -> List[str]:
        """The checks that relate several keys (:func:`flowkit.config.validate_section`)."""
        tb, mb, rs = self.train_batch_size, self.minibatch_size, round_env_steps(run_config)
        return config_checks([
            (tb is not None and mb > tb, f"{n}.minibatch_size={mb} is larger than {n}.train_batch_size={tb}; make "
                                         "minibatch_size <= train_batch_size"),
            (self.sde_sample_freq == 0, f"{n}.sde_sample_freq=0: use -1 (one draw per rollout fragment) or a number "
                                        "of env steps >= 1"),
        ], warnings=[
            (tb is not None and tb % rs, f"{n}.train_batch_size={tb} is not a multiple of one sampling round "
                                         f"(runtime.num_workers x num_envs_per_worker x rollout_fragment_length = "
                                         f"{rs}); each train batch will hold {-(-(tb or 0) // rs) * rs} env steps "
                                         "(reported as learner/<policy>/train_batch_size)"),
            (tb is None and mb > rs, f"{n}.minibatch_size={mb} is larger than one sampling round, the train batch "
                                     f"when {n}.train_batch_size is null (runtime.num_workers x num_envs_per_worker x "
                                     f"rollout_fragment_length = {rs}): each epoch is one step over the whole round"),
        ])


@dataclass
class DDPPOConfig(PPOLossConfig):
    """ddppo: Decentralized Distributed PPO (Wijmans et al. 2020): each worker learns, gradients all-reduced."""
    minibatch_size: int = F(64, "rows per SGD minibatch of a full worker batch (fragments_per_round fragments): "
                                "every worker takes ceil(full batch / minibatch_size) minibatches per epoch, so a "
                                "worker cut short by preemption takes as many, smaller ones", ge=1)
    fragments_per_round: int = F(4, "fragments (runtime.rollout_fragment_length env steps per sub-env) each worker "
                                    "samples per round at most: its batch, learned on by the worker itself", ge=1)
    sync_frac: float = F(0.6, "preemption threshold: once this fraction of the workers has sampled a full batch, "
                              "the others stop after their current fragment (the paper's 0.6; 1.0: never cut)",
                         gt=0, le=1)
    min_rollout_frac: float = F(0.25, "a preempted worker still samples at least this fraction of "
                                      "fragments_per_round (habitat-lab's short-rollout threshold)", gt=0, le=1)
    dist_backend: str = F("auto", "torch.distributed backend of the workers' all-reduce: gloo (CPU), nccl "
                                  "(workers with a GPU), auto: nccl if the workers learn on cuda, else gloo",
                          choices=("auto", "gloo", "nccl"))
    worker_device: str = F("cpu", "device the workers learn on (cuda: one GPU per worker, Ray's num_gpus "
                                  "not reserved by flowkit)", pattern=r"cpu|cuda(:[0-9]+)?")
    collective_timeout_s: float = F(120.0, "seconds a worker waits in the rendezvous or an all-reduce for the "
                                           "others before it gives the round up (a lost worker)", gt=0)
    max_aborted_rounds: int = F(3, "consecutive rounds given up (the group lost a worker and re-forms) before "
                                   "the run stops", ge=1)

    def validate(self, run_config: Any, n: str) -> List[str]:
        """The checks that relate several keys (:func:`flowkit.config.validate_section`)."""
        rt = run_config.runtime
        per_frag = int(rt.num_envs_per_worker) * int(rt.rollout_fragment_length)
        full, k, least = self.fragments_per_round * per_frag, num_minibatches(self, run_config), min_fragments(self) * per_frag
        return config_checks([
            (rt.backend == "local" and int(rt.num_workers) > 1,
             f"{n} on runtime.backend=local runs one worker (a world of 1, no process group); runtime.num_workers="
             f"{rt.num_workers}: set runtime.num_workers=1, or runtime.backend=ray for a group of workers"),
            (k > least, f"{n}.minibatch_size={self.minibatch_size} makes {k} minibatches of a full worker batch ({full} "
                        f"rows), more than the rows of a preempted one ({least}: {n}.min_rollout_frac x "
                        f"fragments_per_round fragments); raise {n}.minibatch_size"),
        ], warnings=[
            (self.minibatch_size > full, f"{n}.minibatch_size={self.minibatch_size} is larger than a worker's batch "
                                         f"({n}.fragments_per_round x num_envs_per_worker x rollout_fragment_length = "
                                         f"{full}): one minibatch per epoch"),
        ])


def min_fragments(c: Any) -> int:
    """Fragments a worker samples before preemption may cut it: ceil(min_rollout_frac x fragments_per_round)."""
    return max(1, min(int(c.fragments_per_round), math.ceil(float(c.min_rollout_frac) * int(c.fragments_per_round) - 1e-9)))


def num_minibatches(c: Any, run_config: Any) -> int:
    """DD-PPO's minibatches per epoch: ceil(full worker batch / minibatch_size)."""
    rt = run_config.runtime
    full = int(c.fragments_per_round) * int(rt.num_envs_per_worker) * int(rt.rollout_fragment_length)
    return max(1, -(-full // int(c.minibatch_size)))


PPO_REF = flowkit.AlgorithmRef("ppo", PPOConfig, "flowkit_ppo.ppo:PPO", recurrent=True, learner_group=True,
                               normalize_obs="normalize_observations")
DDPPO_REF = flowkit.AlgorithmRef("ddppo", DDPPOConfig, "flowkit_ppo.ddppo:DDPPO", normalize_obs_refusal=(
    "its workers would each keep running observation statistics of their own (and their weights would differ); "
    "use ppo with ppo.normalize_observations=true"))


@flowkit.hookimpl
def flowkit_add_algorithms():
    return [PPO_REF, DDPPO_REF]
