"""Experiment-tracker reporters: TensorBoard, MLflow and Weights & Biases.

Each is a reporter (see :mod:`flowkit.reporters`) chosen by ``run.reporters``, e.g.
``run.reporters=[progress,csv,tensorboard,mlflow,wandb,checkpoint,evaluation]``. Each logs
every numeric column of every row (x axis: ``env_steps_sampled``) and the run's resolved config
as hyperparameters (flat dotted keys, :func:`hyperparameters`). Their packages are optional
(``pip install 'flowkit[tensorboard]'``, ``[mlflow]``, ``[wandb]``; the README's set-up installs
TensorBoard, the test set-up all three); a chosen one that is missing is a one-line
:class:`flowkit.ConfigError` before anything starts.

- ``tensorboard``: event files in ``RUN_DIR/tb``; the config as TensorBoard hparams (with the
  final metrics) and as a text summary.
- ``mlflow``: one MLflow run per flowkit run, in ``$MLFLOW_TRACKING_URI`` or else the local file
  store ``mlruns/`` beside the run folder (shared by the runs of one parent folder; MLflow 3
  needs ``MLFLOW_ALLOW_FILE_STORE=true`` for it, which this reporter sets unless already set);
  experiment ``<algo>-<env>``, run name the run folder's name; params the config; status
  FINISHED, or FAILED when the run raised.
- ``wandb``: one W&B run in ``RUN_DIR/wandb``, offline unless ``WANDB_MODE`` says otherwise
  (``wandb sync RUN_DIR/wandb/offline-run-*`` uploads it later); project ``$WANDB_PROJECT`` or
  ``flowkit``; config the config; ``env_steps_sampled`` is the step metric of every column.
"""
from __future__ import annotations

import importlib.util
import math
import os
from typing import TYPE_CHECKING, Any, Dict, Optional

from flowkit.hooks.manager import Reporter, hookimpl
from flowkit.hooks.specs import Row

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from flowkit.core.context import RunContext


def hyperparameters(config: Any) -> Dict[str, Any]:
    """The config as ``{dotted key: int | float | str | bool}``: lists and mappings without
    sections as their text, None as ``"null"``; ``run.dir`` and ``resume`` left out (paths)."""
    from omegaconf import OmegaConf
    out: Dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        for k, v in node.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict) and v:
                walk(v, key + ".")
            elif key not in ("run.dir", "resume"):
                out[key] = "null" if v is None else v if isinstance(v, (int, float, str, bool)) else str(v)
    walk(OmegaConf.to_container(config, resolve=True) if not isinstance(config, dict) else config, "")
    return out


def numeric(row: Row) -> Dict[str, float]:
    """The finite int and float columns of a row (bools and text left out)."""
    return {k: float(v) for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class _Tracker(Reporter):
    """A tracker's reporter: its package and flowkit's extra that installs it are its ``name``."""

    @classmethod
    def validate_config(cls, config: "DictConfig") -> None:
        if importlib.util.find_spec(cls.name) is None:
            from flowkit.config import ConfigError
            raise ConfigError(f"run.reporters: `{cls.name}` needs the {cls.name} package "
                              f"(pip install 'flowkit[{cls.name}]'), or take `{cls.name}` out of run.reporters")


class TensorBoardReporter(_Tracker):
    """TensorBoard scalars in ``run_dir/tb`` (x axis: env_steps_sampled), the config as
    hparams at the end of the run (with the last row's metrics) and as text at the start."""
    name = "tensorboard"

    def flowkit_on_run_start(self, ctx: "RunContext", run_dir: str) -> None:
        from torch.utils.tensorboard import SummaryWriter
        self.tb = SummaryWriter(os.path.join(run_dir, "tb"))
        self.hp = hyperparameters(ctx.config)
        self.last: Dict[str, float] = {}
        self.tb.add_text("config", "\n".join(f"    {k}: {v}" for k, v in self.hp.items()))

    def flowkit_report(self, result: Row) -> None:
        step = int(result.get("env_steps_sampled", 0))
        self.last = numeric(result)
        for k, v in self.last.items():
            self.tb.add_scalar(k, v, step)

    @hookimpl(trylast=True)
    def flowkit_on_train_end(self) -> None:
        if not hasattr(self, "tb"):
            return
        from torch.utils.tensorboard.summary import hparams
        writer = self.tb.file_writer
        assert writer is not None  # open since flowkit_on_run_start
        for s in hparams(self.hp, self.last):  # the metrics: the scalars of the same names
            writer.add_summary(s)
        self.tb.close()


class MLflowReporter(_Tracker):
    """One MLflow run per flowkit run: params the config, metrics every row (step: env steps)."""
    name = "mlflow"

    def flowkit_on_run_start(self, ctx: "RunContext", run_dir: str) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        from flowkit.core import env_name
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        uri = os.environ.get("MLFLOW_TRACKING_URI") or "file:" + os.path.join(
            os.path.dirname(os.path.abspath(run_dir)), "mlruns")
        self.client = MlflowClient(tracking_uri=uri)
        exp_name = f"{ctx.config.algo}-{env_name(ctx.config.env)}"
        exp = self.client.get_experiment_by_name(exp_name)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(exp_name)
        self.run_id = self.client.create_run(exp_id, run_name=os.path.basename(os.path.abspath(run_dir)),
                                             tags={"flowkit.run_dir": os.path.abspath(run_dir)}).info.run_id
        params = [Param(k, str(v)) for k, v in hyperparameters(ctx.config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def flowkit_report(self, result: Row) -> None:
        import time

        from mlflow.entities import Metric
        step, ts = int(result.get("env_steps_sampled", 0)), int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, ts, step) for k, v in numeric(result).items()])

    @hookimpl(trylast=True)
    def flowkit_on_train_end(self, error: Optional[BaseException]) -> None:
        if hasattr(self, "run_id"):
            self.client.set_terminated(self.run_id, "FINISHED" if error is None else "FAILED")


class WandbReporter(_Tracker):
    """One Weights & Biases run (offline by default) in ``run_dir/wandb``."""
    name = "wandb"

    def flowkit_on_run_start(self, ctx: "RunContext", run_dir: str) -> None:
        import wandb

        from flowkit.core import env_name
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "flowkit"), dir=run_dir,
                              mode=os.environ.get("WANDB_MODE", "offline"),  # type: ignore[arg-type]  # env text
                              name=os.path.basename(os.path.abspath(run_dir)),
                              group=f"{ctx.config.algo}-{env_name(ctx.config.env)}",
                              config=hyperparameters(ctx.config), reinit="create_new")
        self.run.define_metric("env_steps_sampled")
        self.run.define_metric("*", step_metric="env_steps_sampled")

    def flowkit_report(self, result: Row) -> None:
        self.run.log(numeric(result))

    @hookimpl(trylast=True)
    def flowkit_on_train_end(self, error: Optional[BaseException]) -> None:
        if hasattr(self, "run"):
            self.run.finish(exit_code=0 if error is None else 1)


LOGGERS = [TensorBoardReporter, MLflowReporter, WandbReporter]
