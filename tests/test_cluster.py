"""Attaching to a running Ray cluster (``runtime.address``): a head started in a subprocess
with its own port, temp dir and CPUs (token authentication on; a short temp dir: Ray's socket paths must fit), stopped
by its pid."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*args, env=None, timeout=240):
    return subprocess.run([sys.executable, "-m", "flowkit.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_train_against_a_head_with_token_auth_and_a_clear_error_without_the_token(tmp_path):
    port, token = _free_port(), "flowkit-test-token-0123456789abcdef"
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    head = subprocess.Popen([ray_bin, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                             f"--temp-dir={tempfile.mkdtemp(prefix='fk', dir='/tmp')}", "--block"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        common = ["train", "algo=ppo", "env=CartPole-v1", f"runtime.address=127.0.0.1:{port}", "stop.iterations=2",
                  "runtime.num_workers=1", "run.reporters=[csv]"]
        env_client = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        env_client["RAY_AUTH_TOKEN"] = token
        r = _cli(*common, f"run.dir={tmp_path / 'a'}", env=env_client)
        assert r.returncode == 0, r.stderr[-3000:]
        assert os.path.exists(tmp_path / "a" / "result.json")
        env_client.pop("RAY_AUTH_TOKEN")
        env_client["HOME"] = str(tmp_path)  # no ~/.ray/auth_token either
        r = _cli(*common, f"run.dir={tmp_path / 'b'}", env=env_client)
        assert r.returncode == 2 and "RAY_AUTH_TOKEN" in r.stderr, r.stderr[-3000:]
        assert "Traceback" not in r.stderr
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(60)


def test_an_unreachable_address_fails_within_seconds_with_one_line(tmp_path):
    t = time.time()
    r = _cli("train", "algo=ppo", "env=CartPole-v1", f"runtime.address=127.0.0.1:{_free_port()}",
             f"run.dir={tmp_path}", timeout=120)
    assert r.returncode == 2 and "no Ray cluster answers" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and time.time() - t < 60


def test_an_address_where_a_web_server_answers_fails_at_once_with_one_line(tmp_path):
    """The dashboard's port (8265) given for the head's (6379): an HTTP/1 server answers, not
    gRPC; without the check Ray retried for 30 s, printing its own warnings."""
    import http.server
    import threading
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        t = time.time()
        r = _cli("train", "algo=ppo", "env=CartPole-v1", f"runtime.address=127.0.0.1:{server.server_port}",
                 f"run.dir={tmp_path}", timeout=120)
        took = time.time() - t
    finally:
        server.shutdown()
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [
        f"flowkit: config error: runtime.address='127.0.0.1:{server.server_port}': 127.0.0.1:{server.server_port} "
        "answers, but not as a Ray head's GCS (gRPC): another service, such as the dashboard (port 8265)? Use the "
        "address `ray start --head` prints (port 6379 by default)"], r.stderr[-2000:]
    assert took < 15, took  # (Python, flowkit and Ray's imports; no retries)


def test_a_local_session_listens_on_loopback_without_dashboard_or_monitor(tmp_path):
    """Issue 12: flowkit's own local Ray binds to 127.0.0.1 only and starts no dashboard/API
    server or autoscaler monitor (seconds of start-up and shutdown a run never uses); its raylet
    does not wait for its agents, which start 10 s later (the first ones of a session, when they
    would take CPU from the run's start-up) and run, as the log monitor does, at nice 19; they end
    with the session, started or not."""
    code = ("import json, os, subprocess, sys, flowkit, ray\n"
            f"flowkit.train(['env=CartPole-v1', 'runtime.backend=ray', 'runtime.num_workers=1', 'stop.iterations=1',"
            f" 'run.reporters=[csv]', 'run.dir={tmp_path}'])\n"
            "n = ray._private.worker._global_node\n"
            "import flowkit._ray\n"
            "pid = lambda k: n.all_processes[k][0].process.pid\n"
            "import time\n"
            "ps = lambda: subprocess.run(['ps', '-o', 'pid=,ni=,args=', '--ppid', str(pid('raylet'))], capture_output=True,"
            " text=True).stdout.splitlines()\n"
            "for _ in range(60):  # agents start late; then they retitle themselves ray::...Agent\n"
            "    agents = [a.split(None, 1)[1] for a in ps() if 'agent' in a.lower() and '_ray.py' not in a]\n"
            "    if len(agents) >= 2:\n"
            "        break\n"
            "    time.sleep(0.5)\n"
            "pids = [int(a.split()[0]) for a in ps() if 'agent' in a.lower()]\n"
            "nice = [a.split()[0] for a in agents] + [os.getpriority(os.PRIO_PROCESS, pid('log_monitor'))]\n"
            "raylet = open(f'/proc/{pid(\"raylet\")}/cmdline').read().split(chr(0))\n"
            "procs = sorted(n.all_processes)\n"
            "flowkit._ray.stop()\n"
            "def alive(p):\n"
            "    try:\n"
            "        os.kill(p, 0)\n"
            "        return open(f'/proc/{p}/stat').read().split()[2] != 'Z'\n"
            "    except (OSError, IndexError):\n"
            "        return False\n"
            "for _ in range(20):\n"
            "    if not any(map(alive, pids)):\n"
            "        break\n"
            "    time.sleep(0.5)\n"
            "print(json.dumps({'left': [p for p in pids if alive(p)], 'ip': n.node_ip_address, 'gcs': n.gcs_address,"
            " 'procs': procs, 'nice': nice, 'raylet': raylet}))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["ip"] == "127.0.0.1" and out["gcs"].startswith("127.0.0.1:"), out
    assert "dashboard" not in out["procs"] and "monitor" not in out["procs"] and "raylet" in out["procs"], out
    assert out["nice"] == ["19", "19", 19] and "--dashboard_agent_listen_port=-1" in out["raylet"], out
    assert "token" not in p.stderr.lower(), p.stderr[-2000:]  # no token warning on a local run
    later = [a.split("=", 1)[1].split()[1:5] for a in out["raylet"] if re.match("--(dashboard|runtime_env)_agent_command=", a)]
    assert [w[:1] + w[2:] for w in later] == [["-S", "10", "19"]] * 2 and later[0][1].endswith("_ray.py"), later
    assert out["left"] == [], out  # the agents ended with the session
    assert os.path.exists(tmp_path / "result.json")
