"""Issue 11, part 1: every installed algorithm passes flowkit.testing.check_algorithm, and a
broken one fails with a message naming what is wrong."""
import re
from dataclasses import dataclass

import pytest
from flowkit_ppo.ppo import PPO, PPOPolicy
from flowkit_ppo import PPOConfig

from flowkit.config import F
from flowkit.hooks import get_plugin_manager
from flowkit.testing import ConformanceError, check_algorithm

# settings that make the checks quick (a learner update within 3 short iterations, the tiny
# env learned within the budget); an algorithm not listed runs with its defaults
SETTINGS = {
    "ppo": ["ppo.minibatch_size=32", "ppo.num_epochs=4"],
    "dqn": ["dqn.learning_starts=64", "dqn.target_network_update_freq=50", "dqn.epsilon_timesteps=2000"],
    "apex": ["dqn.learning_starts=64", "dqn.target_network_update_freq=50", "dqn.epsilon_timesteps=2000",
             "dqn.num_replay_shards=2", "dqn.prioritized_replay=true"],
    "impala": ["impala.train_batch_size=64"],
    "r2d2": ["r2d2.seq_len=8", "r2d2.burn_in=2", "r2d2.learning_starts=64", "r2d2.target_network_update_freq=50",
             "r2d2.epsilon_timesteps=2000", "r2d2.train_batch_size=16", "r2d2.lr=1e-3", "r2d2.training_intensity=16",
             "model.recurrent_size=32"],
}
# the offline algorithms learn from a dataset, not rollouts: tests/test_offline.py checks them
# (config, plan, checkpoint, learn) with one
OFFLINE = {"bc", "marwil", "cql_dqn", "cql_sac"}
# MAML needs a task-settable env: tests/test_maml.py runs the kit on flowkit.testing's PointGoal
# MAPPO, VDN and QMIX need a multi-agent env: tests/test_ctde.py runs the kit on its two-agent
# TeamMatch, tests/test_value_decomposition.py on its cooperative team task
ALGOS = sorted(set(get_plugin_manager().algorithms(load=False)) - {"random", "maml", "mappo", "vdn", "qmix"}
               - OFFLINE) + ["apex"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ALGOS)
def test_every_algorithm_passes_check_algorithm(name, ray_session, tmp_path):
    cls = get_plugin_manager().algorithms()["dqn" if name == "apex" else name]
    out = check_algorithm(cls, SETTINGS.get(name, []), tmp_dir=str(tmp_path))
    assert out["learn_return"] > 0


def test_check_algorithm_quick_checks_of_ppo(tmp_path):
    out = check_algorithm(PPO, SETTINGS["ppo"], checks=["config", "plan", "checkpoint"], tmp_dir=str(tmp_path))
    assert "ParallelRollouts" in out["plan"]


class CountingPolicy(PPOPolicy):
    """A policy with state its checkpoint leaves out: a counter, and the optimizer."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.seen_batches = 0

    def loss(self, batch):
        self.seen_batches += 1
        return super().loss(batch)

    def get_state(self):
        st = super().get_state()
        st.pop("optimizer")
        return st


def _variant(**attrs):
    return type("Variant", (PPO,), {"name": "variant", **attrs})


def test_check_algorithm_names_state_left_out_of_the_checkpoint(tmp_path):
    with pytest.raises(ConformanceError) as e:
        check_algorithm(_variant(policy_class=CountingPolicy), ["variant.minibatch_size=32"], checks=["checkpoint"],
                        tmp_dir=str(tmp_path))
    msg = str(e.value)
    assert msg.startswith("check_algorithm('Variant'): checkpoint: a checkpoint round trip does not give back")
    assert "policy 'default': `optimizer`['state']: keys differ" in msg
    assert re.search(r"policy 'default': `seen_batches`: \d+ after training, 0 after restore", msg)


def test_check_algorithm_config_section(tmp_path):
    @dataclass
    class Undocumented(PPOConfig):
        """variant: PPO with a new knob."""
        knob: float = F(1.0)

    with pytest.raises(ConformanceError, match=r"config: Undocumented fields without a help text: knob"):
        check_algorithm(_variant(config_class=Undocumented), checks=["config"], tmp_dir=str(tmp_path))
    with pytest.raises(ConformanceError, match=r"config: policy_class is None"):
        check_algorithm(_variant(policy_class=None), checks=["config"], tmp_dir=str(tmp_path))


# ---- issue 27 item 6: broken plugins the kit must catch --------------------------------------
class NoSyncPPO(PPO):
    """PPO whose plan never sends the trained weights to the rollout workers."""
    name = "nosync"

    def training_flow(self, experiences, ctx, learner):
        from flowkit.core.ops import ConcatBatches, TrainOneStep
        cfg = self.config
        return (experiences.combine(ConcatBatches(cfg.train_batch_size or ctx.workers.round_env_steps))
                .for_each(TrainOneStep(ctx, learner, cfg.num_epochs, cfg.minibatch_size)))


@pytest.mark.slow
def test_check_algorithm_fails_a_plan_that_never_syncs_the_workers(tmp_path):
    """The learning check acts as a user's run does, through rollout worker 0 after the plan's
    last sync: before, it scored the learner's own weights, and this plugin passed."""
    with pytest.raises(ConformanceError) as e:
        check_algorithm(NoSyncPPO, ["nosync.minibatch_size=32", "nosync.num_epochs=4"], checks=["learn"],
                        tmp_dir=str(tmp_path))
    msg = str(e.value)
    assert msg.startswith("check_algorithm('NoSyncPPO'): learn: greedy return "), msg
    assert "on rollout worker 0" in msg and "below" in msg
    m = re.search(r"greedy return ([-\d.e]+) on rollout worker 0 .* below ([\d.]+) .* the learner's own weights "
                  r"reach ([-\d.e]+): the rollout workers act with other weights", msg)
    assert m, msg
    # the learner's weights pass (what the check scored before), the workers' do not
    assert float(m[1]) < float(m[2]) <= float(m[3]), msg


class WrongShapePolicy(PPOPolicy):
    def compute_actions_encoded(self, obs, mask=None, explore=True):
        a, extras = super().compute_actions_encoded(obs, mask, explore)
        return a[:, None], extras  # [B, 1] for a Discrete space


class OutOfRangePolicy(PPOPolicy):
    def compute_actions_encoded(self, obs, mask=None, explore=True):
        a, extras = super().compute_actions_encoded(obs, mask, explore)
        return a + self.dist.num_outputs, extras  # past the last action


@pytest.mark.parametrize("policy, pattern", [
    (WrongShapePolicy, r"actions: policy 'default' \(WrongShapePolicy\)\.compute_actions_encoded\(explore=True\): "
                       r"actions of shape \[5, 1\] for 5 observations; Discrete\(\d+\) needs \[5\]"),
    (OutOfRangePolicy, r"actions: policy 'default' \(OutOfRangePolicy\)\.compute_actions_encoded\(explore=True\): "
                       r"action indexes \[\d+, \d+, \d+, \d+, \d+\] outside \[0, \[\d+\]\)"),
])
def test_check_algorithm_checks_actions_against_the_action_space(tmp_path, policy, pattern):
    with pytest.raises(ConformanceError, match=pattern):
        check_algorithm(_variant(policy_class=policy), checks=["actions"], tmp_dir=str(tmp_path))
    check_algorithm(PPO, checks=["actions"], tmp_dir=str(tmp_path))  # the shipped policy passes


def test_prioritized_replay_without_td_error_stops_the_run(tmp_path):
    from flowkit_dqn.dqn import DQN, DQNPolicy

    class ForgetfulPolicy(DQNPolicy):
        def loss(self, batch):
            out = super().loss(batch)
            self.td_error = None  # a loss written without it
            return out

    algo = type("Forgetful", (DQN,), {"name": "forgetful", "policy_class": ForgetfulPolicy})
    with pytest.raises(ValueError, match=r"policy 'default': prioritized replay needs ForgetfulPolicy\.loss to set "
                                         r"`self\.td_error` \(float32\[B\], one per replayed row: \d+\); it is not set"):
        check_algorithm(algo, ["forgetful.learning_starts=64", "forgetful.prioritized_replay=true"],
                        checks=["checkpoint"], tmp_dir=str(tmp_path))
