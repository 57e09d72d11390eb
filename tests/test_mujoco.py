"""MuJoCo (issue 23): Gymnasium's HalfCheetah-v5 trains with SAC and model.normalize_obs; the
observation statistics are saved in the checkpoint, restored, and applied when acting; the
on-policy algorithms update them too."""
import os

import numpy as np
import pytest
import torch

pytest.importorskip("mujoco")

import flowkit  # noqa: E402
from flowkit.checkpoint import load_state  # noqa: E402
from flowkit.testing import local_overrides  # noqa: E402

SMALL = ["runtime.num_workers=1", "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=25",
         "model.hidden_sizes=[32,32]", "seed=0"]


def test_sac_halfcheetah_with_observation_normalisation_in_the_checkpoint(run_dir):
    res = flowkit.train(local_overrides(run_dir, "algo=sac", "env=HalfCheetah-v5", *SMALL, "model.normalize_obs=true",
                                        "sac.learning_starts=100", "sac.train_batch_size=32", "stop.env_steps=300"))
    assert res.metrics["env_steps_sampled"] == 300 and np.isfinite(res.metrics["learner/default/critic_loss"])
    w = load_state(res.checkpoint)["policies"]["default"]["weights"]
    mean, var, count = w["obs_rms.mean"], w["obs_rms.var"], float(w["obs_rms.count"])
    assert mean.shape == (17,) and count > 1000  # rows of replayed train batches taken in
    assert np.abs(mean).max() > 0.01 and not np.allclose(var, 1.0)  # not the initial identity
    pol = flowkit.Algorithm.from_checkpoint(res.checkpoint).get_policy()
    np.testing.assert_array_equal(pol.model.obs_rms.mean.numpy(), mean)
    # acting (evaluate, workers) sees the normalised observation: the greedy action by hand
    obs = np.random.default_rng(0).normal(size=(5, 17)).astype(np.float32)
    x = torch.clamp((torch.from_numpy(obs) - torch.from_numpy(mean)) / torch.sqrt(torch.from_numpy(var) + 1e-8), -10, 10)
    with torch.no_grad():
        want = torch.tanh(pol.model.actor(x).chunk(2, -1)[0]).numpy()
    got = pol.compute_actions(obs, explore=False)
    lo, hi = pol.action_space.low, pol.action_space.high
    np.testing.assert_allclose(got, lo + (want + 1) * 0.5 * (hi - lo), rtol=1e-5, atol=1e-5)
    # the worker's copy gets the statistics with the weights
    worker = type(pol)(pol.observation_space, pol.action_space, pol.config, pol.model_config, inference_only=True)
    worker.set_weights(pol.get_weights())
    np.testing.assert_array_equal(worker.model.obs_rms.var.numpy(), var)


@pytest.mark.parametrize("algo", ["a2c", "impala"])
def test_on_policy_algorithms_update_the_statistics(algo, run_dir):
    res = flowkit.train(local_overrides(run_dir, f"algo={algo}", "env=Hopper-v5", *SMALL, "model.normalize_obs=true",
                                        "stop.env_steps=100"))
    w = load_state(res.checkpoint)["policies"]["default"]["weights"]
    trained = res.metrics["env_steps_trained"]
    assert trained >= 100 and float(w["obs_rms.count"]) == pytest.approx(trained, abs=1e-3)  # each trained row once
    assert w["obs_rms.mean"].shape == (11,) and np.abs(w["obs_rms.mean"]).max() > 0


def test_mujocos_own_warnings_are_python_warnings_and_leave_no_log_file(tmp_path, monkeypatch):
    """mujoco 4 warns of a deprecated attribute in Gymnasium's half_cheetah.xml each time an env is
    built: that was a line per env on stderr and a MUJOCO_LOG.TXT in the user's folder."""
    import warnings

    from flowkit.core import EnvContext, _envs, make_env
    monkeypatch.chdir(tmp_path)
    # each note is said once per process: start this process's account afresh (an earlier test built one)
    monkeypatch.setattr(_envs, "_MUJOCO_QUIET", [])
    monkeypatch.setattr(_envs, "_MUJOCO_SHOW", [True])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for i in range(2):
            make_env({"id": "HalfCheetah-v5"}, EnvContext(0, i, 1, 0, 0)).close()
    assert not os.path.exists(tmp_path / "MUJOCO_LOG.TXT")
    import mujoco
    if mujoco.__version__.startswith("4."):  # the version that warns (shown once per process by default)
        assert any(str(w.message).startswith("MuJoCo: compiler attribute 'settotalmass'") for w in seen)


@pytest.mark.slow
def test_evaluate_films_a_mujoco_env_without_a_display(run_dir, tmp_path):
    """A newcomer's find: `flowkit evaluate RUN render=mp4` on HalfCheetah, on a machine with no
    display, ended in a 68-line traceback (mujoco.FatalError: no OpenGL platform library).
    Headless, evaluate now renders off-screen (MUJOCO_GL=egl); where render() fails anyway, one line."""
    import subprocess
    import sys
    try:
        from mujoco.egl import GLContext  # the off-screen backend this machine needs
        GLContext(8, 8).free()
    except Exception as e:  # pragma: no cover - a machine without libEGL
        pytest.skip(f"no EGL here: {e}")
    res = flowkit.train(local_overrides(run_dir, "algo=sac", "env=HalfCheetah-v5", *SMALL, "env.max_episode_steps=12",
                                        "sac.learning_starts=50", "sac.train_batch_size=16", "stop.env_steps=100"))
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL")}
    cmd = [sys.executable, "-m", "flowkit.cli", "evaluate", res.run_dir, "episodes=1", "render=mp4"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    import imageio.v3 as iio
    frames = iio.imread(os.path.join(res.checkpoint, "videos", "episode_000.mp4"))
    assert frames.shape[0] == 13 and frames.ndim == 4 and frames.std() > 0  # the reset frame and 12 steps
    # a display that is not there (glfw fails, as MUJOCO_GL=glfw would headless): one line, exit 2
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**env, "DISPLAY": ":99"})
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert last.startswith("flowkit evaluate: error: render=mp4: the env's render() raised FatalError") \
        and last.endswith("MuJoCo renders off-screen with MUJOCO_GL=egl (or osmesa, with libOSMesa)")


@pytest.mark.parametrize("kwarg,message", [
    ("env.kwargs.reset_noise_scale=nan", "env.kwargs.reset_noise_scale='nan' is not a finite number"),
    ("env.kwargs.reset_noise_scale=.inf", "env.kwargs.reset_noise_scale=inf is not a finite number"),
    ("env.kwargs.healthy_z_range=[.nan,1]", "env.kwargs.healthy_z_range[0]=nan is not a finite number"),
    ("env.kwargs.render_mode=human", "env.kwargs.render_mode='human': training renders nothing (each rollout "
                                     "worker's sub-envs would open windows, and this machine has no display); film the "
                                     "trained policy with `flowkit evaluate RUN render=mp4`"),
    ("env.kwargs.frame_skip=-1", "env.id='Hopper-v5': the env's time step dt=-0.002 s is not > 0 "
                                 "(env.kwargs: {'frame_skip': -1})"),
    ("env.kwargs.frame_skip=1.5", "env.id='Hopper-v5': its first step() raised TypeError: mj_step(): incompatible "
                                  "function arguments. The following argument types are supported: "
                                  "(env.kwargs: {'frame_skip': 1.5})"),
    ("env.kwargs.reset_noise_scale=abc", "env.id='Hopper-v5': its first reset() raised TypeError: bad operand type for unary "
                                         "-: 'str' (env.kwargs: {'reset_noise_scale': 'abc'})"),
])
def test_env_kwargs_no_env_can_train_with_are_one_line_before_anything_starts(tmp_path, monkeypatch, capsys,
                                                                              kwarg, message):
    """Issue 48 item 6: `render_mode=human` aborted the process (GLFW) headless, `reset_noise_scale=nan`
    was retried 3 times into 272 lines of tracebacks, `frame_skip=-1` trained on a simulation
    that never moves. Each is a config error (exit 2), before the run folder is made."""
    from flowkit.cli import main
    for var in ("DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.delenv(var, raising=False)
    rc = main(["train", "algo=ppo", "env=Hopper-v5", kwarg, "runtime.backend=local", "stop.env_steps=64",
               f"run.dir={tmp_path}/r", "--no-tuned"])
    assert rc == 2 and capsys.readouterr().err.strip().splitlines() == [f"flowkit: config error: {message}"]
    assert not os.path.exists(tmp_path / "r")


@pytest.mark.parametrize("backend", ["local", pytest.param("ray", marks=pytest.mark.slow)])
def test_a_mujoco_run_says_mujocos_deprecation_note_once(tmp_path, backend):
    """Issue 48 item 13: every MuJoCo run printed the same note twice (once raw from the env-id
    check before Ray, once as a Python warning; Python's own once-per-place is reset by any
    change of the warning filters), and once more per Ray rollout worker."""
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "flowkit.cli", "train", "algo=sac", "env=HalfCheetah-v5", "--no-tuned",
                        f"runtime.backend={backend}", "runtime.num_workers=2", "runtime.num_cpus_per_worker=0.5",
                        "stop.env_steps=40", "sac.learning_starts=20", "run.reporters=[csv]",
                        "evaluation.final=false", f"run.dir={tmp_path}/r"], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    import mujoco
    if mujoco.__version__.startswith("4."):  # the version that warns
        assert p.stderr.count("compiler attribute 'settotalmass' is deprecated") == 1, p.stderr[-2000:]


def test_an_exported_mujoco_policy_takes_float32_observations_as_the_readme_feeds_them(run_dir, capsys):
    """Issue 48 item 9: MuJoCo's observations are float64, and the export took float64
    (`(obs: float64[B, 11])`), so the README's onnxruntime example (`obs[None].astype("float32")`)
    failed with INVALID_ARGUMENT. Float Boxes are float32 inputs, as the network takes them."""
    import gymnasium as gym
    import onnxruntime as ort

    from flowkit.cli import main
    res = flowkit.train(local_overrides(run_dir, "algo=ppo", "env=Hopper-v5", *SMALL, "ppo.train_batch_size=50",
                                        "ppo.minibatch_size=50", "ppo.num_epochs=1", "stop.env_steps=50"))
    assert main(["export", res.checkpoint, "format=onnx"]) == 0
    assert "(obs: float32[B, 11]) -> action: float32[B, 3]" in capsys.readouterr().out
    env = gym.make("Hopper-v5")
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.float64
    sess = ort.InferenceSession(os.path.join(res.checkpoint, "policy.onnx"))
    action = sess.run(None, {"obs": obs[None].astype("float32")})[0][0]
    policy = flowkit.Algorithm.from_checkpoint(res.run_dir).get_policy()
    np.testing.assert_allclose(action, policy.compute_actions(obs, explore=False), rtol=1e-5, atol=1e-5)
