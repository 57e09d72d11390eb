"""Env runners for PettingZoo games: :class:`ParallelEnvRunner` (simultaneous moves) and
:class:`AECEnvRunner` (turn-based, action masks).

Both step ``runtime.num_envs_per_worker`` sub-envs, make one batched policy call per policy per
step (the acting agents of every sub-env together), and return a :class:`MultiAgentBatch`
keyed by policy id holding whole or cut trajectory pieces of each agent (rows of one agent's
piece contiguous and in time order).

Counting (as for GymEnvRunner): a fragment is exactly ``runtime.rollout_fragment_length`` real env steps
per sub-env. A Parallel env step is one ``step(actions)`` call; an AEC env step is one
``step(action)`` of the agent on move (the "dead" ``step(None)`` calls that remove finished
agents are not transitions). ``agent_steps`` count one per acting agent, so for AEC games
``agent_steps == env_steps``.

Rewards (the AEC attribution rule): an agent's transition ``(obs_t, a_t) -> next_obs`` is
complete when the agent is on move again or is finished; its reward is everything it received
since it acted: ``env.last()``'s cumulative reward, which includes rewards that arrived while
other agents moved and the final reward at game end. Rewards an agent gets before its first
action count in its episode return but belong to no transition. ``next_obs`` is the agent's
own next observation (at its next turn, or its final one); a trajectory cut at a fragment
boundary bootstraps from it. In an AEC game a transition whose next turn has not come yet at
the fragment boundary is carried into the next fragment, never lost or duplicated (tests/test_multiagent.py::test_c03_*).

Batch columns are GymEnvRunner's plus ``agent_index`` (the agent's index in
``possible_agents``). A recurrent policy keeps one state per agent per episode (from its initial
state at the agent's first action), so recurrent and feed-forward policies mix. ``eps_id`` identifies one agent's trajectory in one episode:
``episode_id * len(possible_agents) + agent_index``, so that every consumer that splits
trajectories where ``eps_id`` changes (GAE, V-trace, n-step) never joins two agents' pieces.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import concatenate, create_empty_array

from flowkit.core import EnvError, Episode, RecurrentStates, describe_value, env_name, find_mismatch
from flowkit.core import batch as sb
from flowkit_multiagent.centralized import (
    CRITIC_OBS,
    NEXT_CRITIC_OBS,
    add_agent_id,
    agent_id_policies,
    critic_inputs,
    policy_members,
)
from flowkit_multiagent.specs import build_mapping, eval_opponents


def stack_raw(space: gym.Space, xs: Sequence[Any]) -> Any:
    """Stack single raw observations into the batched form ObsEncoder takes (arrays of the
    space's dtypes)."""
    out: Any = create_empty_array(space, len(xs))  # None only for spaces ObsEncoder refuses
    return concatenate(space, xs, out)


_Enc = Tuple[np.ndarray, Optional[np.ndarray]]  # (encoded observation row, action-mask row or None)


class _Traj:
    """One agent in one episode of one sub-env: complete rows not yet emitted, the pending
    transition (acted, waiting for its reward and next observation), and its return."""

    __slots__ = ("agent", "policy_id", "agent_index", "episode", "rows", "pending", "acc", "t", "ret",
                 "done", "last_enc", "state", "critic")

    def __init__(self, agent: str, policy_id: str, agent_index: int, episode: Episode):
        self.agent, self.policy_id, self.agent_index, self.episode = agent, policy_id, agent_index, episode
        self.rows: List[tuple] = []
        self.pending: Optional[tuple] = None   # (obs_enc, mask, action, extras, t)
        self.acc = 0.0                          # reward received since the pending action
        self.t = 0                              # transitions made so far
        self.ret, self.done = 0.0, False
        self.last_enc: Optional[_Enc] = None    # the newest observation
        self.state: Optional[np.ndarray] = None  # a recurrent policy's state (None: its initial state)
        self.critic: Optional[np.ndarray] = None  # the newest centralized value input (critic_obs), if its policy has one

    def complete(self, terminated: bool, truncated: bool, next_enc: np.ndarray, next_mask: Optional[np.ndarray],
                 next_critic: Optional[np.ndarray] = None):
        if self.pending is None:
            return
        o, m, a, ex, t = self.pending
        if CRITIC_OBS in ex:
            ex = {**ex, NEXT_CRITIC_OBS: ex[CRITIC_OBS] if next_critic is None else next_critic}
        self.rows.append((o, m, a, ex, self.acc, terminated, truncated and not terminated, next_enc, next_mask, t))
        self.pending, self.acc = None, 0.0


class _Slot:
    """One sub-env and its current episode (``episode`` is set by the first reset)."""

    __slots__ = ("j", "env", "ctx", "episode", "trajs", "rotation", "episodes_started", "checks_left", "quota",
                 "need_reset")

    def __init__(self, j, env, ctx, checks):
        self.j, self.env, self.ctx = j, env, ctx
        self.episode: Episode
        self.trajs: Dict[str, _Traj] = {}
        self.rotation = self.episodes_started = 0
        self.checks_left, self.need_reset = checks, True
        self.quota: Optional[int] = None

    @property
    def open(self) -> bool:
        """Whether this slot still has episodes to run (evaluation gives each a quota)."""
        return self.quota is None or self.quota > 0

    def tick(self) -> None:
        """One env step done."""
        self.episode.length += 1
        self.checks_left = max(0, self.checks_left - 1)


class RunnerBase:
    """What every runner of this plugin (these and :class:`~flowkit_multiagent.vmas.VmasRunner`)
    sets up from the worker and its sub-envs ``envs``: the agent -> policy mapping, the agent ids
    and centralized value inputs of CTDE (:mod:`flowkit_multiagent.centralized`), the cache of
    evaluation opponents; and the batch they return."""

    def __init__(self, worker: Any, envs: List[Any]):
        self.worker, self.config, self.n, self.policies = worker, worker.config, len(envs), worker.policies
        self.name, self.T = env_name(self.config.env), int(self.config.runtime.rollout_fragment_length)
        self.possible_agents = list(envs[0].possible_agents)
        self.obs_spaces = {a: envs[0].observation_space(a) for a in self.possible_agents}
        self.mapping = build_mapping(self.config, self.possible_agents)
        self.with_id = agent_id_policies(self.config, policy_members(self.mapping, self.possible_agents))
        self.critics = critic_inputs(self.config, self.policies, envs[0], self.mapping, self.possible_agents)
        self._opponents: Dict[str, Any] = {}
        self._eval = False

    def _eval_policies(self) -> Dict[str, Any]:
        """The policies evaluation acts with: those of ``multiagent.eval_opponents`` replaced by
        fixed ones (:func:`~flowkit_multiagent.specs.eval_opponents`, built once)."""
        if not self._opponents:
            self._opponents = eval_opponents(self.config, self.policies, self.worker.pm.algorithms(),
                                             self.worker.index + 7919)
        return {**self.policies, **self._opponents}

    def _batch(self, batches: Dict[str, sb.SampleBatch], finished: List[Dict[str, Any]],
               agent_steps: int) -> sb.MultiAgentBatch:
        return sb.MultiAgentBatch(batches, env_steps=self.n * self.T, agent_steps=agent_steps, episodes=finished,
                                  worker_index=self.worker.index, meta={"weights_version": self.worker.weights_version})


class _MultiAgentRunner(RunnerBase):
    """Shared machinery of the PettingZoo runners (see module docstring)."""

    turn_based = False

    def __init__(self, worker: Any, envs: List[Any]):
        super().__init__(worker, envs)
        self.envs, self.agent_index = envs, {a: i for i, a in enumerate(self.possible_agents)}
        self.alternate = bool(self.config.multiagent.alternate_seats)
        self.check_steps = int(self.config.env.check_spaces_steps)
        self._state: Optional[List[_Slot]] = None
        self._acting = self.policies       # policy id -> Policy used to act (evaluation swaps some)
        self._explore = True

    # ---- helpers ----------------------------------------------------------------------------
    def _new_slots(self) -> List[_Slot]:
        return [_Slot(j, e, c, self.check_steps) for j, (e, c) in
                enumerate(zip(self.envs, self.worker.sub_env_contexts, strict=False))]

    def _check_agent(self, slot: _Slot, agent: str) -> None:
        if agent not in self.agent_index:
            raise EnvError(f"env {self.name!r} (worker {self.worker.index}, sub-env {slot.j}): agent "
                           f"{agent!r} is not in possible_agents {self.possible_agents}")

    def _fail(self, slot: _Slot, what: str, agent: str, m: Tuple[str, str, str]):
        raise EnvError(f"env {self.name!r} (worker {self.worker.index}, sub-env {slot.j}) returned a bad "
                       f"{what} for agent {agent!r}: at `{m[0]}` expected {m[1]}, received {m[2]}")

    def _check_obs(self, slot: _Slot, agent: str, obs: Any, what: str):
        if slot.checks_left > 0:
            self._check_agent(slot, agent)
            m = find_mismatch(slot.env.observation_space(agent), obs, f"obs[{agent}]")
            if m:
                self._fail(slot, f"observation from {what}", agent, m)

    def _check_reward(self, slot: _Slot, agent: str, r: Any):
        if slot.checks_left > 0 and (np.ndim(r) != 0 or not np.isfinite(float(np.asarray(r)))):
            self._fail(slot, "reward", agent, (f"reward[{agent}]", "a finite float scalar", describe_value(np.asarray(r))))

    def _start_episode(self, slot: _Slot) -> Any:
        """Reset the sub-env (its seed on the first reset) and start an episode; returns the reset's output."""
        out = slot.env.reset(seed=slot.ctx.seed if slot.episodes_started == 0 else None)
        slot.episode = Episode(next(self.worker.episode_ids), slot.j, self.worker.index)
        slot.trajs, slot.rotation, slot.need_reset = {}, slot.episodes_started + slot.j, False
        slot.episodes_started += 1
        return out

    def _traj(self, slot: _Slot, agent: str) -> _Traj:
        tr = slot.trajs.get(agent)
        if tr is None:
            self._check_agent(slot, agent)
            alternate = bool(self.config.multiagent.eval_alternate_seats) if self._eval else self.alternate
            pid = self.mapping.policy_for(agent, slot.rotation, alternate,
                                          None if self._eval else slot.episode.episode_id)
            tr = slot.trajs[agent] = _Traj(agent, pid, self.agent_index[agent], slot.episode)
        return tr

    def _credit(self, slot: _Slot, agent: str, r: Any) -> _Traj:
        """Check ``agent``'s reward and add it to its return and, while it waits for its next
        observation, to the pending transition's reward. Returns its trajectory."""
        self._check_reward(slot, agent, r)
        tr = self._traj(slot, agent)
        tr.ret += float(r)
        if tr.pending is not None:
            tr.acc += float(r)
        return tr

    def _encode(self, pid: str, raws: List[Any], agents: Sequence[str]) -> _Enc:
        """The raw observations of ``agents`` (acting as policy ``pid``) encoded, the agent id added
        for a policy with ``multiagent.obs_agent_id``."""
        pol = self.policies[pid]
        if pid in self.with_id:
            raws = [add_agent_id(self.obs_spaces[a], o, self.agent_index[a]) for a, o in zip(agents, raws, strict=True)]
        return pol.encoder(stack_raw(pol.observation_space, raws), len(raws))

    def _critic_rows(self, slot: _Slot, trajs: Sequence[_Traj], observe: Any) -> None:
        """Set ``critic`` of every traj in ``trajs`` whose policy has a centralized value input,
        from ``slot``'s env now (``observe(agent)``: its current raw observation or None)."""
        if self._eval:  # evaluation acts only: no critic
            return
        bases: Dict[int, np.ndarray] = {}  # one base per CriticInput and moment
        for tr in trajs:
            ci = self.critics.get(tr.policy_id)
            if ci is not None:
                if id(ci) not in bases:
                    bases[id(ci)] = ci.base(slot.env.state, observe)
                tr.critic = ci.row(bases[id(ci)], tr.agent_index)

    def _act(self, requests: List[Tuple[_Traj, np.ndarray, Optional[np.ndarray]]]) -> List[Any]:
        """One batched policy call per policy; sets each traj's pending transition and returns
        the env actions in request order."""
        out: List[Any] = [None] * len(requests)
        by_pid: Dict[str, List[int]] = {}
        for i, (tr, _, _) in enumerate(requests):
            by_pid.setdefault(tr.policy_id, []).append(i)
        for pid, idx in by_pid.items():
            pol, trs = self._acting[pid], [requests[i][0] for i in idx]
            obs = np.stack([requests[i][1] for i in idx])
            masks = [requests[i][2] for i in idx]  # all None or all arrays: one policy, one space
            mask = None if masks[0] is None else np.stack([m for m in masks if m is not None])
            states = RecurrentStates.of(pol, len(idx))
            if states is None:
                actions, extras = pol.compute_actions_encoded(obs, mask, self._explore)
            else:  # a recurrent policy: each agent's own state, from the initial one at its episode's start
                states.state = np.stack([s if tr.state is None else tr.state for tr, s in zip(trs, states.state)])
                actions, extras = states.act(obs, mask, self._explore)
                for tr, s in zip(trs, states.state):
                    tr.state = s
            env_actions = pol.dist.to_env(actions)
            if pol.dist.kind == "cat":
                env_actions = env_actions.tolist()
            for k, (i, tr) in enumerate(zip(idx, trs)):
                ex = {key: v[k] for key, v in extras.items()}
                if tr.critic is not None:
                    ex[CRITIC_OBS] = tr.critic
                tr.pending = (obs[k], None if mask is None else mask[k], actions[k], ex, tr.t)
                tr.acc, tr.t, out[i] = 0.0, tr.t + 1, env_actions[k]
        return out

    def _end_episode(self, slot: _Slot, finished: List[Dict[str, Any]], done_trajs: List[_Traj]):
        ep = slot.episode
        for tr in slot.trajs.values():
            ep.agent_rewards[(tr.agent, tr.policy_id)] = tr.ret
            tr.done = True
            if tr.rows:
                done_trajs.append(tr)
        ep.total_reward = float(sum(tr.ret for tr in slot.trajs.values()))
        ep.terminated = any(t.rows and t.rows[-1][5] for t in slot.trajs.values())
        ep.truncated = not ep.terminated
        if not self._eval and self.worker.pm.hook.flowkit_on_episode_end.get_hookimpls():
            self.worker.pm.hook.flowkit_on_episode_end(episode=ep, worker=self.worker)
        s = ep.summary()
        if self._eval:
            s["eval_metrics"] = self._outcomes(slot)
        finished.append(s)
        slot.need_reset = True
        if slot.quota is not None:
            slot.quota -= 1

    def _outcomes(self, slot: _Slot) -> Dict[str, float]:
        """Win / draw / loss of each learning policy in a turn-based game: the side with the
        higher return wins; equal returns are a draw."""
        out: Dict[str, float] = {}
        best: Dict[str, float] = {}
        for tr in slot.trajs.values() if self.turn_based else ():
            best[tr.policy_id] = max(best.get(tr.policy_id, -np.inf), tr.ret)
        for pid, r in best.items():
            o = max((v for p, v in best.items() if p != pid), default=None)
            if o is not None and pid not in self._opponents:
                out.update({f"{pid}/win_rate": float(r > o), f"{pid}/draw_rate": float(r == o),
                            f"{pid}/loss_rate": float(r < o)})
        return out

    # ---- building the batch -------------------------------------------------------------------
    def _piece(self, tr: _Traj) -> sb.SampleBatch:
        obs, masks, actions, extras, rewards, terms, truncs, next_obs, next_masks, ts = zip(*tr.rows, strict=True)
        n = len(obs)
        b = sb.SampleBatch({
            sb.OBS: np.stack(obs), sb.ACTIONS: np.stack(actions), sb.REWARDS: np.fromiter(rewards, np.float32, n),
            sb.TERMINATEDS: np.fromiter(terms, bool, n), sb.TRUNCATEDS: np.fromiter(truncs, bool, n),
            sb.NEXT_OBS: np.stack(next_obs),
            sb.EPS_ID: np.full(n, tr.episode.episode_id * len(self.possible_agents) + tr.agent_index, np.int64),
            sb.T: np.fromiter(ts, np.int64, n), sb.AGENT_INDEX: np.full(n, tr.agent_index, np.int64)})
        if masks[0] is not None:
            b[sb.ACTION_MASK], b[sb.NEXT_ACTION_MASK] = np.stack(masks), np.stack(next_masks)
        for k in extras[0]:
            b[k] = np.stack([ex[k] for ex in extras])
        tr.rows = []
        return b

    def _build(self, trajs: List[_Traj], finished, agent_steps: int) -> sb.MultiAgentBatch:
        pm = self.worker.pm
        hook = bool(pm.hook.flowkit_on_trajectory.get_hookimpls())
        pieces: Dict[str, List[sb.SampleBatch]] = {}
        for tr in trajs:
            if not tr.rows:
                continue
            piece = self._piece(tr)
            if hook:
                pm.hook.flowkit_on_trajectory(policy_id=tr.policy_id, batch=piece, episode=tr.episode)
            pieces.setdefault(tr.policy_id, []).append(self.policies[tr.policy_id].postprocess_trajectory(piece))
        return self._batch({pid: sb.concat_samples(ps) for pid, ps in pieces.items()}, finished, agent_steps)

    # ---- the public API ------------------------------------------------------------------------
    def sample(self, explore: bool = True) -> sb.MultiAgentBatch:
        if self._state is None:
            self._state = self._new_slots()
        self._explore = explore
        finished: List[Dict[str, Any]] = []
        done_trajs: List[_Traj] = []
        agent_steps = self._run(self._state, finished, done_trajs, ticks=self.T)
        # every agent of the current episodes, finished or not (a traj emitted already by an
        # episode that ended has no rows left, so nothing is sent twice)
        current = [tr for s in self._state for tr in s.trajs.values()]
        return self._build(done_trajs + current, finished, agent_steps)

    def evaluate(self, num_episodes: int, explore: bool = False) -> List[Dict[str, Any]]:
        """``num_episodes`` whole episodes from fresh resets (spread over the sub-envs), with the
        policies named in ``multiagent.eval_opponents`` replaced by fixed ones and, with
        ``multiagent.eval_alternate_seats``, the seats rotated every episode. Summaries of turn-based
        games carry ``eval_metrics`` (``<policy>/win_rate``, ``draw_rate``, ``loss_rate``)."""
        self._acting = self._eval_policies()
        self._eval, self._explore = True, explore
        try:
            slots = self._new_slots()
            for s in slots:  # num_episodes spread over the sub-envs, the first ones get the remainder
                s.quota, s.checks_left = len(range(s.j, num_episodes, self.n)), 0
            finished: List[Dict[str, Any]] = []
            while len(finished) < num_episodes:
                self._run(slots, finished, [], ticks=1)
            return finished
        finally:
            self._eval, self._acting = False, self.policies
            self._state = None  # the envs were reset: sampling starts fresh episodes

    def close(self):
        for e in self.envs:
            with contextlib.suppress(Exception):
                e.close()

    def _run(self, slots: List[_Slot], finished, done_trajs, ticks: int) -> int:
        raise NotImplementedError


class ParallelEnvRunner(_MultiAgentRunner):
    """PettingZoo ParallelEnv: every live agent acts each step. Actions are asked only for
    agents in the current observation dict that have not terminated or been truncated; agents
    may join late (first seen in an observation dict) and leave early."""

    def _receive(self, slot: _Slot, obs: Dict[str, Any], term: Dict[str, bool], trunc: Dict[str, bool], what: str):
        by_pid: Dict[str, List[Tuple[_Traj, Any]]] = {}
        for agent, o in obs.items():
            self._check_obs(slot, agent, o, what)
            tr = self._traj(slot, agent)
            by_pid.setdefault(tr.policy_id, []).append((tr, o))
        if self.critics:
            self._critic_rows(slot, [tr for items in by_pid.values() for tr, _ in items], obs.get)
        for pid, items in by_pid.items():
            enc, mask = self._encode(pid, [o for _, o in items], [tr.agent for tr, _ in items])
            for k, (tr, _) in enumerate(items):
                m = None if mask is None else mask[k]
                te, tu = bool(term.get(tr.agent, False)), bool(trunc.get(tr.agent, False))
                tr.complete(te, tu, enc[k], m, tr.critic)
                tr.last_enc, tr.done = (enc[k], m), tr.done or te or tu

    def _run(self, slots, finished, done_trajs, ticks):
        agent_steps = 0
        for _ in range(ticks):
            active = [s for s in slots if s.open]
            if not active:
                break
            for s in active:
                if s.need_reset:
                    obs, _ = self._start_episode(s)
                    self._receive(s, obs, {}, {}, "reset()")
            requests = [(tr, *tr.last_enc) for s in active for tr in s.trajs.values()
                        if not tr.done and tr.last_enc is not None]
            actions = dict(zip([tr for tr, _, _ in requests], self._act(requests), strict=True))
            agent_steps += len(requests)
            for s in active:
                acted = {tr.agent: actions[tr] for tr in s.trajs.values() if tr in actions}
                obs, rew, term, trunc, _ = s.env.step(acted)
                for agent, r in rew.items():
                    self._credit(s, agent, r)
                self._receive(s, obs, term, trunc, "step()")
                for agent in acted:  # acted but no observation came back: it left the game
                    tr = s.trajs[agent]
                    if tr.pending is not None:
                        tr.complete(True, False, tr.pending[0], tr.pending[1])
                        tr.done = True
                s.tick()
                if all(tr.done for tr in s.trajs.values()):
                    self._end_episode(s, finished, done_trajs)
        return agent_steps


class AECEnvRunner(_MultiAgentRunner):
    """PettingZoo AECEnv (turn-based): one agent on move per sub-env per step; action masks
    come from the observation dict (``action_mask``). Finished agents get their dead step
    (``step(None)``), which completes their last transition with its final reward."""

    turn_based = True

    def _advance(self, s: _Slot, finished, done_trajs) -> Optional[Tuple[_Traj, np.ndarray, Optional[np.ndarray]]]:
        """Run dead steps and resets until an agent of ``s`` is on move; return its traj with
        its observation encoded (and its previous transition completed)."""
        env = s.env
        while s.open:
            if s.need_reset:
                self._start_episode(s)
            if not env.agents:
                self._end_episode(s, finished, done_trajs)
                continue
            agent = env.agent_selection
            obs, r, term, trunc, _ = env.last()
            self._check_obs(s, agent, obs, "last()")
            tr = self._credit(s, agent, r)
            if tr.policy_id in self.critics:
                self._critic_rows(s, [tr], lambda a: env.observe(a) if a in env.agents else None)
            enc, mask = self._encode(tr.policy_id, [obs], [agent])
            m = None if mask is None else mask[0]
            tr.complete(bool(term), bool(trunc), enc[0], m, tr.critic)
            if term or trunc:
                tr.done = True
                env.step(None)
                continue
            tr.last_enc = (enc[0], m)
            return tr, enc[0], m
        return None

    def _run(self, slots, finished, done_trajs, ticks):
        agent_steps = 0
        for _ in range(ticks):
            advanced = [(s, self._advance(s, finished, done_trajs)) for s in slots]
            owners, requests = [s for s, req in advanced if req], [req for _, req in advanced if req]
            if not requests:
                break
            agent_steps += len(requests)
            for s, a in zip(owners, self._act(requests), strict=True):
                s.env.step(a)
                s.tick()
        return agent_steps


def runner_for(env: Any) -> type:
    from pettingzoo.utils.env import AECEnv
    return AECEnvRunner if isinstance(env, AECEnv) else ParallelEnvRunner
