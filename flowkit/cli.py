"""The ``flowkit`` command: train, plan, plugins; evaluate, export and record a trained policy;
plot (flowkit/plot.py) and tune (flowkit/tune.py). Every command's settings are ``key=value``
words: train's, plan's and plugins' are the config's; the others' are checked against their
arguments dataclass (:class:`ExportArgs`, ...) by one runner, :func:`_keyed`.

Exit status: 0 success, 1 a failed run (a bad env, non-finite training or workers Ray could not
place: one line, no traceback), 2 a config error (short message, no traceback),
128 + the signal number for a run stopped by a signal after its clean save (130 SIGINT,
143 SIGTERM, 129 SIGHUP).
"""
from __future__ import annotations

import os
import signal
import sys

from flowkit import _exit_on_signal

# first thing when this module is the program (`python -m flowkit.cli`; the `flowkit` command's were set
# when it imported the package), never when it is imported as a library; signals inherited as ignored
# (nohup) stay ignored
if __name__ == "__main__":
    for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(_sig) != signal.SIG_IGN:
            signal.signal(_sig, _exit_on_signal)

import argparse  # noqa: E402
import atexit  # noqa: E402
import contextlib  # noqa: E402
import gc  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any, Callable, Dict, List, NoReturn, Optional, Sequence, Tuple  # noqa: E402

from flowkit.config import ConfigError, F  # noqa: E402

USAGE = """flowkit train [-c FILE ...] [--no-tuned] [--dry-run | --print-config] [--trust-config] [--take-over-lock] [key=value ...]
flowkit plan [-c FILE ...] [--no-tuned] [key=value ...]
flowkit plugins [plugins=[module,...]]
flowkit evaluate RUN_DIR|CHECKPOINT [--trust-config] [episodes=N] [seed=S] [explore=false] [render=mp4|gif] [key=value ...]
flowkit export RUN_DIR|CHECKPOINT format=torchscript|onnx [out=PATH] [policy=ID] [--trust-config]
flowkit record RUN_DIR|CHECKPOINT [episodes=N | steps=N] [explore=greedy|sample|epsilon|random] [out=PATH] [key=value ...] [--trust-config]
flowkit plot RUN_DIR... [x=env_steps|time] [metric=M] [out=FILE]
flowkit tune [-c FILE ...] [--no-tuned] [metric=M] [mode=max|min] [search=grid|random|optuna]
             [num_samples=N] [scheduler=asha|none] [grace_period=T] [max_concurrent=K]
             [key=value ...] [key=choice(a,b) key=range(3) ...]
flowkit --version"""


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
    from flowkit.config import build_config
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


def option_hint(argv: Sequence[str], unknown: Sequence[str],
                key_for: Optional[Any] = None, real: Sequence[str] = ()) -> Optional[str]:
    """The error for options a command does not take among ``unknown`` (``--episodes 5``,
    ``--episodes=5``, ``-x``), with the ``key=value`` to write instead (``episodes=5``: a
    flag's value is the word after it unless that is an option or a key=value; ``key_for``
    maps a bare key to the config key, ``lr`` to ``ppo.lr``); an option close to one of the
    command's ``real`` flags (``--no_tuned``) is pointed to that flag; None when ``unknown``
    holds no option."""
    flags = [u for u in unknown if re.match(r"-+[^\d.\W]", u)]  # (not a negative number)
    if not flags:
        return None
    import difflib
    near = [difflib.get_close_matches(f.partition("=")[0].replace("_", "-"), real, n=1, cutoff=0.8) for f in flags]
    if all(near):
        return f"unrecognised option {' '.join(flags)}: did you mean {' '.join(m[0] for m in near)}?"
    hints = []
    for f in flags:
        key, eq, val = f.lstrip("-").partition("=")
        if not eq:
            i = list(argv).index(f) + 1
            nxt = argv[i] if i < len(argv) else ""
            val = nxt if nxt and not nxt.startswith("-") and "=" not in nxt else "VALUE"
        hints.append(f"{key_for(key) if key_for else key}={val}")
    return (f"unrecognised option{'s' * (len(flags) > 1)} {' '.join(f.partition('=')[0] for f in flags)}: "
            f"settings are key=value words, not --options; write {' '.join(hints)}")


def _config_key(key: str, overrides: Sequence[str], config_file: Any) -> str:
    """``key`` as the config key it most likely means: itself when the config has it, else the
    run's algorithm's key of that name (``lr`` -> ``ppo.lr``), else the one key ending in it
    (``num_workers`` -> ``runtime.num_workers``), else a close key; ``key`` when the config
    cannot be built."""
    import difflib

    from flowkit.config import build_config, make_schema_class, schema_keys
    from flowkit.hooks import PluginError, get_plugin_manager
    try:
        sections = get_plugin_manager().config_sections()
        algo = build_config(list(overrides), config_file, sections).algo
    except (ConfigError, PluginError):
        return key
    flat = list(schema_keys(make_schema_class(sections)))
    if key in flat:
        return key
    owners = [k for k in flat if k.endswith(f".{key}")]
    best = [f"{algo}.{key}"] if f"{algo}.{key}" in flat else owners if len(owners) == 1 else []
    return (best or difflib.get_close_matches(key, flat, n=1, cutoff=0.75) or [key])[0]


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse, with a usage error as one line on stderr and exit 2 (argparse prints the whole
    usage first: 12 lines for ``flowkit nope``); ``--help`` still shows the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (usage: {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    """The arguments of train, plan and plugins (``--help`` prints :data:`USAGE`, not argparse's)."""
    p = OneLineArgumentParser(prog="flowkit", usage=USAGE, add_help=False)
    p.add_argument("command", nargs="?", choices=["train", "plan", "plugins", *COMMANDS])
    p.add_argument("-c", "--config", dest="config_file", action="append")  # several: merged in order
    for flag in ("--no-tuned", "--print-config", "--dry-run", "--mermaid", "--trust-config", "--take-over-lock",
                 "-h/--help", "-V/--version"):
        p.add_argument(*flag.split("/"), action="store_true")
    p.add_argument("overrides", nargs="*")
    return p


def _usage(args: argparse.Namespace, overrides: List[str]) -> int:
    """The usage: with every config key (``flowkit train --help``), else a pointer to it
    (``flowkit --help``; ``flowkit`` alone, then exit 2 with why on stderr)."""
    usage = f"usage:\n  {USAGE.replace(chr(10), chr(10) + '  ')}\n\n"
    if args.command not in ("train", "plan"):
        print(usage + "Every config key with its type, allowed values, default and doc: flowkit train --help\n"
              "A command's own key=value settings: flowkit evaluate|export|record|plot|tune --help")
    else:
        from flowkit.config import help_text, plugin_modules_from
        from flowkit.hooks import get_plugin_manager
        try:
            secs = get_plugin_manager(plugin_modules_from(overrides)).config_sections()
        except Exception:
            secs = {}
        print(usage + "Config keys (override with key=value; `env=ID` is short for env.id=ID; floats must be "
              "finite):" + help_text(secs))
    if not args.help:  # the usage on stdout, what went wrong on stderr (as every other usage error)
        print("flowkit: error: no command given (train, plan, plugins, evaluate, export, record, plot or tune; "
              "the usage is above)", file=sys.stderr)
    return 0 if args.help else 2


def main(argv: Optional[List[str]] = None) -> int:
    """The ``flowkit`` command: ``COMMANDS`` take ``key=value`` settings of their own
    (:func:`_keyed`); train, plan and plugins take the config's (``-c FILE``, ``key=value``).
    Returns the exit status (module docstring)."""
    from flowkit._guard import GUARD  # signals raise Interrupted now (one inherited as ignored stays ignored)
    argv = list(sys.argv[1:] if argv is None else argv)
    with GUARD.running():
        return _dispatch(argv)


def _dispatch(argv: List[str]) -> int:
    if argv and argv[0] in COMMANDS:
        return COMMANDS[argv[0]](argv[1:])
    args, unknown = _parser().parse_known_args(argv)
    if args.version:
        from flowkit import __version__
        print(f"flowkit {__version__}")
        return 0
    overrides = list(args.overrides) + [u for u in unknown if "=" in u and not u.startswith("-")]
    bad = [u for u in unknown if "=" not in u or u.startswith("-")]
    if args.help or args.command is None:
        return _usage(args, overrides)
    if bad:
        real = [o for a in _parser()._actions for o in a.option_strings if o.startswith("--")]
        hint = option_hint(argv, bad, lambda k: _config_key(k, overrides, args.config_file), real)
        print(f"flowkit: error: {hint or f'unrecognised arguments {bad}'}", file=sys.stderr)
        return 2
    return _one_line("", lambda: _config_command(args, overrides))


def _one_line(cmd: str, fn: Callable[[], int]) -> int:
    """``fn()``; a bad input or a failed run is one line on stderr, ``flowkit[ CMD]: ...``, no
    traceback, and its exit status: 2 a config, plugin or usage error (1 a damaged run folder),
    1 a failed run (a bad env, non-finite training, workers Ray could not place, an output that
    cannot be written, an evaluation past its deadline or an env that ended the process)."""
    from flowkit.hooks import PluginError
    try:
        return fn()
    except (ConfigError, PluginError, MemoryError) as e:  # (MemoryError: a buffer or batch too large)
        status = getattr(e, "exit_status", 2)
        what = "error" if cmd or status == 1 else "plugin error" if isinstance(e, PluginError) else "config error"
        why = f"out of memory, lower the sizes in the config: {e}" if isinstance(e, MemoryError) else str(e)
    except Exception as e:
        if not isinstance(e, _run_failures()):
            raise
        status, what, why = 1, "error", str(e)
        import traceback  # the frames' envs go now (the exit skips the collection that would free them,
        traceback.clear_frames(e.__traceback__)  # and ale-py would list them as leaked)
    print(f"flowkit{' ' + cmd if cmd else ''}: {what}: {why}", file=sys.stderr)
    return status


def _run_failures() -> Tuple[type, ...]:
    """The errors of a run or an evaluation that end the command with one line and exit 1."""
    from flowkit._guard import EvaluationTimeout
    from flowkit._outputs import OutputError
    from flowkit._ray import RayStartError
    from flowkit.core import EnvError
    from flowkit.core.workers import StartTimeout, WorkerImportError
    from flowkit.evaluation import EnvExit
    learner = sys.modules.get("flowkit.core.learner")  # (not loaded: no NonFiniteError, and no torch to load for it)
    return (EnvError, StartTimeout, WorkerImportError, OutputError, RayStartError, EvaluationTimeout, EnvExit,
            *([learner.NonFiniteError] if learner else []))


def _config_command(args: argparse.Namespace, overrides: List[str]) -> int:
    """train, plan, plugins (and ``--print-config``, ``--dry-run``)."""
    from flowkit._guard import GUARD
    from flowkit.config import check_run, plugin_modules_from
    from flowkit.hooks import get_plugin_manager
    if args.command == "plugins":
        return _plugins(plugin_modules_from(overrides, args.config_file))
    with GUARD.held(second=_exit_on_signal):  # config building, Ray's start, the imports of Ray and torch
        pm = get_plugin_manager(plugin_modules_from(overrides, args.config_file))
        cfg, args.config_file, tuned = build_tuned(overrides, args.config_file, args.no_tuned, pm)
        if tuned:
            print(f"{'# ' if args.print_config else ''}tuned config: {shown_path(tuned)} (no -c given; "
                  "--no-tuned for the defaults)", flush=True)
        if args.print_config or args.command == "plan" or args.dry_run:
            if not cfg.resume:
                check_run(cfg, pm)  # config errors found without torch, the env or Ray come before they load
            return _show(args, cfg, pm, overrides)
        from flowkit._prepare import prepare
        run = prepare(overrides, args.config_file, trust_config=args.trust_config, pm=pm, built=cfg)  # once
        if not cfg.resume:  # (a resumed run's env and runtime come from its checkpoint)
            from flowkit import _ray
            from flowkit._guard import check_env_id
            check_env_id(run.config, pm)
            _ray.start(run.config, prestart=True)  # Ray and the workers come up while torch and the learner load
        from flowkit.engine import train
    res = train(run, take_over_lock=args.take_over_lock)  # prints the summary
    return exit_status(res.stop_reason)


def _show(args: argparse.Namespace, cfg: Any, pm: Any, overrides: List[str]) -> int:
    """``--print-config`` (resolved and validated, nothing started), ``plan`` and ``--dry-run``."""
    if args.print_config:
        from omegaconf import OmegaConf

        from flowkit.config import run_algorithms, used_sections
        print(OmegaConf.to_yaml(OmegaConf.create(used_sections(cfg, run_algorithms(cfg), pm))), end="")
        return 0
    from flowkit.engine import describe_plan
    d = describe_plan(overrides, args.config_file)
    if args.mermaid:
        print(d["mermaid"])
        return 0
    print(("config OK\n\n" if args.dry_run else "") + d["text"] + "\n\n```mermaid\n" + d["mermaid"] + "\n```")
    return 0


def exit_status(stop_reason: str) -> int:
    """0, or 128 + N for ``interrupted (SIGxxx)`` (the shell's convention for a signal)."""
    m = re.match(r"interrupted \((SIG[A-Z]+)\)", stop_reason or "")
    return 128 + int(signal.Signals[m[1]]) if m else 0


def _first_line(obj: object) -> str:
    """The docstring's first sentence, whole (lines joined), RST ````x```` shown as ```x```."""
    para = " ".join((getattr(obj, "__doc__", None) or "").strip().split("\n\n")[0].split())
    return re.split(r"(?<=[.!?])\s+(?=[A-Z(])", para, maxsplit=1)[0].replace("``", "`")


def _plugins(modules: List[str]) -> int:
    """Every plugin (built-ins, entry points, ``plugins=[...]`` modules, registered objects)
    with what it contributes:
    algorithms, reporters, env presets, config sections, env runners and the other hooks it implements.
    Metadata only (AlgorithmRef, config dataclasses): imports no torch."""
    from flowkit.hooks import get_plugin_manager
    pm = get_plugin_manager(modules)
    algos, reporters, presets = pm.algorithms(load=False), pm.reporters(), pm.env_presets()
    for name, plugin in pm.list_name_plugin():
        impls = {hc.name: impl for hc in pm.get_hookcallers(plugin) or [] for impl in hc.get_hookimpls()
                 if impl.plugin is plugin}
        dist = pm.dists.get(name, "flowkit (built-in)" if name.startswith("flowkit.") else
                            "`plugins`" if name in modules else "registered in code")
        print(f"{name}  [{dist}]" + (f"  {_first_line(plugin)}" if name in pm.dists else ""))
        for a in sorted(n for n, o in pm.owner.items() if o == name and n in algos):
            doc = _first_line(algos[a].config_class or algos[a])
            print(f"  algorithm   {doc if doc.startswith(a + ':') else f'{a}: {doc}'}")
        for r in sorted(n for n, o in pm.owner.items() if o == name and n in reporters):
            print(f"  reporter    {r}: {_first_line(reporters[r])}")
        for p in sorted(n for n, o in pm.owner.items() if o == name and n in presets):
            print(f"  env preset  {p}: {presets[p].help}")
        if "flowkit_add_config_sections" in impls:
            secs: Dict[str, type] = impls["flowkit_add_config_sections"].function() or {}  # type: ignore[assignment]  # pluggy: object
            for key, sec in secs.items():
                print(f"  config      {key}.*: {_first_line(sec)}")
        if "flowkit_make_env_runner" in impls:
            print(f"  env runner  {_first_line(impls['flowkit_make_env_runner'].function)}")
        rest = sorted(set(impls) - {"flowkit_add_algorithms", "flowkit_add_reporters", "flowkit_add_config_sections",
                                    "flowkit_add_env_presets", "flowkit_make_env_runner"})
        if rest:
            print(f"  hooks       {', '.join(rest)}")
    return 0


# ---- commands with key=value settings: evaluate, export, record, plot, tune ----------------------
@dataclass
class ExportArgs:
    """``flowkit export``: write a policy as one module from raw observation to greedy action
    (encoding, normalisation, masks, Box scaling and clipping inside). The fields are its
    ``key=value`` arguments."""
    format: Optional[str] = F(None, "torchscript or onnx (required)", choices=("torchscript", "onnx"))  # noqa: A003
    out: Optional[str] = F(None, "output file (default: policy[-ID].pt|.onnx in the checkpoint's folder)")
    policy: Optional[str] = F(None, "policy id (needed when the run has several)")


def _checkpoint_path(paths: List[str]) -> str:
    """The one run folder (its newest checkpoint) or checkpoint folder of ``paths``."""
    if len(paths) != 1:
        raise ConfigError(f"give one run folder or checkpoint folder{f', not {paths}' if paths else ''}")
    if not os.path.exists(paths[0]):  # before torch is imported
        raise ConfigError(f"no checkpoint at {paths[0]!r}: no such file or folder")
    return paths[0]


def _keyed(cmd: str, argv: List[str], args_cls: type, act: Callable[..., int],
           flags: Sequence[str] = ("--trust-config",), config_words: bool = False) -> int:
    """The one runner of the commands whose settings are ``key=value`` words, checked against
    the dataclass ``args_cls`` as config keys are (evaluate, export, record, plot, tune):
    ``act(paths, settings, given flags, other words)``. ``flags``: the command's flags
    (``--trust-config`` -> ``trust_config=True``; ``-c FILE``, repeatable -> ``config=[FILE,
    ...]``). ``config_words`` (tune): a word whose key is not ``args_cls``'s is a config
    override passed on, else an unknown key with the closest one. Paths, flags and words come in
    any order; ``--help`` prints ``args_cls``'s docstring and the keys; an ``--option`` is one line with the ``key=value`` to
    write instead."""
    def run() -> int:
        from omegaconf import OmegaConf

        from flowkit.config import _dotlist, check_values, merge_overrides, schema_keys
        keys = schema_keys(args_cls)
        got: Dict[str, Any] = {f.lstrip("-").replace("-", "_"): False for f in flags if f != "-c"}
        paths: List[str] = []
        words: List[str] = []
        bad: List[str] = []
        it = iter(argv)
        for w in it:
            if w in ("-h", "--help"):
                got["help"] = True
            elif "-c" in flags and w in ("-c", "--config"):
                got.setdefault("config", []).append(next(it, None) or _needs_file(cmd, w))
            elif w in flags:
                got[w.lstrip("-").replace("-", "_")] = True
            elif re.match(r"-+[^\d.\W]", w):  # (not a negative number)
                bad.append(w)
            else:
                (words if "=" in w else paths).append(w)
        if bad:
            import difflib
            raise ConfigError(option_hint(argv, bad, lambda k: (difflib.get_close_matches(
                k.replace("-", "_"), keys, n=1, cutoff=0.75) or [k])[0], [*flags, "--help"]))
        if got.pop("help", False):
            usage = re.findall(rf"^flowkit {cmd} .*(?:\n +.*)*", USAGE, re.M)[0]
            keys_text = "\n".join(f"  {k} (default {d!r}): {h}" for k, (_, h, d) in keys.items())
            doc = " ".join((args_cls.__doc__ or "").split()).replace("``", "`")
            print(f"usage: {usage}\n\n{doc}\n\nkeys:\n{keys_text}")
            return 0
        own = [w for w in words if not config_words or w.partition("=")[0].strip().split(".")[0] in
               {k.split(".")[0] for k in keys}]
        cfg = merge_overrides(OmegaConf.structured(args_cls), _dotlist(own), args_cls)
        check_values(cfg, args_cls)
        return act(paths, OmegaConf.to_container(cfg), got, [w for w in words if w not in own])
    return _one_line(cmd, run)


def _needs_file(cmd: str, flag: str) -> NoReturn:
    raise ConfigError(f"{flag} needs a FILE (flowkit {cmd} {flag} FILE)")


def _evaluate(argv: List[str]) -> int:
    """``flowkit evaluate``: see :mod:`flowkit.evaluation`."""
    from flowkit.evaluation import EvaluateArgs, evaluate, format_table

    def act(paths: List[str], opts: Dict[str, Any], flags: Dict[str, bool], _: List[str]) -> int:
        report = evaluate(_checkpoint_path(paths), **opts, trust_config=flags["trust_config"])
        print(format_table(report))
        for v in report.get("videos", []):
            print(f"video: {v}")
        print(f"evaluation.json not written: {report['not_written']}" if "not_written" in report else
              f"wrote {os.path.join(report['checkpoint'], 'evaluation.json')}")
        return 0
    return _keyed("evaluate", argv, EvaluateArgs, act)


def _top_missing_dir(path: str) -> Optional[str]:
    """The top-most folder of ``path`` that does not exist, or None."""
    top = None
    while path and not os.path.isdir(path) and path != os.path.dirname(path):
        top, path = path, os.path.dirname(path)
    return top


def signature_text(sig: Dict[str, Any]) -> str:
    """An exported module's signature as ``export`` prints it: ``(obs: uint8[B, 4, 84, 84]) ->
    action: int64[B]``; several outputs in parentheses (a recurrent policy's ``(action,
    state_out)``). ``sig``: :func:`flowkit.export.export_policy`'s result."""
    def names(ds: List[Dict[str, Any]]) -> str:
        return ", ".join(f"{d['name']}: {d['dtype']}[{', '.join(map(str, d['shape']))}]" for d in ds)
    outs = names(sig["outputs"]) if len(sig["outputs"]) == 1 else f"({names(sig['outputs'])})"
    return f"({names(sig['inputs'])}) -> {outs}"


def _export(argv: List[str]) -> int:
    """``flowkit export``: see :mod:`flowkit.export`."""
    def act(paths: List[str], o: Dict[str, Any], flags: Dict[str, bool], _: List[str]) -> int:
        fmt, out, policy = o["format"], o["out"], o["policy"]
        if fmt is None:
            raise ConfigError("format= is required (format=torchscript or format=onnx)")
        path = _checkpoint_path(paths)
        if out:  # before any work: a folder, a path under a file, a read-only folder, a run's own file
            from flowkit._outputs import check_output
            check_output(out, "out=")
        from flowkit.checkpoint import find_checkpoint, load_trained
        from flowkit.export import export_policy
        try:
            ck = find_checkpoint(path)
        except FileNotFoundError as e:  # a folder without checkpoints
            raise ConfigError(str(e)) from None
        if not out and not os.access(ck, os.W_OK | os.X_OK):  # the default out=, before the policy loads
            raise ConfigError(f"the checkpoint's folder {ck} is read-only: give out=FILE to write the policy elsewhere")
        algo = load_trained(ck, trust_config=flags["trust_config"])
        if policy is None and len(algo.policies) > 1:
            raise ConfigError(f"the run has several policies ({', '.join(algo.policies)}): name one with policy=ID")
        if policy is not None and policy not in algo.policies:
            raise ConfigError(f"policy={policy!r}: the checkpoint has {', '.join(algo.policies)}")
        pid = policy or next(iter(algo.policies))
        out = os.path.abspath(out or os.path.join(ck, f"policy{'-' + pid if len(algo.policies) > 1 else ''}"
                                                      f"{'.pt' if fmt == 'torchscript' else '.onnx'}"))
        new_dir = _top_missing_dir(os.path.dirname(out))
        tmp = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.tmp-{os.getpid()}")
        try:  # into a temporary file, renamed once written and checked: a failure leaves nothing behind
            sig = export_policy(algo.policies[pid], fmt, tmp)  # creates the missing folders
            os.replace(tmp, out)
        except Exception as e:  # any failure (a module the exporter cannot take, a full disk): one line
            with contextlib.suppress(OSError):
                os.remove(tmp)
            if new_dir:
                shutil.rmtree(new_dir, ignore_errors=True)
            why = (str(e) if isinstance(e, ValueError) else
                   f"cannot write it as {fmt}: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}")
            raise ConfigError(f"policy {pid!r}: {why.replace(tmp, out)}") from None
        print(f"wrote {out} ({fmt}, policy {pid!r}): {signature_text(sig)}"
              + (f"; created the folder {new_dir}" if new_dir else ""))
        print(f"same actions as compute_actions(obs, explore=False) on {sig['checked']} sampled observations"
              if sig["checked"] else "not checked against the policy (onnxruntime is not installed)")
        return 0
    return _keyed("export", argv, ExportArgs, act)


def _record(argv: List[str]) -> int:
    """``flowkit record``: see :mod:`flowkit.datasets`."""
    from flowkit.datasets import RecordArgs, record

    def act(paths: List[str], opts: Dict[str, Any], flags: Dict[str, bool], _: List[str]) -> int:
        res = record(_checkpoint_path(paths), **opts, trust_config=flags["trust_config"])
        ret = res["return_mean"]
        said = (f"whole-episode return mean {ret:.6g}" if math.isfinite(ret) else
                "no episode ended within these steps (the running ones are kept, cut there)")
        print(f"recorded {res['recorded_steps']} steps from {res['checkpoint']} ({opts['explore']}): {said}; the "
              f"dataset holds {res['episodes']} episodes, {res['steps']} steps\nwrote {res['path']} (train from "
              f"it: input.dataset={res['path']})")
        return 0
    return _keyed("record", argv, RecordArgs, act)


def _plot(argv: List[str]) -> int:
    """``flowkit plot``: see :mod:`flowkit.plot`."""
    from flowkit.plot import PlotArgs, main
    return _keyed("plot", argv, PlotArgs, main, flags=())


def _tune(argv: List[str]) -> int:
    """``flowkit tune``: see :mod:`flowkit.tune`."""
    import importlib
    tune = importlib.import_module("flowkit.tune")  # (by name: flowkit.tune imports build_tuned from here)
    return _keyed("tune", argv, tune.TuneArgs, tune.main, flags=("-c", "--no-tuned"), config_words=True)


COMMANDS = {"evaluate": _evaluate, "export": _export, "record": _record, "plot": _plot, "tune": _tune}


def _show_warning(message: Any, category: type, filename: str, lineno: int, file: Any = None,
                  line: Optional[str] = None) -> None:
    """``warnings.showwarning`` of the command: a warning raised in flowkit's or a plugin's code
    (a config key without effect, a skipped checkpoint) is one line, ``flowkit: warning: ...``,
    on stderr; another library's keeps Python's form (file, line, source)."""
    parts = os.path.normpath(os.path.abspath(filename)).split(os.sep)
    if any(p == "flowkit" or p.startswith("flowkit_") for p in parts[-4:-1]):
        print(f"flowkit: warning: {message}", file=file or sys.stderr, flush=True)
    else:
        _PY_SHOW_WARNING(message, category, filename, lineno, file, line)


def _entry() -> int:
    # runs after every other exit handler (Ray's shutdown, the run's files are done by then):
    # the interpreter's final garbage collections skip the heap that torch, Ray and
    # matplotlib built (seconds under load; objects still go as their references do)
    atexit.register(gc.freeze)
    warnings.showwarning = _show_warning  # the program only: a library caller keeps its own
    try:
        return main()
    except BrokenPipeError:  # `flowkit train --help | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt as e:  # before the run took the signals (imports), or after it
        reason = getattr(e, "reason", "interrupted (SIGINT)")
        print(f"flowkit: stopped: {reason}", file=sys.stderr)
        return exit_status(reason)


_PY_SHOW_WARNING = warnings.showwarning

if __name__ == "__main__":
    sys.exit(_entry())
