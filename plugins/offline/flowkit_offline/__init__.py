"""flowkit-offline: learning from recorded datasets (entry point group ``flowkit``).

- the ``input`` config section: ``input.dataset=PATH`` replaces the rollout workers with a
  reader of a Minari dataset (written by ``flowkit record``, see :mod:`flowkit.datasets`);
  online evaluation (``evaluation.*``) still runs the env;
- the algorithms ``bc`` (behavioural cloning) and ``marwil`` (Wang et al. 2018,
  advantage-weighted imitation; ``marwil.beta=0`` is BC), in :mod:`flowkit_offline.marwil`,
  ``cql_dqn`` (conservative Q-learning, Kumar et al. 2020, CQL(H) on DQN's Q-network,
  Discrete actions) and ``cql_sac`` (CQL(H) on SAC's actor and twin critics, Box actions), in
  :mod:`flowkit_offline.cql`.

This module is the plugin's torch-free declaration (config sections, the algorithms'
:class:`flowkit.AlgorithmRef`, the checks made before anything starts); the algorithms and the
reader (torch) are in :mod:`flowkit_offline.marwil`, :mod:`flowkit_offline.cql` and
:mod:`flowkit_offline.reader`, imported when a run uses them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

from flowkit_dqn import DQN_REF, DQNLossConfig
from flowkit_sac import SAC_REF, SACLossConfig

import flowkit
from flowkit.config import MAX_BATCH_ROWS, F, config_checks


@dataclass
class InputConfig:
    """input: where a run's experience comes from: the rollout workers (default) or a dataset."""
    dataset: Optional[str] = F(None, "a dataset folder written by `flowkit record` (or a local Minari dataset id "
                                     "under $MINARI_DATASETS_PATH): the run learns from it instead of rollout "
                                     "workers (algo=bc, marwil, cql_dqn, cql_sac); evaluation still runs the env")
    mix: Optional[float] = F(None, "online and offline: with live rollout workers, this share of every replayed "
                                   "batch comes from input.dataset, the rest from the replay buffer (RLPD's symmetric "
                                   "sampling at 0.5; off-policy algorithms that replay: dqn, sac, td3, ...)",
                             gt=0, lt=1)
    shuffle_buffer_size: int = F(100_000, "rows shuffled together, the reader's memory bound: a dataset of at most "
                                          "this many rows is read once and kept (a full shuffle each epoch); a larger "
                                          "one is streamed, whole episodes in a random order into a buffer of this "
                                          "many rows, handed out in a random order", ge=1)
    num_readers: int = F(0, "0: the dataset is read on the driver; k >= 1: by k readers (Ray actors on "
                            "runtime.backend=ray, in-process on local: the same batches), reader i reading the "
                            "episodes i, i + k, ... with a shuffle buffer of shuffle_buffer_size / k rows; the driver "
                            "takes their batches round-robin (deterministic) while they read ahead", ge=0)

    def validate(self, run_config: Any, name: str) -> List[str]:
        """``input.mix`` and ``input.num_readers`` need ``input.dataset``; with ``input.dataset``:
        the dataset opens, its spaces are the env's and every episode fits them
        (:func:`flowkit.datasets.check_dataset`), and it holds an episode for each reader (each
        reads whole episodes), whichever algorithm reads it (an offline one, or one that mixes
        it into replay: ``input.mix``); torch-free, before Ray and the run folder (one-line
        config errors, exit 2)."""
        warns = config_checks([
            (not self.dataset and self.mix is not None, f"input.mix={self.mix} needs input.dataset=PATH (the dataset "
                                                        "mixed into the replayed batches)"),
            (not self.dataset and self.num_readers > 0, f"input.num_readers={self.num_readers} needs "
                                                        "input.dataset=PATH (the dataset the readers read)"),
        ])
        if self.dataset:
            from flowkit.datasets import check_dataset
            n = int(check_dataset(run_config).total_episodes)
            config_checks([(self.num_readers > n, f"input.num_readers={self.num_readers}: the dataset "
                                                  f"{self.dataset!r} holds {n} episodes, fewer than the readers (each "
                                                  f"reads whole episodes; at most {n})")])
        return warns


class FromDataset:
    """The check of the algorithms that learn from a dataset (a base of their config classes):
    the run needs ``input.dataset`` (its contents are checked by :meth:`InputConfig.validate`;
    made before torch and Ray load: one-line config errors, exit 2)."""

    def validate(self, run_config: Any, name: str) -> List[str]:
        from omegaconf import OmegaConf
        return config_checks([(not OmegaConf.select(run_config, "input.dataset"), f"algo={name} learns from a "
                               "dataset: set input.dataset=PATH (write one with `flowkit record RUN_DIR`)")])


@dataclass
class BCConfig(FromDataset):
    """bc: behavioural cloning, maximum likelihood of the dataset's actions (MARWIL with beta = 0)."""
    lr: float = F(1e-3, "Adam learning rate", gt=0)
    train_batch_size: int = F(256, "dataset rows per gradient step", ge=1)
    max_grad_norm: Optional[float] = F(None, "clip the gradient's global norm (null: off)", gt=0)
    log_std_init: float = F(0.0, "initial log-std of the Gaussian (Box actions)", ge=-20, le=20)


@dataclass
class MARWILConfig(BCConfig):
    """marwil: Monotonic Advantage Re-Weighted Imitation Learning (Wang et al. 2018), exp(beta * A / c)-weighted BC."""
    beta: float = F(1.0, "advantage temperature: weights exp(beta * A / c) (0: plain BC, no value network trained)",
                    ge=0)
    gamma: float = F(0.99, "discount of the returns-to-go", ge=0, le=1)
    vf_coef: float = F(1.0, "value-loss coefficient", ge=0)
    moving_average_sqd_adv_norm_start: float = F(100.0, "initial c^2, the moving average of the squared advantage",
                                                 gt=0)
    moving_average_sqd_adv_norm_update_rate: float = F(1e-2, "its update rate per gradient step: "
                                                             "c^2 <- c^2 + rate * (mean(A^2) - c^2)", gt=0, le=1)
    max_weight: Optional[float] = F(20.0, "clip the weights exp(beta * A / c) at this value (null: off)", gt=0)


@dataclass
class CQLDQNConfig(DQNLossConfig, FromDataset):
    """cql_dqn: Conservative Q-Learning (Kumar et al. 2020), CQL(H) on DQN's Q-network, Discrete actions."""
    cql_alpha: float = F(1.0, "weight of the conservative term mean(logsumexp_a Q(s, a) - Q(s, a_data)) (a greedy "
                              "expert's data: 10, the authors' DQN value; docs/offline.md)", ge=0)
    n_step: int = F(1, "n-step returns inside each dataset episode (1: one-step TD)", gt=0)
    train_batch_size: int = F(256, "dataset rows per gradient step", ge=1)
    initial_epsilon: float = F(0.0, "epsilon of epsilon-greedy acting when sampling (evaluation.explore=true)",
                               ge=0, le=1)


@dataclass
class CQLSACConfig(SACLossConfig, FromDataset):
    """cql_sac: Conservative Q-Learning (Kumar et al. 2020), CQL(H) on SAC's actor, twin critics and temperature, Box actions."""
    lr: float = F(3e-4, "Adam learning rate of the critics, SAC's temperature and the Lagrange multiplier", gt=0)
    train_batch_size: int = F(256, "dataset rows per gradient step", gt=0, le=MAX_BATCH_ROWS)
    actor_lr: Optional[float] = F(1e-4, "Adam learning rate of the actor (null: lr)", gt=0)
    cql_alpha: float = F(5.0, "weight of the conservative term mean(T logsumexp(Q(s, a) / T) - Q(s, a_data)) per "
                              "critic (lagrangian=true: its starting value, then learned)", ge=0)
    num_actions: int = F(10, "actions drawn per state from each of the three proposals of the log-sum-exp "
                             "(uniform, pi(.|s), pi(.|s')): 3 x num_actions Q-values per state", ge=1, le=1000)
    cql_temperature: float = F(1.0, "temperature T of the log-sum-exp", gt=0)
    lagrangian: bool = F(False, "CQL-Lagrange: learn the weight alpha' >= 0 by dual gradient descent so that the "
                                "conservative gap stays at target_action_gap (eq. 30)")
    target_action_gap: float = F(5.0, "lagrangian: the gap's threshold tau (the multiplier grows while the gap is "
                                      "above it, shrinks below)")
    backup_entropy: bool = F(True, "subtract alpha log pi(a'|s') in the Bellman target (SAC's soft backup); false: "
                                   "the paper's backup r + gamma min_j Q_targ_j(s', a'), as the authors' code and CORL")
    bc_steps: int = F(0, "the actor's first gradient steps fit the dataset's actions (alpha log pi(a~|s) minus "
                         "the beta-NLL of atanh(a_t)) instead of maximising Q (the authors' policy_eval_start)", ge=0)
    bc_lr: Optional[float] = F(None, "Adam learning rate of the actor during the bc_steps warm start (null: "
                                     "actor_lr); after it, actor_lr", gt=0)


BC_REF = flowkit.AlgorithmRef("bc", BCConfig, "flowkit_offline.marwil:BC", normalize_obs=True)
MARWIL_REF = flowkit.AlgorithmRef("marwil", MARWILConfig, "flowkit_offline.marwil:MARWIL", normalize_obs=True)
CQL_DQN_REF = flowkit.AlgorithmRef("cql_dqn", CQLDQNConfig, "flowkit_offline.cql:CQLDQN", DQN_REF.action_spaces,
                                   normalize_obs=True)
CQL_SAC_REF = flowkit.AlgorithmRef("cql_sac", CQLSACConfig, "flowkit_offline.cql:CQLSAC", SAC_REF.action_spaces,
                                   normalize_obs=True)
OFFLINE_ALGOS = tuple(r.name for r in (BC_REF, MARWIL_REF, CQL_DQN_REF, CQL_SAC_REF))


@flowkit.hookimpl
def flowkit_add_algorithms():
    return [BC_REF, MARWIL_REF, CQL_DQN_REF, CQL_SAC_REF]


@flowkit.hookimpl
def flowkit_add_config_sections():
    return {"input": InputConfig}


@flowkit.hookimpl(tryfirst=True)
def flowkit_build_plan(ctx):
    """Runs on: driver. With ``input.dataset``: the dataset reader instead of the rollout
    workers, into the algorithm's training flow, or with ``input.mix`` mixed into the replay of
    a run with rollout workers; None otherwise."""
    from omegaconf import OmegaConf
    if not OmegaConf.select(ctx.config, "input.dataset"):
        return None
    from flowkit_offline.reader import build_plan
    return build_plan(ctx)
