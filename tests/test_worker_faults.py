"""Issue 6, part 1: worker fault tolerance (case C12, and a worker process killed from outside).

Env "Flaky" (flowkit.testing.flaky_env): episodes of 5 steps, armed only in worker 1,
sub-env 0, while restart_count == 0. With 2 workers x 2 sub-envs and
rollout_fragment_length=5, one sampling round is 2 * 2 * 5 = 20 env steps and PPO's train
batch is one round (ConcatBatches(20)).

Reset variant: the vector env resets at construction (call 1), after episode 1 (call 2, the
autoreset step at the start of sample 2) and after episode 2 (call 3, the first step of
sample 3), so round 3 loses worker 1's fragment: iteration 3 trains on worker 0's 10 steps
of round 3 plus round 4 (20), i.e. env_steps_sampled = 20, 40, 70, 90.
Step variant: step 3 of episode 2 lies in sample 2, so iteration 2 is 10 + 20 steps:
20, 50, 70, 90.
"""
import logging

import numpy as np
import pytest

import flowkit
from flowkit.testing import local_overrides
from flowkit.core.batch import DEFAULT_POLICY_ID
from flowkit.core import derive_seed
from flowkit.engine import load_config, setup
from flowkit.testing import KillWorkers


def c12(run_dir, fail, *extra, backend="local"):
    ov = local_overrides(run_dir, "env.factory=flowkit.testing:flaky_env", f"env.kwargs.fail={fail}",
                         "runtime.num_workers=2", "runtime.num_envs_per_worker=2",
                         "runtime.rollout_fragment_length=5", "ppo.minibatch_size=10", "ppo.num_epochs=1",
                         "stop.iterations=4", "checkpoint.at_end=false", *extra)
    if backend == "ray":
        ov = [o for o in ov if o != "runtime.backend=local"] + ["runtime.num_cpus_per_worker=0.5"]
    last = {o.split("=", 1)[0]: o for o in ov}  # a later override of a key wins
    return list(last.values())


def _notes(e):
    return "\n".join(getattr(e, "__notes__", []))


@pytest.mark.parametrize("fail,call", [("reset", "reset()"), ("step", "step()")])
def test_c12_restarts_off_original_error_with_worker_and_sub_env(run_dir, fail, call):
    with pytest.raises(RuntimeError) as ei:
        flowkit.train(c12(run_dir, fail, "runtime.restart_failed_workers=false"))
    e = ei.value
    assert type(e) is RuntimeError and str(e) == "simulator disconnected"
    assert f"raised by {call} of env 'flowkit.testing:flaky_env' in worker 1, sub-env 0 (restart 0)" in _notes(e)
    assert "rollout worker 1 failed" in _notes(e)


@pytest.mark.parametrize("fail,steps", [("reset", [20, 40, 70, 90]), ("step", [20, 50, 70, 90])])
def test_c12_restarts_on_rebuilds_only_that_worker(run_dir, fail, steps, caplog):
    caplog.set_level(logging.WARNING, logger="flowkit")
    res = flowkit.train(c12(run_dir, fail, "runtime.max_worker_restarts=3"))
    assert [r["env_steps_sampled"] for r in res.history] == steps
    assert [r["env_steps_trained"] for r in res.history] == steps
    assert res.metrics["num_worker_restarts"] == 1
    assert res.stop_reason.startswith("stop.iterations")
    msgs = [r.getMessage() for r in caplog.records if "rebuilding" in r.getMessage()]
    assert msgs == ["rollout worker 1 failed (RuntimeError: simulator disconnected); "
                    "rebuilding it (restart 1, 1/3 in a row)"]


def test_c12_rebuilt_worker_gets_current_weights_and_derived_seed(run_dir):
    """Rebuild worker 1 by hand: only slot 1 changes; it carries the learner's current
    weights and seeds derive_seed(seed, "env", 1, j, restart_count=1)."""
    pm, cfg = load_config(c12(run_dir, None, "seed=7"))
    ctx = setup(cfg, pm, run_dir)
    ws = ctx.workers
    ws.start()
    old0, old1 = ws.actors
    pol = ctx.policies[DEFAULT_POLICY_ID]
    w = {k: np.full_like(v, 0.125) for k, v in pol.get_weights().items()}
    pol.set_weights(w)
    assert ws.on_failure(old1, RuntimeError("boom")) is True
    new0, new1 = ws.actors
    assert new0 is old0 and new1 is not old1
    worker = new1.obj
    assert worker.restart_count == 1 and ws.restart_counts == [0, 1] and ws.num_restarts == 1
    for k, v in worker.policies[DEFAULT_POLICY_ID].get_weights().items():
        np.testing.assert_array_equal(v, w[k])
    seeds = [c.seed for c in worker.sub_env_contexts]
    assert seeds == [derive_seed(7, "env", 1, j, 1) for j in range(2)]
    assert seeds[0] != derive_seed(7, "env", 1, 0, 0)
    # the vector env reset each sub-env with its own derived seed
    assert [e.unwrapped.reset_seeds[0] for e in worker.runner.vec.envs] == seeds
    # a late failure report from the replaced actor is dropped, not counted again
    assert ws.on_failure(old1, RuntimeError("stale")) is True and ws.num_restarts == 1
    ws.stop()


def test_c12_always_fails_stops_after_max_restarts(run_dir, caplog):
    caplog.set_level(logging.WARNING, logger="flowkit")
    with pytest.raises(RuntimeError) as ei:
        flowkit.train(c12(run_dir, "always", "runtime.max_worker_restarts=3"))
    assert str(ei.value) == "simulator disconnected"
    assert ("worker 0 failed 4 times in a row (runtime.max_worker_restarts=3); stopping"
            in _notes(ei.value))
    assert len([r for r in caplog.records if "rebuilding" in r.getMessage()]) == 3


def test_c12_space_mismatch_is_not_restarted(run_dir):
    """A bad env output is a bug in the env, not a fault: it stops at once (no restart)."""
    with pytest.raises(flowkit.EnvError, match=r"worker 0, sub-env 0\) returned"):
        flowkit.train(local_overrides(run_dir, "env.factory=test_bad_input:wrong_shape_env",
                                      "runtime.num_envs_per_worker=1", "stop.iterations=1"))


# ---- Ray ------------------------------------------------------------------------------------
@pytest.mark.ray
@pytest.mark.slow
def test_c12_ray_restarts_off(ray_session, tmp_path):
    with pytest.raises(RuntimeError) as ei:
        flowkit.train(c12(str(tmp_path / "off"), "reset", "runtime.restart_failed_workers=false", backend="ray"))
    e = ei.value
    assert type(e) is RuntimeError and str(e) == "simulator disconnected"
    assert "in worker 1, sub-env 0 (restart 0)" in _notes(e)
    assert "remote traceback" in _notes(e) and "testing/_faults.py" in _notes(e)
    # an env failing in the actor's constructor keeps its type too (Ray would say ActorDiedError)
    with pytest.raises(RuntimeError) as ei:
        flowkit.train(c12(str(tmp_path / "always"), "always", "runtime.max_worker_restarts=1",
                          "runtime.num_workers=1", backend="ray"))
    assert type(ei.value) is RuntimeError and str(ei.value) == "simulator disconnected"
    assert "worker 0 failed 2 times in a row (runtime.max_worker_restarts=1)" in _notes(ei.value)


@pytest.mark.ray
@pytest.mark.slow
def test_c12_ray_restarts_on_and_worker_killed_from_outside(ray_session, run_dir):
    """Flaky's reset fault hits worker 1 in round 3; then, once 100 env steps are sampled
    (the hook after iteration 5), worker 0's process is SIGKILLed from outside: round 6 fails
    with ActorDiedError and worker 0 is rebuilt in a new process. Iterations:
    20, 40, 70 (10 + 20), 90, 110, 140 (10 + 20)."""
    kill = KillWorkers(every_env_steps=100, worker_index=0, max_kills=1)
    res = flowkit.train(c12(run_dir, "reset", "stop.iterations=6", backend="ray"), plugins=[kill])
    assert [k[:2] for k in kill.kills] == [(110, 0)]
    assert [r["env_steps_sampled"] for r in res.history] == [20, 40, 70, 90, 110, 140]
    assert [r["num_worker_restarts"] for r in res.history] == [0, 0, 1, 1, 1, 2]
    assert res.stop_reason.startswith("stop.iterations")
