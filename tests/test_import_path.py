"""Issue 27 item 1: a run started from a folder that holds a folder named ``flowkit`` (the parent
folder of a clone). Ray puts the driver's current folder first on its workers' import path, so
the workers imported that folder (a namespace package) and failed in the first plugin with
"module 'flowkit' has no attribute 'hookimpl'", restarted 3 times."""
import os
import subprocess
import sys

import pytest

from flowkit.core.workers import WorkerImportError, WorkerSet
from flowkit.engine import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_ray_run_from_a_folder_holding_a_flowkit_folder(tmp_path):
    (tmp_path / "flowkit").mkdir()  # as `cd ~` with the clone in ~/flowkit
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    cli = os.path.join(os.path.dirname(sys.executable), "flowkit")
    p = subprocess.run([cli, "train", "algo=ppo", "env=CartPole-v1", "runtime.backend=ray", "runtime.num_workers=1",
                        "runtime.num_envs_per_worker=1", "runtime.rollout_fragment_length=32", "ppo.train_batch_size=32",
                        "ppo.minibatch_size=32", "ppo.num_epochs=1", "stop.iterations=2", "run.reporters=[csv]",
                        f"run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "stopped: stop.iterations=2 reached" in p.stdout, p.stdout[-2000:]
    assert "hookimpl" not in p.stderr and "rebuilding" not in p.stderr, p.stderr[-3000:]


def test_a_namespace_flowkit_is_named_when_flowkit_core_is_imported(tmp_path):
    """What a worker with such a folder first on its path says (an external Ray session, a cluster)."""
    (tmp_path / "flowkit").mkdir()
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import flowkit; import flowkit.core"
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: `import flowkit` in this process"), p.stderr[-2000:]
    assert f"found the folder {tmp_path / 'flowkit'} (no __init__.py" in last
    assert f"not the flowkit package {os.path.join(ROOT, 'flowkit')}" in last


@pytest.mark.parametrize("text, expect", [
    ("ray.exceptions.RaySystemError: System error: module 'flowkit' has no attribute 'hookimpl'\ntraceback: ...\n"
     "AttributeError: module 'flowkit' has no attribute 'hookimpl'\n", "module 'flowkit' has no attribute 'hookimpl'"),
    ("The actor died ...\n  File \"x.py\", line 3\nModuleNotFoundError: No module named 'flowkit_ppo'\n",
     "No module named 'flowkit_ppo'"),
    ("ActorDiedError ... ImportError: `import flowkit` in this process (pid 7) found the folder /a/flowkit (no "
     "__init__.py ...)\n", "`import flowkit` in this process (pid 7) found the folder /a/flowkit"),
])
def test_a_worker_that_cannot_import_flowkit_or_a_plugin_stops_the_run_at_once(text, expect):
    _, cfg = load_config(["algo=ppo", "env=CartPole-v1", "runtime.backend=local", "runtime.max_worker_restarts=3"])
    ws = WorkerSet(cfg, {}, None)
    with pytest.raises(WorkerImportError, match="^rollout worker 0 cannot import flowkit or a plugin: ") as ei:
        ws.on_failure(type("A", (), {"index": 0, "is_remote": False})(), RuntimeError(text))
    assert expect in str(ei.value) and "\n" not in str(ei.value)
    assert ws.num_restarts == 0


def test_other_worker_failures_are_still_restarted():
    _, cfg = load_config(["algo=ppo", "env=CartPole-v1", "runtime.backend=local"])
    ws = WorkerSet(cfg, {}, None)  # not started: on_failure answers without rebuilding
    assert ws.on_failure(type("A", (), {"index": 0, "is_remote": False})(),
                         RuntimeError("ModuleNotFoundError: No module named 'my_envs'")) is False
