"""flowkit-dqn: the DQN algorithm plugin (entry point group ``flowkit``): ``algo=dqn`` (Ape-X
with ``dqn.num_replay_shards``) and ``algo=r2d2`` (recurrent replay).

This module is the plugin's torch-free declaration (its config sections, their checks and the
algorithms' :class:`flowkit.AlgorithmRef`, what ``flowkit train --help``, ``flowkit plugins``
and the checks before torch loads read); the algorithms and their policies (torch) are in
:mod:`flowkit_dqn.dqn` and :mod:`flowkit_dqn.r2d2`, imported when a run uses them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

import flowkit
from flowkit.config import MAX_BATCH_ROWS, F, LRConfig, config_checks


@dataclass
class DQNLossConfig:
    """DQN's Q-network, TD loss and optimizer keys (shared by ``dqn.*`` and the offline ``cql_dqn.*``)."""
    lr: float = F(5e-4, "Adam learning rate", gt=0)
    adam_eps: float = F(1e-8, "Adam epsilon", gt=0)
    gamma: float = F(0.99, "discount factor", ge=0, le=1)
    n_step: int = F(1, "n-step returns (1: one-step TD)", gt=0)
    double_q: bool = F(True, "double-Q target: argmax by the online network, value by the target network")
    dueling: bool = F(True, "dueling heads: Q = V + A - mean(A)")
    train_batch_size: int = F(32, "replayed transitions per gradient step", gt=0, le=MAX_BATCH_ROWS)
    target_network_update_freq: int = F(500, "gradient steps between target-network updates", gt=0)
    max_grad_norm: Optional[float] = F(10.0, "clip the gradient norm (null: off)", gt=0)
    huber_delta: float = F(1.0, "Huber loss threshold", gt=0)
    initial_epsilon: float = F(1.0, "epsilon-greedy: epsilon at the start", ge=0, le=1)


@dataclass
class DQNConfig(DQNLossConfig, LRConfig):
    """dqn: Deep Q-Networks (double-Q, dueling, n-step, prioritized replay, Ape-X shards)."""
    ROWS = "transitions"  # what a replay row is (in messages)
    buffer_size: int = F(50_000, "replay capacity in transitions (per policy; split over shards in Ape-X)", gt=0)
    learning_starts: int = F(1_000, "env steps sampled before the first gradient step", ge=0)
    training_intensity: Optional[float] = F(8.0, "transitions trained per transition sampled (8: one gradient "
                                                 "step of 32 per 4 env steps, SB3's and RLlib's default ratio; null: "
                                                 "one gradient step per sampling round)", gt=0)
    weight_sync_freq: int = F(16, "gradient steps between weight broadcasts to the workers (0: after every step)", ge=0)
    final_epsilon: float = F(0.02, "epsilon-greedy: epsilon after epsilon_timesteps", ge=0, le=1)
    epsilon_timesteps: int = F(10_000, "env steps sampled over which epsilon decays linearly "
                                    "(0: final_epsilon from the start)", ge=0)
    prioritized_replay: Optional[bool] = F(None, "proportional prioritized replay (Schaul et al. 2016); "
                                                 "null: on in Ape-X mode, off otherwise")
    prioritized_replay_alpha: float = F(0.6, "priority exponent alpha (0: uniform)", ge=0)
    prioritized_replay_beta: float = F(0.4, "importance-weight exponent beta (1: full correction)", ge=0, le=1)
    prioritized_replay_eps: float = F(1e-6, "added to |td_error| for the priority", gt=0)
    num_replay_shards: int = F(0, "Ape-X: replay shards held by Ray actors (0: one local buffer)", ge=0)
    replay_num_async: int = F(2, "Ape-X: replay requests in flight per shard", gt=0)
    apex_epsilon_base: float = F(0.4, "Ape-X: per-worker epsilon_i = base^(1 + alpha*i/(N-1))", ge=0, le=1)
    apex_epsilon_alpha: float = F(7.0, "Ape-X: per-worker epsilon exponent alpha", ge=0)

    def validate(self, run_config: Any, n: str) -> List[str]:
        """The checks that relate several keys (:func:`flowkit.config.validate_section`)."""
        tb, size, shards = self.train_batch_size, self.buffer_size, self.num_replay_shards
        return config_checks([
            (tb > size, f"{n}.train_batch_size={tb} is larger than {n}.buffer_size={size}"),
            (shards > 0 and size // shards < tb, f"{n}.buffer_size={size} split over {n}.num_replay_shards="
                                                        f"{shards} leaves fewer than {n}.train_batch_size={tb} "
                                                        f"{self.ROWS} per shard"),
        ])


@dataclass
class R2D2Config(DQNConfig):
    """r2d2: Recurrent Replay Distributed DQN (Kapturowski et al. 2019): an LSTM Q-network trained on replayed sequences with burn-in."""
    ROWS = "sequences"
    seq_len: int = F(80, "env steps per stored sequence, burn_in included (padded after an episode's end)", gt=1,
                     le=100_000)
    burn_in: int = F(40, "first steps of each sequence that only warm the recurrent state up from the stored one "
                         "(no loss, no gradient)", ge=0)
    seq_stride: Optional[int] = F(None, "env steps between the starts of two sequences of an episode (null: "
                                        "seq_len - burn_in: every step after an episode's first burn_in is trained "
                                        "on once; the paper's sequences overlap by 40)", gt=0)
    value_rescaling: bool = F(True, "targets through h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x and its inverse "
                                    "(false: plain n-step double-Q targets)")
    value_rescale_eps: float = F(1e-3, "eps of the value rescaling h", gt=0)
    priority_eta: float = F(0.9, "sequence priority eta max|td| + (1 - eta) mean|td| over its trained steps",
                            ge=0, le=1)
    # DQN keys whose meaning or default differs for sequences (the paper's values where they apply)
    lr: float = F(1e-4, "Adam learning rate", gt=0)
    adam_eps: float = F(1e-3, "Adam epsilon", gt=0)
    gamma: float = F(0.997, "discount factor", ge=0, le=1)
    n_step: int = F(5, "n-step returns inside each sequence (cut at its last real step)", gt=0)
    train_batch_size: int = F(64, "replayed sequences per gradient step", gt=0, le=MAX_BATCH_ROWS)
    buffer_size: int = F(10_000, "replay capacity in sequences (per policy; split over shards in Ape-X mode)", gt=0)
    training_intensity: Optional[float] = F(None, "sequence steps replayed (burn-in and padding included) per env "
                                                  "step sampled (null: one gradient step per sampling round)", gt=0)
    target_network_update_freq: int = F(2500, "gradient steps between target-network updates", gt=0)
    prioritized_replay: Optional[bool] = F(True, "prioritized replay of sequences by priority_eta's max/mean "
                                                 "mix (null: on in Ape-X mode, off otherwise)")
    prioritized_replay_alpha: float = F(0.9, "priority exponent alpha (0: uniform)", ge=0)
    prioritized_replay_beta: float = F(0.6, "importance-weight exponent beta (1: full correction)", ge=0, le=1)

    def validate(self, run_config: Any, n: str) -> List[str]:
        """DQN's checks (in sequences), then ``burn_in < seq_len`` and ``seq_stride <= seq_len``;
        a warning when ``seq_stride`` leaves steps that no sequence trains on."""
        stride, seq, burn = self.seq_stride, self.seq_len, self.burn_in
        return super().validate(run_config, n) + config_checks([
            (burn >= seq, f"{n}.burn_in={burn} must be smaller than {n}.seq_len={seq}: no step of a sequence would "
                          "be trained on"),
            (stride is not None and stride > seq, f"{n}.seq_stride={stride} must be at most {n}.seq_len={seq} (a "
                                                  "sequence starts where the previous one has not ended yet, or "
                                                  "right after it)"),
        ], warnings=[
            (stride is not None and stride > seq - burn, f"{n}.seq_stride={stride} is larger than {n}.seq_len - "
                                                         f"{n}.burn_in={seq - burn}: some steps of each episode are "
                                                         "never trained on"),
        ])


def sequence_stride(cfg: Any) -> int:
    """Env steps between the starts of two sequences of an episode: ``r2d2.seq_stride``, by
    default ``seq_len - burn_in`` (``cfg``: the section, a dataclass or its config view)."""
    return int(cfg.seq_stride) if cfg.seq_stride is not None else int(cfg.seq_len) - int(cfg.burn_in)


DQN_REF = flowkit.AlgorithmRef("dqn", DQNConfig, "flowkit_dqn.dqn:DQN", ("Discrete",), learner_group=True, normalize_obs=True)
R2D2_REF = flowkit.AlgorithmRef("r2d2", R2D2Config, "flowkit_dqn.r2d2:R2D2", ("Discrete",), recurrent=True,
                                normalize_obs_refusal=(
    "its replayed sequences and stored recurrent states are not normalised; use dqn, or a recurrent actor-critic "
    "(ppo, a2c, impala or appo with model.recurrent), which keep the statistics"))


@flowkit.hookimpl
def flowkit_add_algorithms():
    return [DQN_REF, R2D2_REF]
