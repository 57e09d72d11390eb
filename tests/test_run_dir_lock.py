"""Issue 28, item 6: the run.dir lock is atomic (flock), names its host and pid, is taken over
when its process is gone (same host) and, for another host, only with --take-over-lock."""
import multiprocessing as mp
import os
import queue
import signal
import socket
import subprocess
import sys
import threading

import pytest

from flowkit._guard import lock_run_dir
from flowkit.config import ConfigError

N = 60


def _taker(run_dir, start, hold, results):
    start.wait()
    try:
        release = lock_run_dir(run_dir)
    except ConfigError as e:
        results.put(("refused", os.getpid(), str(e)))
        hold.wait()
        return
    results.put(("won", os.getpid(), ""))
    hold.wait()  # hold it while the others try
    release()


@pytest.mark.parametrize("kind", ["processes", "threads"])
@pytest.mark.slow
def test_sixty_simultaneous_takers_exactly_one_wins(tmp_path, kind):
    """(Before: check-then-write; threads of one process all took it, as did 26 of 60 processes
    in the issue's tries.)"""
    run_dir = str(tmp_path / "run")
    if kind == "processes":
        ctx = mp.get_context("fork")
        start, hold, results = ctx.Barrier(N), ctx.Barrier(N), ctx.Queue()
        procs = [ctx.Process(target=_taker, args=(run_dir, start, hold, results)) for _ in range(N)]
    else:
        start, hold, results = threading.Barrier(N), threading.Barrier(N), queue.Queue()
        procs = [threading.Thread(target=_taker, args=(run_dir, start, hold, results)) for _ in range(N)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in range(N)]
    for p in procs:
        p.join(60)
    won = [pid for what, pid, _ in got if what == "won"]
    assert len(won) == 1, [w for w, _, _ in got].count("won")
    refused = [msg for what, _, msg in got if what == "refused"]
    assert len(refused) == N - 1
    assert all(f"is in use by a live run (pid {won[0]})" in m or "is in use by a live run (pid ?)" in m
               for m in refused), refused
    assert not os.path.exists(os.path.join(run_dir, ".lock"))  # released by the winner
    lock_run_dir(run_dir)()  # free again


def test_the_lock_of_a_killed_run_is_taken_over_and_names_host_and_pid(tmp_path):
    run_dir = str(tmp_path / "run")
    code = ("import sys, time; from flowkit._guard import lock_run_dir; lock_run_dir(sys.argv[1]); "
            "print('locked', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code, run_dir], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "locked"
        with open(os.path.join(run_dir, ".lock")) as f:
            assert f.read() == f"{p.pid} {socket.gethostname()}\n"
        with pytest.raises(ConfigError, match=rf"is in use by a live run \(pid {p.pid}\)"):
            lock_run_dir(run_dir)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    release = lock_run_dir(run_dir)  # its process is gone: taken over
    with open(os.path.join(run_dir, ".lock")) as f:
        assert f.read() == f"{os.getpid()} {socket.gethostname()}\n"
    release()
    assert not os.path.exists(os.path.join(run_dir, ".lock"))


def test_a_lock_from_another_host_needs_the_explicit_option(tmp_path):
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, ".lock"), "w") as f:
        f.write("4242 node-b\n")
    with pytest.raises(ConfigError, match=r"locked by a run on host 'node-b' \(pid 4242\).*--take-over-lock"):
        lock_run_dir(run_dir)
    release = lock_run_dir(run_dir, take_over=True)
    with open(os.path.join(run_dir, ".lock")) as f:
        assert f.read().split() == [str(os.getpid()), socket.gethostname()]
    release()
