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


class TinyGRUActorCritic(nn.Module):
    """A recurrent custom network (the recurrent-model contract of flowkit.core.recurrent): a
    GRU cell unrolled by hand over the sequence, resets zeroing the state."""

    def __init__(self, encoder, num_outputs, model_config):
        super().__init__()
        self.cell = nn.GRUCell(encoder.shape[0], 8)
        self.pi, self.vf = nn.Linear(8, num_outputs), nn.Linear(8, 1)

    def initial_state(self, n):
        return torch.zeros(n, 8)

    def forward(self, obs, state, resets=None):
        outs = []
        for t in range(obs.shape[1]):
            if resets is not None:
                state = state * (~resets[:, t:t + 1]).float()
            state = self.cell(obs[:, t], state)
            outs.append(state)
        h = torch.stack(outs, 1)
        return self.pi(h), self.vf(h).squeeze(-1), state
