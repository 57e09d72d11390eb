"""The env preset ``atari`` (``env.preset=atari``; :class:`flowkit.EnvPreset` describes the
functions a preset module defines): DeepMind's Atari preprocessing (Mnih et al. 2015,
Nature 518, "Methods: preprocessing"; Machado et al. 2018 for the v5 sticky-action ids) built
from Gymnasium's own wrappers, plus the three small ones Gymnasium lacks.

From the base ALE env (frameskip 1) outwards::

    AtariPreprocessing(noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True)
        -- up to 30 no-ops after reset, each action repeated 4 frames with the last two
           frames max-pooled, 84x84 grayscale uint8; terminal_on_life_loss stays off (see
           EpisodicLife)
    GameStats           -- the unclipped return and length (agent steps) of each whole game,
                           in ``info["game_return"]`` / ``info["game_length"]`` at its end
    EpisodicLife        -- training only: terminated on a life loss; the game goes on
    FireReset           -- games whose action 1 is FIRE: FIRE after every (re)start, and in
                           evaluation (no EpisodicLife) after every lost life
    TransformReward(np.sign)  -- training only: rewards clipped to their sign
    FrameStackObservation(4)  -- uint8[4, 84, 84], the oldest frame first (padded with the
                                 reset frame at an episode's start)

"Training" is a rollout worker (``EnvContext.worker_index >= 0``); evaluation (the run's
evaluation worker, ``flowkit evaluate``) plays whole games with raw rewards. A rollout worker's
sub-envs run in ale-py's own vector env instead, under :class:`AtariVector` (the same frames and
training side; :func:`make_vector_env` says when), unless ``env.vectorization=sync``.

Why not AtariPreprocessing's own ``terminal_on_life_loss``: it ends the episode at a life loss
and the next ``reset()`` (the vector env's autoreset) restarts the whole game, so training never
sees a second life. EpisodicLife keeps the game running across the life boundary, as the
DeepMind and Stable-Baselines3 implementations do.

``ALE/<Game>-v5`` ids skip 4 frames in the env itself (and repeat the previous action with
probability 0.25): the preset makes them with ``frameskip=1`` so that AtariPreprocessing
skips and max-pools, as CleanRL and the RL Baselines3 Zoo do; sticky actions stay.
``<Game>NoFrameskip-v4`` ids (no sticky actions) are the classic setup of the DQN paper, the
Zoo's and CleanRL's published Atari figures.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import gymnasium as gym
import numpy as np

FRAME_STACK = 4
FRAME_SKIP = 4
ATARI_HZ = 60  # the Atari 2600's frames a second (NTSC)


class GameStats(gym.Wrapper):
    """Adds ``info["game_return"]`` (float, unclipped) and ``info["game_length"]`` (agent steps)
    on the step that ends a whole game (terminated or truncated below the life-loss wrapper);
    the env runner reports these as the episode's return and length. ``flowkit_game_stats``
    is how the runner finds out that an env reports games."""

    flowkit_game_stats = True

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._ret, self._len = 0.0, 0

    def reset(self, **kw):
        self._ret, self._len = 0.0, 0
        return self.env.reset(**kw)

    def step(self, action):
        obs, rew, term, trunc, info = self.env.step(action)
        self._ret += float(rew)
        self._len += 1
        if term or trunc:
            info = {**info, "game_return": self._ret, "game_length": self._len}
        return obs, rew, term, trunc, info


class EpisodicLife(gym.Wrapper):
    """Terminated when a life is lost; ``reset()`` then only steps a no-op (the game goes on)
    unless the game is really over. ``info["game_over"]``: whether the last end was the game's."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.ale = env.unwrapped.ale  # type: ignore[attr-defined]
        self.lives, self.game_over = 0, True

    def step(self, action):
        obs, rew, term, trunc, info = self.env.step(action)
        self.game_over = bool(term or trunc)
        lives = self.ale.lives()
        if 0 < lives < self.lives:
            term = True
        self.lives = lives
        return obs, rew, term, trunc, info

    def reset(self, **kw):
        if self.game_over:
            obs, info = self.env.reset(**kw)
        else:
            obs, _, term, trunc, info = self.env.step(0)
            if term or trunc:  # the no-op ended the game
                obs, info = self.env.reset(**kw)
        self.lives = self.ale.lives()
        self.game_over = False
        return obs, info


class FireReset(gym.Wrapper):
    """After a reset, presses FIRE (action 1) then action 2, for games that wait for FIRE to
    start (Breakout, Pong's serve); a step that ends the game resets again.

    ``on_life_loss`` (evaluation, where no :class:`EpisodicLife` turns a lost life into a reset):
    the same two presses right after a step that loses a life, their rewards added to that
    step's, so a game waits for FIRE at no point of play, as in training (a greedy policy that
    never chose FIRE would otherwise stand still until ALE's frame limit ends the game)."""

    def __init__(self, env: gym.Env, on_life_loss: bool = False):
        super().__init__(env)
        self.ale = env.unwrapped.ale if on_life_loss else None  # type: ignore[attr-defined]
        self.lives = 0

    def reset(self, **kw):
        self.env.reset(**kw)
        obs: Any = None
        info: Dict[str, Any] = {}
        for a in (1, 2):
            obs, _, term, trunc, info = self.env.step(a)
            if term or trunc:
                obs, info = self.env.reset(**kw)
        if self.ale is not None:
            self.lives = self.ale.lives()
        return obs, info

    def step(self, action):
        obs, rew, term, trunc, info = self.env.step(action)
        if self.ale is None:
            return obs, rew, term, trunc, info
        lives = self.ale.lives()
        lost, self.lives = 0 < lives < self.lives, lives
        for a in (1, 2):
            if not lost or term or trunc:
                break
            obs, r, term, trunc, info = self.env.step(a)
            rew = float(rew) + float(r)
        return obs, rew, term, trunc, info


def _has_fire(env: gym.Env) -> bool:
    meanings = env.unwrapped.get_action_meanings()  # type: ignore[attr-defined]
    return len(meanings) >= 3 and meanings[1] == "FIRE"


def register_ale() -> None:
    """Register ale-py's env ids (``PongNoFrameskip-v4``, ``ALE/Pong-v5``) with Gymnasium, with
    ale-py's log at errors only (no banner per env built).

    Raises:
        ImportError: ale-py is not installed (``pip install 'flowkit[atari]'``).
    """
    try:
        import ale_py
    except ImportError:
        raise ImportError("env.preset=atari needs ale-py: pip install 'flowkit[atari]'") from None
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner per env (Ray prints workers' after the summary)
    gym.register_envs(ale_py)


def hint(env_id: str) -> Optional[str]:
    """For an ``env.id`` that failed to build without a preset: the one-line error when it is
    ale-py's (installed; its ids are registered only under ``env.preset=atari``, which also
    applies the DeepMind preprocessing the Zoo's, CleanRL's and RLlib's Atari figures use), else
    None (any other env: the caller reports the real cause)."""
    try:
        import ale_py
    except ImportError:
        return None
    gym.register_envs(ale_py)
    try:
        entry = gym.spec(env_id).entry_point
    except Exception:
        return None
    if not str(getattr(entry, "__module__", entry)).startswith("ale_py"):
        return None
    return (f"env.id={env_id!r} is an Atari game: give it with env.preset=atari (ale-py's env under the DeepMind "
            f"preprocessing), e.g. `flowkit train algo=ppo env={env_id} env.preset=atari`")


def check(env_cfg: Dict[str, Any]) -> None:
    """The preset's checks before Ray starts: ``env.id`` given (not ``env.factory``), and
    ``env.kwargs.repeat_action_probability`` (ale-py does not check it) a probability; then
    ale-py's ids are registered with Gymnasium.

    Raises:
        ValueError: naming the key.
        ImportError: ale-py is not installed (``pip install 'flowkit[atari]'``).
    """
    if env_cfg.get("factory") or not env_cfg.get("id"):
        raise ValueError("env.preset=atari needs env.id (an ALE id such as PongNoFrameskip-v4), not env.factory")
    p = (env_cfg.get("kwargs") or {}).get("repeat_action_probability")
    if p is not None and not (isinstance(p, (int, float)) and 0.0 <= float(p) <= 1.0):
        raise ValueError(f"env.kwargs.repeat_action_probability={p!r}: a probability, in [0, 1] (sticky actions: "
                         "0.25 in the v5 ids, 0 in NoFrameskip-v4)")
    register_ale()


def make_env(env_cfg: Dict[str, Any], context: Any) -> gym.Env:
    """The base ALE env of ``env.id`` (``env.kwargs`` to gym.make) under the preset's wrappers
    (see the module docstring); a rollout worker's (``context.worker_index >= 0``) add the
    life-loss terminal and reward clipping; ``env.max_episode_steps`` (agent steps) truncates a
    game below GameStats, so a truncated game is still reported.

    Raises:
        ImportError: ale-py is not installed (``pip install 'flowkit[atari]'``).
        ValueError: see :func:`check`; ``env.id`` is not an ALE env.
    """
    check(env_cfg)
    env_id, kw = str(env_cfg["id"]), dict(env_cfg.get("kwargs") or {})
    training, max_episode_steps = context.worker_index >= 0, env_cfg.get("max_episode_steps")
    if env_id.startswith("ALE/"):
        kw.setdefault("frameskip", 1)
    env = gym.make(env_id, **kw)
    if not hasattr(env.unwrapped, "ale"):
        raise ValueError(f"env.preset=atari: env.id={env_id!r} is not an Atari (ALE) env")
    if env.unwrapped.spec is not None and env.unwrapped._frameskip != 1:  # type: ignore[attr-defined]
        raise ValueError(f"env.preset=atari skips frames itself: make env.id={env_id!r} with frameskip=1 "
                         f"(env.kwargs.frameskip={kw.get('frameskip')!r})")
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=FRAME_SKIP, screen_size=84,
                                          terminal_on_life_loss=False, grayscale_obs=True, scale_obs=False)
    # a video plays in real time: the console's 60 frames a second, 4 of them an agent step
    env.metadata = {**env.metadata, "render_fps": ATARI_HZ / FRAME_SKIP}
    if max_episode_steps:
        env = gym.wrappers.TimeLimit(env, max_episode_steps=int(max_episode_steps))
    env = GameStats(env)
    if training:
        env = EpisodicLife(env)
    if _has_fire(env):
        env = FireReset(env, on_life_loss=not training)
    if training:
        env = gym.wrappers.TransformReward(env, lambda r: float(np.sign(float(r))))
    return gym.wrappers.FrameStackObservation(env, FRAME_STACK)


# keys of ``env.kwargs`` that ale-py's own vector env takes as the single env does
_VECTOR_KWARGS = ("repeat_action_probability", "full_action_space", "max_num_frames_per_episode")


class AtariVector(gym.vector.VectorWrapper):
    """The preset's training side on ale-py's own vector env (``ale_py.vector_env.AtariVectorEnv``,
    C++, the envpool design): the same frames as the wrappers (noop_max 30, 4 frames skipped with
    the last two max-pooled, 84x84 grayscale, 4 stacked: bit for bit once the stack is full), at
    about two thirds of the CPU time per env step of a SyncVectorEnv of the wrapped envs. This
    wrapper adds what the preset's training side has on top:

    - a life loss ends the training episode and the game goes on (ale-py's ``episodic_life``
      restarts the whole game: not used); the step after it is the episode's reset step
      (autoreset ``next_step``): it presses FIRE in games that have it, else a no-op, and the
      runner keeps no transition of it;
    - rewards clipped to their sign; ``info["game_return"]`` (unclipped) and
      ``info["game_length"]`` (agent steps) with their ``_game_return`` / ``_game_length``
      masks on the step that ends a whole game, as :class:`GameStats` reports them.

    Where it differs from the wrappers: a stack starts with zero frames at a game's start (the
    wrappers repeat the first frame), a life's start is one FIRE step (the wrappers step a no-op,
    FIRE and action 2) and its stack goes on from the previous life's frames. Evaluation keeps
    the wrappers. Observations uint8[N, 4, 84, 84], rewards float64[N] in {-1, 0, 1}.
    """

    flowkit_game_stats = True

    def __init__(self, env: Any, fire: bool):
        super().__init__(env)
        n = self.num_envs
        self.restart_action = 1 if fire else 0
        self.lives = np.zeros(n, np.int64)
        self.after_life = np.zeros(n, bool)  # the last step lost a life: this one is the reset step
        self.after_game = np.ones(n, bool)   # the last step ended the game: ale-py resets it now
        self.ret, self.len = np.zeros(n), np.zeros(n, np.int64)

    def reset(self, *, seed: Any = None, options: Any = None):
        if seed is not None:  # one seed per sub-env (an int: consecutive ones), in ale-py's int32 range
            s = np.asarray(seed, np.int64).reshape(-1)
            seed = (s[0] + np.arange(self.num_envs) if s.size == 1 else s) % (2 ** 31 - 1)
        obs, info = self.env.reset(seed=seed, options=options)
        self.lives = np.asarray(info["lives"], np.int64).copy()
        self.after_life[:], self.after_game[:], self.ret[:], self.len[:] = False, False, 0.0, 0
        return obs, info

    def send(self, actions) -> None:
        """Start a step of every sub-env (ale-py steps them in its own thread, off the GIL);
        :meth:`recv` waits for its outputs. ``step(a)`` is ``send(a)`` then ``recv()``."""
        ale: Any = self.env  # (ale-py's AtariVectorEnv: send and recv beyond gymnasium's VectorEnv)
        ale.send(np.where(self.after_life, self.restart_action, np.asarray(actions, np.int64)))

    def step(self, actions):
        self.send(actions)
        return self.recv()

    def recv(self):
        """The outputs of the step :meth:`send` started, as :meth:`step` returns them."""
        ale: Any = self.env
        obs, rew, term, trunc, info = ale.recv()
        rew = np.asarray(rew, np.float64)
        restarted = self.after_game  # ale-py's reset step: the game starts again
        self.ret = np.where(restarted, 0.0, self.ret + rew)
        self.len = np.where(restarted, 0, self.len + 1)
        lives = np.asarray(info["lives"], np.int64)
        game_over = (term | trunc) & ~restarted
        life_lost = (0 < lives) & (lives < self.lives) & ~game_over & ~restarted & ~self.after_life
        info = dict(info)
        if game_over.any():
            info.update({"game_return": np.where(game_over, self.ret, 0.0), "_game_return": game_over.copy(),
                         "game_length": np.where(game_over, self.len, 0), "_game_length": game_over.copy()})
        self.lives, self.after_life, self.after_game = lives, life_lost, game_over
        return obs, np.sign(rew), (term & ~restarted) | life_lost, trunc & ~restarted, info


def make_vector_env(env_cfg: Dict[str, Any], num_envs: int, like: Optional[gym.Env] = None) -> Optional[AtariVector]:
    """The preset's training side for ``num_envs`` sub-envs of ``env.id`` on ale-py's own vector
    env (:class:`AtariVector`), or None where it cannot stand in for the wrappers:
    ``env.max_episode_steps`` set, ``env.kwargs`` other than ``repeat_action_probability``,
    ``full_action_space`` and ``max_num_frames_per_episode`` (e.g. ``mode``, ``difficulty``), or
    an ale-py without it. The env id's own settings (sticky actions of the v5 ids, the frame
    limit) carry over. ``like``: an env of the same game (wrapped or not), asked whether it has
    FIRE; without it one is made for the question."""
    env_id, kwargs = str(env_cfg["id"]), dict(env_cfg.get("kwargs") or {})
    if env_cfg.get("max_episode_steps") or set(kwargs) - set(_VECTOR_KWARGS):
        return None
    register_ale()
    try:
        from ale_py.vector_env import AtariVectorEnv
    except ImportError:
        return None
    spec = {**gym.spec(env_id).kwargs, **kwargs}
    vec = AtariVectorEnv(spec["game"], num_envs, num_threads=1, noop_max=30, frameskip=FRAME_SKIP, maxpool=True,
                         img_height=84, img_width=84, grayscale=True, stack_num=FRAME_STACK,
                         episodic_life=False, reward_clipping=False, use_fire_reset=True,
                         **{k: spec[k] for k in _VECTOR_KWARGS if k in spec})
    if like is not None:
        return AtariVector(vec, _has_fire(like))
    probe = gym.make(env_id, **kwargs)
    fire = _has_fire(probe)
    probe.close()
    return AtariVector(vec, fire)
