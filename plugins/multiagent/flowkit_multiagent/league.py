"""Leagues: a population of policies for a two-player game, matchmaking by win rate and Elo
ratings (``multiagent.league.*``).

The members are the main policy (trained), the fixed policies that the ``opponent`` seat
names (the policy the league replaces: a random player or a frozen checkpoint, kept as a
member) and up to ``snapshots`` past snapshots of the main policy, frozen copies taken every
``snapshot_interval`` iterations (the oldest replaced once all slots are used). The snapshot
slots are policies ``<main>@1`` .. ``<main>@<snapshots>`` of the main policy's class and
spaces, never trained.

Matchmaking (prioritized fictitious self-play, PFSP: Vinyals et al. 2019, "Grandmaster level
in StarCraft II using multi-agent reinforcement learning", Methods, "Prioritized fictitious
self-play"): in each episode the agents that the mapping gives to ``opponent`` play the main
policy itself with probability ``self_play``, else a member ``m`` of the others (fixed ones and
filled snapshot slots) with probability ``f(p_m) / sum_k f(p_k)``, where ``p_m`` is the main
policy's win rate against ``m`` (draws count one half; 0.5 before any game) and ``f`` is

- ``hard``: ``(1 - p)^2`` (AlphaStar's f_hard: the opponents the main policy loses to),
- ``variance``: ``p (1 - p)`` (AlphaStar's f_var: opponents of its own level),
- ``linear``: ``1 - p``,
- ``uniform``: ``1`` (fictitious self-play).

The win rate is AlphaStar's decayed one (its pseudocode's payoff table): before each game of
the main policy against ``m``, the games, wins and draws counted against ``m`` are multiplied by
``win_rate_decay`` (``d``; 1: plain counts), so that a game ``n`` games ago counts ``d**n``: the
main policy keeps changing, and its old results against a member say little about today's.

Where every ``f(p_m)`` is 0 (it beats them all) the choice is uniform. Without other members
(no snapshot yet, no fixed member) the main policy plays itself. The draw is made on the rollout
workers, once per episode, from the run's seed and the episode id (the mapping's weighted
choice, :class:`~flowkit_multiagent.specs.AgentMapping`); the driver sends the new
probabilities after every iteration (:meth:`League.push`; a restarted worker starts from the
first distribution and gets the current one with the next iteration's).

Ratings: Elo (Elo 1978; the logistic form of the chess federations) per member: after a game of
the main policy ``a`` against member ``b`` with score ``s`` (1 win, 0.5 draw, 0 loss)::

    E = 1 / (1 + 10 ** ((R_b - R_a) / 400));   R_a += K (s - E);   R_b -= K (s - E)

with ``K = elo_k``. A new snapshot starts with the main policy's rating at that moment and an
empty row of the win-rate table. Games of the main policy against itself change nothing.

Everything (members, ratings, win-rate table, the next slot) is checkpointed with the run as
plain values (:meth:`League.get_state`) and shown per iteration as ``metrics.csv`` columns
``league/<member>/elo``, ``league/<member>/win_rate`` (the main policy's against it),
``league/<member>/prob`` (its matchmaking probability), ``league/<member>/games`` (the games the
main policy played against it, not decayed; since a snapshot's creation) and ``league/size``.
"""
from __future__ import annotations

import functools
import itertools
from typing import Any, Dict, List, Optional, Sequence, Tuple

PFSP = {"hard": lambda p: (1.0 - p) ** 2, "variance": lambda p: p * (1.0 - p), "linear": lambda p: 1.0 - p,
        "uniform": lambda p: 1.0}  # f(p) by multiagent.league.pfsp
PFSP_WEIGHTINGS = tuple(PFSP)
STATEFUL_NAME = "multiagent/league"


def pfsp_weight(p: float, weighting: str) -> float:
    """The PFSP weighting ``f(p)`` of an opponent the main policy beats with probability
    ``p`` in [0, 1] (see the module docstring). Raises ValueError for an unknown ``weighting``."""
    if weighting not in PFSP:
        raise ValueError(f"pfsp weighting must be one of {', '.join(PFSP_WEIGHTINGS)}, got {weighting!r}")
    return float(PFSP[weighting](p))


def elo_update(r_a: float, r_b: float, score: float, k: float) -> Tuple[float, float]:
    """The ratings of ``a`` and ``b`` after a game that ``a`` scored ``score`` in (1, 0.5, 0)."""
    expected = 1.0 / (1.0 + 10.0 ** ((r_b - r_a) / 400.0))
    d = k * (score - expected)
    return r_a + d, r_b - d


def slot_ids(config: Any) -> List[str]:
    """The snapshot slots' policy ids (``<main>@1`` ..), none without a league."""
    lg = config.multiagent.league
    return [f"{lg.main}@{k}" for k in range(1, int(lg.snapshots) + 1)] if lg.main else []


def league_mapping(config: Any) -> Dict[str, Any]:
    """``multiagent.mapping`` with the league's rule targets expanded: a rule that maps to the
    ``opponent`` policy maps to a choice among every member (the opponent first, so that
    evaluation keeps it). Without a league: the mapping as it is."""
    ma = config.multiagent
    mapping = dict(ma.mapping or {})
    lg = ma.league
    if not lg.main:
        return mapping
    members = {str(lg.opponent): 1.0, str(lg.main): 1.0, **{s: 1.0 for s in slot_ids(config)}}
    return {pat: (members if str(target) == str(lg.opponent) else target) for pat, target in mapping.items()}


class League:
    """The league's population, win-rate table and ratings (see the module docstring).

    Args:
        main: the main policy's id.
        fixed: ids of the fixed members (the ``opponent`` policy).
        slots: the snapshot slots' policy ids.
        rules: the mapping rules whose choice the league sets (agent-id patterns).
        weighting, self_play, elo_k, elo_initial, decay: as ``multiagent.league.*`` names them
            (``decay``: ``win_rate_decay``).
    """

    name = "League"

    def __init__(self, main: str, fixed: Sequence[str], slots: Sequence[str], rules: Sequence[str] = (),
                 weighting: str = "hard", self_play: float = 0.0, elo_k: float = 16.0, elo_initial: float = 1000.0,
                 decay: float = 1.0):
        self.main, self.fixed, self.slots, self.rules = str(main), list(fixed), list(slots), list(rules)
        self.weighting, self.self_play, self.elo_k, self.decay = weighting, float(self_play), float(elo_k), float(decay)
        self.members = [*self.fixed, *self.slots, self.main]
        self.ratings = {m: float(elo_initial) for m in self.members}
        # decayed counts (the win rate) and the plain count of games against each member
        self.wins, self.draws, self.games, self.played = ({m: 0.0 for m in self.members} for _ in range(4))
        self.filled: Dict[str, int] = {}  # slot -> iteration of its snapshot
        self.next_slot = 0

    @classmethod
    def from_config(cls, config: Any) -> "League":
        lg = config.multiagent.league
        rules = [p for p, t in (config.multiagent.mapping or {}).items() if str(t) == str(lg.opponent)]
        return cls(lg.main, [lg.opponent], slot_ids(config), rules, lg.pfsp, lg.self_play, lg.elo_k, lg.elo_initial,
                   lg.win_rate_decay)

    # ---- matchmaking ----------------------------------------------------------------------
    def win_rate(self, member: str) -> float:
        """The main policy's decayed win rate against ``member`` (draws one half; 0.5 before any
        game)."""
        g = self.games[member]
        return (self.wins[member] + 0.5 * self.draws[member]) / g if g else 0.5

    def candidates(self) -> List[str]:
        """The members the main policy may be matched against (fixed ones, filled slots)."""
        return [*self.fixed, *(s for s in self.slots if s in self.filled)]

    def probabilities(self) -> Dict[str, float]:
        """``{member: probability}`` of playing the ``opponent`` seat in an episode, every
        member listed (0 for empty slots), in member order."""
        cands = self.candidates()
        out = {m: 0.0 for m in self.members}
        if not cands:
            out[self.main] = 1.0
            return out
        w = {m: pfsp_weight(self.win_rate(m), self.weighting) for m in cands}
        total = sum(w.values())
        rest = 1.0 - self.self_play
        for m in cands:
            out[m] = rest * (w[m] / total if total > 0 else 1.0 / len(cands))
        out[self.main] = self.self_play
        return out

    def cumulative(self) -> List[Tuple[str, float]]:
        """The matchmaking distribution as a mapping rule's ``[(policy id, cumulative
        probability)]`` (opponent first, then the slots, then the main policy)."""
        probs = self.probabilities()
        order = [*self.fixed, self.main, *self.slots]
        cum = list(itertools.accumulate(probs[m] for m in order))
        cum[-1] = 1.0  # (rounding)
        return list(zip(order, cum, strict=True))

    def push(self, workers: Any) -> None:
        """Send the matchmaking distribution to every rollout worker (their mapping's rules;
        a Ray actor runs it before its next sample request). Not awaited: a worker that fails
        reports it with its next sample, and is rebuilt as usual."""
        fn = functools.partial(set_rules, self.rules, self.cumulative())
        for a in workers.actors:
            a.submit("apply", fn)

    # ---- results ----------------------------------------------------------------------------
    def __call__(self, batch: Any) -> Any:
        """The operator: record the games of a sampled batch's finished episodes; passes it on."""
        for ep in batch.episodes:
            self.record(ep.get("policy_returns") or {})
        return batch

    def record(self, policy_returns: Dict[str, Dict[str, float]]) -> Optional[float]:
        """Record one episode (``{policy id: {agent id: return}}``): a game of the main policy
        against one other member updates the table and both ratings. Returns the main policy's
        score (1, 0.5, 0), or None for an episode that is no such game."""
        others = [p for p in policy_returns if p != self.main]
        if self.main not in policy_returns or len(others) != 1 or others[0] not in self.ratings:
            return None
        b = others[0]
        mine, theirs = max(policy_returns[self.main].values()), max(policy_returns[b].values())
        score = 1.0 if mine > theirs else 0.5 if mine == theirs else 0.0
        for stats in (self.games, self.wins, self.draws):
            stats[b] *= self.decay
        self.games[b] += 1.0
        self.played[b] += 1.0
        self.wins[b] += score == 1.0
        self.draws[b] += score == 0.5
        self.ratings[self.main], self.ratings[b] = elo_update(self.ratings[self.main], self.ratings[b], score, self.elo_k)
        return score

    def add_snapshot(self, iteration: int) -> str:
        """Take the next slot (the oldest once all are used) for a snapshot of the main policy
        made at ``iteration``: its rating starts at the main policy's, its table row empty.
        Returns the slot's policy id (the caller copies the weights)."""
        slot = self.slots[self.next_slot % len(self.slots)]
        self.next_slot += 1
        self.filled[slot] = int(iteration)
        self.ratings[slot] = self.ratings[self.main]
        self.wins[slot] = self.draws[slot] = self.games[slot] = self.played[slot] = 0.0
        return slot

    def columns(self) -> Dict[str, float]:
        """This iteration's ``metrics.csv`` columns (see the module docstring)."""
        probs = self.probabilities()
        out: Dict[str, float] = {"league/size": float(len(self.candidates()) + 1)}
        for m in self.members:
            out[f"league/{m}/elo"] = self.ratings[m]
            if m != self.main:
                out[f"league/{m}/win_rate"] = self.win_rate(m)
                out[f"league/{m}/games"] = self.played[m]
            out[f"league/{m}/prob"] = probs[m]
        return out

    def table(self) -> Dict[str, Any]:
        """The members as a table (plain lists): member, Elo, games against the main policy,
        the main policy's (decayed) win rate against them, matchmaking probability, the iteration of the
        snapshot (-1: not a snapshot)."""
        probs = self.probabilities()
        rows = [[m, self.ratings[m], self.played[m] if m != self.main else "", self.win_rate(m) if m != self.main else "",
                 probs[m], self.filled.get(m, -1)] for m in self.members if m not in self.slots or m in self.filled]
        return {"columns": ["member", "elo", "games", "win_rate", "prob", "snapshot"], "rows": rows}

    # ---- checkpoints ---------------------------------------------------------------------------
    def get_state(self) -> Dict[str, Any]:
        return {"ratings": dict(self.ratings), "wins": dict(self.wins), "draws": dict(self.draws),
                "games": dict(self.games), "played": dict(self.played), "filled": dict(self.filled), "next_slot": self.next_slot,
                "table": self.table()}

    def set_state(self, state: Dict[str, Any]) -> None:
        for key in ("ratings", "wins", "draws", "games", "played"):  # (a checkpoint before `played`: the games)
            getattr(self, key).update({str(k): float(v) for k, v in state.get(key, state["games"]).items()})
        self.filled = {str(k): int(v) for k, v in state["filled"].items()}
        self.next_slot = int(state["next_slot"])


def set_rules(rules: Sequence[str], cum: List[Tuple[str, float]], worker: Any) -> None:
    """On a rollout worker: the league's matchmaking distribution into its mapping's ``rules``."""
    for r in rules:
        worker.runner.mapping.rules[r] = list(cum)
