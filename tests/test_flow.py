"""The dataflow substrate: order semantics of every combinator, hand-checked."""
import time

import pytest

from flowkit.core.flow import (NOT_READY, Flow, FlowContext, LocalActor, ParallelFlow, RoundRobinCursor,
                               from_callable, from_items, union_tagged)
from flowkit.core.ops import Concurrently


def test_for_each_filter_combine_batch_flatten_order():
    f = from_items([1, 2, 3, 4, 5])
    out = (f.for_each(lambda x: x * 10)
            .filter(lambda x: x != 30)
            .combine(lambda x: [x, x + 1])
            .batch(3)
            .flatten())
    assert out.take(100) == [10, 11, 20, 21, 40, 41]  # 50, 51 stay in the unfinished batch


def test_lazy_nothing_runs_until_pulled():
    calls = []
    f = from_items([1, 2]).for_each(lambda x: calls.append(x) or x)
    assert calls == []
    assert next(f) == 1 and calls == [1]


def test_union_round_robin_weights_exact_order():
    a = from_items(["a1", "a2", "a3", "a4"], repeat=False)
    b = from_items(["b1", "b2", "b3", "b4", "b5", "b6"], repeat=False)
    u = a.union(b, weights=[1, 2])
    assert u.take(10) == ["a1", "b1", "b2", "a2", "b3", "b4", "a3", "b5", "b6", "a4"]


def test_union_fractional_weights_accumulate_credit():
    a = from_items(list(range(10)))
    b = from_items(["x"] * 10)
    u = a.union(b, weights=[0.5, 1])
    # a gets a turn every second cycle
    assert u.take(6) == ["x", 0, "x", "x", 1, "x"]


def test_union_not_ready_branch_ends_its_turn_and_all_waiting_yields_not_ready():
    seq = iter([NOT_READY, NOT_READY, "late1", "late2"])
    slow = from_callable(lambda: next(seq), "slow")
    fast = from_items(["f1", "f2", "f3"])
    u = union_tagged([slow, fast])
    got = [next(u) for _ in range(5)]
    assert got == [(1, "f1"), (1, "f2"), (0, "late1"), (1, "f3"), (0, "late2")]
    idle = union_tagged([from_callable(lambda: NOT_READY, "idle")])
    assert next(idle) is NOT_READY


def test_union_cursor_restored_continues_the_cycle_inside_a_turn():
    """A checkpoint taken inside a branch's turn (an iteration ends after the first of k
    train steps): a union built again with the restored cursor takes the rest of that turn
    first, with the fractional credit carried, so the sequence is the uninterrupted one."""
    def sources():
        return [from_items([f"s{i}" for i in range(20)]), from_items([f"t{i}" for i in range(60)])]
    whole = union_tagged(sources(), weights=[1, 2.5], cursor=RoundRobinCursor(2)).take(21)
    assert whole[:10] == [(0, "s0"), (1, "t0"), (1, "t1"), (0, "s1"), (1, "t2"), (1, "t3"), (1, "t4"),
                          (0, "s2"), (1, "t5"), (1, "t6")]
    first = RoundRobinCursor(2)
    src = sources()
    head = union_tagged(src, weights=[1, 2.5], cursor=first).take(2)  # stops after t0, 1 of the turn's 2 left
    assert first.get_state() == {"credit": [0.0, 0.5], "turn": 1, "left": 1.0}
    restored = RoundRobinCursor(2)
    restored.set_state(first.get_state())
    tail = union_tagged(src, weights=[1, 2.5], cursor=restored).take(19)
    assert head + tail == whole
    fresh = union_tagged(sources(), weights=[1, 2.5]).take(5)  # no cursor: a new cycle from the store
    assert fresh == whole[:5]
    with pytest.raises(ValueError, match="cursor of 3 branches restored into a union of 2"):
        RoundRobinCursor(2).set_state({"credit": [0, 0, 0], "turn": None, "left": 0})
    with pytest.raises(ValueError, match="deterministic round-robin"):
        union_tagged(sources(), deterministic=False, cursor=RoundRobinCursor(2))


def test_union_star_weight_drains_ready_items():
    a = from_items([1, 2, 3])
    b = from_items(["b"] * 3)
    assert a.union(b, weights=["*", 1]).take(5) == [1, 2, 3, "b", "b"]


def test_duplicate_every_branch_sees_every_item_and_buffers_are_bounded():
    src = from_items(list(range(10)))
    d0, d1 = src.duplicate(2, max_buffer=3)
    assert [next(d0) for _ in range(3)] == [0, 1, 2]
    assert next(d0) is NOT_READY  # d1 lags 3 items: back-pressure
    assert [next(d1) for _ in range(4)] == [0, 1, 2, 3]
    assert next(d0) == 3


def test_concurrently_output_indexes_and_modes():
    a = from_items(["a1", "a2"])
    b = from_items(["b1", "b2"])
    c = Concurrently([a, b], mode="round_robin", output_indexes=[1])
    assert c.take(2) == ["b1", "b2"]
    with pytest.raises(ValueError, match="mode"):
        Concurrently([a, b], mode="bogus")


def test_zip_with_source_actor_reads_context():
    ctx = FlowContext()
    f = from_items([1, 2], ctx=ctx)
    ctx.current_actor = "w7"
    assert next(f.zip_with_source_actor()) == ("w7", 1)


def test_operator_error_keeps_type_and_names_operator():
    class Boom:
        name = "Boom"

        def __call__(self, x):
            raise KeyError("missing column")
    f = from_items([1]).for_each(Boom())
    with pytest.raises(KeyError, match="missing column") as ei:
        next(f)
    assert any("operator Boom" in n for n in ei.value.__notes__)


def test_describe_text_and_mermaid_without_running():
    ran = []
    src = from_callable(lambda: ran.append(1), "source")
    a, b = src.duplicate(2)
    plan = Concurrently([a.for_each(len), b], mode="async")
    g = plan.describe()
    names = [n for _, n in g["nodes"]]
    assert names[0].startswith("Concurrently(async") and "source" in names and "len" in names
    assert names.count("source") == 1  # shared upstream listed once
    assert "flowchart LR" in plan.to_mermaid() and "-->" in plan.to_mermaid()
    assert "(shared, see above)" in plan.to_text()
    assert ran == []


class Counter:
    def __init__(self, start):
        self.i = start

    def next(self):
        self.i += 1
        return self.i

    def apply_flow(self, method, fns, *args):
        x = getattr(self, method)(*args)
        for fn in fns:
            x = fn(x)
        return x


def test_gather_sync_round_order_and_shard_transforms_local():
    actors = [LocalActor(Counter(0), 0), LocalActor(Counter(100), 1)]
    pf = ParallelFlow(lambda: actors, "next", "counters").for_each(lambda x: x * 2)
    assert pf.gather_sync().take(4) == [2, 202, 4, 204]
    rounds = ParallelFlow(lambda: actors, "next", "counters").gather_sync(per_round=True)
    assert [x for _, x in next(rounds)] == [3, 103]


def test_gather_async_records_source_actor_local():
    actors = [LocalActor(Counter(0), 0), LocalActor(Counter(100), 1)]
    f = ParallelFlow(lambda: actors, "next", "counters").gather_async().zip_with_source_actor()
    items = f.take(4)
    assert sorted(x for _, x in items) == [1, 2, 101, 102]
    assert all((a.index == 0) == (x < 100) for a, x in items)


def test_parallel_flow_failure_handler_and_note():
    class Bad(Counter):
        def next(self):
            raise RuntimeError("env exploded")
    actors = [LocalActor(Bad(0), 3)]
    with pytest.raises(RuntimeError, match="env exploded") as ei:
        next(ParallelFlow(lambda: actors, "next", "bad").gather_sync())
    assert any("worker 3" in n for n in ei.value.__notes__)
    seen = []
    f = ParallelFlow(lambda: actors, "next", "bad", on_failure=lambda a, e: seen.append(a.index) or True)
    rounds = f.gather_sync(per_round=True)
    assert next(rounds) == [] and seen == [3]


@pytest.mark.usefixtures("ray_session")
@pytest.mark.slow
def test_gather_async_on_ray_actors():
    import ray
    from flowkit.core.flow import RayActor
    cls = ray.remote(num_cpus=0)(Counter)
    actors = [RayActor(cls.remote(0), 0), RayActor(cls.remote(100), 1)]
    f = ParallelFlow(lambda: actors, "next", "counters").gather_async(num_async=2).zip_with_source_actor()
    items = f.take(6)
    assert all((a.index == 0) == (x < 100) for a, x in items)
    assert sorted(x for a, x in items if a.index == 0) == list(range(1, 1 + sum(a.index == 0 for a, _ in items)))
    for a in actors:
        ray.kill(a.handle)


class Sleeper:
    def __init__(self, s):
        self.s = s

    def next(self):
        time.sleep(self.s)
        return self.s


@pytest.mark.usefixtures("ray_session")
@pytest.mark.slow
def test_gather_sync_times_the_drivers_wait_for_each_round():
    # perf/sample_wait_time_ms: the time the driver blocks on a round (it once timed the
    # accounting after the round had arrived, and read about 0 while the driver waited)
    import ray
    from flowkit.core.flow import RayActor
    cls = ray.remote(num_cpus=0)(Sleeper)
    actors = [RayActor(cls.remote(0.4), 0), RayActor(cls.remote(0.1), 1)]
    ray.get([a.handle.next.remote() for a in actors])  # started (not a sample wait)
    ctx = FlowContext()
    rounds = ParallelFlow(lambda: actors, "next", "sleepers", ctx).gather_sync(per_round=True, prefetch=True)
    assert [x for _, x in next(rounds)] == [0.4, 0.1]
    t = ctx.timers["sample_wait"]
    assert t.count == 1 and 0.3 <= t.total_s < 3.0
    time.sleep(0.8)  # the consumer works longer than the prefetched round takes
    assert [x for _, x in next(rounds)] == [0.4, 0.1]
    assert t.count == 2 and t.last_s < 0.3
    for a in actors:
        ray.kill(a.handle)
