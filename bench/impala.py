"""IMPALA throughput: the async plan (learner thread, weights pushed to the producing worker)
against the bulk-sync plan driving the same learner (``impala.rollout_mode=bulk_sync``), and
APPO (the same async plan with its clipped-surrogate loss and target network), on the same
workers, env and learner settings; optionally RLlib's IMPALA on the same env and worker count.

Setting: CartPole-v1, 2 Ray rollout workers x 8 sub-envs, rollout_fragment_length 32,
train_batch_size 512, lr 1e-3, one learner thread (torch 1 thread), Ray with num_cpus=2.
Each plan runs ``--time-s`` seconds, ``--repeats`` times, alternating (the median is shown);
the first reported iteration (start-up) is left out of the rates.

Columns: env steps/s sampled (steady state) and the ratio to the strict bulk-sync plan;
policy lag (learner updates between the weights a batch was sampled with and the weights it
trains: mean, and the largest seen); CPU utilisation (CPU seconds per wall second; 1.0 = one
core) of the driver process (learner thread included) and of each worker (mean); the
learner's busy fraction; the final episode_return_mean.

RLlib runs in a separate virtualenv (it pins another gymnasium): give its python with
``--rllib-python`` (default ``/tmp/rllib_venv/bin/python`` when it exists; ``--no-rllib`` to
skip). How that one was made, leaving ``.venv`` untouched (RLlib ships inside the ray wheel;
only its extras go into the new venv, ray and torch are reused from ``.venv`` through a path
appended last)::

    python3.11 -m venv /tmp/rllib_venv
    echo "import sys; sys.path.append('$PWD/.venv/lib/python3.11/site-packages')" \
        > /tmp/rllib_venv/lib/python3.11/site-packages/zz_main_venv.pth
    /tmp/rllib_venv/bin/pip install "gymnasium==1.2.2" pandas "pyarrow>=17" dm_tree lz4 \
        "ormsgpack>=1.7" scipy "tensorboardX>=1.9" "pydantic>=2.5,<3" fsspec
 RLlib 2.60's new-API-stack IMPALA sampled nothing on this 2-core machine (its requests
to the env runners never completed), so the old API stack (IMPALA with a learner thread, the
one the RLlib Flow paper measured) is used.

    python bench/impala.py                    # 2 x 30 s per plan
    python bench/impala.py --time-s 10 --repeats 1 --no-rllib      # a quick look
    python bench/impala.py --acceptance 0 1 2 3 4    # configs/impala/CartPole-v1.yaml per seed:
                                                     # env steps to episode_return_mean >= 450
    python bench/impala.py --acceptance 0 1 2 --algo appo  # configs/appo/CartPole-v1.yaml
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("RAY_DEDUP_LOGS", "0")

ENV, WORKERS, ENVS, FRAGMENT, BATCH, LR = "CartPole-v1", 2, 8, 32, 512, 1e-3


def steady_rate(rows, key_steps, key_time):
    rows = rows[1:] if len(rows) > 2 else rows
    if len(rows) < 2:
        return float("nan")
    return (rows[-1][key_steps] - rows[0][key_steps]) / max(rows[-1][key_time] - rows[0][key_time], 1e-9)


def _mean(rows, key):
    vals = [r[key] for r in rows[1:] if key in r]
    return statistics.fmean(vals) if vals else float("nan")


def run_flowkit(mode: str, prefetch: bool, time_s: float, seed: int, hidden: str = "64,64", algo: str = "impala"):
    import flowkit
    from flowkit.engine import read_metrics
    run_dir = tempfile.mkdtemp(prefix="flowkit-bench-impala-")
    res = flowkit.train([f"algo={algo}", f"env={ENV}", f"seed={seed}", "runtime.backend=ray",
                         f"runtime.num_workers={WORKERS}", f"runtime.num_envs_per_worker={ENVS}",
                         f"runtime.rollout_fragment_length={FRAGMENT}", f"runtime.prefetch={str(prefetch).lower()}",
                         f"{algo}.rollout_mode={mode}", f"{algo}.train_batch_size={BATCH}", f"{algo}.lr={LR}",
                         f"model.hidden_sizes=[{hidden}]",
                         f"stop.time_s={time_s}", "run.min_iter_time_s=1", f"run.dir={run_dir}",
                         "run.reporters=[csv,checkpoint,evaluation]", "checkpoint.at_end=false"])
    rows = read_metrics(os.path.join(run_dir, "metrics.csv"))
    return {"rate": steady_rate(rows, "env_steps_sampled", "time_total_s"),
            "lag": _mean(rows, "learner/default/policy_lag_mean"),
            "lag_max": max((r.get("learner/default/policy_lag_max", 0) for r in rows), default=float("nan")),
            "cpu_driver": _mean(rows, "perf/cpu_util_driver"),
            "cpu_workers": _mean(rows, "perf/cpu_util_workers"),
            "busy": _mean(rows, "perf/learner_busy_frac"),
            "return": res.metrics["episode_return_mean"]}


def rllib_child(time_s: float, seed: int) -> None:
    """Runs inside RLlib's virtualenv; prints one JSON line."""
    import ray
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="error")
    from ray.rllib.algorithms.impala import IMPALAConfig
    cfg = (IMPALAConfig().environment(ENV)
           .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
           .env_runners(num_env_runners=WORKERS, num_envs_per_env_runner=ENVS, rollout_fragment_length=FRAGMENT)
           .resources(num_gpus=0).reporting(min_time_s_per_iteration=1)
           .training(train_batch_size=BATCH, lr=LR).debugging(seed=seed))
    algo = cfg.build_algo()
    rows, t0, c0 = [], time.perf_counter(), os.times()
    while time.perf_counter() - t0 < time_s:
        r = algo.train()
        rows.append({"steps": r.get("num_env_steps_sampled_lifetime") or r.get("num_env_steps_sampled", 0),
                     "t": time.perf_counter() - t0,
                     "ret": (r.get("env_runners") or {}).get("episode_return_mean", float("nan"))})
    c1 = os.times()
    algo.stop()
    ray.shutdown()
    print(json.dumps({"rate": steady_rate(rows, "steps", "t"), "return": rows[-1]["ret"],
                      "cpu_driver": (c1.user + c1.system - c0.user - c0.system) / (time.perf_counter() - t0)}))


def run_rllib(python: str, time_s: float, seed: int):
    t0 = time.perf_counter()
    p = subprocess.run([python, os.path.abspath(__file__), "--rllib-child", "--time-s", str(time_s),
                        "--seed", str(seed)], capture_output=True, text=True, timeout=time_s * 4 + 120)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        print(f"RLlib run failed ({time.perf_counter() - t0:.0f} s):\n{p.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(lines[-1])


def acceptance(seeds, algo: str = "impala") -> None:
    """The acceptance run (tests/test_impala.py, tests/test_appo.py) over several seeds, as a table."""
    import flowkit
    here = os.path.dirname(os.path.abspath(__file__))
    cfg = os.path.join(here, "..", "configs", algo, f"{ENV}.yaml")
    print("\n| seed | env steps | episode_return_mean | wall time (s) | policy lag max | reached 450 |")
    print("|---|---|---|---|---|---|")
    for seed in seeds:
        run_dir = tempfile.mkdtemp(prefix="flowkit-bench-impala-acc-")
        t0 = time.perf_counter()
        m = flowkit.train([f"seed={seed}", f"run.dir={run_dir}", "run.reporters=[csv,checkpoint,evaluation]",
                           "checkpoint.at_end=false"], cfg).metrics
        print(f"| {seed} | {m['env_steps_sampled']} | {m['episode_return_mean']:.1f} | {time.perf_counter() - t0:.1f} "
              f"| {m['learner/default/policy_lag_max']:.0f} | {m['episode_return_mean'] >= 450} |", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--time-s", type=float, default=30.0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rllib-python", default="/tmp/rllib_venv/bin/python")
    p.add_argument("--no-rllib", action="store_true")
    p.add_argument("--hidden", default="64,64", help="model.hidden_sizes of both plans (a heavier learner: 256,256)")
    p.add_argument("--acceptance", type=int, nargs="+", metavar="SEED",
                   help="run configs/impala/CartPole-v1.yaml (--algo appo: configs/appo/CartPole-v1.yaml) "
                        "for these seeds instead")
    p.add_argument("--algo", default="impala", choices=("impala", "appo"), help="the algorithm of --acceptance")
    p.add_argument("--rllib-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rllib_child:
        rllib_child(args.time_s, args.seed)
        return 0
    import ray
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="error")
    if args.acceptance:
        try:
            acceptance(args.acceptance, args.algo)
        finally:
            ray.shutdown()
        return 0
    plans = [("async (learner thread)", "async", False, "impala"), ("bulk_sync", "bulk_sync", False, "impala"),
             ("bulk_sync + prefetch", "bulk_sync", True, "impala"), ("APPO async", "async", False, "appo")]
    runs = {name: [] for name, *_ in plans}
    try:
        for _ in range(args.repeats):
            for name, mode, prefetch, algo in plans:
                runs[name].append(run_flowkit(mode, prefetch, args.time_s, args.seed, args.hidden, algo))
    finally:
        ray.shutdown()
    rllib = None
    if not args.no_rllib and os.path.exists(args.rllib_python):
        rllib = run_rllib(args.rllib_python, args.time_s, args.seed)

    def med(name, key):
        return statistics.median(r[key] for r in runs[name])
    base = med("bulk_sync", "rate")
    print(f"\nIMPALA and APPO, {ENV}, {WORKERS} Ray workers x {ENVS} envs, fragment {FRAGMENT}, train batch {BATCH}, "
          f"hidden [{args.hidden}], "
          f"{args.time_s:.0f} s per run, median of {args.repeats}; 2 shared CPU cores (figures disturbed "
          f"by other jobs on the machine)\n")
    print("| plan | env steps/s | vs bulk_sync | policy lag mean | policy lag max | CPU driver | CPU per worker "
          "| learner busy | episode_return_mean |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, *_ in plans:
        print(f"| flowkit {name} | {med(name, 'rate'):.0f} | {med(name, 'rate') / base:.2f}x | {med(name, 'lag'):.2f} "
              f"| {med(name, 'lag_max'):.0f} | {med(name, 'cpu_driver'):.2f} | {med(name, 'cpu_workers'):.2f} "
              f"| {med(name, 'busy'):.2f} | {med(name, 'return'):.1f} |")
    if rllib is not None:
        a = med("async (learner thread)", "rate")
        print(f"| RLlib IMPALA (old API stack) | {rllib['rate']:.0f} | {rllib['rate'] / base:.2f}x | - | - "
              f"| {rllib['cpu_driver']:.2f} | - | - | {rllib['return']:.1f} |")
        print(f"\nflowkit async / RLlib: {a / rllib['rate']:.2f}x")
    elif not args.no_rllib:
        print("\nRLlib: not run (no virtualenv at --rllib-python, or the run failed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
