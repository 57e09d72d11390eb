"""An algorithm: its torch-free declaration (:class:`AlgorithmRef`: name, config section,
spaces, recurrence, observation normalisation) and the Algorithm base class (Lightning style)
that takes it, adds a policy class and a rollout mode, and has one method that matters,
:meth:`Algorithm.training_flow`. This module imports no torch."""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Dict, Optional, Tuple, Type, Union

from flowkit.config import ConfigError, RandomConfig, action_space_error, model_error, section_object

if TYPE_CHECKING:
    from flowkit.core.context import RunContext
    from flowkit.core.flow import Flow
    from flowkit.core.learner import Learner


@dataclass(frozen=True)
class AlgorithmRef:
    """An algorithm's declaration, torch-free: what ``flowkit_add_algorithms`` returns, read
    before torch and Ray load (``flowkit plugins``, ``--help``, :func:`flowkit.config.check_run`),
    and what the class takes its declared attributes from (``class PPO(Algorithm, ref=PPO_REF)``:
    each is written once, here).

    Attributes:
        name: registry name and config section (``ppo`` -> ``ppo.*``).
        config_class: the section's dataclass (torch-free; its docstring is the algorithm's
            description). Its ``validate(self, run_config, name) -> warnings`` method, where it
            has one, holds the checks that relate several keys (:func:`flowkit.config.validate_section`).
        target: where the class is, ``"flowkit_ppo.ppo:PPO"``, imported when a run needs it.
        action_spaces: the Gymnasium action space classes it acts in, by name (``("Discrete",)``;
            empty: any).
        recurrent: its policies train recurrent networks (``model.recurrent``).
        normalize_obs: what it does with ``model.normalize_obs``: True: honoured; the name of a
            key of its own section that is the same switch (``"normalize_observations"``); False:
            refused, with ``normalize_obs_refusal`` (why, and what to use instead).
        normalize_obs_refusal: the reason given when ``model.normalize_obs=true`` is refused.
        learner_group: its plan trains through ``TrainOneStep`` on a learner whose policies'
            losses are per-row means and draw per-row noise only through ``Policy.randn``, so
            ``learner.num_learners`` > 0 (a :class:`~flowkit.core.learner.LearnerGroup`) gives
            one learner's update; False: the key is refused for it.
    """
    name: str
    config_class: Optional[type]
    target: str
    action_spaces: Tuple[str, ...] = ()
    recurrent: bool = False
    normalize_obs: Union[bool, str] = False
    normalize_obs_refusal: str = ""
    learner_group: bool = False

    def load(self) -> Type["Algorithm"]:
        """Import the class (what the plugin manager does on the first lookup of ``name``).

        Raises:
            ImportError: the target does not import, or is not the algorithm declared here
                (naming the target).
        """
        mod, _, attr = self.target.partition(":")
        try:
            cls = getattr(importlib.import_module(mod), attr)
        except Exception as e:
            raise ImportError(f"{self.target} failed to import: {type(e).__name__}: {e}") from e
        if getattr(cls, "name", None) != self.name:
            raise ImportError(f"{self.target} is named {getattr(cls, 'name', None)!r}, not {self.name!r}; declare it "
                              f"with `class {attr}(flowkit.Algorithm, ref=<its AlgorithmRef>)`")
        return cls


class Algorithm:
    """Base class of every algorithm plugin.

    Attributes:
        name, config_class, action_spaces, recurrent, normalize_obs, normalize_obs_refusal, learner_group:
            what the algorithm declares, as :class:`flowkit.AlgorithmRef` describes them; a
            plugin writes them once, in its torch-free ``AlgorithmRef``, and the class takes
            them from it (``class PPO(Algorithm, ref=PPO_REF)``); a class registered as it is
            (a variant, a test's algorithm) sets them as class attributes.
        policy_class: the :class:`flowkit.Policy` subclass it trains.
        rollout_mode: ``bulk_sync`` (experiences are MultiAgentBatches), ``async``
            (experiences are ``(source_actor, MultiAgentBatch)``) or ``async_gradients``
            (as ``async``, the batches without rows and with the gradients the worker
            computed in ``meta["gradients"]``: A3C; see ``ParallelRollouts``).
        consumes_rollouts: False for an algorithm whose plan takes no rollout fragments
            (ES, ARS, DD-PPO, MAML: its source is :func:`flowkit.core.ops.WorkerRounds`): the
            engine then builds no rollout stream and passes ``experiences=None``.
        off_policy: True if it can learn from stale samples (turns ``runtime.prefetch`` on
            by default when every algorithm of the run is off-policy).

    Instances hold ``config`` (their own section as an instance of ``config_class``) and
    ``run_config`` (the whole config). ``training_flow`` must not report metrics or read other
    policies' data; the engine wraps it.

    ``MyAlgo.from_checkpoint(path)`` (a class method) rebuilds a trained algorithm, policies
    with their weights, from a checkpoint folder, a run folder (its latest checkpoint) or a
    ``state.pt`` file, and starts no worker; it raises FileNotFoundError when there is no
    checkpoint at ``path``. (flowkit/__init__.py adds it: checkpoints are read by
    ``flowkit.checkpoint.load_trained``, a layer above core.)
    """

    name: str = ""
    config_class: Optional[type] = None
    policy_class: Optional[type] = None
    rollout_mode: str = "bulk_sync"
    consumes_rollouts: bool = True
    off_policy: bool = False
    action_spaces: Tuple[str, ...] = ()
    recurrent: bool = False
    normalize_obs: Union[bool, str] = False
    normalize_obs_refusal: str = ""
    learner_group: bool = False
    from_checkpoint: ClassVar[Callable[..., "Algorithm"]]

    def __init_subclass__(cls, ref: Any = None, **kwargs: Any) -> None:
        """``class PPO(Algorithm, ref=PPO_REF)``: every field of the declaration ``ref`` (a
        :class:`flowkit.AlgorithmRef`) but its ``target`` becomes a class attribute."""
        super().__init_subclass__(**kwargs)
        for f in dataclasses.fields(ref) if ref is not None else ():
            if f.name != "target":
                setattr(cls, f.name, getattr(ref, f.name))

    def __init__(self, run_config: Any, config: Any = None):
        self.run_config: Any = run_config
        self.config: Any = config if config is not None else section_object(run_config, self.name, self.config_class)
        self.policies: Dict[str, Any] = {}

    @classmethod
    def check_spaces(cls, policy_id: str, observation_space: Any, action_space: Any) -> None:
        """Raise ConfigError if this algorithm cannot handle the spaces of ``policy_id``: here,
        an action space not in :attr:`action_spaces`; subclasses add their own conditions."""
        if why := action_space_error(cls, policy_id, action_space):
            raise ConfigError(why)

    @classmethod
    def check_model(cls, policy_id: str, model_config: Any, section: Any = None) -> None:
        """Raise ConfigError if this algorithm cannot train ``policy_id``'s network as
        ``model_config`` (its ``model.*``) describes: ``model.recurrent`` without
        :attr:`recurrent`; ``model.normalize_obs=true`` without :attr:`normalize_obs`, or
        contradicted by the algorithm's own key (``section``: its section, None: defaults;
        :func:`flowkit.config.model_error`)."""
        if why := model_error(cls, policy_id, model_config, section):
            raise ConfigError(why)

    def only_policy(self, ctx: "RunContext", learner: "Learner") -> str:
        """The id of the one policy ``learner`` trains, for plans that drive a single-agent env's
        only policy themselves (ES, ARS, DD-PPO, MAML).

        Raises:
            ConfigError: the run has several policies, naming them.
        """
        pids = list(learner.policies)
        if len(pids) != 1 or len(ctx.policy_specs) != 1:
            raise ConfigError(f"{self.name} trains the one policy of a single-agent env; this run has policies "
                              f"{sorted(ctx.policy_specs)}")
        return pids[0]

    def get_rollout_mode(self) -> str:
        """``bulk_sync`` or ``async`` for this instance (a config key may override the class
        attribute, e.g. ``impala.rollout_mode``)."""
        return self.rollout_mode

    def training_flow(self, experiences: Optional["Flow"], ctx: "RunContext", learner: "Learner") -> "Flow":
        """From this algorithm's experiences to train steps (one item per train step).

        Args:
            experiences: a Flow of MultiAgentBatch (bulk_sync) or of (actor, MultiAgentBatch)
                (async, async_gradients), already restricted to this algorithm's policies;
                None when :attr:`consumes_rollouts` is False.
            ctx: the RunContext (``ctx.workers``, ``ctx.counters``, ``ctx.add_stateful``).
            learner: the Learner of these policies (train through ``TrainOneStep``, send
                weights through ``SyncWeights``); name stateful parts after ``learner.name``
                so two groups of one algorithm keep separate state.

        An off-policy algorithm that replays takes ``mix=None`` too (a
        :class:`~flowkit.core.replay.ReplayMix`: rows of a second source in every replayed batch,
        the offline plugin's ``input.mix``) and passes it to :func:`~flowkit.core.ops.ReplayPlan`.
        """
        raise NotImplementedError

    def worker_exploration_state(self, policy_id: str, state: Dict[str, Any], worker_index: int,
                                 num_workers: int) -> Dict[str, Any]:
        """The exploration state a new rollout worker ``worker_index`` (of ``num_workers``) gets
        for ``policy_id`` before its first sample (at start, rebuilt, resumed), from ``state``,
        the driver policy's :meth:`~flowkit.core.Policy.exploration_state`. Default: ``state``
        (Ape-X gives each worker its own epsilon)."""
        return state

    def get_state(self) -> Dict[str, Any]:
        """Algorithm-level state for checkpoints, as plain data (policies, learners and
        replay buffers are saved on their own). None by default."""
        return {}

    def set_state(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`get_state` returned (nothing to restore by default)."""

    def get_policy(self, policy_id: Optional[str] = None) -> Any:
        """The policy ``policy_id``, or the only one.

        Raises:
            KeyError: no such policy, or no ``policy_id`` given and there are several.
        """
        if policy_id is None:
            if len(self.policies) != 1:
                raise KeyError(f"several policies {sorted(self.policies)}: name one")
            return next(iter(self.policies.values()))
        return self.policies[policy_id]

    def compute_actions(self, obs: Any, explore: bool = False, policy_id: Optional[str] = None) -> Any:
        """Env-ready actions for raw observations (see :meth:`Policy.compute_actions`)."""
        return self.get_policy(policy_id).compute_actions(obs, explore=explore)


#: the built-in ``random`` algorithm (flowkit.core.ops.RandomAlgorithm), registered by flowkit.builtin
RANDOM = AlgorithmRef("random", RandomConfig, "flowkit.core.ops:RandomAlgorithm", normalize_obs_refusal=(
    "it has no network and keeps no observation statistics; in a multi-agent run set "
    "multiagent.policies.<id>.model.normalize_obs=false for its policies"))
