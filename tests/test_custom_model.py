"""Issue 11, part 3: model.class=module:Class, its contract checked at set-up, checkpoints of
such runs loaded in a fresh process."""
import os
import subprocess
import sys

import pytest

import flowkit
from flowkit.testing import local_overrides

HERE = os.path.dirname(os.path.abspath(__file__))
COMMON = ["env.factory=flowkit.testing.envs:match", "runtime.num_workers=1", "runtime.rollout_fragment_length=16",
          "stop.iterations=2", "ppo.minibatch_size=32", "dqn.learning_starts=16"]


@pytest.mark.parametrize("algo,cls", [("ppo", "TinyActorCritic"), ("impala", "TinyActorCritic"), ("dqn", "TinyQ")])
@pytest.mark.slow
def test_a_custom_model_trains_and_loads_in_a_fresh_process(run_dir, algo, cls):
    res = flowkit.train(local_overrides(run_dir, f"algo={algo}", f"model.class=custom_models:{cls}", *COMMON),
                        verbose=False)
    assert res.checkpoint
    code = ("import sys, flowkit, numpy as np\n"
            "a = flowkit.Algorithm.from_checkpoint(sys.argv[1], trust_config=True)\n"
            "print(type(a.get_policy().model).__name__, a.compute_actions(1))")
    p = subprocess.run([sys.executable, "-c", code, run_dir], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])})
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split()[0] == cls


@pytest.mark.parametrize("value,msg", [
    ("custom_models:LogitsOnly", "model.class='custom_models:LogitsOnly': forward returned float32[2, 2] for a batch "
                                 "of 2 observations; PPOPolicy expects (float32[2, 2], float32[2]) (as its default "
                                 "ActorCritic)"),
    ("custom_models:Nope", "model.class='custom_models:Nope' does not import: AttributeError"),
    ("custom_models:NotAModule", "not a torch.nn.Module subclass"),
    ("custom_models", "model.class='custom_models' must match"),
])
def test_a_model_that_breaks_the_contract_is_a_config_error_at_set_up(run_dir, value, msg):
    with pytest.raises(flowkit.ConfigError) as e:
        flowkit.train(local_overrides(run_dir, f"model.class={value}", *COMMON), verbose=False)
    assert msg in str(e.value)
    assert not os.path.exists(os.path.join(run_dir, "checkpoints"))


def test_a_recurrent_custom_model_trains_and_a_feed_forward_one_cannot_be_recurrent(run_dir):
    """A model.class with initial_state is recurrent (its batches carry state_in, its loss runs
    over sequences) without model.recurrent; with model.recurrent a feed-forward class is an error."""
    res = flowkit.train(local_overrides(run_dir, "model.class=custom_models:TinyGRUActorCritic", *COMMON),
                       verbose=False)
    pol = flowkit.Algorithm.from_checkpoint(res.checkpoint, trust_config=True).get_policy()
    assert pol.is_recurrent and pol.initial_state(3).shape == (3, 8)
    actions, state = pol.compute_actions([0, 1, 1], state=pol.initial_state(3))
    assert actions.shape == (3,) and state.shape == (3, 8) and (state != 0).any()
    with pytest.raises(flowkit.ConfigError, match="model.recurrent='gru' needs a recurrent network: "
                                                  "model.class='custom_models:TinyActorCritic' has no initial_state"):
        flowkit.train(local_overrides(run_dir + "x", "model.class=custom_models:TinyActorCritic",
                                      "model.recurrent=gru", *COMMON), verbose=False)


def test_normalize_observations_needs_obs_rms(run_dir):
    with pytest.raises(flowkit.ConfigError, match="normalize_observations=true needs the model's `obs_rms`"):
        flowkit.train(local_overrides(run_dir, "model.class=custom_models:TinyActorCritic",
                                      "ppo.normalize_observations=true", *COMMON), verbose=False)


@pytest.mark.slow
def test_a_custom_model_per_policy_in_a_multi_agent_run(run_dir):
    """multiagent.policies.<id>.model.* overrides model.* for that policy only; the checkpoint
    keeps each policy's model section, so a fresh process rebuilds both networks."""
    pytest.importorskip("pettingzoo")
    res = flowkit.train(local_overrides(
        run_dir, "env.factory=flowkit.testing.envs:turn_game", "multiagent.policies.a.algo=ppo",
        "multiagent.policies.b.algo=ppo", "multiagent.mapping.p0=a", "multiagent.mapping.p1=b",
        "multiagent.policies.a.model.class=custom_models:TinyActorCritic", "multiagent.policies.b.model.hidden_sizes=[8]",
        "runtime.num_workers=1", "runtime.rollout_fragment_length=16", "stop.iterations=2", "ppo.minibatch_size=16"),
        verbose=False)
    code = ("import sys, flowkit\n"
            "a = flowkit.Algorithm.from_checkpoint(sys.argv[1], trust_config=True)\n"
            "print(type(a.get_policy('a').model).__name__, type(a.get_policy('b').model).__name__,"
            " a.get_policy('b').model_config.hidden_sizes)")
    p = subprocess.run([sys.executable, "-c", code, res.run_dir], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])})
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["TinyActorCritic", "ActorCritic", "[8]"]
    with pytest.raises(flowkit.ConfigError, match=r"multiagent.policies.a.model"):
        flowkit.train(local_overrides(run_dir + "2", "env.factory=flowkit.testing.envs:turn_game",
                                      "multiagent.policies.a.model.hidden_size=[8]"), verbose=False)


@pytest.mark.parametrize("algo", ["ppo", "dqn", "impala", "appo", "a2c", "a3c", "sac", "td3"])
def test_every_policy_builds_with_model_config_none(algo):
    """Issue 27 item 10: Policy documents ``model_config=None`` (the model.* defaults), but DQN's
    policy (and SAC's, TD3's) crashed with it."""
    import gymnasium as gym
    import numpy as np

    from flowkit.config import section_object
    from flowkit.engine import load_config
    env = "Pendulum-v1" if algo in ("sac", "td3") else "CartPole-v1"
    pm, cfg = load_config([f"algo={algo}", f"env={env}"])[:2]
    cls = pm.algorithms()[algo]
    conf = section_object(cfg, algo, cls.config_class)
    e = gym.make(env)
    pol = cls.policy_class(e.observation_space, e.action_space, conf, None)
    assert list(pol.model_config.hidden_sizes) == [64, 64] and pol.model_config.activation == "tanh"
    obs = np.stack([e.observation_space.sample() for _ in range(4)])
    act = np.asarray(pol.compute_actions(obs, explore=False))
    assert act.shape[0] == 4 and all(e.action_space.contains(a.astype(e.action_space.dtype)) for a in act)
