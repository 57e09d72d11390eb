"""The Algorithm base class (Lightning style): a name, a config dataclass, a policy class,
a rollout mode and one method that matters, :meth:`Algorithm.training_flow`."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ClassVar, Dict, List, Optional, Tuple, Union

from flowkit.config import ConfigError, action_space_error, check_schedules, normalize_obs_error, recurrent_error

if TYPE_CHECKING:
    from flowkit.core.context import RunContext
    from flowkit.core.flow import Flow
    from flowkit.core.learner import Learner


class Algorithm:
    """Base class of every algorithm plugin.

    Attributes:
        name: registry name and config section (``ppo`` -> ``ppo.*``).
        config_class: dataclass of the section (a docstring per field).
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
        action_spaces: the Gymnasium action space classes it acts in, by name (``("Discrete",)``;
            empty: any), checked at set-up by :meth:`check_spaces`; declare the same tuple on
            the plugin's :class:`flowkit.AlgorithmRef` so the CLI checks it before Ray starts.
        recurrent: its policies train recurrent networks (``model.recurrent``, or a recurrent
            ``model.class``): their batches carry ``state_in`` and the losses run over whole
            sequences (:meth:`flowkit.Policy.model_forward`); checked by :meth:`check_model`
            (declare the same on the :class:`flowkit.AlgorithmRef`).
        normalize_obs: what it does with ``model.normalize_obs``: True: its policies keep
            running observation statistics in their model (updated on the learner, sent with
            the weights, in checkpoints, applied when acting and by export); the name of a key
            of its own section that is the same switch (PPO's ``"normalize_observations"``:
            either key turns normalisation on, :func:`flowkit.config.normalize_obs_on`; that key
            given false where its default is true, with ``model.normalize_obs=true``, is
            refused); False (the default): ``model.normalize_obs=true`` is refused, with
            :attr:`normalize_obs_refusal` (why, and what to use instead). Checked by
            :meth:`check_model`; declare the same on the :class:`flowkit.AlgorithmRef`.
        normalize_obs_refusal: the reason given when ``model.normalize_obs=true`` is refused.

    Instances hold ``config`` (a read-only, struct-mode view of their own section: reading an
    undeclared key raises) and ``run_config`` (the whole config). ``training_flow`` must not
    report metrics or read other policies' data; the engine wraps it.

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
    from_checkpoint: ClassVar[Callable[..., "Algorithm"]]

    def __init__(self, run_config: Any, config: Any = None):
        from flowkit.config import section_view
        self.run_config: Any = run_config
        self.config: Any = config if config is not None else (
            section_view(run_config, self.name) if self.name in run_config else None)
        self.policies: Dict[str, Any] = {}

    @classmethod
    def validate_config(cls, run_config: Any, section: Any) -> List[str]:
        """Check what relates several keys of this algorithm's section (and its fit with
        ``runtime.*``) before anything starts; each key's own range or choices belong in its
        field declaration (``F(3e-4, "...", gt=0)``), checked before this is called. Raise
        :class:`flowkit.ConfigError` naming keys and values; return warnings. Default: the
        linear schedules' horizon (:func:`flowkit.config.check_schedules`), the config
        class's own ``validate(section, run_config, name)`` where it has one (torch-free, so
        the CLI runs it before torch loads), and a warning when the section's
        ``learning_starts`` is not below ``stop.env_steps`` (the run stops in the replay
        warm-up, untrained)."""
        if section is None:
            return []
        check_schedules(section, cls.name, run_config)
        check = getattr(cls.config_class, "validate", None)
        out = list((check(section, run_config, cls.name) or []) if check is not None else [])
        starts, budget = section.get("learning_starts"), run_config.stop.env_steps
        if starts is not None and budget is not None and starts >= budget:
            out.append(f"{cls.name}.learning_starts={starts} >= stop.env_steps={budget}: the run stops in the "
                       "replay warm-up and trains nothing")
        return out

    @classmethod
    def check_spaces(cls, policy_id: str, observation_space: Any, action_space: Any) -> None:
        """Raise ConfigError if this algorithm cannot handle the spaces of ``policy_id``: here,
        an action space not in :attr:`action_spaces`; subclasses add their own conditions."""
        why = action_space_error(cls.name, cls.action_spaces, policy_id, action_space)
        if why:
            raise ConfigError(why)

    @classmethod
    def check_model(cls, policy_id: str, model_config: Any, section: Any = None) -> None:
        """Raise ConfigError if this algorithm cannot train ``policy_id``'s network as
        ``model_config`` (its ``model.*``) describes: ``model.recurrent`` without
        :attr:`recurrent`; ``model.normalize_obs=true`` without :attr:`normalize_obs`, or
        contradicted by the algorithm's own key (``section``: its section, None: defaults;
        :func:`flowkit.config.normalize_obs_error`)."""
        why = recurrent_error(cls.name, cls.recurrent, policy_id, model_config) or normalize_obs_error(
            cls.name, cls.normalize_obs, policy_id, model_config, section, cls.config_class, cls.normalize_obs_refusal)
        if why:
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
