"""The learner on a GPU against the CPU: PPO (CartPole, Pong), DQN (Pong), SAC (HalfCheetah) and
PPO CartPole with a learner group (``learner.num_learners=2``), each trained with
``learner.device=<--device>`` and with ``learner.device=cpu`` from its tuned config
(configs/<algo>/<env>.yaml), alternating the sides, ``--repeats`` times each.

The figure is the learner's own throughput: env steps trained per second of the learner's busy
time (``Learner.env_steps_trained / Learner.busy_s`` at the run's end, what
``perf/learner_throughput_env_steps_per_s`` reports), so sampling speed does not enter it; the
env steps per second of the whole run are printed next to it.
DQN and SAC start learning after 1,000 env steps (not their configs' 100,000 and 10,000: the
learner is what is measured). Workers act on CPU either way. A workload whose env is not installed here (``ale-py`` for
Pong, ``mujoco`` for HalfCheetah) is listed as skipped, saying why.

``--device cpu`` compares the CPU with itself: the smoke test of this script on a machine
without a GPU. ``--budget short`` trains 2,000 env steps per run (a smoke test, minutes);
``--budget full`` (default) trains ``--env-steps`` env steps per run.

Run: python bench/gpu.py [--device cuda] [--budget short|full] [--env-steps 50000] [--repeats 1]
                         [--only ppo-cartpole ppo-pong dqn-pong sac-halfcheetah group-cartpole]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(os.path.dirname(HERE), "configs")

# name: (config file, extra overrides, the module its env needs)
WORKLOADS = {
    "ppo-cartpole": ("ppo/CartPole-v1.yaml", [], None),
    "ppo-pong": ("ppo/PongNoFrameskip-v4.yaml", [], "ale_py"),
    "dqn-pong": ("dqn/PongNoFrameskip-v4.yaml", ["dqn.learning_starts=1000"], "ale_py"),
    "sac-halfcheetah": ("sac/HalfCheetah-v5.yaml", ["sac.learning_starts=1000"], "mujoco"),
    "group-cartpole": ("ppo/CartPole-v1.yaml", ["learner.num_learners=2", "learner.num_cpus_per_learner=0.5",
                                                "runtime.num_cpus_per_worker=0.5"], None),
}
SHORT = ["stop.env_steps=2000", "stop.episode_return_mean=null",
         "runtime.num_workers=1", "run.min_iter_time_s=0", "run.min_iter_env_steps=0"]


def run_once(name: str, device: str, args: argparse.Namespace) -> dict:
    """One training run of workload ``name`` with ``learner.device=device``: the learner's env
    steps trained per second and the run's env steps sampled per second."""
    import flowkit
    cfg, extra, _ = WORKLOADS[name]
    budget = SHORT if args.budget == "short" else [f"stop.env_steps={args.env_steps}", "stop.episode_return_mean=null"]
    if args.budget == "short" and name.startswith("group"):
        budget = [o for o in budget if not o.startswith("runtime.num_workers")]
    probe = LearnerProbe()
    with tempfile.TemporaryDirectory() as d:
        res = flowkit.train([f"learner.device={device}", "seed=0", f"run.dir={d}/run", "run.reporters=[csv]",
                             "evaluation.interval=0", "evaluation.final=false", *extra, *budget],
                            config_file=os.path.join(CONFIGS, cfg), plugins=[probe], verbose=False)
    m = res.metrics
    return {"learner": probe.trained / max(probe.busy_s, 1e-9),
            "run": m["env_steps_sampled"] / max(m["time_total_s"], 1e-9)}


class LearnerProbe:
    """At the run's end: env steps trained and seconds spent updating, over the run's learners."""
    trained = 0
    busy_s = 0.0

    def flowkit_on_train_end(self, summary, error, ctx):
        self.trained = sum(lr.env_steps_trained for lr in ctx.learners.values())
        self.busy_s = sum(lr.busy_s for lr in ctx.learners.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget", choices=("short", "full"), default="full")
    ap.add_argument("--env-steps", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--only", nargs="+", choices=sorted(WORKLOADS), default=list(WORKLOADS))
    args = ap.parse_args()
    if args.device.startswith("cuda"):
        import torch
        if not torch.cuda.is_available():
            sys.exit(f"--device {args.device}: torch sees no CUDA device here (--device cpu: the smoke test)")
    rows = []
    for name in args.only:
        need = WORKLOADS[name][2]
        if need and importlib.util.find_spec(need) is None:
            rows.append((name, f"skipped: {need} is not installed"))
            continue
        sides: dict = {"cpu": [], args.device: []} if args.device != "cpu" else {"cpu": [], "cpu ": []}
        for _ in range(args.repeats):
            for side in sides:
                sides[side].append(run_once(name, side.strip(), args))
        (a, ra), (b, rb) = ((k, v) for k, v in sides.items())
        la, lb = (statistics.median(r["learner"] for r in v) for v in (ra, rb))
        sa, sb_ = (statistics.median(r["run"] for r in v) for v in (ra, rb))
        ratio = f"{lb / la:>7.2f}x" if la > 0 else f"{'-':>8}"  # nothing trained within the budget
        rows.append((name, f"{la:>12,.0f} {lb:>12,.0f} {ratio} {sa:>12,.0f} {sb_:>12,.0f}"))
        print(f"{name}: learner {la:,.0f} (cpu) / {lb:,.0f} ({args.device}) env steps/s", flush=True)
    print(f"\nlearner env steps trained per second of busy time (median of {args.repeats}), "
          f"budget {args.budget}; run env steps/s beside it")
    print(f"{'workload':<17}{'learner cpu':>12} {'learner ' + args.device:>12} {'ratio':>8} "
          f"{'run cpu':>12} {'run ' + args.device:>12}")
    for name, text in rows:
        print(f"{name:<17}{text}")


if __name__ == "__main__":
    main()
