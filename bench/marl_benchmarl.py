"""flowkit against BenchMARL (Bettini et al. 2024, TorchRL) on the same multi-agent task, the same
frame budget, the same network sizes and seeds, on this machine (issue 51).

Rows (``--rows``, ``ALGO/TASK``): ``ippo`` and ``mappo`` on VMAS ``balance`` and ``navigation``
(continuous actions), ``qmix`` and ``vdn`` on MPE ``simple_spread`` (discrete), ``masac`` on VMAS
``balance``. A row whose flowkit algorithm is not installed is reported as such and skipped.

The same settings on both sides, declared once (``TASKS``, ``BATCH_FRAMES``, ``N_ENVS``, ``ON``,
``VD``, ``SAC``, ``GAMMA``, ``MEMORY_FRAMES``) and translated into each side's keys
(``flowkit_overrides``, ``benchmarl_settings``):

- task: BenchMARL's own task configs key for key (balance: 4 agents, package_mass 5, random
  package position, 100 steps; navigation: 3 agents, collisions, lidar 0.35, 100 steps;
  simple_spread: N 3, local_ratio 0.5, max_cycles 100). flowkit's env: ``flowkit_multiagent.vmas``
  (one batched VMAS env of 10 sub-envs) and ``mpe2.simple_spread_v3`` (10 sub-envs); BenchMARL's:
  VMAS and ``pettingzoo.mpe.simple_spread_v3`` (PettingZoo 1.24.3, the same MPE code that mpe2 1.1.1
  carries on). One shared policy (BenchMARL's ``share_policy_params``), no agent id input.
- network: an MLP of ``--hidden`` (default BenchMARL's 256x256) tanh units for actor and critic.
  QMIX/VDN: flowkit's agent network is recurrent (R2D2's sequence machinery): MLP ``hidden[:-1]``
  then a GRU of ``hidden[-1]``, against BenchMARL's MLP ``hidden`` (its QMIX/VDN replay single
  transitions); the same widths, not the same cell.
- on-policy (ippo, mappo): BenchMARL's experiment defaults: 6,000 frames per batch from 10 envs
  (flowkit: one round of 10 sub-envs x 600 steps, ``train_batch_size`` 6000), 45 minibatches of 400
  frames (flowkit: ``minibatch_size`` 400 x n agent rows, ``num_epochs`` 3 = 45 minibatches), lr 5e-5,
  Adam eps 1e-6, grad-norm clip 5, gamma 0.99, GAE lambda 0.9, clip 0.2, no entropy bonus, value
  coefficient 1, no advantage standardisation (TorchRL's ``normalize_advantage=False``). MAPPO's
  critic: all agents' observations concatenated, no agent id (``critic_input=concat_obs``,
  ``critic_agent_id=false``; VMAS has no global state). Policies: BenchMARL's tanh-normal with a
  softplus scale from the network, flowkit's diagonal Gaussian with a learned log-std (clipped to the
  action bounds by VMAS).
- value decomposition (qmix, vdn): 6,000 frames per batch from 10 envs; per batch 100 gradient steps
  (BenchMARL's ``off_policy_n_optimizer_steps``: its default 1,000 of 128 transitions does not fit
  this machine) of 16 episodes' worth of team steps (BenchMARL: 1,600 transitions; flowkit: 16
  whole-episode sequences of 100 steps, ``training_intensity`` 26.7 sequence steps per frame),
  flowkit's interleaved (16.7 per 1,000 frames from 2,000 frames on: within 33 steps of BenchMARL's
  count), replay of 1M frames, lr 5e-4, Adam eps 1e-6, grad-norm clip
  5, gamma 0.99, hard target copies every 100 gradient steps (BenchMARL: ``soft_target_update``
  false), no double Q (TorchRL's QMixerLoss default), the team reward = the agents' mean (BenchMARL's
  QMIX/VDN ``process_batch``), epsilon-greedy 0.8 -> 0.01 over the first third of the frames
  (BenchMARL's default anneal); QMIX's mixer: embedding 32, the env's global ``state()``.
- masac: BenchMARL's off-policy defaults: 6,000 frames per batch, 1,000 gradient steps of 128
  team steps (flowkit: 512 agent rows of 4 agents, ``training_intensity`` 85.3), learning after the
  first batch, replay 1M, lr 5e-5, tau 0.005, critic over all agents' observations and actions.
- evaluation (both sides the same): after the last batch, ``--episodes`` greedy episodes
  (BenchMARL: its own ``_evaluation_loop``, deterministic actions; flowkit: ``evaluation.final``);
  the return is each agent's reward summed over its episode, the mean over agents and episodes
  (flowkit's ``evaluation_return_mean`` is the team's sum: divided by n agents). ``train_return``
  (not in the table) is the training episodes' mean per agent (flowkit: its last row's window;
  BenchMARL: the episodes that ended in the last collected batch).
- speed: frames (env steps) per second with learning, training only: flowkit's ``time_total_s`` of
  its last training row, BenchMARL's ``Experiment.run()``; start-up and the evaluation excluded.
  One process per run, ``--threads`` torch threads (default 1) on both sides; the seeds run one
  after the other, the sides alternating (seed 0: flowkit first, seed 1: BenchMARL first, ...).

The table: per row and side the median over seeds with the 90% interval of the seeds (5th-95th
percentile, interpolated), the median frames/s and flowkit's ratio to BenchMARL's, and the 1-minute
load average at the end of each run (median): the machine is shared, and the ratio is only
meaningful between runs taken under the same load.

BenchMARL lives in its own virtualenv, never in flowkit's dependencies. Recipe (about 10 minutes)::

    python3.11 -m venv /work/venvs/benchmarl
    /work/venvs/benchmarl/bin/pip install torch==2.13.0      # finds the CPU wheel on disk first
    /work/venvs/benchmarl/bin/pip install benchmarl vmas     # torchrl, tensordict, hydra, ...
    echo torch==2.13.0 > /tmp/pin.txt                         # for the simple_spread rows: TorchRL imports
    /work/venvs/benchmarl/bin/pip install -c /tmp/pin.txt 'pettingzoo[mpe]==1.24.3'  # pettingzoo.mpe
    touch /work/venvs/benchmarl/READY

(PettingZoo 1.25+ moved MPE out to ``mpe2``, which TorchRL 0.11's ``PettingZooEnv`` does not load;
without the pin pip replaces the CPU torch with a CUDA build.)

This script runs in flowkit's venv and starts itself in BenchMARL's (``--benchmarl-python``) for
each BenchMARL run (``--child``). ``--json`` keeps every run's figures, written after each run, and
rows of several invocations add up in one file (``--table`` prints it)::

    python bench/marl_benchmarl.py --rows mappo/balance --frames 30000 --json bench/results/marl_benchmarl.json
    python bench/marl_benchmarl.py --rows qmix/simple_spread --frames 30000 --json bench/results/marl_benchmarl.json
    python bench/marl_benchmarl.py --table --json bench/results/marl_benchmarl.json
    python bench/marl_benchmarl.py --rows ippo/balance --frames 6000 --seeds 0 --episodes 2  # a tiny check
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
VALUE_DECOMPOSITION = {"qmix", "vdn"}
ROWS = ["ippo/balance", "mappo/balance", "ippo/navigation", "mappo/navigation", "qmix/simple_spread",
        "vdn/simple_spread", "masac/balance"]
# flowkit's algorithm of each row (the independent learner is PPO with one shared policy)
FLOWKIT_ALGO = {"ippo": "ppo", "mappo": "mappo", "qmix": "qmix", "vdn": "vdn", "masac": "masac"}

# The settings of each family, declared once and given to both sides (BenchMARL's keys in comments).
BATCH_FRAMES, N_ENVS = 6000, 10  # {on,off}_policy_collected_frames_per_batch, {on,off}_policy_n_envs_per_worker
ON = dict(minibatch=400, minibatch_iters=45, lr=5e-5, gae_lambda=0.9, clip=0.2, max_grad_norm=5.0, adam_eps=1e-6)
VD = dict(steps=100, batch_episodes=16, lr=5e-4, target_every=100, eps_init=0.8, eps_end=0.01,
          max_grad_norm=5.0, adam_eps=1e-6)
SAC = dict(steps=1000, batch=128, lr=5e-5, tau=0.005, max_grad_norm=5.0)
GAMMA, MEMORY_FRAMES = 0.99, 1_000_000
# flowkit's value decomposition trains VD['steps'] / 6,000 per frame from this many frames on (20
# episodes stored), BenchMARL its VD['steps'] after each 6,000: the same gradient steps, +-33
VD_STARTS = 2000


def episode_limit(task: str) -> int:
    kw = TASKS[task][2]
    return int(kw.get("max_steps", kw.get("max_cycles", 0)))


def n_agents_of(task: str) -> int:
    kw = TASKS[task][2]
    return int(kw.get("n_agents", kw.get("N", 1)))


def flowkit_overrides(algo: str, task: str, frames: int, seed: int, hidden: list, threads: int,
                      episodes: int) -> list:
    """The flowkit run of a row: the task's env, the family's settings (``ON``/``VD``/``SAC``) in flowkit's keys."""
    kind, _, kw = TASKS[task]
    env = (["env.factory=flowkit_multiagent.vmas:parallel_env", f"env.kwargs.scenario={task}",
            f"env.kwargs.continuous_actions={json.dumps(algo not in VALUE_DECOMPOSITION)}"] if kind == "vmas"
           else [f"env.factory=mpe2.{task}_v3:parallel_env"])
    env += [f"env.kwargs.{k}={json.dumps(v)}" for k, v in kw.items()]
    fk, n, limit = FLOWKIT_ALGO[algo], n_agents_of(task), episode_limit(task)
    out = ["runtime.backend=local", "run.reporters=[csv,evaluation]", f"algo={fk}", f"seed={seed}",
           f"stop.env_steps={frames}", f"runtime.torch_threads={threads}", "runtime.num_workers=1",
           f"runtime.num_envs_per_worker={N_ENVS}", f"{fk}.gamma={GAMMA}",
           "evaluation.final=true", f"evaluation.episodes={episodes}", *env]
    if algo in ON_POLICY:
        # one round = one BenchMARL batch (10 envs x 600 steps); 45 minibatches of 400 frames
        # (x n agent rows: one shared policy) = 3 epochs of 15; no advantage standardisation
        out += [f"model.hidden_sizes={json.dumps(hidden)}", "model.activation=tanh",
                f"runtime.rollout_fragment_length={BATCH_FRAMES // N_ENVS}", f"{fk}.train_batch_size={BATCH_FRAMES}",
                f"{fk}.minibatch_size={ON['minibatch'] * n}",
                f"{fk}.num_epochs={ON['minibatch_iters'] * ON['minibatch'] // BATCH_FRAMES}",
                f"{fk}.lr={ON['lr']}", f"{fk}.gae_lambda={ON['gae_lambda']}", f"{fk}.clip_param={ON['clip']}",
                f"{fk}.ent_coef=0.0", f"{fk}.vf_coef=1.0", f"{fk}.max_grad_norm={ON['max_grad_norm']}",
                f"{fk}.adam_eps={ON['adam_eps']}", f"{fk}.normalize_advantages=none"]
        if algo == "mappo":  # BenchMARL's MAPPO critic: all agents' observations, no agent id (VMAS has no state)
            out += [f"{fk}.critic_input=concat_obs", f"{fk}.critic_agent_id=false"]
    elif algo in VALUE_DECOMPOSITION:
        # whole episodes (seq_len = the episode limit); VD['steps'] gradient steps of VD['batch_episodes']
        # episodes per 6,000 frames; the agent network: MLP hidden[:-1] then a GRU of hidden[-1]
        seqs = VD["batch_episodes"]
        out += [f"model.hidden_sizes={json.dumps(hidden[:-1])}", "model.activation=tanh", "model.recurrent=gru",
                f"model.recurrent_size={hidden[-1]}", f"runtime.rollout_fragment_length={limit}",
                f"{fk}.seq_len={limit}", f"{fk}.train_batch_size={seqs}",
                f"{fk}.training_intensity={VD['steps'] * seqs * limit / BATCH_FRAMES}",
                f"{fk}.learning_starts={VD_STARTS}", f"{fk}.buffer_size={MEMORY_FRAMES // limit}",
                f"{fk}.target_network_update_freq={VD['target_every']}", f"{fk}.lr={VD['lr']}",
                f"{fk}.adam_eps={VD['adam_eps']}", f"{fk}.max_grad_norm={VD['max_grad_norm']}",
                f"{fk}.double_q=false", f"{fk}.team_reward=mean", f"{fk}.initial_epsilon={VD['eps_init']}",
                f"{fk}.final_epsilon={VD['eps_end']}", f"{fk}.epsilon_timesteps={frames // 3}",
                "multiagent.obs_agent_id=false"]
        if algo == "qmix":
            out += [f"{fk}.critic_input=auto"]
    else:  # masac: SAC['steps'] gradient steps of SAC['batch'] team steps (x n agent rows) per 6,000 frames
        out += [f"model.hidden_sizes={json.dumps(hidden)}", "model.activation=tanh",
                f"runtime.rollout_fragment_length={limit}", f"{fk}.lr={SAC['lr']}", f"{fk}.tau={SAC['tau']}",
                f"{fk}.train_batch_size={SAC['batch'] * n}",
                f"{fk}.training_intensity={SAC['steps'] * SAC['batch'] * n / BATCH_FRAMES}",
                f"{fk}.learning_starts={BATCH_FRAMES}", f"{fk}.buffer_size={MEMORY_FRAMES * n}",
                f"{fk}.critic_input=concat_obs", f"{fk}.critic_agent_id=false"]
    return out


def run_flowkit(algo: str, task: str, frames: int, seed: int, hidden: list, threads: int, episodes: int) -> dict:
    """One flowkit run (in a fresh process: bench/_isolated.py): the final greedy return per agent
    (``evaluation_return_mean``, the team's sum, over n agents), frames/s of training."""
    import flowkit
    run_dir = os.path.join(tempfile.mkdtemp(prefix=f"fk-{algo}-{task}-{seed}-"), "run")
    res = flowkit.train(flowkit_overrides(algo, task, frames, seed, hidden, threads, episodes) + [f"run.dir={run_dir}"])
    last, train_row = res.metrics, res.history[-1]
    rets = [float(v) for k, v in train_row.items() if k.startswith("policy/") and k.endswith("/episode_return_mean")]
    return {"return": float(last["evaluation_return_mean"]) / n_agents_of(task),
            "train_return": sum(rets) / max(1, len(rets)), "frames": int(float(train_row["env_steps_sampled"])),
            "fps": float(train_row["env_steps_sampled"]) / float(train_row["time_total_s"])}


# ---- the BenchMARL side (runs in BenchMARL's venv: nothing of flowkit imported) ----------------------
try:  # (BenchMARL pickles its callbacks: the class lives at module level)
    from benchmarl.experiment import Callback as _Callback
except ImportError:  # flowkit's venv: the class is never used there
    _Callback = object  # type: ignore[misc,assignment]


class Returns(_Callback):  # type: ignore[misc,valid-type]
    """Per-agent episode returns: ``train`` of the episodes that ended in the last collected batch,
    ``eval`` of the greedy evaluation episodes (each agent's reward summed over its episode)."""
    train: list = []
    eval: list = []

    def on_batch_collected(self, batch):
        vals = []
        done = batch.get(("next", "done"))  # the global done, as BenchMARL's logger reads it
        for group in self.experiment.group_map:
            vals += batch.get(("next", group, "episode_reward")).mean(-2)[done].flatten().tolist()
        if vals:
            Returns.train = vals

    def on_evaluation_end(self, rollouts):
        vals = []
        for td in rollouts:  # [T, ...], cut at the first done (the episode; BenchMARL's logger does the same)
            done = td.get(("next", "done")).reshape(td.shape[0], -1).any(-1).nonzero()
            td = td[: int(done[0, 0]) + 1] if len(done) else td
            for group in self.experiment.group_map:
                vals += td.get(("next", group, "reward")).sum(0).flatten().tolist()  # [T, n, 1] -> per agent
        Returns.eval = vals


def benchmarl_settings(exp, algo: str, task: str, frames: int, episodes: int) -> None:
    """The family's settings (``ON``/``VD``/``SAC``) in BenchMARL's experiment keys."""
    exp.max_n_frames, exp.loggers, exp.create_json, exp.render = frames, [], False, False
    exp.evaluation, exp.evaluation_episodes = True, episodes  # run once, by hand, after training
    exp.evaluation_interval = BATCH_FRAMES * 10 ** 6
    exp.checkpoint_interval, exp.save_folder = 0, tempfile.mkdtemp(prefix="benchmarl-")
    exp.sampling_device = exp.train_device = exp.buffer_device = "cpu"
    exp.gamma, exp.clip_grad_norm, exp.off_policy_memory_size = GAMMA, True, MEMORY_FRAMES
    exp.on_policy_collected_frames_per_batch = exp.off_policy_collected_frames_per_batch = BATCH_FRAMES
    exp.on_policy_n_envs_per_worker = exp.off_policy_n_envs_per_worker = N_ENVS
    if algo in ON_POLICY:
        exp.lr, exp.adam_eps, exp.clip_grad_val = ON["lr"], ON["adam_eps"], ON["max_grad_norm"]
        exp.on_policy_minibatch_size, exp.on_policy_n_minibatch_iters = ON["minibatch"], ON["minibatch_iters"]
    elif algo in VALUE_DECOMPOSITION:
        exp.lr, exp.adam_eps, exp.clip_grad_val = VD["lr"], VD["adam_eps"], VD["max_grad_norm"]
        exp.off_policy_n_optimizer_steps = VD["steps"]
        exp.off_policy_train_batch_size = VD["batch_episodes"] * episode_limit(task)  # transitions
        exp.soft_target_update, exp.hard_target_update_frequency = False, VD["target_every"]
        exp.exploration_eps_init, exp.exploration_eps_end = VD["eps_init"], VD["eps_end"]
        exp.exploration_anneal_frames = frames // 3
    else:
        exp.lr, exp.clip_grad_val, exp.polyak_tau = SAC["lr"], SAC["max_grad_norm"], SAC["tau"]
        exp.off_policy_n_optimizer_steps, exp.off_policy_train_batch_size = SAC["steps"], SAC["batch"]
        exp.off_policy_init_random_frames = 0


def benchmarl_child(spec: dict) -> dict:
    import torch
    from benchmarl.algorithms import IppoConfig, MappoConfig, MasacConfig, QmixConfig, VdnConfig
    from benchmarl.environments import PettingZooTask, VmasTask
    from benchmarl.experiment import Experiment, ExperimentConfig
    from benchmarl.models.mlp import MlpConfig
    torch.set_num_threads(spec["threads"])
    kind, name, kw = TASKS[spec["task"]]
    task = (VmasTask if kind == "vmas" else PettingZooTask)[name].get_from_yaml()
    task.config.update(kw)
    algo = {"ippo": IppoConfig, "mappo": MappoConfig, "qmix": QmixConfig, "vdn": VdnConfig,
            "masac": MasacConfig}[spec["algo"]].get_from_yaml()
    exp = ExperimentConfig.get_from_yaml()
    benchmarl_settings(exp, spec["algo"], spec["task"], spec["frames"], spec["episodes"])
    model = MlpConfig(num_cells=list(spec["hidden"]), activation_class=torch.nn.Tanh, layer_class=torch.nn.Linear)

    experiment = Experiment(task=task, algorithm_config=algo, model_config=model, critic_model_config=model,
                            seed=spec["seed"], config=exp, callbacks=[Returns()])
    t0 = time.perf_counter()
    experiment.run()
    dt = time.perf_counter() - t0
    experiment._evaluation_loop()  # the final greedy evaluation (BenchMARL's own, deterministic actions)
    frames = int(experiment.total_frames)
    return {"return": sum(Returns.eval) / max(1, len(Returns.eval)),
            "train_return": sum(Returns.train) / max(1, len(Returns.train)), "frames": frames, "fps": frames / dt}


def run_benchmarl(algo: str, task: str, frames: int, seed: int, hidden: list, threads: int, episodes: int,
                  python: str) -> dict:
    spec = dict(algo=algo, task=task, frames=frames, seed=seed, hidden=hidden, threads=threads, episodes=episodes)
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


def summary(runs: list) -> tuple:
    """(return median [90% interval of the seeds], frames/s median) of one side's runs."""
    r = [x["return"] for x in runs]
    ret = f"{quantile(r, 0.5):8.3f} [{quantile(r, 0.05):8.3f}, {quantile(r, 0.95):8.3f}]"
    return ret, quantile([x["fps"] for x in runs], 0.5)


def table(results: dict) -> str:
    """The printed table: a line per row and side, the fps ratio on flowkit's line."""
    lines = [f"{'row':20s} {'frames':>7s} {'seeds':>7s} {'side':10s} {'return/agent median [90% int.]':>30s}"
             f" {'frames/s':>8s} {'ratio':>5s} {'load':>5s}"]
    for row, r in results.items():
        if not (r["flowkit"] and r["benchmarl"]):
            continue
        fps_b = summary(r["benchmarl"])[1]
        for side in ("flowkit", "benchmarl"):
            ret, fps = summary(r[side])
            seeds = ",".join(str(x["seed"]) for x in r[side])
            load = quantile([x.get("load1", float("nan")) for x in r[side]], 0.5)
            ratio = f"{fps / fps_b:5.2f}" if side == "flowkit" else ""
            lines.append(f"{row:20s} {r['frames']:7d} {seeds:>7s} {side:10s} {ret:>30s} {fps:8.0f} {ratio:>5s} {load:5.1f}")
    return "\n".join(lines)


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
    ap.add_argument("--episodes", type=int, default=10, help="greedy evaluation episodes at the end, both sides")
    ap.add_argument("--benchmarl-python", default=BENCHMARL_PY)
    ap.add_argument("--json", default=None, help="write every run's figures here")
    ap.add_argument("--table", action="store_true", help="print the table of --json and stop")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(benchmarl_child(json.loads(a.child))), flush=True)
        return
    if a.table:
        with open(a.json) as f:
            print(table(json.load(f)["results"]))
        return
    sys.path.insert(0, HERE)
    from _isolated import run_isolated
    if a.frames % BATCH_FRAMES:
        raise SystemExit(f"--frames: {a.frames} is not a multiple of BenchMARL's batch ({BATCH_FRAMES} frames)")
    results: dict = {}
    if a.json and os.path.exists(a.json):  # rows run in several invocations share one file
        with open(a.json) as f:
            results = json.load(f)["results"]
    have = installed_algorithms()
    for row in a.rows:
        algo, task = row.split("/")
        if row not in ROWS:
            raise SystemExit(f"--rows: {row!r} is not one of {ROWS}")
        if FLOWKIT_ALGO[algo] not in have:
            print(f"{row}: flowkit algorithm {FLOWKIT_ALGO[algo]!r} is not installed: skipped", flush=True)
            continue
        results[row] = {"frames": a.frames, "hidden": a.hidden, "threads": a.threads, "episodes": a.episodes,
                        "flowkit": [], "benchmarl": []}
        for i, seed in enumerate(a.seeds):
            sides = ["flowkit", "benchmarl"] if i % 2 == 0 else ["benchmarl", "flowkit"]
            for side in sides:
                if side == "flowkit":
                    out = run_isolated("marl_benchmarl", "run_flowkit", algo, task, a.frames, seed, a.hidden, a.threads,
                                       a.episodes)
                else:
                    out = run_benchmarl(algo, task, a.frames, seed, a.hidden, a.threads, a.episodes,
                                        a.benchmarl_python)
                out = {**out, "seed": seed, "load1": os.getloadavg()[0]}
                print(f"  {row} seed {seed} {side}: {out}", flush=True)
                results[row][side].append(out)
                if a.json:  # after every run: a cut-short table keeps what it measured
                    with open(a.json, "w") as f:
                        json.dump({"results": results}, f, indent=1)
    print(f"\nMLP {a.hidden}, {a.threads} torch thread(s), {a.episodes} greedy evaluation episodes; load: 1-min "
          "load average at the end of each run (median)")
    print(table(results))


if __name__ == "__main__":
    main()
