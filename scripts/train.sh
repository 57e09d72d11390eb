#!/usr/bin/env bash
# Quick start, command 1: set up, then train PPO on CartPole-v1 with 2 Ray rollout workers
# until it is solved (episode_return_mean >= 475). Extra arguments are config overrides,
# e.g. `bash scripts/train.sh seed=1`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/flowkit train -c configs/ppo/CartPole-v1.yaml "$@"
