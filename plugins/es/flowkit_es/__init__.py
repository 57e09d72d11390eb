"""flowkit-es: the ES and ARS algorithm plugin (entry point group ``flowkit``).

This module is the plugin's torch-free declaration (the config sections, their checks and the
algorithms' :class:`flowkit.AlgorithmRef`); the algorithms and their policies (torch) are in
:mod:`flowkit_es.es`, imported when a run uses them, the worker-side evaluation of
perturbations (numpy only) in :mod:`flowkit_es.evaluate`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

import flowkit
from flowkit.config import F, config_checks


@dataclass
class _PerturbationConfig:
    """The keys ES and ARS share: the noise table, the perturbations and their evaluation."""
    noise_size: int = F(25_000_000, "float32 entries of the shared noise table (N(0, 1), seeded; 100 MB at "
                                    "25M, put once in Ray's object store and read by index on the workers)", ge=1)
    noise_seed: Optional[int] = F(None, "seed of the noise table (null: derived from the run's seed)", ge=0)
    sigma: float = F(0.02, "perturbation scale: episodes run with theta +- sigma * eps", gt=0)
    eval_episodes: int = F(1, "episodes per worker per round with the unperturbed parameters: the run's "
                              "episode_return_mean (counted as env steps like the perturbed episodes)", ge=0)


@dataclass
class ESConfig(_PerturbationConfig):
    """es: Evolution Strategies (Salimans et al. 2017): antithetic pairs, centred ranks, Adam."""
    pairs_per_worker: int = F(8, "antithetic pairs (2 episodes each) each worker evaluates per round", ge=1)
    lr: float = F(0.01, "Adam step size on the flat parameter vector", gt=0)
    l2_coeff: float = F(0.005, "L2 coefficient (weight decay added to the negated gradient estimate)", ge=0)
    normalize_observations: bool = F(False, "running mean/std observation normalisation (workers' statistics "
                                            "merged after each round); the same switch as model.normalize_obs "
                                            "(either key turns it on; neither alone turns it off)")

    def validate(self, run_config: Any, n: str) -> List[str]:
        """The network's activation has a numpy form (the workers evaluate the MLP in numpy)."""
        act = str(run_config.model.activation)
        return config_checks([(act not in ("tanh", "relu"), f"model.activation={act!r}: {n} evaluates its MLP in "
                                                            "numpy on the workers; use tanh or relu")])


@dataclass
class ARSConfig(_PerturbationConfig):
    """ars: Augmented Random Search V2-t (Mania et al. 2018): linear policy, top-b directions."""
    sigma: float = F(0.03, "perturbation scale nu: episodes run with M +- nu * delta", gt=0)
    directions_per_worker: int = F(8, "directions delta (2 episodes each) each worker evaluates per round", ge=1)
    top_directions: Optional[int] = F(None, "b: the directions with the best max(r+, r-) used in the update "
                                            "(null: all of them, ARS V2)", ge=1)
    step_size: float = F(0.02, "alpha: M += alpha / (b * sigma_R) * sum (r+ - r-) delta", gt=0)
    normalize_observations: bool = F(True, "state normalisation (V2): running mean/std of the states of all "
                                           "perturbed episodes, merged from the workers after each round; the "
                                           "same switch as model.normalize_obs (either key turns it on: "
                                           "false with model.normalize_obs=true is a config error)")

    def validate(self, run_config: Any, n: str) -> List[str]:
        """``top_directions`` fits in one round's directions."""
        total, top = max(1, int(run_config.runtime.num_workers)) * self.directions_per_worker, self.top_directions
        return config_checks([(top is not None and top > total, f"{n}.top_directions={top} is more than the directions "
                                                                f"of one round (runtime.num_workers x "
                                                                f"{n}.directions_per_worker = {total})")])


ES_REF = flowkit.AlgorithmRef("es", ESConfig, "flowkit_es.es:ES", normalize_obs="normalize_observations")
ARS_REF = flowkit.AlgorithmRef("ars", ARSConfig, "flowkit_es.es:ARS", normalize_obs="normalize_observations")


@flowkit.hookimpl
def flowkit_add_algorithms():
    return [ES_REF, ARS_REF]
