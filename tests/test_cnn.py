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
    from flowkit_ppo import PPOConfig
    from flowkit_ppo.ppo import PPOPolicy
    mc = model_cfg(shared_value_network=True, **kw)
    learner = PPOPolicy(FRAMES, spaces.Discrete(6), PPOConfig(), mc, seed=1)
    worker = PPOPolicy(FRAMES, spaces.Discrete(6), PPOConfig(), mc, seed=2, inference_only=True)
    return learner, worker


def dqn_pair(**kw):
    from flowkit_dqn import DQNConfig
    from flowkit_dqn.dqn import DQNPolicy
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


def impala_paper_params(c_in, channels=(16, 32, 32)):
    """Espeholt et al. 2018, Figure 3 (right), by hand: per stack a 3x3 conv from the previous
    depth and two residual blocks of two 3x3 convs each (weights + biases)."""
    n = 0
    for c in channels:
        n += c_in * c * 9 + c + 4 * (c * c * 9 + c)
        c_in = c
    return n


@pytest.mark.parametrize("shape,features", [((4, 84, 84), 32 * 11 * 11), ((3, 64, 64), 32 * 8 * 8)])
def test_impala_cnn_is_the_paper_s_deep_network(shape, features):
    from flowkit.core import ImpalaCNN, ObsEncoder, build_trunk
    torch.manual_seed(0)
    cnn = ImpalaCNN(shape)
    assert cnn.out_dim == features  # 84 -> 42 -> 21 -> 11 (3x3 max-pools of stride 2, padding 1)
    assert impala_paper_params(4) == 97_744
    assert sum(p.numel() for p in cnn.parameters()) == impala_paper_params(shape[0])
    convs = [m for m in cnn.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride, c.padding) for c in convs] == [
        (c, (3, 3), (1, 1), (1, 1)) for c in (16,) * 5 + (32,) * 10]
    pools = [m for m in cnn.modules() if isinstance(m, torch.nn.MaxPool2d)]
    assert [(p.kernel_size, p.stride, p.padding) for p in pools] == [(3, 2, 1)] * 3
    # with the paper's 256-unit ReLU layer: model.cnn=impala, hidden_sizes=[256]
    trunk, d = build_trunk(ObsEncoder(spaces.Box(0, 255, shape, np.uint8)), [256], "relu", "impala")
    assert d == 256 and sum(p.numel() for p in trunk.parameters()) == impala_paper_params(shape[0]) + features * 256 + 256
    x = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (5, *shape), dtype=np.uint8))
    with torch.no_grad():
        out = cnn(x)
        assert out.shape == (5, features) and out.dtype == torch.float32
        # uint8 frames scaled to [0, 1] inside (folded into the first conv), as float input / 255
        assert torch.allclose(out, cnn(x.float() / 255.0), rtol=1e-4, atol=1e-5)
        # a residual block adds its input: zero convolutions leave x unchanged
        block = cnn.net[2]
        for p in block.parameters():
            p.zero_()
        h = torch.randn(2, 16, 5, 5)
        assert torch.equal(block(h), h)
    with pytest.raises(ValueError, match="model.cnn='resnet'"):
        build_trunk(ObsEncoder(spaces.Box(0, 255, shape, np.uint8)), [256], "relu", "resnet")


@pytest.mark.parametrize("algo", ["ppo", "a2c", "impala", "appo", "dqn"])
def test_model_cnn_impala_for_every_pixel_algorithm(algo):
    import flowkit
    from flowkit.core import ImpalaCNN, SmallCNN
    cls = flowkit.get_plugin_manager().algorithms()[algo]
    mc = model_cfg(cnn="impala", shared_value_network=True)
    mc.hidden_sizes = [32]
    obs = np.random.default_rng(1).integers(0, 256, (3, 4, 84, 84), dtype=np.uint8)
    for inference_only in (False, True):  # the learner's copy, a rollout worker's
        pol = cls.policy_class(FRAMES, spaces.Discrete(6), cls.config_class(), mc, "cpu", 0,
                               inference_only=inference_only)
        assert [type(m) for m in pol.model.modules() if isinstance(m, (SmallCNN, ImpalaCNN))] == [ImpalaCNN]
        a, _ = pol.compute_actions_encoded(obs, None, True)
        assert a.shape == (3,) and set(a.tolist()) <= set(range(6))
