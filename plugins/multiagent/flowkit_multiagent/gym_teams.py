"""Gymnasium envs of several agents in one Tuple -- Level-Based Foraging (``lbforaging``) and
the multi-robot warehouse (``rware``), the EPyMARL benchmark's (Papoudakis et al. 2021,
"Benchmarking Multi-Agent Deep Reinforcement Learning Algorithms in Cooperative Tasks",
NeurIPS Datasets and Benchmarks) -- as PettingZoo ParallelEnvs::

    flowkit train env.factory=flowkit_multiagent.gym_teams:parallel_env \\
        env.kwargs.env_id=Foraging-8x8-2p-2f-coop-v3
    flowkit train env.factory=flowkit_multiagent.gym_teams:parallel_env env.kwargs.env_id=rware-tiny-2ag-v2

Such an env has ``observation_space = Tuple(per agent)`` and ``action_space = Tuple(per
agent)``, takes a tuple of actions and returns a tuple of observations and a list of per-agent
rewards. Agent ``i`` is ``agent_<i>``; the episode ends for every agent together.

Both packages report their time limit as ``terminated`` (``done``); here it is a truncation,
so that it bootstraps: Level-Based Foraging terminates when no food is left (its
``field`` is empty) and is truncated at its ``max_episode_steps`` (50 in the registered ids);
the warehouse never terminates (its episodes end at ``max_steps``, 500, or after
``max_inactivity_steps``: truncations). Other Tuple envs keep their own flags.
"""
from __future__ import annotations

import contextlib
import difflib
import importlib
from typing import Any, Dict, List, Optional, Tuple

import gymnasium as gym
import numpy as np
from pettingzoo.utils.env import ParallelEnv

PACKAGES = ("lbforaging", "rware")  # imported to register their ids with Gymnasium


def parallel_env(env_id: str, context: Any = None, **kwargs: Any) -> "TupleAgentsEnv":
    """The env factory (``env.factory=flowkit_multiagent.gym_teams:parallel_env``): Gymnasium
    id ``env_id`` (``env.kwargs.env_id``; its other ``env.kwargs`` go to ``gym.make``) as a
    :class:`TupleAgentsEnv`.

    Raises:
        ValueError: ``env_id`` in the ``module:Id`` form (a run folder's ``env.kwargs`` must
            not import code), an id no installed package registers, or an env whose spaces are
            not Tuples of one space per agent (naming ``env.kwargs.env_id``).
    """
    if ":" in str(env_id):
        raise ValueError(f"env.kwargs.env_id={env_id!r}: give a registered id without `module:` "
                         f"({', '.join(PACKAGES)} are imported here to register theirs)")
    for pkg in PACKAGES:
        with contextlib.suppress(ImportError):
            importlib.import_module(pkg)
    if str(env_id) not in gym.registry:
        close = difflib.get_close_matches(str(env_id), list(gym.registry), n=1)
        raise ValueError(f"env.kwargs.env_id={env_id!r} is not a registered Gymnasium id"
                         + (f"; did you mean {close[0]!r}?" if close else ""))
    env = gym.make(str(env_id), disable_env_checker=True, **kwargs)
    obs, act = env.observation_space, env.action_space
    if not (isinstance(obs, gym.spaces.Tuple) and isinstance(act, gym.spaces.Tuple) and len(obs) == len(act) > 0):
        env.close()
        raise ValueError(f"env.kwargs.env_id={env_id!r}: not an env of several agents (observation space {obs}, "
                         f"action space {act}; expected a Tuple of one space per agent in each)")
    return TupleAgentsEnv(env)


def _ends(env: gym.Env, done: bool, truncated: bool) -> Tuple[bool, bool]:
    """``(terminated, truncated)`` of a step whose env said ``done`` / ``truncated``: the
    packages' time limits as truncations (see the module docstring)."""
    u: Any = env.unwrapped
    module = type(u).__module__
    if module.startswith("lbforaging"):
        terminated = bool(done) and int(np.sum(u.field)) == 0
    elif module.startswith("rware"):
        terminated = False
    else:
        return bool(done), bool(truncated) and not bool(done)
    return terminated, (bool(done) or bool(truncated)) and not terminated


class TupleAgentsEnv(ParallelEnv):
    """A Gymnasium env of ``n`` agents in one Tuple (see the module docstring) as a PettingZoo
    ParallelEnv: agents ``agent_0 .. agent_<n-1>``, agent ``i``'s spaces the Tuples' item ``i``,
    its reward float ``rewards[i]``."""

    metadata = {"name": "gym_teams", "is_parallelizable": True}

    def __init__(self, env: gym.Env):
        self.env = env
        n = len(env.observation_space.spaces)  # type: ignore[attr-defined]
        self.possible_agents = [f"agent_{i}" for i in range(n)]
        self.observation_spaces = dict(zip(self.possible_agents, env.observation_space.spaces, strict=True))  # type: ignore[attr-defined]
        self.action_spaces = dict(zip(self.possible_agents, env.action_space.spaces, strict=True))  # type: ignore[attr-defined]
        self.agents: List[str] = []
        self.metadata = {**self.metadata, "name": env.spec.id if env.spec else type(env.unwrapped).__name__}

    def observation_space(self, agent: str) -> gym.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> gym.Space:
        return self.action_spaces[agent]

    def reset(self, seed: Optional[int] = None, options: Optional[Dict[str, Any]] = None):
        obs, _ = self.env.reset(seed=seed, options=options)
        self.agents = list(self.possible_agents)
        return dict(zip(self.agents, obs, strict=True)), {a: {} for a in self.agents}

    def step(self, actions: Dict[str, Any]):
        agents = self.agents
        obs, rew, done, trunc, _ = self.env.step(tuple(actions[a] for a in self.possible_agents))
        rewards: Any = rew  # one reward per agent
        te, tu = _ends(self.env, done, trunc)
        if te or tu:
            self.agents = []
        return (dict(zip(agents, obs, strict=True)), {a: float(r) for a, r in zip(agents, rewards, strict=True)},
                {a: te for a in agents}, {a: tu for a in agents}, {a: {} for a in agents})

    def close(self) -> None:
        self.env.close()
