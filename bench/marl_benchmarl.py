"""flowkit against BenchMARL (Bettini et al. 2024, TorchRL) on the same multi-agent task, the same
frame budget, the same network sizes and seeds, on this machine (issue 51).

Rows (``--rows``, ``ALGO/TASK``): ``ippo`` and ``mappo`` on VMAS ``balance`` and ``navigation``,
``qmix`` and ``vdn`` on MPE ``simple_spread``, ``masac`` on VMAS ``balance``. A row whose flowkit
algorithm is not installed (``flowkit plugins``: MAPPO, QMIX/VDN and MASAC come from their own
issue-51 branches) is reported as such and skipped; the table is complete for every other row.

Both sides get the task with the same arguments (``TASKS``: BenchMARL's own task configs, so the
flowkit side is given them key for key), the same MLP (``--hidden``, tanh), BenchMARL's
experiment settings (``benchmarl/conf/experiment/base_experiment.yaml``: on-policy 6,000 frames
per batch in 10 vectorized envs, 45 minibatches of 400 frames, lr 5e-5, gamma 0.99; GAE lambda
0.9, clip 0.2 and no entropy bonus from its IPPO/MAPPO configs) translated into flowkit's keys
(``flowkit_overrides``), one process each (flowkit: ``runtime.backend=local``, one rollout worker
of 10 sub-envs stepping 600 steps per fragment) and ``--threads`` torch threads. The seeds run one
after the other, the sides alternating (seed 0: flowkit first, seed 1: BenchMARL first, ...).

Columns, per row and side: the final mean episode return per agent (flowkit: the last row's
``policy/<id>/episode_return_mean``, the last 20 episodes of each agent, averaged over policies;
BenchMARL: the mean ``episode_reward`` per agent of the episodes that ended in its last collected
batch), median over seeds with the 90% interval of the seeds (5th-95th percentile, interpolated),
and the frames (env steps) per second with learning (frames / seconds of training: flowkit's
``time_total_s``, BenchMARL's ``Experiment.run()``; start-up excluded on both sides).

BenchMARL lives in its own virtualenv, never in flowkit's dependencies. Recipe (about 10 minutes)::

    python3.11 -m venv /work/venvs/benchmarl
    /work/venvs/benchmarl/bin/pip install torch==2.13.0      # finds the CPU wheel on disk first
    /work/venvs/benchmarl/bin/pip install benchmarl vmas     # torchrl, tensordict, hydra, ...
    /work/venvs/benchmarl/bin/pip install 'pettingzoo[mpe]'  # for the simple_spread rows only
    touch /work/venvs/benchmarl/READY

This script runs in flowkit's venv and starts itself in BenchMARL's (``--benchmarl-python``) for
each BenchMARL run (``--child``).

    python bench/marl_benchmarl.py --rows ippo/balance --frames 60000 --seeds 0 1 2
    python bench/marl_benchmarl.py --rows ippo/balance mappo/balance ippo/navigation mappo/navigation
    python bench/marl_benchmarl.py --rows ippo/balance --frames 12000 --seeds 0   # a tiny check
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARL_PY = "/work/venvs/benchmarl/bin/python"

# BenchMARL's task configs (benchmarl/conf/task/...), given key for key to both sides
TASKS = {
    "balance": ("vmas", "BALANCE", {"n_agents": 4, "package_mass": 5, "random_package_pos_on_line": True,
                                    "max_steps": 100}),
    "navigation": ("vmas", "NAVIGATION", {"n_agents": 3, "collisions": True, "agents_with_same_goal": 1,
                                          "observe_all_goals": False, "shared_rew": False, "split_goals": False,
                                          "lidar_range": 0.35, "agent_radius": 0.1, "max_steps": 100}),
    "simple_spread": ("pettingzoo", "SIMPLE_SPREAD", {"N": 3, "local_ratio": 0.5, "max_cycles": 100,
                                                      "continuous_actions": False}),
}
ON_POLICY = {"ippo", "mappo"}
ROWS = ["ippo/balance", "mappo/balance", "ippo/navigation", "mappo/navigation", "qmix/simple_spread",
        "vdn/simple_spread", "masac/balance"]
# flowkit's algorithm of each row (the independent learner is PPO with one shared policy)
FLOWKIT_ALGO = {"ippo": "ppo", "mappo": "mappo", "qmix": "qmix", "vdn": "vdn", "masac": "masac"}


def flowkit_overrides(algo: str, task: str, frames: int, seed: int, hidden: list, threads: int) -> list:
    """The flowkit run of a row: the task's env, BenchMARL's experiment settings in flowkit's keys."""
    kind, _, kw = TASKS[task]
    env = (["env.factory=flowkit_multiagent.vmas:parallel_env", f"env.kwargs.scenario={task}"] if kind == "vmas"
           else [f"env.factory=mpe2.{task}_v3:parallel_env"])
    env += [f"env.kwargs.{k}={json.dumps(v)}" for k, v in kw.items()]
    fk = FLOWKIT_ALGO[algo]
    out = ["runtime.backend=local", "run.reporters=[csv]", f"algo={fk}", f"seed={seed}",
           f"stop.env_steps={frames}", f"runtime.torch_threads={threads}", f"model.hidden_sizes={json.dumps(hidden)}",
           "model.activation=tanh", "runtime.num_workers=1", *env]
    if algo in ON_POLICY:
        n_agents = int(kw.get("n_agents", kw.get("N", 1)))
        # 6000 frames per batch from 10 envs; 45 minibatches of 400 frames (x n_agents rows) = 3 epochs
        out += ["runtime.num_envs_per_worker=10", "runtime.rollout_fragment_length=600",
                f"{fk}.train_batch_size=6000", f"{fk}.minibatch_size={400 * n_agents}", f"{fk}.num_epochs=3",
                f"{fk}.lr=5e-5", f"{fk}.gamma=0.99", f"{fk}.gae_lambda=0.9", f"{fk}.clip_param=0.2",
                f"{fk}.ent_coef=0.0", f"{fk}.vf_coef=1.0", f"{fk}.max_grad_norm=5.0"]
    else:  # off-policy: BenchMARL's 1,000 frames per batch in 10 envs, lr 5e-5... (the algorithm's own keys)
        out += ["runtime.num_envs_per_worker=10", "runtime.rollout_fragment_length=100", f"{fk}.lr=5e-5",
                f"{fk}.gamma=0.99"]
    return out


def run_flowkit(algo: str, task: str, frames: int, seed: int, hidden: list, threads: int) -> dict:
    """One flowkit run (in a fresh process: bench/_isolated.py): final return per agent, frames/s."""
    import flowkit
    run_dir = os.path.join(tempfile.mkdtemp(prefix=f"fk-{algo}-{task}-{seed}-"), "run")
    last = flowkit.train(flowkit_overrides(algo, task, frames, seed, hidden, threads) + [f"run.dir={run_dir}"]).metrics
    rets = [float(v) for k, v in last.items() if k.startswith("policy/") and k.endswith("/episode_return_mean")]
    return {"return": sum(rets) / len(rets), "frames": int(float(last["env_steps_sampled"])),
            "fps": float(last["env_steps_sampled"]) / float(last["time_total_s"])}


# ---- the BenchMARL side (runs in BenchMARL's venv: nothing of flowkit imported) ----------------------
def benchmarl_child(spec: dict) -> dict:
    import torch
    from benchmarl.algorithms import IppoConfig, MappoConfig, MasacConfig, QmixConfig, VdnConfig
    from benchmarl.environments import PettingZooTask, VmasTask
    from benchmarl.experiment import Callback, Experiment, ExperimentConfig
    from benchmarl.models.mlp import MlpConfig
    torch.set_num_threads(spec["threads"])
    kind, name, kw = TASKS[spec["task"]]
    task = (VmasTask if kind == "vmas" else PettingZooTask)[name].get_from_yaml()
    task.config.update(kw)
    algo = {"ippo": IppoConfig, "mappo": MappoConfig, "qmix": QmixConfig, "vdn": VdnConfig,
            "masac": MasacConfig}[spec["algo"]].get_from_yaml()
    exp = ExperimentConfig.get_from_yaml()
    exp.max_n_frames, exp.loggers, exp.evaluation, exp.create_json = spec["frames"], [], False, False
    exp.checkpoint_interval, exp.save_folder = 0, tempfile.mkdtemp(prefix="benchmarl-")
    exp.sampling_device = exp.train_device = exp.buffer_device = "cpu"
    exp.gamma, exp.lr = 0.99, 5e-5
    model = MlpConfig(num_cells=list(spec["hidden"]), activation_class=torch.nn.Tanh, layer_class=torch.nn.Linear)

    class Returns(Callback):
        """The per-agent episode returns of the episodes that ended in each collected batch."""
        last: list = []

        def on_batch_collected(self, batch):
            vals = []
            for group in self.experiment.group_map:
                done = batch.get(("next", group, "done"))
                vals += batch.get(("next", group, "episode_reward"))[done].tolist()
            if vals:
                Returns.last = vals

    experiment = Experiment(task=task, algorithm_config=algo, model_config=model, critic_model_config=model,
                            seed=spec["seed"], config=exp, callbacks=[Returns()])
    t0 = time.perf_counter()
    experiment.run()
    dt = time.perf_counter() - t0
    frames = int(experiment.total_frames)
    return {"return": sum(Returns.last) / max(1, len(Returns.last)), "frames": frames, "fps": frames / dt}


def run_benchmarl(algo: str, task: str, frames: int, seed: int, hidden: list, threads: int, python: str) -> dict:
    spec = dict(algo=algo, task=task, frames=frames, seed=seed, hidden=hidden, threads=threads)
    p = subprocess.run([python, os.path.abspath(__file__), "--child", json.dumps(spec)], capture_output=True, text=True)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"BenchMARL {algo}/{task} seed {seed} failed:\n{p.stderr[-3000:]}")
    return json.loads(lines[-1])


# ---- the table ---------------------------------------------------------------------------------------
def quantile(xs: list, q: float) -> float:
    xs = sorted(xs)
    i = q * (len(xs) - 1)
    lo = int(i)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (i - lo)


def summary(runs: list) -> str:
    r = [x["return"] for x in runs]
    fps = sorted(x["fps"] for x in runs)
    return (f"{quantile(r, 0.5):9.3f} [{quantile(r, 0.05):8.3f}, {quantile(r, 0.95):8.3f}]"
            f"  {quantile(fps, 0.5):8.0f}")


def installed_algorithms() -> set:
    import flowkit
    return set(flowkit.get_plugin_manager().algorithms(load=False))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", nargs="*", default=ROWS[:4], help=f"ALGO/TASK rows, of {ROWS}")
    ap.add_argument("--frames", type=int, default=60_000, help="env steps (frames) per run, both sides")
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--hidden", type=int, nargs="*", default=[256, 256], help="MLP widths, both sides")
    ap.add_argument("--threads", type=int, default=1, help="torch threads, both sides")
    ap.add_argument("--benchmarl-python", default=BENCHMARL_PY)
    ap.add_argument("--json", default=None, help="write every run's figures here")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(benchmarl_child(json.loads(a.child))), flush=True)
        return
    sys.path.insert(0, HERE)
    from _isolated import run_isolated
    have = installed_algorithms()
    results: dict = {}
    for row in a.rows:
        algo, task = row.split("/")
        if row not in ROWS:
            raise SystemExit(f"--rows: {row!r} is not one of {ROWS}")
        if FLOWKIT_ALGO[algo] not in have:
            print(f"{row}: flowkit algorithm {FLOWKIT_ALGO[algo]!r} is not installed: skipped", flush=True)
            continue
        results[row] = {"flowkit": [], "benchmarl": []}
        for i, seed in enumerate(a.seeds):
            sides = ["flowkit", "benchmarl"] if i % 2 == 0 else ["benchmarl", "flowkit"]
            for side in sides:
                if side == "flowkit":
                    out = run_isolated("marl_benchmarl", "run_flowkit", algo, task, a.frames, seed, a.hidden, a.threads)
                else:
                    out = run_benchmarl(algo, task, a.frames, seed, a.hidden, a.threads, a.benchmarl_python)
                print(f"  {row} seed {seed} {side}: {out}", flush=True)
                results[row][side].append({**out, "seed": seed})
    print(f"\n{a.frames} frames per run, seeds {a.seeds}, MLP {a.hidden}, {a.threads} torch thread(s)")
    print(f"{'row':22s} {'side':10s} {'return/agent median [90% int.]':>33s}  {'frames/s':>8s}")
    for row, sides in results.items():
        for side, runs in sides.items():
            print(f"{row:22s} {side:10s} {summary(runs)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"frames": a.frames, "seeds": a.seeds, "hidden": a.hidden, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
