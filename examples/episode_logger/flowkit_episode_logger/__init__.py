"""flowkit-episode-logger: a callback plugin (example) with two hooks and no algorithm.

- ``flowkit_on_episode_end`` (runs on the workers): a custom episode metric, the mean reward
  per step, reported per iteration as ``custom/reward_per_step``.
- ``flowkit_report`` (runs on the driver, once per reported row): appends the row's main
  columns to ``<run folder>/episodes.jsonl``.

Installed (``pip install ./examples/episode_logger``) it is active in every run; without
installing it, name it in a config: ``plugins=[flowkit_episode_logger]``.
"""
from __future__ import annotations

import json
import os

import flowkit

COLUMNS = ("iteration", "env_steps_sampled", "episode_return_mean", "custom/reward_per_step")


@flowkit.hookimpl
def flowkit_on_episode_end(episode, worker):
    """The episode's mean reward per step."""
    episode.custom_metrics["reward_per_step"] = episode.total_reward / max(1, episode.length)


@flowkit.hookimpl
def flowkit_report(result, ctx):
    """One JSON line per reported row."""
    with open(os.path.join(ctx.run_dir, "episodes.jsonl"), "a") as f:
        f.write(json.dumps({k: result[k] for k in COLUMNS if k in result}) + "\n")
