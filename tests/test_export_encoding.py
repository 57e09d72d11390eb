"""The exported module encodes observations with the workers' own ObsEncoder.encode, traced in
torch ops (issue 22 item 2: one observation encoder, not a copy in export.py)."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from flowkit.core.encoders import ObsEncoder
from flowkit.export import encode_inputs, input_arrays, sample_observations

S = gym.spaces
SPACES = {
    "box": S.Box(-2.0, 2.0, (2, 3), np.float32),
    "discrete-start": S.Discrete(4, start=-1),
    "multidiscrete": S.MultiDiscrete([2, 5, 3]),
    "nested": S.Dict({"a": S.Discrete(3, start=1),
                      "b": S.Tuple((S.MultiDiscrete([2, 3]), S.Box(-1.0, 1.0, (2, 2), np.float32))),
                      "c": S.MultiBinary(3), "action_mask": S.MultiBinary(2)}),
    "image-hwc-uint8": S.Box(0, 255, (8, 9, 3), np.uint8),
    "image-chw-float": S.Box(0.0, 1.0, (2, 8, 9), np.float32),
}


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("name", list(SPACES))
def test_traced_encoding_is_the_workers_encoding(name):
    space = SPACES[name]
    enc = ObsEncoder(space)
    obs = sample_observations(space, 50, seed=3)
    want, _ = enc(obs, 50)
    ins = [torch.from_numpy(x) for x in input_arrays(space, obs)]
    traced = torch.jit.trace(lambda *xs: encode_inputs(enc, xs), tuple(t[:2] for t in ins))  # traced on 2 rows
    got = traced(*ins).numpy()  # run on 50: the batch axis is not baked in
    assert got.dtype == enc.dtype == want.dtype and got.shape == (50, *enc.shape)  # uint8 images stay uint8
    np.testing.assert_array_equal(got, want)
    assert enc.is_image == name.startswith("image")


ACTION_SPACES = {
    "discrete-start": (S.Discrete(5, start=2), lambda r: r.integers(0, 5, 40)),
    "multidiscrete": (S.MultiDiscrete([3, 4]), lambda r: r.integers(0, 3, (40, 2))),
    "multibinary": (S.MultiBinary(3), lambda r: r.integers(0, 2, (40, 3))),
    "box-bounded": (S.Box(np.array([-2.0, 0.0], np.float32), np.array([1.0, 5.0], np.float32)),
                    lambda r: r.normal(0.0, 1.5, (40, 2)).astype(np.float32)),
    "box-int-2d": (S.Box(-3, 3, (2, 2), np.int64), lambda r: r.normal(0.0, 1.5, (40, 4)).astype(np.float32)),
    "box-unbounded": (S.Box(-np.inf, np.inf, (3,), np.float32), lambda r: r.normal(0.0, 9.0, (40, 3)).astype(np.float32)),
}


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("name", list(ACTION_SPACES))
def test_traced_to_env_is_the_workers_to_env(name):
    """The exported module's last step is ActionDist.to_env traced with TorchOps: the same
    values and dtype as the workers' numpy call (scale, clip, round, start, shape)."""
    from flowkit.core.distributions import ActionDist
    from flowkit.export import TorchOps
    space, draw = ACTION_SPACES[name]
    dist, a = ActionDist(space), draw(np.random.default_rng(1))
    want = dist.to_env(a.copy())
    traced = torch.jit.trace(lambda t: dist.to_env(t, TorchOps), (torch.from_numpy(a[:2].copy()),))
    got = traced(torch.from_numpy(a.copy())).numpy()
    assert got.dtype == want.dtype and got.shape == want.shape == (40, *(space.shape or ()))
    np.testing.assert_array_equal(got, want)
    assert all(space.contains(x) for x in got) and (name.endswith("unbounded") or len(np.unique(got)) > 1)
