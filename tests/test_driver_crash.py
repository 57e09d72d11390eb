"""Issue 6, part 3: the driver is SIGKILLed after a checkpoint; `flowkit train resume=RUN_DIR`
continues from the last checkpoint, and nothing on disk is corrupt.

One worker x 2 sub-envs x rollout_fragment_length 16: every iteration samples 32 env steps,
so iteration k ends at env_steps_sampled = 32 k whether or not the run was interrupted.
"""
import csv
import os
import signal
import subprocess
import sys
import time

import pytest

from flowkit.checkpoint import load_state
from flowkit.engine import find_checkpoint, read_metrics

FLOWKIT = [sys.executable, "-m", "flowkit.cli"]


def _overrides(run_dir):
    return ["env=CartPole-v1", "runtime.backend=local", f"run.dir={run_dir}", "run.reporters=[csv,checkpoint,evaluation]", "runtime.num_workers=1", "runtime.num_envs_per_worker=2",
            "runtime.rollout_fragment_length=16", "ppo.minibatch_size=16", "ppo.num_epochs=1",
            "checkpoint.every_iters=1", "checkpoint.keep=2"]


@pytest.mark.slow
def test_driver_sigkill_then_resume(tmp_path):
    run_dir = str(tmp_path / "run")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(FLOWKIT + ["train", *_overrides(run_dir), "stop.env_steps=10000000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    ck_root = os.path.join(run_dir, "checkpoints")
    deadline = time.time() + 120
    try:
        while time.time() < deadline:
            done = [d for d in os.listdir(ck_root) if d.startswith("iter_")] if os.path.isdir(ck_root) else []
            if any(d >= "iter_000003" for d in done):
                break
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.05)
        else:
            raise AssertionError("no checkpoint within 120 s")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL

    # the wreckage a crash can leave: a half-written checkpoint folder and a torn CSV row
    os.makedirs(os.path.join(ck_root, ".tmp-crashed"), exist_ok=True)
    with open(os.path.join(ck_root, ".tmp-crashed", "state.pt"), "wb") as f:
        f.write(b"\x80\x02garbage")
    with open(os.path.join(run_dir, "metrics.csv"), "a") as f:
        f.write("1,3")
    ck = find_checkpoint(run_dir)
    n = load_state(ck)["iteration"]
    assert n >= 3 and os.path.basename(ck) == f"iter_{n:06d}"

    out = subprocess.run(FLOWKIT + ["train", f"resume={run_dir}", f"stop.iterations={n + 2}", "run.reporters=[csv,plot,checkpoint,evaluation]"],
                         capture_output=True, text=True, env=env, timeout=180)
    assert out.returncode == 0, out.stderr
    rows = read_metrics(os.path.join(run_dir, "metrics.csv"))
    assert [r["iteration"] for r in rows] == list(range(1, n + 3))
    assert [r["env_steps_sampled"] for r in rows] == [32 * k for k in range(1, n + 3)]
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        lines = list(csv.reader(f))
    assert all(len(line) == len(lines[0]) for line in lines)  # no torn row left
    for d in os.listdir(ck_root):  # every checkpoint left loads; no temp folder survives
        assert not d.startswith("."), d
        st = load_state(os.path.join(ck_root, d))
        assert st["counters"]["env_steps_sampled"] == 32 * st["iteration"]
    assert find_checkpoint(run_dir).endswith(f"iter_{n + 2:06d}")
