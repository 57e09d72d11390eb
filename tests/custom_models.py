"""Custom networks for tests/test_custom_model.py (``model.class=custom_models:Name``)."""
import torch
from torch import nn


class TinyActorCritic(nn.Module):
    """One hidden layer shared by the policy and value heads."""

    def __init__(self, encoder, num_outputs, model_config):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(encoder.shape[0], 16), nn.Tanh())
        self.pi, self.vf = nn.Linear(16, num_outputs), nn.Linear(16, 1)

    def forward(self, obs):
        h = self.body(obs)
        return self.pi(h), self.vf(h).squeeze(-1)


class LogitsOnly(TinyActorCritic):
    """Breaks the actor-critic contract: no value."""

    def forward(self, obs):
        return self.pi(self.body(obs))


class TinyQ(nn.Module):
    def __init__(self, encoder, num_outputs, model_config):
        super().__init__()
        self.net = nn.Linear(encoder.shape[0], num_outputs)

    def forward(self, obs):
        return self.net(obs)


NotAModule = torch.zeros
