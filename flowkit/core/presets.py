"""Env presets: a named family of env wrappers that ``env.preset=NAME`` picks, contributed by
plugins through the ``flowkit_add_env_presets`` hook (plugins/atari: ``atari``, DeepMind's
preprocessing; plugins/minigrid: ``minigrid``).

Core knows no preset by name: :func:`~flowkit.core.make_env` builds ``env.id`` through the
preset registered under ``env.preset``, the Gymnasium runner asks it for a vector env of its own,
and the checks before Ray starts ask it what to check. The plugin manager registers the presets
its plugins contribute (:func:`register_presets`, on the driver and on every worker), so that
any code of the process that builds an env finds them by name, as Gymnasium finds env ids.

Two things the runner and the replay read from the envs themselves, whatever built them:

- an env (or vector env) with the attribute ``flowkit_game_stats = True`` reports whole games:
  ``info["game_return"]`` / ``info["game_length"]`` on the step that ends one (a vector env: with
  their ``_game_return`` / ``_game_length`` masks); the runner's episode metrics then count
  games with those figures, not the training episodes (e.g. a life each);
- observations that are stacks of uint8 frames, ``uint8[K, H, W]`` with H, W >= 8, stay uint8 on
  the wire and are stored once per frame in replay (:mod:`flowkit.core._frames`).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Optional

from flowkit.config import ConfigError

if TYPE_CHECKING:
    import gymnasium as gym


@dataclass(frozen=True)
class EnvPreset:
    """An env preset as ``flowkit_add_env_presets`` contributes it: its ``name`` (the value of
    ``env.preset``), the ``module`` that implements it (imported when a run uses the preset: the
    declaration imports neither Gymnasium nor the env's package, so ``flowkit --help`` stays
    light) and a one-line ``help``.

    The module defines these functions (``env_cfg``: the run's ``env`` section as a dict):

    - ``make_env(env_cfg, context) -> gym.Env`` (required): ``env.id`` under the preset's
      wrappers, the training ones on a rollout worker (``context.worker_index >= 0``), the
      evaluation ones elsewhere (the run's evaluation, ``flowkit evaluate`` and ``record``:
      ``worker_index == -1``); it applies ``env.max_episode_steps`` itself. Raises ValueError
      naming the ``env.*`` key of a value it cannot take.
    - ``check(env_cfg)`` (optional): what must hold and happen on the driver before Ray starts,
      without building an env: the ``env.*`` values the preset refuses (ValueError naming the
      key), and registering the env ids of its package with Gymnasium, so that the env-id check
      finds them.
    - ``make_vector_env(env_cfg, num_envs, like) -> Optional[gym.vector.VectorEnv]``
      (optional): a rollout worker's ``num_envs`` sub-envs as one vector env of the preset's own
      that gives the training side's transitions (e.g. ale-py's, in C++), or None where it
      cannot (the wrapped envs then run in a SyncVectorEnv). One that also has ``send(actions)``
      and ``recv()`` (stepping off the GIL) serves double-buffered sampling. ``like``: an env of
      the same ``env.id`` already built by the worker (or None).
    - ``hint(env_id) -> Optional[str]`` (optional): for an ``env.id`` that failed to build
      without a preset, the one-line error when it is this preset's (e.g. "env.id=... is a
      MiniGrid env: give it with env.preset=minigrid"), else None.
    """
    name: str
    module: str
    help: str = ""

    def _fn(self, name: str) -> Optional[Callable[..., Any]]:
        return getattr(importlib.import_module(self.module), name, None)

    def make_env(self, env_cfg: Dict[str, Any], context: Any) -> "gym.Env":  # context: an EnvContext
        return importlib.import_module(self.module).make_env(env_cfg, context)

    def check(self, env_cfg: Dict[str, Any]) -> None:
        """The module's ``check`` (none: nothing to check); its ValueError or ImportError as a
        one-line :class:`~flowkit.config.ConfigError`."""
        if (fn := self._fn("check")) is not None:
            try:
                fn(env_cfg)
            except (ValueError, ImportError) as e:
                raise ConfigError(str(e)) from None

    def make_vector_env(self, env_cfg: Dict[str, Any], num_envs: int, like: Any = None) -> Any:
        fn = self._fn("make_vector_env")
        return None if fn is None else fn(env_cfg, num_envs, like)

    def hint(self, env_id: str) -> Optional[str]:
        fn = self._fn("hint")
        return None if fn is None else fn(env_id)


_PRESETS: Dict[str, EnvPreset] = {}


def register_presets(presets: Iterable[EnvPreset]) -> None:
    """Make ``presets`` known by name in this process (the plugin manager registers those its
    plugins contribute; a name registered again takes the newer preset)."""
    _PRESETS.update({p.name: p for p in presets})


def env_preset(name: str) -> EnvPreset:
    """The preset registered under ``name``.

    Raises:
        ConfigError: no preset of that name (the message lists the registered ones).
    """
    try:
        return _PRESETS[name]
    except KeyError:
        raise ConfigError(f"env.preset={name!r} is not a registered env preset (registered: "
                          f"{', '.join(sorted(_PRESETS)) or 'none: no plugin manager built in this process yet'})"
                          ) from None


def preset_hint(env_id: Any) -> Optional[str]:
    """For an ``env.id`` that failed to build without a preset: the first registered preset's
    one-line error claiming it (see :class:`EnvPreset`), or None."""
    return next(filter(None, (p.hint(str(env_id)) for p in _PRESETS.values())), None)
