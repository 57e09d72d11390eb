"""Issue 28: evaluation obeys stops and deadlines, signals from the first moment of the CLI,
output paths checked before work starts, Ray start-ups that end."""
import csv
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

import flowkit
from flowkit.checkpoint import load_state
from flowkit.engine import find_checkpoint, read_metrics

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = ["runtime.backend=local", "runtime.num_workers=1", "runtime.num_envs_per_worker=1",
        "runtime.rollout_fragment_length=8", "ppo.minibatch_size=8", "ppo.num_epochs=1",
        "run.reporters=[csv,checkpoint,evaluation]", "evaluation.episodes=2"]
# child processes: started with SIGINT/SIGHUP at their defaults, killed after each test
from test_reliability import _CHILDREN, FLOWKIT, _default_signals, _env, _kill_children, _popen  # noqa: E402,F401


def _wait_for(path, proc=None, timeout=60.0):
    end = time.time() + timeout
    while not os.path.exists(path):
        assert time.time() < end and (proc is None or proc.poll() is None), (
            proc.communicate()[1] if proc is not None and proc.poll() is not None else "timed out")
        time.sleep(0.05)


def _resumes(run_dir, iteration):
    res = flowkit.train([f"resume={run_dir}", f"stop.iterations={iteration + 1}", "evaluation.interval=0",
                         "evaluation.final=false"], verbose=False, trust_config=True)  # envs: the tests' own factory
    assert res.metrics["iteration"] == iteration + 1


# ---- evaluation obeys stops and deadlines --------------------------------------------------------
@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
@pytest.mark.slow
def test_a_signal_during_a_stuck_evaluation_keeps_a_resumable_run(tmp_path, sig, code):
    """The periodic evaluation of iteration 2 hangs in env.step (60 s): the signal ends it, the
    final checkpoint holds iteration 1 (before: the signal was held until the evaluation ended)."""
    run_dir, marker = str(tmp_path / "run"), tmp_path / "stuck"
    proc = _popen(["train", *TINY, f"run.dir={run_dir}", "env.factory=envs:stuck_eval",
                   f"env.kwargs={{marker: '{marker}'}}", "evaluation.interval=2", "evaluation.final=true",
                   "stop.iterations=100"])
    _wait_for(marker, proc)
    t0 = time.time()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == code and time.time() - t0 < 15, err
    assert "Traceback" not in err and f"stopped: interrupted ({sig.name})" in out
    summary = json.load(open(os.path.join(run_dir, "result.json")))
    assert summary["stop_reason"] == f"interrupted ({sig.name})" and summary["iteration"] == 1
    assert summary["final_evaluation_error"] == f"not run: interrupted ({sig.name})"
    assert [r["iteration"] for r in read_metrics(os.path.join(run_dir, "metrics.csv"))] == [1]
    assert load_state(find_checkpoint(run_dir))["iteration"] == 1
    _resumes(run_dir, 1)


@pytest.mark.slow
def test_stop_time_s_ends_a_stuck_periodic_evaluation(run_dir):
    t0 = time.perf_counter()
    res = flowkit.train(TINY + [f"run.dir={run_dir}", "env.factory=envs:stuck_eval", "evaluation.interval=2",
                                "stop.time_s=3", "stop.iterations=100"], verbose=False)
    assert time.perf_counter() - t0 < 25
    assert res.stop_reason == "stop.time_s=3.0 reached (iteration abandoned)" and res.metrics["iteration"] == 1
    assert load_state(find_checkpoint(run_dir))["iteration"] == 1
    _resumes(run_dir, 1)


@pytest.mark.parametrize("mode", ["sleep", "endless"])
def test_a_stuck_evaluation_is_abandoned_after_its_deadline_and_the_final_checkpoint_comes_first(run_dir, mode):
    """Periodic (iteration 2) and final evaluation stuck (a step that sleeps, an episode that never
    ends): each is abandoned after evaluation.timeout_s with a warning, the run ends normally with
    its checkpoint (before: the run hung, and the final checkpoint came after the final evaluation)."""
    t0 = time.perf_counter()
    with pytest.warns(UserWarning, match=r"evaluation \(2 episodes\) did not finish within evaluation.timeout_s=1 s"):
        res = flowkit.train(TINY + [f"run.dir={run_dir}", "env.factory=envs:stuck_eval", f"env.kwargs={{mode: {mode}}}",
                                    "evaluation.interval=2", "evaluation.final=true", "evaluation.timeout_s=1",
                                    "stop.iterations=3"], verbose=False)
    assert time.perf_counter() - t0 < 25
    assert res.stop_reason == "stop.iterations=3 reached" and res.metrics["iteration"] == 3
    assert "evaluation_return_mean" not in res.metrics and "final_evaluation" not in res.metrics
    assert "did not finish within evaluation.timeout_s=1 s" in res.metrics["final_evaluation_error"]
    assert [r["iteration"] for r in res.history] == [1, 2, 3]
    assert not any("evaluation_return_mean" in r for r in res.history)
    assert load_state(find_checkpoint(run_dir))["iteration"] == 3
    assert json.load(open(os.path.join(run_dir, "result.json")))["iteration"] == 3


def test_the_evaluation_deadline_defaults_to_sample_timeout_s_and_a_good_evaluation_is_unchanged(run_dir):
    with pytest.warns(UserWarning, match="within runtime.sample_timeout_s=1 s"):
        res = flowkit.train(TINY + [f"run.dir={run_dir}", "env.factory=envs:stuck_eval", "evaluation.final=true",
                                    "runtime.sample_timeout_s=1", "stop.iterations=1"], verbose=False)
    assert "final_evaluation_error" in res.metrics
    res = flowkit.train(TINY + [f"run.dir={run_dir}-ok", "env.factory=envs:FixedLenEnv", "evaluation.final=true",
                                "evaluation.interval=1", "runtime.sample_timeout_s=1", "stop.iterations=2"], verbose=False)
    assert res.metrics["final_evaluation"] is True and res.metrics["evaluation_return_mean"] == 3.0
    assert all(r["evaluation_return_mean"] == 3.0 for r in res.history)


# ---- signals from the first moment of the CLI ----------------------------------------------------
@pytest.mark.parametrize("launcher", ["module", "script"])
@pytest.mark.parametrize("delay", [0.5, 1.0])
def test_a_sigterm_early_in_start_up_exits_143_with_a_message(tmp_path, launcher, delay):
    """Before: the default action (-15, nothing said) up to ~0.25 s in (the CLI took the signals
    only once main() ran), then 143 with nothing said. (Earlier than the interpreter's own start,
    ~0.15 s, here up to 0.3 s under load, no Python code can take a signal: not tested.)"""
    script = os.path.join(os.path.dirname(sys.executable), "flowkit")
    cmd = FLOWKIT if launcher == "module" else [script]
    proc = subprocess.Popen(cmd + ["train", "env=CartPole-v1", "runtime.backend=local", f"run.dir={tmp_path / 'run'}",
                                   "stop.iterations=1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(), preexec_fn=_default_signals())
    _CHILDREN.append(proc)
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, (proc.returncode, err)
    assert "interrupted (SIGTERM)" in out + err and "Traceback" not in err, err


def test_a_signal_while_the_config_is_built_is_held_until_it_is_built():
    """The CI run on record: a SIGTERM 0.5 s in landed inside OmegaConf's config building and came
    out as an unrelated OmegaConf error (exit 1); a loop of 60 such runs also gave exit 2 and even
    0 (the signal lost). Both the CLI's early handler and the run's guard now hold it there."""
    from flowkit import cli
    from flowkit._guard import GUARD, Interrupted
    from flowkit.config import build_config
    from flowkit.hooks import get_plugin_manager
    pm = get_plugin_manager()

    def build():
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs at once, inside the block
        return build_config(["env=CartPole-v1"], None, pm.config_sections())

    with GUARD.running():
        with pytest.raises(Interrupted, match=r"interrupted \(SIGTERM\)"):
            with GUARD.held():
                cfg = build()
    assert cfg.env.id == "CartPole-v1" and GUARD.pending is None
    with GUARD.running():  # the CLI's start-up: a second signal in the block ends the process (next test)
        with pytest.raises(Interrupted, match=r"interrupted \(SIGTERM\)"):
            with GUARD.held(second=cli._exit_on_signal):
                cfg = build()
    assert cfg.env.id == "CartPole-v1" and GUARD.pending is None


def test_a_second_signal_while_one_is_held_ends_the_process_at_once():
    """A held signal waits for the end of the block (a config build, an import); a hung step
    there (an env constructor, a plugin's import) still ends on the second signal."""
    code = ("import signal, time; from flowkit import cli\n"
            "from flowkit._guard import GUARD\n"
            "with GUARD.running(), GUARD.held(second=cli._exit_on_signal):\n"
            "    signal.raise_signal(signal.SIGTERM)\n"
            "    print('held', flush=True)\n"
            "    signal.raise_signal(signal.SIGTERM)\n"
            "    time.sleep(30)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=_env())
    assert p.returncode == 143 and p.stdout == "held\n", (p.returncode, p.stdout, p.stderr)
    assert p.stderr == "flowkit: stopped: interrupted (SIGTERM) while starting\n"


# ---- flowkit evaluate: a deadline, and an env that ends the process ------------------------------
@pytest.fixture(scope="module")
def stuck_eval_run(tmp_path_factory):
    """A trained run whose env gets stuck in evaluation as STUCK_EVAL says (see envs.stuck_eval)."""
    run_dir = str(tmp_path_factory.mktemp("stuck_eval") / "run")
    flowkit.train(TINY + [f"run.dir={run_dir}", "env.factory=envs:stuck_eval", "env.kwargs={mode: from_env}",
                          "stop.iterations=1", "runtime.sample_timeout_s=600"], verbose=False)
    return run_dir


@pytest.mark.parametrize("mode,args,message", [
    ("sleep", ["timeout_s=2"], "did not finish within timeout_s=2 s: a stuck env"),
    ("endless", ["timeout_s=2"], "did not finish within timeout_s=2 s: a stuck env"),
    ("exit", [], "env 'envs:stuck_eval' ended the process (os._exit(3)) during the evaluation"),
    ("sys.exit", [], "env 'envs:stuck_eval' tried to end the process (sys.exit(3)) during the evaluation"),
])
@pytest.mark.slow
def test_evaluate_bounds_a_stuck_env_and_names_an_env_that_exits(stuck_eval_run, mode, args, message):
    """Before: a stuck env or an endless episode hung `flowkit evaluate` without bound (the
    run's 600 s deadline did not apply), and an env's os._exit(3) / sys.exit(3) ended it with
    exit 3 and nothing said."""
    ev = os.path.join(find_checkpoint(stuck_eval_run), "evaluation.json")
    if os.path.exists(ev):
        os.remove(ev)
    t0 = time.time()
    proc = subprocess.run(FLOWKIT + ["evaluate", stuck_eval_run, "--trust-config", "episodes=2", *args], capture_output=True,
                          text=True, env=dict(_env(), STUCK_EVAL=mode), timeout=60)
    assert proc.returncode == 1 and time.time() - t0 < 30, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("flowkit evaluate: error: "), proc.stderr
    assert not os.path.exists(ev)


def test_evaluate_names_an_env_that_raises_in_one_line(stuck_eval_run, capsys, monkeypatch):
    """Issue 28 rerun: an env whose step raised in `flowkit evaluate` ended in its traceback."""
    from flowkit.cli import main
    monkeypatch.setenv("STUCK_EVAL", "raise")
    assert main(["evaluate", stuck_eval_run, "--trust-config", "episodes=2"]) == 1
    assert capsys.readouterr().err == ("flowkit evaluate: error: env 'envs:stuck_eval' (evaluation, sub-env 0) raised "
                                       "in step(): RuntimeError: simulator disconnected\n")


def test_evaluate_with_a_deadline_that_is_not_reached_is_unchanged(stuck_eval_run):
    from flowkit.cli import main
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STUCK_EVAL", "none")
        assert main(["evaluate", stuck_eval_run, "--trust-config", "episodes=2", "timeout_s=30"]) == 0
    rep = json.load(open(os.path.join(find_checkpoint(stuck_eval_run), "evaluation.json")))
    assert rep["returns"] == [3.0, 3.0]


# ---- output paths checked before work; run files never replaced; temp-then-rename writes ---------
@pytest.fixture(scope="module")
def done_run(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("done") / "run")
    flowkit.train(TINY + [f"run.dir={run_dir}", "env.factory=envs:FixedLenEnv", "stop.iterations=2",
                          "run.reporters=[csv,checkpoint]"], verbose=False)
    return run_dir


def _files(run_dir):
    out = {}
    for d, _, fs in os.walk(run_dir):
        for f in fs:
            p = os.path.join(d, f)
            out[os.path.relpath(p, run_dir)] = open(p, "rb").read()
    return out


@pytest.mark.parametrize("cmd,target,message", [
    ("plot", "{run}/metrics.png", "out= '{run}/metrics.csv' would replace the run's own metrics.csv"),
    ("plot", "{run}/learning_curve.png", "would replace the run's own learning_curve.png"),
    ("plot", "{tmp}", "is a folder: give a file name"),
    ("plot", "{tmp}/afile/p.png", "is a file, not a folder"),
    ("export", "{run}/metrics.csv", "would replace the run's own metrics.csv"),
    ("export", "{ck}/state.pt", "would replace the run's own state.pt"),
    ("export", "{run}/config.yaml", "would replace the run's own config.yaml"),
    ("export", "{tmp}", "is a folder: give a file name"),
    ("export", "{tmp}/newdir/", "is a folder: give a file name"),  # before: a file named newdir
    ("plot", "{tmp}/newdir/", "is a folder: give a file name"),
    ("export", "{tmp}/afile/p.pt", "is a file, not a folder"),
    # issue 28 rerun: as root, `--out /dev/full` (now out=/dev/full) replaced the device by the output (renamed over it)
    ("export", "{tmp}/fifo", "is not a regular file (a device, a pipe, a socket or a broken link)"),
    ("plot", "{tmp}/fifo", "is not a regular file (a device, a pipe, a socket or a broken link)"),
])
def test_output_paths_are_checked_before_work_and_never_replace_a_run_file(done_run, tmp_path, capsys, cmd, target,
                                                                          message):
    """Before: IsADirectoryError / FileExistsError tracebacks, and `plot --out RUN/metrics.png` (now out=)
    replaced the run's metrics.csv with the plot's series."""
    from flowkit.cli import main
    (tmp_path / "afile").write_text("x")
    os.mkfifo(tmp_path / "fifo")  # a special file, as /dev/null is
    ck = find_checkpoint(done_run)
    fill = {"run": done_run, "tmp": str(tmp_path), "ck": ck}
    out = target.format(**fill)
    before = _files(done_run)
    args = [done_run, f"out={out}"] + (["format=torchscript"] if cmd == "export" else [])
    assert main([cmd, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message.format(**fill) in err[0], err
    assert _files(done_run) == before


def test_a_read_only_output_folder_is_refused_before_work(done_run, tmp_path, capsys, monkeypatch):
    """(os.access simulated: these tests may run as root, for whom every folder is writable.)"""
    from flowkit.cli import main
    ro = str(tmp_path / "ro")
    os.makedirs(ro)
    ck = find_checkpoint(done_run)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m, **kw: False if os.path.abspath(p) in (ro, ck) else real(p, m, **kw))
    for argv in (["plot", done_run, f"out={ro}/p.png"], ["export", done_run, "format=onnx", f"out={ro}/p.onnx"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is not writable" in err[0], err
    assert main(["evaluate", done_run, "episodes=1", "--trust-config"]) == 0  # figures printed, nothing written
    assert capsys.readouterr().out.splitlines()[-1].endswith(f"{ck} is read-only")
    assert not os.listdir(ro) and not os.path.exists(os.path.join(ck, "evaluation.json"))


@pytest.mark.slow
def test_a_full_disk_leaves_the_previous_plot_and_no_partial_file(done_run, tmp_path):
    """A real write failure: the file size limit (RLIMIT_FSIZE, EFBIG) under the PNG's size.
    Before: a traceback and a 0-byte or truncated plot.png."""
    import resource
    out = tmp_path / "p.png"
    ok = subprocess.run(FLOWKIT + ["plot", done_run, f"out={out}"], capture_output=True, text=True, env=_env())
    assert ok.returncode == 0, ok.stderr
    before = out.read_bytes()
    assert len(before) > 4096

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))
    proc = subprocess.run(FLOWKIT + ["plot", done_run, f"out={out}", "x=time"], capture_output=True,
                          text=True, env=_env(), preexec_fn=limit)
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"flowkit plot: error: cannot write {out}: File too large"), err
    assert out.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["p.csv", "p.png"]


def test_result_json_is_written_through_a_temporary_file(run_dir, monkeypatch, capsys):
    """A failed write of result.json (a full disk, simulated at the flush) is one line, exit 1,
    and leaves no partial file (before: a traceback, result.json left at 0 bytes)."""
    import errno

    from flowkit import _outputs
    from flowkit.cli import main

    real = os.fsync

    def full(fd):  # only for result.json (checkpoints fsync too)
        if ".result.json.tmp-" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)
    monkeypatch.setattr(_outputs.os, "fsync", full)
    assert main(["train", *TINY, f"run.dir={run_dir}", "env.factory=envs:FixedLenEnv", "stop.iterations=1",
                 "run.reporters=[csv,checkpoint]"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"flowkit: error: cannot write {os.path.abspath(run_dir)}/result.json: No space left on device"
    assert sorted(os.listdir(run_dir)) == ["checkpoints", "config.yaml", "metrics.csv"]
    assert load_state(find_checkpoint(run_dir))["iteration"] == 1


def test_a_run_dir_holding_a_projects_config_yaml_is_refused(tmp_path, capsys):
    from flowkit.cli import main
    (tmp_path / "config.yaml").write_text("algo: ppo\n# my project\n")
    assert main(["train", *TINY, f"run.dir={tmp_path}", "env.factory=envs:FixedLenEnv", "stop.iterations=1"]) == 2
    assert "holds a config.yaml that is not a run's" in capsys.readouterr().err
    assert (tmp_path / "config.yaml").read_text() == "algo: ppo\n# my project\n"
    assert sorted(os.listdir(tmp_path)) == ["config.yaml"]


@pytest.mark.parametrize("marker", [".git", "pyproject.toml"])
def test_a_project_root_as_run_dir_is_refused(tmp_path, capsys, marker):
    from flowkit.cli import main
    (tmp_path / marker).mkdir() if marker == ".git" else (tmp_path / marker).write_text("[project]\n")
    assert main(["train", *TINY, f"run.dir={tmp_path}", "env.factory=envs:FixedLenEnv", "stop.iterations=1"]) == 2
    assert f"is a project folder (it holds {marker})" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == [marker]


# ---- Ray start-ups that end ----------------------------------------------------------------------
_HANG = "import time, ray; ray.init = lambda **kw: time.sleep(3600)"
_FAIL = "import ray\ndef f(**kw): raise RuntimeError('Failed to create the object store: mmap failed\\nmore')\nray.init = f"


@pytest.mark.parametrize("patch,message", [
    (_HANG, "flowkit: error: Ray did not start a local cluster within 4 s"),
    (_FAIL, "flowkit: error: Ray could not start a local cluster: RuntimeError: Failed to create the object store: "
            "mmap failed (is memory"),
])
@pytest.mark.slow
def test_a_ray_start_up_that_hangs_or_fails_ends_with_one_line(tmp_path, patch, message):
    """Ray's start hung (object store that cannot be mapped under a memory limit) or failed:
    before, flowkit waited without bound (or printed Ray's traceback)."""
    code = (f"{patch}\nimport sys\nfrom flowkit.cli import main\n"
            f"sys.exit(main(['train', 'env=CartPole-v1', 'runtime.num_workers=1', 'runtime.num_cpus_per_worker=0.5', "
            f"'runtime.start_timeout_s=4', 'ppo.minibatch_size=32', 'stop.iterations=1', 'run.dir={tmp_path / 'run'}']))")
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert proc.returncode == 1 and time.time() - t0 < 40, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), proc.stderr


@pytest.mark.slow
def test_more_worker_processes_than_a_local_cluster_may_run_are_refused_before_spawning():
    """num_cpus_per_worker=0 let num_workers=10000 spawn Ray processes without limit (121 in
    120 s, 10.5 GB). Now as many as the available memory holds at WORKER_MEMORY_MB each, a
    config error at once. (A child process: in this one the test session's own Ray may be up,
    and a caller's session is the caller's to size.)"""
    from flowkit._guard import WORKER_MEMORY_MB, available_memory_mb
    n = int(2 * available_memory_mb() / WORKER_MEMORY_MB) + 1  # (twice: memory freed meanwhile cannot let it pass)
    t0 = time.time()
    p = subprocess.run(FLOWKIT + ["train", "--dry-run", "env=CartPole-v1", f"runtime.num_workers={n}",
                                  "runtime.num_cpus_per_worker=0"], capture_output=True, text=True, env=_env(),
                       timeout=120)
    assert p.returncode == 2, p.stderr
    assert time.time() - t0 < 30
    assert re.search(rf"runtime.num_workers={n}: {n} rollout worker processes need about [0-9.]+ GB \(300 MB each\), "
                     r"this machine has [0-9.]+ GB available: lower runtime.num_workers", p.stderr), p.stderr


def test_stop_evaluation_return_mean_stops_at_the_first_greedy_evaluation_that_reaches_it(run_dir):
    # FixedLenEnv's episodes return 3.0: evaluated at iterations 2, 4, ..., the run stops at 2
    res = flowkit.train(TINY + [f"run.dir={run_dir}", "env.factory=envs:FixedLenEnv", "evaluation.interval=2",
                                "stop.evaluation_return_mean=3", "stop.iterations=10"], verbose=False)
    assert res.metrics["iteration"] == 2 and res.stop_reason == "stop.evaluation_return_mean=3.0 reached"
    with pytest.raises(flowkit.ConfigError, match=r"stop.evaluation_return_mean=3.0 needs periodic evaluation: "
                                                  r"set evaluation.interval"):
        flowkit.train(TINY + [f"run.dir={run_dir}-x", "env.factory=envs:FixedLenEnv", "evaluation.interval=0",
                              "stop.evaluation_return_mean=3"], verbose=False)


# ---- a SIGTERM to the whole process group (Slurm, systemd) -----------------------------------------
def _group_popen(args):
    proc = subprocess.Popen(FLOWKIT + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(), preexec_fn=_default_signals(), start_new_session=True)
    _CHILDREN.append(proc)
    return proc


def _wait_rows(proc, csvs, timeout=180):
    deadline = time.time() + timeout
    while not (len(csvs()) and all(len(read_metrics(c)) >= 1 for c in csvs())):
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else ""
        time.sleep(0.1)


@pytest.mark.slow
def test_a_sigterm_to_a_ray_runs_process_group_keeps_a_resumable_run(tmp_path):
    """Issue 28: a SIGTERM to the whole group (driver, Ray's GCS and raylet, the workers) lost
    the run in 2 of 8 PPO tries (exit 1, no checkpoint). Ray's own processes now run in a
    session of their own: the driver stops the run with the workers still up."""
    run_dir = str(tmp_path / "run")
    proc = _group_popen(["train", "env=CartPole-v1", "--no-tuned", f"run.dir={run_dir}", "stop.iterations=100000"])
    _wait_rows(proc, lambda: [c for c in [os.path.join(run_dir, "metrics.csv")] if os.path.exists(c)])
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "Traceback" not in err, err
    with open(os.path.join(run_dir, "result.json")) as f:
        assert json.load(f)["stop_reason"] == "interrupted (SIGTERM)"
    assert load_state(find_checkpoint(run_dir))


@pytest.mark.slow
def test_a_sigterm_to_a_sweeps_process_group_ends_every_trial_with_its_checkpoint(tmp_path):
    """Issue 28: a SIGTERM to `flowkit tune`'s group exited 130 with a Ray C++ stack dump and left
    every trial without a checkpoint or result.json, with a stale lock. Now: Tune ends the sweep
    (the trials' processes leave the signal to it), each run writes its final checkpoint, the
    table is written, and the exit status is 143."""
    import glob
    sweep = str(tmp_path / "sweep")
    proc = _group_popen(["tune", "algo=ppo", "env=CartPole-v1", "--no-tuned", "runtime.backend=local",
                         "stop.env_steps=2000000", "ppo.lr=choice(1e-3,3e-4)", f"run.dir={sweep}"])
    _wait_rows(proc, lambda: c if len(c := glob.glob(os.path.join(sweep, "0*", "metrics.csv"))) == 2 else [])
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 143, (out, err)
    assert "flowkit tune: stopped: interrupted (SIGTERM)" in err and "SIGTERM received" not in err, err
    trials = sorted(glob.glob(os.path.join(sweep, "0*")))
    assert err.splitlines()[-1] == (  # flowkit's way to go on, not Ray Tune's `Tuner.restore(...)` (issue 48)
        "flowkit tune: stopped: interrupted (SIGTERM); each trial's run folder holds its final checkpoint: "
        f"`flowkit train {shlex.quote('resume=' + trials[0])}` continues that trial (a sweep is not resumed: a new one needs a new "
        "run.dir)") and "Tuner.restore" not in err, err
    assert len(trials) == 2 and os.path.exists(os.path.join(sweep, "tune_results.csv"))
    for t in trials:
        assert os.path.exists(os.path.join(t, "result.json")) and load_state(find_checkpoint(t)), t
        assert not os.path.exists(os.path.join(t, ".lock")), t
        with open(os.path.join(t, "result.json")) as f:  # not "stopped early by the Tune scheduler"
            assert json.load(f)["stop_reason"] == "the sweep was stopped by SIGTERM", t
    with open(os.path.join(sweep, "tune_results.csv")) as f:
        assert [r["status"] for r in csv.DictReader(f)] == ["stopped by SIGTERM"] * 2


# ---- flowkit evaluate beside a live run -------------------------------------------------------------
def test_pruning_leaves_what_evaluate_wrote_and_evaluate_survives_a_pruned_checkpoint(tmp_path, monkeypatch):
    """Issue 28: beside a live run with checkpoint.keep=1, `flowkit evaluate` failed 9 of 10 times
    (its checkpoint pruned while it loaded or ran: "cannot write .../evaluation.json"), and with
    keep=3 the run's pruning deleted the evaluation results. Now a pruned checkpoint's folder keeps
    evaluation.json and videos/ (and is no checkpoint any more), and evaluate loads the newest
    checkpoint again when the one it found is pruned under it."""
    from flowkit import checkpoint as ckm
    from flowkit.evaluation import evaluate

    class EvaluatesEachCheckpoint:  # stands in for an evaluation that finished beside the run
        def flowkit_on_checkpoint(self, path, ctx):
            with open(os.path.join(path, "evaluation.json"), "w") as f:
                f.write("{}")
            os.makedirs(os.path.join(path, "videos"))

    run_dir = str(tmp_path / "run")
    flowkit.train(TINY + ["env=CartPole-v1", f"run.dir={run_dir}", "stop.iterations=4", "checkpoint.every_iters=1", "checkpoint.keep=1",
                          "run.reporters=[csv,checkpoint]"], plugins=[EvaluatesEachCheckpoint()], verbose=False)
    root = os.path.join(run_dir, "checkpoints")
    assert sorted(os.listdir(root)) == ["iter_000001", "iter_000002", "iter_000003", "iter_000004"]
    for d in ["iter_000001", "iter_000002", "iter_000003"]:
        assert sorted(os.listdir(os.path.join(root, d))) == ["evaluation.json", "videos"], d
    assert find_checkpoint(run_dir) == os.path.join(root, "iter_000004")
    ckm.prune_checkpoint(os.path.join(root, "iter_000004"))  # no evaluation outputs: the folder goes
    assert not os.path.exists(os.path.join(root, "iter_000003", "state.pt"))

    flowkit.train(TINY + ["env=CartPole-v1", f"run.dir={tmp_path / 'run2'}", "stop.iterations=2", "checkpoint.every_iters=1",
                          "checkpoint.keep=0", "run.reporters=[csv,checkpoint]"], verbose=False)
    first, newest = (os.path.join(str(tmp_path / "run2"), "checkpoints", d) for d in ("iter_000001", "iter_000002"))
    real_find, calls = ckm.find_checkpoint, []

    def find_then_prune(path):  # the run prunes the checkpoint evaluate found, before it loads
        calls.append(path)
        if len(calls) == 1:
            ckm.prune_checkpoint(newest)
            return newest
        return real_find(path)

    monkeypatch.setattr(ckm, "find_checkpoint", find_then_prune)
    rep = evaluate(str(tmp_path / "run2"), episodes=1)
    assert calls[0] == str(tmp_path / "run2") and rep["checkpoint"] == first
    assert os.path.isfile(os.path.join(first, "evaluation.json"))


def test_a_run_stopped_by_sigterm_inside_an_env_step_lets_every_env_go_before_the_cli_exits(tmp_path):
    """Issue 48 item 7: a PPO Atari run on the local backend stopped by SIGTERM printed ale-py's
    leaked-object report: the abandoned iteration's frames (the env runner's among them) formed a
    cycle with the signal handler's frame, and the CLI's exit collects no cycles (gc.freeze). Every
    env built is freed before the process ends (a leaked one never logs "released")."""
    import subprocess
    import sys
    log = tmp_path / "envs.log"
    p = subprocess.run([sys.executable, "-m", "flowkit.cli", "train", "env.factory=envs:sigterm_at",
                        f"env.kwargs.log={log}", "env.kwargs.at=40", "algo=ppo", "--no-tuned", "runtime.backend=local",
                        "runtime.num_workers=1", "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=32",
                        "ppo.train_batch_size=64", "ppo.minibatch_size=32", "run.reporters=[csv]",
                        f"run.dir={tmp_path}/run"], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__),
                                                                         os.environ.get("PYTHONPATH", "")])})
    assert p.returncode == 143 and "stopped: interrupted (SIGTERM)" in p.stdout, p.stderr[-2000:]
    lines = log.read_text().split()
    assert lines.count("built") == 3 and lines.count("released") == 3, lines  # the probe and 2 sub-envs
