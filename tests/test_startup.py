"""Issue 12: start-up. The rollout workers of a new local Ray session are prestarted (plugins and
envs built while the driver imports torch and builds the learner) and taken by the run whose
config they were built for; otherwise they are killed and the run creates its own."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow

CODE = """
import json, sys, flowkit
from flowkit import _ray
from flowkit.core import workers
from flowkit.engine import load_config
made, orig = [], workers.WorkerSet._make
def _make(self, index, handle=None):
    made.append(handle is not None)
    return orig(self, index, handle)
workers.WorkerSet._make = _make
base = ['env=CartPole-v1', 'runtime.backend=ray', 'runtime.num_workers=2', 'runtime.num_envs_per_worker=1',
        'runtime.rollout_fragment_length=16', 'ppo.minibatch_size=32', 'ppo.num_epochs=1', 'stop.iterations=3',
        'run.reporters=[csv]']
def run(name, *extra, over=base):
    made.clear()
    try:
        r = flowkit.train(over + [f'run.dir={sys.argv[1]}/{name}', *extra], verbose=False)
        return {'made': list(made), 'rows': [[h['env_steps_sampled'], h['episode_return_mean']] for h in r.history]}
    except Exception as e:
        return {'made': list(made), 'error': f'{type(e).__name__}: {e}'}
out = {'prestarted': run('a')}
_ray.stop()
_ray.start(load_config(base + ['seed=1'])[1], prestart=True)  # built for another seed: not taken
out['other'] = run('b')
_ray.stop()
_ray.start(load_config(base)[1])  # a session without prestarted workers
out['fresh'] = run('c')
_ray.stop()  # an env that fails in the prestarted worker's second half (its runner resets it)
out['failing'] = run('d', 'env.factory=flowkit.testing:flaky_env', 'env.kwargs.fail=always', 'runtime.num_workers=1',
                     'runtime.max_worker_restarts=0', over=base[1:])
print(json.dumps(out))
"""


def test_prestarted_workers_are_taken_by_their_run_and_killed_otherwise(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    p = subprocess.run([sys.executable, "-c", CODE, str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["prestarted"]["made"] == [True, True], out
    assert out["other"]["made"] == [False, False] and len(out["other"]["rows"]) == 3, out
    assert out["fresh"]["made"] == [False, False], out
    assert out["prestarted"]["rows"] == out["fresh"]["rows"], out  # the same run either way
    assert out["failing"]["made"] == [True], out
    assert out["failing"]["error"].startswith("RuntimeError: simulator disconnected"), out


ADDONS = """
import json, sys
import ray
from flowkit import _ray
from flowkit.core.workers import prestart
from flowkit.engine import load_config
from flowkit.hooks.manager import worker_plugin_manager
mods = ('pydantic', 'starlette', 'pyarrow')
cfg = load_config(['env=CartPole-v1', 'runtime.backend=ray', 'runtime.num_workers=2'])[1]
_ray.start(cfg)
_ray.wait()
_, handles = prestart(cfg, worker_plugin_manager)
workers = ray.get([h.__ray_call__.remote(lambda self: [m for m in mods if m in sys.modules]) for h in handles])
print(json.dumps({'workers': workers, 'driver': [m for m in mods if m in sys.modules]}))
_ray.stop()
"""


def test_ray_sessions_serialize_without_importing_pydantic_starlette_or_pyarrow():
    """Ray's serialization context imports them to register serializers flowkit never uses (0.17 s
    of CPU per process before the first sample); flowkit's driver and rollout workers skip that."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    p = subprocess.run([sys.executable, "-c", ADDONS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {"workers": [[], []], "driver": []}
