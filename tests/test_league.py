"""Leagues (multiagent.league): PFSP weights and matchmaking, Elo, snapshots every K
iterations, checkpoint and resume, the members table in `flowkit evaluate`."""
from __future__ import annotations

import csv
import os
from collections import Counter

import numpy as np
import pytest
from flowkit_multiagent.league import STATEFUL_NAME, League, elo_update, pfsp_weight
from flowkit_multiagent.specs import AgentMapping

import flowkit
from flowkit import ConfigError
from flowkit.checkpoint import STATE_FILE, load_state, restore
from flowkit.engine import build_plan, load_config, setup
from flowkit.testing import local_overrides

TTT = ["env.factory=pettingzoo.classic.tictactoe_v3:env", "multiagent.policies.learner.algo=ppo",
       "multiagent.policies.opponent.algo=random", "multiagent.mapping.player_1=learner",
       "multiagent.mapping.player_2=opponent", "multiagent.alternate_seats=true", "multiagent.league.main=learner",
       "runtime.num_workers=1", "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=16",
       "ppo.train_batch_size=32", "ppo.minibatch_size=16", "ppo.num_epochs=1"]


def test_pfsp_weight_functions_exact_values():
    assert pfsp_weight(0.25, "hard") == 0.5625          # (1 - p)^2
    assert pfsp_weight(0.25, "variance") == 0.1875      # p (1 - p)
    assert pfsp_weight(0.25, "linear") == 0.75          # 1 - p
    assert pfsp_weight(0.25, "uniform") == 1.0
    assert pfsp_weight(1.0, "hard") == 0.0 and pfsp_weight(0.0, "variance") == 0.0
    with pytest.raises(ValueError, match=r"pfsp weighting must be one of hard, variance, linear, uniform, got 'soft'"):
        pfsp_weight(0.5, "soft")


def _fixed_table() -> League:
    """main m; fixed member rand (beaten 10 of 10: p=1); slots m@1 (1 win, 2 draws of 4:
    p=0.5) and m@2 (2 wins of 10: p=0.2) filled, m@3 empty; 20% self-play."""
    lg = League("m", ["rand"], ["m@1", "m@2", "m@3"], ["player_2"], "hard", self_play=0.2)
    lg.add_snapshot(5)
    lg.add_snapshot(10)
    for member, results in (("rand", [1.0] * 10), ("m@1", [1.0, 0.5, 0.5, 0.0]), ("m@2", [1.0, 1.0] + [0.0] * 8)):
        for s in results:
            lg.games[member] += 1
            lg.wins[member] += s == 1.0
            lg.draws[member] += s == 0.5
    return lg


def test_pfsp_probabilities_on_a_fixed_win_rate_table():
    lg = _fixed_table()
    assert [lg.win_rate(m) for m in ("rand", "m@1", "m@2", "m@3")] == [1.0, 0.5, 0.2, 0.5]
    # f_hard: rand 0, m@1 0.25, m@2 0.64 (sum 0.89); 80% of the episodes split by them, 20% self-play
    p = lg.probabilities()
    assert p["rand"] == 0.0 and p["m@3"] == 0.0 and p["m"] == 0.2
    assert p["m@1"] == pytest.approx(0.8 * 0.25 / 0.89, abs=1e-12)   # 0.224719...
    assert p["m@2"] == pytest.approx(0.8 * 0.64 / 0.89, abs=1e-12)   # 0.575281...
    lg.self_play = 0.0
    lg.wins["m@1"] = lg.wins["m@2"] = lg.games["m@1"] = lg.games["m@2"] = 10.0
    lg.draws["m@1"] = 0.0
    assert lg.probabilities()["m@1"] == pytest.approx(1 / 3)  # it beats them all: uniform over rand, m@1, m@2


def test_pfsp_matchmaking_frequencies_follow_the_weights():
    lg = _fixed_table()
    m = AgentMapping({"player_1": "m", "player_2": {"rand": 1, "m": 1, "m@1": 1, "m@2": 1, "m@3": 1}},
                     ["m", "rand", "m@1", "m@2", "m@3"], ["player_1", "player_2"], seed=3)
    m.rules["player_2"] = lg.cumulative()  # what League.push sends to the workers
    n = 20000
    freq = Counter(m.policy_for("player_2", episode_id=e) for e in range(n))
    want = lg.probabilities()
    assert freq["rand"] == 0 and freq["m@3"] == 0
    for member in ("m", "m@1", "m@2"):
        assert abs(freq[member] / n - want[member]) < 0.015, (member, freq[member] / n, want[member])
    assert m.policy_for("player_2") == "rand"  # evaluation: the rule's first option, the fixed opponent


def test_elo_updates_hand_computed():
    assert elo_update(1000.0, 1000.0, 1.0, 16.0) == (1008.0, 992.0)   # E = 0.5: +-16 * 0.5
    # E = 1 / (1 + 10^(-200/400)) = 0.759747; an upset loss: 32 * -0.759747 = -24.3119
    a, b = elo_update(1200.0, 1000.0, 0.0, 32.0)
    assert a == pytest.approx(1175.688098, abs=1e-6) and b == pytest.approx(1024.311902, abs=1e-6)
    lg = League("m", ["rand"], ["m@1"], [], "hard", elo_k=16.0, elo_initial=1000.0)
    assert lg.record({"m": {"player_1": 1.0}, "rand": {"player_2": -1.0}}) == 1.0
    assert lg.ratings == {"m": 1008.0, "rand": 992.0, "m@1": 1000.0}
    # a draw at 1008 vs 992: E = 1 / (1 + 10^(-16/400)) = 0.523010, d = 16 (0.5 - E) = -0.368153
    assert lg.record({"m": {"player_2": 0.0}, "rand": {"player_1": 0.0}}) == 0.5
    assert lg.ratings["m"] == pytest.approx(1007.631847, abs=1e-6)
    assert lg.ratings["rand"] == pytest.approx(992.368153, abs=1e-6)
    assert (lg.games["rand"], lg.wins["rand"], lg.draws["rand"]) == (2.0, 1.0, 1.0)
    # self-play and games without the main policy change nothing
    assert lg.record({"m": {"player_1": 1.0, "player_2": -1.0}}) is None
    assert lg.record({"rand": {"player_1": 1.0}, "m@1": {"player_2": -1.0}}) is None
    # a new snapshot starts at the main policy's rating, its row empty
    assert lg.add_snapshot(3) == "m@1" and lg.ratings["m@1"] == lg.ratings["m"] and lg.games["m@1"] == 0.0


def test_win_rate_decays_per_game_and_games_are_counted():
    """AlphaStar's payoff decay: before each game against a member its games, wins and draws are
    multiplied by the decay (here 0.5); the games column counts plainly."""
    lg = League("m", ["rand"], ["m@1"], [], "hard", decay=0.5)
    lg.record({"m": {"player_1": 1.0}, "rand": {"player_2": -1.0}})    # games 1, wins 1
    lg.record({"m": {"player_1": -1.0}, "rand": {"player_2": 1.0}})    # games 0.5 + 1, wins 0.5
    lg.record({"m": {"player_2": 0.0}, "rand": {"player_1": 0.0}})     # games 0.75 + 1, wins 0.25, draws 1
    assert (lg.games["rand"], lg.wins["rand"], lg.draws["rand"], lg.played["rand"]) == (1.75, 0.25, 1.0, 3.0)
    assert lg.win_rate("rand") == pytest.approx(0.75 / 1.75, abs=1e-12)  # plain counts: (1 + 0.5) / 3 = 0.5
    cols = lg.columns()
    assert cols["league/rand/games"] == 3.0 and cols["league/rand/win_rate"] == pytest.approx(0.428571, abs=1e-6)
    assert "league/m/games" not in cols
    assert lg.table()["rows"][0][:3] == ["rand", lg.ratings["rand"], 3.0]
    lg.add_snapshot(2)
    assert cols.keys() <= lg.columns().keys() and lg.columns()["league/m@1/games"] == 0.0
    state = lg.get_state()
    other = League("m", ["rand"], ["m@1"], [], "hard", decay=0.5)
    other.set_state(state)
    assert other.get_state() == state


def test_league_config_errors_are_named():
    def ctx(*extra):
        pm, cfg = load_config(["runtime.backend=local", *TTT, *extra])
        return setup(cfg, pm)
    with pytest.raises(ConfigError, match=r"multiagent.league.main='lerner': no policy 'lerner'.*did you mean"):
        ctx("multiagent.league.main=lerner")
    with pytest.raises(ConfigError, match=r"multiagent.league.opponent='rival': no multiagent.mapping rule maps to it"):
        ctx("multiagent.league.opponent=rival")
    with pytest.raises(ConfigError, match=r"multiagent.league.pfsp"):
        ctx("multiagent.league.pfsp=soft")


def test_league_policies_and_plan():
    pm, cfg = load_config(["runtime.backend=local", *TTT, "multiagent.league.snapshots=2"])
    ctx = setup(cfg, pm)
    try:
        specs = ctx.policy_specs
        assert list(specs) == ["learner", "opponent", "learner@1", "learner@2"]
        assert specs["learner@1"].policy_class is specs["learner"].policy_class
        assert not specs["learner@1"].trainable and specs["learner@1"].group == ""
        assert "League" in build_plan(ctx).to_text()
        # the workers start with the league's first matchmaking: no snapshot yet, so the
        # opponent (65%) or the learner itself (35%)
        assert ctx.stateful[STATEFUL_NAME].decay == 0.99  # multiagent.league.win_rate_decay's default
        rule = ctx.workers.local_worker().runner.mapping.rules["player_2"]
        assert rule == [("opponent", 0.65), ("learner", 1.0), ("learner@1", 1.0), ("learner@2", 1.0)]
    finally:
        ctx.shutdown()


def test_snapshots_every_k_iterations_metrics_and_exact_resume(run_dir):
    base = [*TTT, "multiagent.league.snapshots=2", "multiagent.league.snapshot_interval=2", "stop.iterations=5",
            "run.reporters=[csv,checkpoint]", "checkpoint.every_iters=1", "checkpoint.keep=0"]
    res = flowkit.train(local_overrides(run_dir, *base))
    with open(os.path.join(res.run_dir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [float(r["league/size"]) for r in rows] == [2.0, 3.0, 3.0, 4.0, 4.0]  # opponent + learner + snapshots
    assert rows[-1]["league/learner/elo"] and "league/learner@2/win_rate" in rows[-1]
    # the games per member add up to the games the league recorded (self-play is none)
    st = load_state(os.path.join(res.run_dir, "checkpoints", "iter_000005", STATE_FILE))["stateful"][STATEFUL_NAME]
    assert {m: float(rows[-1][f"league/{m}/games"]) for m in ("opponent", "learner@1", "learner@2")} == \
        {m: st["played"][m] for m in ("opponent", "learner@1", "learner@2")}
    assert abs(sum(float(rows[-1][f"league/{m}/prob"]) for m in ("opponent", "learner", "learner@1", "learner@2"))
               - 1.0) < 1e-9
    ck4 = os.path.join(res.run_dir, "checkpoints", "iter_000004")
    st4 = load_state(os.path.join(ck4, STATE_FILE))
    league4 = st4["stateful"][STATEFUL_NAME]
    assert league4["filled"] == {"learner@1": 2, "learner@2": 4} and league4["next_slot"] == 2
    w = st4["policies"]
    # the snapshot of iteration 4 is the learner of iteration 4; that of iteration 2 is older
    assert all(np.array_equal(w["learner@2"]["weights"][k], v) for k, v in w["learner"]["weights"].items())
    assert not all(np.array_equal(w["learner@1"]["weights"][k], v) for k, v in w["learner"]["weights"].items())
    assert sum(league4["games"].values()) > 0
    # resume: the population, ratings, win-rate table and the snapshots' weights as saved
    pm, cfg = load_config(["runtime.backend=local", *base])
    ctx = setup(cfg, pm)
    try:
        build_plan(ctx)
        restore(ctx, ck4)
        league = ctx.stateful[STATEFUL_NAME]
        assert league.get_state() == league4
        assert all(np.array_equal(ctx.policies["learner@2"].get_weights()[k], v)
                   for k, v in w["learner@2"]["weights"].items())
        league.push(ctx.workers)  # (flowkit_on_run_start)
        assert ctx.workers.local_worker().runner.mapping.rules["player_2"] == league.cumulative()
    finally:
        ctx.shutdown()
    # `flowkit evaluate`: the members table
    from flowkit.evaluation import evaluate, format_table
    report = evaluate(res.run_dir, episodes=4, trust_config=True)
    table = format_table(report)
    assert "league" in table and "learner@2" in table and "elo" in table


def _worker_view(slots, worker):
    """On a rollout worker: its league rule and its snapshot slots' weights."""
    return worker.runner.mapping.rules["player_2"], {s: worker.policies[s].get_weights() for s in slots}


class _AtEnd:
    """Reads every Ray worker's league rule and snapshot weights when the run ends (the workers
    still up), with the driver's view."""

    @flowkit.hookimpl
    def flowkit_on_train_end(self, summary, error, ctx):
        import functools
        league = ctx.stateful[STATEFUL_NAME]
        self.driver = league.cumulative(), {s: ctx.policies[s].get_weights() for s in league.filled}
        self.workers = ctx.workers.foreach_worker("apply", functools.partial(_worker_view, list(league.filled)))


@pytest.mark.slow  # (quick pass under 15 min: Ray workers, ~40 s)
@pytest.mark.ray
def test_league_reaches_ray_workers(ray_session, run_dir):
    """On the Ray backend the workers get each snapshot's weights and the new matchmaking."""
    grab = _AtEnd()
    flowkit.train([*TTT, "runtime.backend=ray", "runtime.num_workers=2", "runtime.num_cpus_per_worker=0.5",
                   "multiagent.league.snapshot_interval=1", "stop.iterations=3", f"run.dir={run_dir}",
                   "run.reporters=[csv]"], plugins=[grab], verbose=False)
    rule, weights = grab.driver
    assert len(weights) == 3 and len(grab.workers) == 2
    for w_rule, w_weights in grab.workers:
        assert [(p, pytest.approx(c)) for p, c in rule] == w_rule
        for s, w in weights.items():
            assert all(np.array_equal(w[k], v) for k, v in w_weights[s].items()), s
