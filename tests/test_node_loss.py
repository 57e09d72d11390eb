"""Issue 6, part 2: a node is lost mid-run; training completes on the remaining node.

In its own process (it needs its own Ray cluster): a two-node cluster on this machine
(ray.cluster_utils.Cluster). The head's only CPU is held by a placeholder actor, so both
rollout workers (0.5 CPU each) land on the second node. flowkit connects with
``runtime.address`` (so the code reaches the workers through the Ray runtime_env,
py_modules, not the local install). After iteration 2 a hook removes the second node and
frees the head: the workers die with the node, are rebuilt on the head, and the run ends at
iteration 5.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import json, os, sys
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    import flowkit

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    node2 = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    head_id = cluster.head_node.node_id
    ray.init(address=cluster.address, namespace="nodeloss", logging_level="error", log_to_driver=False)

    @ray.remote(num_cpus=1)
    class Placeholder:
        def ping(self):
            return True

    ph = Placeholder.options(name="placeholder", lifetime="detached",
                             scheduling_strategy=NodeAffinitySchedulingStrategy(head_id, soft=False)).remote()
    ray.get(ph.ping.remote())
    ray.shutdown()

    def node_of(worker):
        return ray.get_runtime_context().get_node_id()

    def flowkit_file(worker):
        import flowkit, flowkit_ppo
        return [flowkit.__file__, flowkit_ppo.__file__]

    class NodeLoss:
        before = after = files = None

        def flowkit_on_train_result(self, result, ctx):
            if result["iteration"] == 2:
                self.before = ctx.workers.foreach_worker("apply", node_of)
                self.files = ctx.workers.foreach_worker("apply", flowkit_file)
                cluster.remove_node(node2)
                ray.kill(ray.get_actor("placeholder", namespace="nodeloss"))
            if result["iteration"] == 5:
                self.after = ctx.workers.foreach_worker("apply", node_of)

    hook = NodeLoss()
    res = flowkit.train(["env=CartPole-v1", f"runtime.address={cluster.address}", "runtime.num_workers=2",
                         "runtime.num_cpus_per_worker=0.5", "runtime.num_envs_per_worker=2",
                         "runtime.rollout_fragment_length=50", "stop.iterations=5", "ppo.num_epochs=1",
                         "run.dir=" + sys.argv[1], "run.reporters=[csv,checkpoint,evaluation]",
                         "checkpoint.at_end=false"], plugins=[hook])
    print("RESULT " + json.dumps({"head": head_id, "node2": node2.node_id, "before": hook.before,
                                  "after": hook.after, "files": hook.files,
                                  "steps": [r["env_steps_sampled"] for r in res.history],
                                  "restarts": res.metrics["num_worker_restarts"], "stop": res.stop_reason}))
    flowkit._ray.stop()  # flowkit keeps its session for later runs: end it first
    cluster.shutdown()
''')


@pytest.mark.ray
@pytest.mark.slow
def test_node_loss_training_completes_on_remaining_node(tmp_path):
    script = tmp_path / "node_loss.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, RAY_DEDUP_LOGS="0", RAY_health_check_period_ms="500",
               RAY_health_check_failure_threshold="4", RAY_health_check_initial_delay_ms="0")
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True,
                         timeout=400, env=env, cwd=str(tmp_path))
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout[-3000:] + out.stderr[-5000:]
    r = json.loads(lines[-1][len("RESULT "):])
    assert r["before"] == [r["node2"], r["node2"]]
    assert r["after"] == [r["head"], r["head"]]
    assert r["restarts"] == 2 and r["stop"].startswith("stop.iterations")
    # one round is 2 workers x 2 envs x 50 = 200 env steps; the round that found both workers
    # dead yields nothing, so iteration 3 is the next full round
    assert r["steps"] == [200, 400, 600, 800, 1000]
    # flowkit and the PPO plugin came to the workers through the runtime_env, not the checkout
    for files in r["files"]:
        for f in files:
            assert "runtime_resources" in f and not f.startswith(os.path.dirname(os.path.dirname(__file__))), f
