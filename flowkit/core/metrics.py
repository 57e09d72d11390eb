"""What a run reports: the :class:`Result` of :func:`flowkit.train`."""
from __future__ import annotations


class Result:
    """What :func:`flowkit.train` returns.

    Attributes:
        metrics: the last result row, plus the final evaluation if any (``{column: value}``,
            the columns of ``metrics.csv``; also written to ``result.json``).
        history: every row, in order (a resumed run: the rows kept up to its checkpoint, then
            the new ones).
        run_dir: the run folder.
        checkpoint: the last checkpoint folder, or None when none was written.
        stop_reason: why the run stopped, e.g. ``stop.env_steps=100000 reached`` or
            ``interrupted (SIGTERM)``.
        config: the resolved config (an OmegaConf DictConfig).
    """

    def __init__(self, metrics, history, run_dir, checkpoint, stop_reason, config):
        self.metrics, self.history, self.run_dir = metrics, history, run_dir
        self.checkpoint, self.stop_reason, self.config = checkpoint, stop_reason, config

    def __repr__(self) -> str:
        r = self.metrics.get("episode_return_mean")
        return (f"Result(stop_reason={self.stop_reason!r}, env_steps={self.metrics.get('env_steps_sampled')}, "
                f"episode_return_mean={r}, run_dir={self.run_dir!r})")
