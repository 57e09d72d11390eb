"""Image networks (issue 23): the rollout workers' CPU acting layout of a CNN computes the same
functions as the learner's network, and keeps its layout across weight syncs."""
import numpy as np
import pytest
import torch
from gymnasium import spaces
from omegaconf import OmegaConf

from flowkit.config import ModelConfig

FRAMES = spaces.Box(0, 255, (4, 84, 84), np.uint8)


def model_cfg(**kw):
    cfg = OmegaConf.structured(ModelConfig)
    cfg.hidden_sizes, cfg.activation = [512], "relu"
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


def ppo_pair(**kw):
    from flowkit_ppo import PPOConfig, PPOPolicy
    mc = model_cfg(shared_value_network=True, **kw)
    learner = PPOPolicy(FRAMES, spaces.Discrete(6), PPOConfig(), mc, seed=1)
    worker = PPOPolicy(FRAMES, spaces.Discrete(6), PPOConfig(), mc, seed=2, inference_only=True)
    return learner, worker


def dqn_pair(**kw):
    from flowkit_dqn import DQNConfig, DQNPolicy
    mc = model_cfg(**kw)
    return (DQNPolicy(FRAMES, spaces.Discrete(6), DQNConfig(), mc, seed=1),
            DQNPolicy(FRAMES, spaces.Discrete(6), DQNConfig(), mc, seed=2, inference_only=True))


@pytest.mark.parametrize("pair", [ppo_pair, dqn_pair])
def test_worker_cnn_acts_in_its_cpu_layout_with_the_learner_s_function(pair):
    learner, worker = pair()
    convs = [m for m in worker.model.modules() if isinstance(m, torch.nn.Conv2d)]
    lins = [m for m in worker.model.modules() if isinstance(m, torch.nn.Linear)]
    # before and after a weight sync: load_state_dict copies into the acting layout
    for _ in range(2):
        worker.set_weights(learner.get_weights())
        assert convs and all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)
        assert lins and all(lin.weight.t().is_contiguous() for lin in lins)
        obs = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (8, 4, 84, 84), dtype=np.uint8))
        with torch.no_grad():
            want, got = learner.model(obs), worker.model(obs)
        for w, g in zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,),
                        strict=True):
            assert torch.allclose(w, g, rtol=1e-4, atol=1e-5), (w - g).abs().max()
        # the scaling by 1/255 is inside: uint8 frames give what their float [0, 1] values give
        with torch.no_grad():
            scaled = learner.model(obs.float() / 255.0)
        for w, s in zip(want if isinstance(want, tuple) else (want,), scaled if isinstance(scaled, tuple) else (scaled,),
                        strict=True):
            assert torch.allclose(w, s, rtol=1e-4, atol=1e-5)
        with torch.no_grad():  # the learner trains on the next sync's weights
            for p in learner.model.parameters():
                p.add_(0.01)
    # the learner's parameters keep their plain layout (views of the optimizer's flat buffer)
    assert all(m.weight.is_contiguous() for m in learner.model.modules() if isinstance(m, torch.nn.Conv2d))
    w = worker.get_weights()
    assert all(v.flags.c_contiguous for v in w.values())  # what travels is plain arrays
