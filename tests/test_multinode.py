"""Issue 50, item 5: multi-node on one machine. A head and two more nodes
(ray.cluster_utils.Cluster), PPO CartPole with 2 rollout workers (``runtime.worker_scheduling=
SPREAD``) and a group of learner processes (``learner.placement_strategy``); each scenario in
its own process (it needs its own Ray cluster):

- ``spread``: the workers and the learners are spread over the nodes; then the node of a
  learner (not the head) is removed after iteration 2: the group is rebuilt on the nodes left
  and the run ends at iteration 5, its workers rebuilt where the node held one.
- ``no_room``: 3 learners, STRICT_SPREAD, one per node; a learner's node is removed: the group
  cannot be placed again, the run stops with a one-line error naming the group within
  ``runtime.start_timeout_s`` (60 s), never a hang, and its crash checkpoint resumes (one learner).
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import json, sys
    import ray
    from ray.cluster_utils import Cluster
    import flowkit

    scenario, run_dir = sys.argv[1], sys.argv[2]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    head = cluster.head_node.node_id

    def node_of(worker):
        return ray.get_runtime_context().get_node_id()

    class Watch:
        before = after = None

        def flowkit_on_train_result(self, result, ctx):
            group = ctx.learners["ppo"]
            if result["iteration"] == 2:
                self.before = {"workers": ctx.workers.foreach_worker("apply", node_of), "learners": group.node_ids()}
                lost = next(n for n in nodes if n.node_id in self.before["learners"])
                self.lost = lost.node_id
                cluster.remove_node(lost)
            if result["iteration"] == 5:
                self.after = {"workers": ctx.workers.foreach_worker("apply", node_of), "learners": group.node_ids(),
                              "rebuilds": group.num_rebuilds}

    watch = Watch()
    n, strategy, wait = (2, "SPREAD", 180) if scenario == "spread" else (3, "STRICT_SPREAD", 60)
    base = ["env=CartPole-v1", "seed=0", f"runtime.address={cluster.address}", "runtime.num_workers=2",
            "runtime.num_cpus_per_worker=0.25", "runtime.worker_scheduling=SPREAD", "runtime.num_envs_per_worker=2",
            "runtime.rollout_fragment_length=50", f"runtime.start_timeout_s={wait}", "ppo.num_epochs=1",
            f"learner.num_learners={n}", "learner.num_cpus_per_learner=0.25", f"learner.placement_strategy={strategy}",
            "run.reporters=[csv,checkpoint]", "run.min_iter_env_steps=0"]
    out = {"head": head, "nodes": [x.node_id for x in nodes]}
    try:
        res = flowkit.train([*base, "stop.iterations=5", "run.dir=" + run_dir], plugins=[watch])
        out.update(stop=res.stop_reason, steps=[r["env_steps_sampled"] for r in res.history],
                   restarts=res.metrics["num_worker_restarts"])
    except Exception as e:
        out.update(error=f"{type(e).__name__}: {e}")
        print("ERROR " + out["error"], file=sys.stderr, flush=True)
        import glob
        ckpts = sorted(glob.glob(run_dir + "/checkpoints/*"))
        out["checkpoints"] = [c.rsplit("/", 1)[-1] for c in ckpts]
        again = flowkit.train([f"resume={run_dir}", "learner.num_learners=0", "stop.iterations=4"])
        out.update(resumed=[r["iteration"] for r in again.history], resumed_stop=again.stop_reason)
    out.update(before=watch.before, after=watch.after, lost=getattr(watch, "lost", None))
    print("RESULT " + json.dumps(out))
    flowkit._ray.stop()
    cluster.shutdown()
''')


def _run(tmp_path, scenario):
    script = tmp_path / "multinode.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, RAY_DEDUP_LOGS="0", RAY_health_check_period_ms="500",
               RAY_health_check_failure_threshold="4", RAY_health_check_initial_delay_ms="0")
    out = subprocess.run([sys.executable, str(script), scenario, str(tmp_path / "run")], capture_output=True,
                         text=True, timeout=500, env=env, cwd=str(tmp_path))
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout[-3000:] + out.stderr[-5000:]
    return json.loads(lines[-1][len("RESULT "):]), out.stderr


@pytest.mark.ray
@pytest.mark.slow
def test_workers_and_learners_spread_over_nodes_and_a_lost_learner_node_is_survived(tmp_path):
    r, err = _run(tmp_path, "spread")
    assert len(set(r["before"]["workers"])) == 2 and len(set(r["before"]["learners"])) == 2
    assert len(set(r["before"]["workers"]) | set(r["before"]["learners"])) == 3  # every node holds one
    assert r["lost"] in r["before"]["learners"] and r["lost"] != r["head"]
    assert r["stop"].startswith("stop.iterations") and r["after"]["rebuilds"] == 1
    assert r["lost"] not in r["after"]["learners"] + r["after"]["workers"]
    assert r["restarts"] == r["before"]["workers"].count(r["lost"])
    assert "learner group ppo:" in err and "rebuilding the group and retrying the update" in err


@pytest.mark.ray
@pytest.mark.slow
def test_a_learner_node_lost_without_room_stops_with_a_clear_error_and_a_resumable_checkpoint(tmp_path):
    r, _ = _run(tmp_path, "no_room")
    assert r["before"] is not None, r
    assert len(set(r["before"]["learners"])) == 3
    assert r["error"].startswith("RuntimeError: learner group ppo: 3 x {'CPU': 0.25} (STRICT_SPREAD) could not be "
                                 "placed within 60 s; free: "), r["error"]
    assert r["checkpoints"] and r["resumed"][-1] == 4 and r["resumed_stop"].startswith("stop.iterations")
