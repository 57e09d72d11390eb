"""One preparation of a run, shared by ``flowkit train`` and :func:`flowkit.train`: the plugin
manager, the config (on the command line, ``flowkit train`` and ``flowkit tune``, a tuned config's
when no ``-c`` is given: :func:`build_tuned`) (a resumed run's from its checkpoint), the run folder and every check that
needs neither the env nor torch, each done once. The CLI prepares before torch and Ray load (a
config error is one line within a second) and hands the result to the engine, which does not
build or check it again."""
from __future__ import annotations

import datetime
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from omegaconf import DictConfig, OmegaConf

from flowkit._guard import check_cpus, check_env_kwargs, check_new_run_dir
from flowkit.config import build_config, check_run, check_unused_sections, plugin_modules_from
from flowkit.core.presets import env_preset
from flowkit.hooks import get_plugin_manager


@dataclass
class Prepared:
    """A run built and checked by :func:`prepare`: ``pm`` the plugin manager, ``config`` the
    validated config (a resumed run's: its checkpoint's, the overrides on top; ``run.dir``
    set), ``run_dir`` the run folder (created when the run starts), and for ``resume=`` the
    checkpoint folder, its iteration and the result rows up to it."""
    pm: Any
    config: DictConfig
    run_dir: str
    resume_from: Optional[str] = None
    resume_iteration: int = 0
    run_rows: List[Dict[str, Any]] = field(default_factory=list)


def default_run_dir(cfg: DictConfig) -> str:
    """``runs/<algo>-<env>-<timestamp>`` (microseconds: two runs started together differ)."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    env = str(cfg.env.id or cfg.env.factory or "env").replace("/", "_").replace(":", "_")
    return os.path.join("runs", f"{cfg.algo}-{env}-{stamp}")


def tuned_config_path(algo: str, env_id: Optional[str]) -> Optional[str]:
    """The tuned config ``configs/<algo>/<env-id>.yaml`` for ``algo`` on ``env_id``, or None.

    Looked up as package data, ``flowkit/configs/`` (``importlib.resources``): in a checkout or
    an editable install that folder is a link to the repository's ``configs/``; a wheel or a
    non-editable ``pip install`` copies the files into the installed package
    (``[tool.setuptools.package-data]``). Then in each installed plugin's package (the module
    of its ``flowkit`` entry point): a plugin ships the tuned configs of its algorithms as its
    own package data, ``<package>/configs/<algo>/<env-id>.yaml``. A Gymnasium ``pkg:Id-v0`` id
    is looked up by ``Id-v0``.
    """
    if not algo or not env_id or "/" in algo or ".." in env_id:
        return None
    from importlib.resources import files

    from flowkit.core.names import plugin_entry_points
    for top in ["flowkit", *dict.fromkeys(ep.module.split(".")[0] for ep in plugin_entry_points())]:
        try:
            path = files(top).joinpath("configs", algo, env_id.rpartition(":")[2] + ".yaml")
        except Exception:  # noqa: S112 - a plugin that does not import is reported when plugins load
            continue
        if path.is_file():
            return str(path)
    return None


def build_tuned(overrides: List[str], files: Optional[List[str]], no_tuned: bool, pm: Any
                ) -> Tuple[Any, Optional[List[str]], Optional[str]]:
    """``(config, config files, tuned config or None)``: the config of ``files`` and
    ``overrides``; without ``files`` (unless ``no_tuned``, or a resumed run), on the tuned config
    of its algo and env (:func:`tuned_config_path`) when there is one. Raises ConfigError."""
    cfg = build_config(overrides, files, pm.config_sections())  # errors before torch and Ray load
    tuned = None if files or no_tuned or cfg.resume else tuned_config_path(cfg.algo, cfg.env.id)
    if tuned:  # the tuned config for this algo and env, under the overrides
        files = [tuned]
        cfg = build_config(overrides, files, pm.config_sections())
    return cfg, files, tuned


def shown_path(path: str) -> str:
    """``path`` relative to the working directory when it lies below it, else absolute."""
    rel = os.path.relpath(os.path.realpath(path))
    return os.path.realpath(path) if rel.startswith("..") else rel


def check_config(cfg: DictConfig, pm: Any) -> None:
    """The checks of a built config that need neither the env nor torch: the cross-field rules
    (:func:`flowkit.config.check_run`), ``env.preset`` a registered preset, sections no policy of
    the run reads, keys whose reporter is not in ``run.reporters`` (warnings), and the CPUs of a
    local Ray cluster.

    Raises:
        ConfigError: naming the key.
    """
    check_run(cfg, pm)
    if cfg.env.get("preset"):
        env_preset(cfg.env.preset)  # (a name no plugin registered: the error lists those that are)
    for w in check_unused_sections(cfg, pm.algorithms(load=False), pm.config_sections()):
        warnings.warn(w, stacklevel=3)
    for key, on, rep in (("evaluation.interval", int(cfg.evaluation.interval) > 0, "evaluation"),
                         ("evaluation.final", bool(cfg.evaluation.final), "evaluation"),
                         ("checkpoint.every_iters", int(cfg.checkpoint.every_iters) > 0, "checkpoint")):
        if on and rep not in cfg.run.reporters:
            warnings.warn(f"{key}={OmegaConf.select(cfg, key)} has no effect: `{rep}` is not in run.reporters",
                          stacklevel=3)
    check_cpus(cfg)
    check_env_kwargs(cfg)


def prepare(config: Any = None, config_file: Union[str, Sequence[str], None] = None, plugins: Sequence[Any] = (),
            trust_config: bool = False, pm: Any = None, built: Optional[DictConfig] = None) -> Prepared:
    """Build and check a run once (arguments as :func:`flowkit.train`'s): the plugins, the
    config (``resume=``: :func:`flowkit.checkpoint.resume_config`), the run folder (a new
    run's must not hold a run), :func:`check_config` and ``run.output``. ``pm`` and ``built``:
    a plugin manager and the config the caller already built from ``config`` and
    ``config_file`` (the CLI's), not built again. Imports torch only to resume.

    Raises:
        ConfigError: what is wrong, naming the key (a resumed run: also RunFolderError,
            UntrustedConfigError).
    """
    if pm is None:
        pm = get_plugin_manager(plugin_modules_from(config, config_file), extra=plugins)
    pre = built if built is not None else build_config(config, config_file, pm.config_sections())
    if pre.resume:
        from flowkit.checkpoint import resume_config
        from flowkit.reporters import kept_rows
        resume_from, cfg, pm, st_iter = resume_config(config, pre.resume, pm, trust_config)
        run_dir = os.path.dirname(os.path.dirname(resume_from))
        p = Prepared(pm, cfg, run_dir, resume_from, st_iter, kept_rows(run_dir, st_iter))  # each iteration once
    else:
        check_new_run_dir(pre.run.dir)
        p = Prepared(pm, pre, pre.run.dir or default_run_dir(pre))
    p.config.run.dir = p.run_dir
    check_config(p.config, p.pm)  # config errors found without the env come before Ray starts
    if p.config.run.get("output"):  # (the dataset writer's module and numpy load only for a run that records)
        from flowkit._dataset_output import check_output
        check_output(p.config, resuming=p.resume_from is not None)
    return p
