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


def _exit_on_signal(signum: int, frame: object) -> None:
    """The handler while the program imports this module (nothing started yet): one line and
    128 + the signal number, not the default action (a silent -15)."""
    os.write(2, f"flowkit: stopped: interrupted ({signal.Signals(signum).name}) while starting\n".encode())
    os._exit(128 + signum)


# first thing when this module is the program (`flowkit ...`, `python -m flowkit.cli`), never
# when it is imported as a library; signals inherited as ignored (nohup) stay ignored
if __name__ == "__main__" or os.path.basename(getattr(sys.modules.get("__main__"), "__file__", None) or "") == "flowkit":
    for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(_sig) != signal.SIG_IGN:
            signal.signal(_sig, _exit_on_signal)

import atexit  # noqa: E402
import functools  # noqa: E402
import gc  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any, Callable, Dict, List, Mapping, NoReturn, Optional, Sequence, Tuple  # noqa: E402

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


def option_hint(argv: Sequence[str], flags: Sequence[str], key_for: Callable[[str], str], real: Sequence[str]) -> str:
    """The error for options ``flags`` of ``argv`` that a command does not take (``--episodes 5``,
    ``--episodes=5``, ``-x``), with the ``key=value`` to write instead (``episodes=5``: a
    flag's value is the word after it unless that is an option or a key=value; ``key_for``
    maps a bare key to the key it means, ``lr`` to ``ppo.lr``); an option close to one of the
    command's ``real`` flags (``--no_tuned``) is pointed to that flag."""
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
        hints.append(f"{key_for(key)}={val}")
    return (f"unrecognised option{'s' * (len(flags) > 1)} {' '.join(f.partition('=')[0] for f in flags)}: "
            f"settings are key=value words, not --options; write {' '.join(hints)}")


def _meant_key(key: str, keys: Sequence[str], algo: Optional[str] = None) -> str:
    """``key`` (``-`` read as ``_``) as the key of ``keys`` it most likely means: itself, else the
    run's algorithm's key of that name (``lr`` -> ``ppo.lr``), else the one key ending in it
    (``num_workers`` -> ``runtime.num_workers``), else a close key, else ``key``."""
    import difflib
    key = key.replace("-", "_")
    owners = [k for k in keys if k.endswith(f".{key}")]
    best = [key] if key in keys else [f"{algo}.{key}"] if f"{algo}.{key}" in keys else owners[:1] if len(owners) == 1 else []
    return (best or difflib.get_close_matches(key, keys, n=1, cutoff=0.75) or [key])[0]


def _config_keys(overrides: Sequence[str], config_file: Any) -> Tuple[List[str], Optional[str]]:
    """``(every config key, the run's algorithm)`` of a config's sources; ``([], None)`` when the
    config cannot be built."""
    from flowkit.config import build_config, make_schema_class, schema_keys
    from flowkit.hooks import PluginError, get_plugin_manager
    try:
        sections = get_plugin_manager().config_sections()
        algo = build_config(list(overrides), config_file, sections).algo
    except (ConfigError, PluginError):
        return [], None
    return list(schema_keys(make_schema_class(sections))), algo


class UsageError(ConfigError):
    """A command line a command does not take (an ``--option``, ``-c`` without its FILE, an unknown
    command): one line, ``flowkit[ CMD]: error: ...``, exit 2."""


def _usage(cmd: Optional[str], overrides: Sequence[str] = (), asked: bool = True) -> int:
    """The usage: with every config key (``flowkit train|plan --help``), else a pointer to it
    (``flowkit --help``; ``flowkit`` alone, ``asked`` false: then exit 2 with why on stderr)."""
    usage = f"usage:\n  {USAGE.replace(chr(10), chr(10) + '  ')}\n\n"
    if cmd not in ("train", "plan"):
        print(usage + "Every config key with its type, allowed values, default and doc: flowkit train --help\n"
              "A command's own key=value settings: flowkit evaluate|export|record|plot|tune --help")
    else:
        from flowkit.config import help_text, plugin_modules_from
        from flowkit.hooks import get_plugin_manager
        try:
            secs = get_plugin_manager(plugin_modules_from(list(overrides))).config_sections()
        except Exception:
            secs = {}
        print(usage + "Config keys (override with key=value; `env=ID` is short for env.id=ID; floats must be "
              "finite):" + help_text(secs))
    if not asked:  # the usage on stdout, what went wrong on stderr (as every other usage error)
        print("flowkit: error: no command given (train, plan, plugins, evaluate, export, record, plot or tune; "
              "the usage is above)", file=sys.stderr)
    return 0 if asked else 2


def main(argv: Optional[List[str]] = None) -> int:
    """The ``flowkit`` command: the first word of ``argv`` (default ``sys.argv[1:]``) that names a
    command runs it (:data:`COMMANDS`) with the other words, each command's settings ``key=value``
    words read by one runner (:func:`_keyed`). Returns the exit status (module docstring)."""
    from flowkit._guard import GUARD  # signals raise Interrupted now (one inherited as ignored stays ignored)
    argv = list(sys.argv[1:] if argv is None else argv)
    i = next((i for i, w in enumerate(argv) if w in COMMANDS), None)
    with GUARD.running():
        if {"-V", "--version"} & set(argv):
            from flowkit import __version__
            print(f"flowkit {__version__}")
            return 0
        if i is not None:
            return COMMANDS[argv[i]](argv[:i] + argv[i + 1:])
        if word := next((w for w in argv if not w.startswith("-")), None):  # (in argparse's words, which users know)
            print(f"flowkit: error: argument command: invalid choice: {word!r} (choose from "
                  f"{', '.join(map(repr, COMMANDS))}) (usage: flowkit --help)", file=sys.stderr)
            raise SystemExit(2)
        return _usage(None, asked=bool({"-h", "--help"} & set(argv)))


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
        what = ("error" if cmd or status == 1 or isinstance(e, UsageError) else
                "plugin error" if isinstance(e, PluginError) else "config error")
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


def _config_command(cmd: str, paths: List[str], _: Any, got: Dict[str, Any], words: List[str]) -> int:
    """train, plan and plugins (and ``--print-config``, ``--dry-run``): their words are the config's
    overrides (a word that is not ``key=value`` is refused by the config's reader)."""
    from flowkit._guard import GUARD
    from flowkit._prepare import build_tuned, prepare, shown_path
    from flowkit.config import check_run, plugin_modules_from
    from flowkit.hooks import get_plugin_manager
    overrides, files = [*paths, *words], got.get("config")
    if cmd == "plugins":
        return _plugins(plugin_modules_from(overrides, files))
    with GUARD.held(second=_exit_on_signal):  # config building, Ray's start, the imports of Ray and torch
        pm = get_plugin_manager(plugin_modules_from(overrides, files))
        cfg, files, tuned = build_tuned(overrides, files, got["no_tuned"], pm)
        if tuned:
            print(f"{'# ' if got['print_config'] else ''}tuned config: {shown_path(tuned)} (no -c given; "
                  "--no-tuned for the defaults)", flush=True)
        if got["print_config"] or cmd == "plan" or got["dry_run"]:
            if not cfg.resume:
                check_run(cfg, pm)  # config errors found without torch, the env or Ray come before they load
            return _show(got, cfg, pm, overrides, files)
        run = prepare(overrides, files, trust_config=got["trust_config"], pm=pm, built=cfg)  # once
        if not cfg.resume:  # (a resumed run's env and runtime come from its checkpoint)
            from flowkit import _ray
            from flowkit._guard import check_env_id
            check_env_id(run.config, pm)
            _ray.start(run.config, prestart=True)  # Ray and the workers come up while torch and the learner load
        from flowkit.engine import train
    res = train(run, take_over_lock=got["take_over_lock"])  # prints the summary
    return exit_status(res.stop_reason)


def _show(got: Dict[str, Any], cfg: Any, pm: Any, overrides: List[str], files: Optional[List[str]]) -> int:
    """``--print-config`` (resolved and validated, nothing started), ``plan`` and ``--dry-run``."""
    if got["print_config"]:
        from omegaconf import OmegaConf

        from flowkit.config import run_algorithms, used_sections
        print(OmegaConf.to_yaml(OmegaConf.create(used_sections(cfg, run_algorithms(cfg), pm))), end="")
        return 0
    from flowkit.engine import describe_plan
    d = describe_plan(overrides, files)
    if got["mermaid"]:
        print(d["mermaid"])
        return 0
    print(("config OK\n\n" if got["dry_run"] else "") + d["text"] + "\n\n```mermaid\n" + d["mermaid"] + "\n```")
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
    algos = pm.algorithms(load=False)
    kinds: List[Tuple[str, Mapping[str, Any], Callable[[Any], str]]] = [  # (an algorithm's doc may begin with its name)
        ("algorithm", algos, lambda a: _first_line(a.config_class or a)),
        ("reporter", pm.reporters(), _first_line), ("env preset", pm.env_presets(), lambda p: p.help)]
    for name, plugin in pm.list_name_plugin():
        impls = {hc.name: impl for hc in pm.get_hookcallers(plugin) or [] for impl in hc.get_hookimpls()
                 if impl.plugin is plugin}
        dist = pm.dists.get(name, "flowkit (built-in)" if name.startswith("flowkit.") else
                            "`plugins`" if name in modules else "registered in code")
        print(f"{name}  [{dist}]" + (f"  {_first_line(plugin)}" if name in pm.dists else ""))
        for kind, table, text in kinds:
            for n in sorted(k for k, o in pm.owner.items() if o == name and k in table):
                doc = text(table[n])
                print(f"  {kind:<11} {doc if doc.startswith(n + ':') else f'{n}: {doc}'}")
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


def _keyed(cmd: str, argv: List[str], args_cls: Optional[type], act: Callable[..., int],
           flags: Sequence[str] = ("--trust-config",), config_words: bool = False) -> int:
    """The one runner of every command's words (:data:`COMMANDS`): settings are ``key=value``
    words, checked against the dataclass ``args_cls`` as config keys are (evaluate, export,
    record, plot, tune), or with ``args_cls`` None the config's overrides (train, plan, plugins:
    an error reads ``flowkit: config error: ...``, ``--help`` lists every config key):
    ``act(paths, settings, given flags, other words)``. ``flags``: the command's flags
    (``--trust-config`` -> ``trust_config=True``; ``-c FILE``, repeatable -> ``config=[FILE,
    ...]``). ``config_words`` (tune): a word whose key is not ``args_cls``'s is a config
    override passed on, else an unknown key with the closest one. Paths, flags and words come in
    any order; ``--help`` prints ``args_cls``'s docstring and the keys; an ``--option`` is one line
    with the ``key=value`` to write instead (a config key for train, plan and plugins)."""
    def run() -> int:
        from omegaconf import OmegaConf

        from flowkit.config import _dotlist, check_values, merge_overrides, schema_keys
        keys = schema_keys(args_cls) if args_cls else {}
        got: Dict[str, Any] = {f.lstrip("-").replace("-", "_"): False for f in flags if f != "-c"}
        paths: List[str] = []
        words: List[str] = []
        bad: List[str] = []
        it = iter(argv)
        for w in it:
            if w in ("-h", "--help"):
                got["help"] = True
            elif "-c" in flags and (w in ("-c", "--config") or w.startswith("--config=")):
                f = w.partition("=")[2] or next(it, "")  # (an option after -c is no FILE)
                got.setdefault("config", []).append(f if f and not f.startswith("-") else _needs_file(cmd, w))
            elif w in flags:
                got[w.lstrip("-").replace("-", "_")] = True
            elif re.match(r"-+[^\d.\W]", w):  # (not a negative number)
                bad.append(w)
            else:
                (words if "=" in w else paths).append(w)
        if bad:  # (train, plan, plugins: the config's keys)
            flat, algo = _config_keys(words, got.get("config")) if not args_cls else (list(keys), None)
            raise UsageError(option_hint(argv, bad, lambda k: _meant_key(k, flat, algo), [*flags, "--help"]))
        if not args_cls:
            return _usage(cmd, words) if got.pop("help", False) else act(paths, {}, got, words)
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
    return _one_line(cmd if args_cls else "", run)


def _needs_file(cmd: str, flag: str) -> NoReturn:
    raise UsageError(f"{flag} needs a FILE (flowkit {cmd} {flag} FILE)")


def _evaluate(argv: List[str]) -> int:
    """``flowkit evaluate``: see :mod:`flowkit.evaluation`."""
    from flowkit.evaluation import EvaluateArgs, evaluate, format_table

    def act(paths: List[str], opts: Dict[str, Any], flags: Dict[str, bool], _: List[str]) -> int:
        report = evaluate(_checkpoint_path(paths), **opts, trust_config=flags["trust_config"])
        print(format_table(report))
        for v in report.get("videos", []):
            print(f"video: {v}")
        print(f"wrote {os.path.join(report['checkpoint'], 'evaluation.json')}")
        return 0
    return _keyed("evaluate", argv, EvaluateArgs, act)


def signature_text(sig: Dict[str, Any]) -> str:
    """An exported module's signature as ``export`` prints it: ``(obs: uint8[B, 4, 84, 84]) ->
    action: int64[B]``; several outputs in parentheses (a recurrent policy's ``(action,
    state_out)``). ``sig``: :func:`flowkit.export.export_policy`'s result."""
    def names(ds: List[Dict[str, Any]]) -> str:
        return ", ".join(f"{d['name']}: {d['dtype']}[{', '.join(map(str, d['shape']))}]" for d in ds)
    outs = names(sig["outputs"]) if len(sig["outputs"]) == 1 else f"({names(sig['outputs'])})"
    return f"({names(sig['inputs'])}) -> {outs}"


def _export(argv: List[str]) -> int:
    """``flowkit export``: see :func:`flowkit.export.export_checkpoint`."""
    def act(paths: List[str], o: Dict[str, Any], flags: Dict[str, bool], _: List[str]) -> int:
        if o["format"] is None:  # (before torch is imported)
            raise ConfigError("format= is required (format=torchscript or format=onnx)")
        path = _checkpoint_path(paths)
        from flowkit.export import export_checkpoint
        sig = export_checkpoint(path, **o, trust_config=flags["trust_config"])
        print(f"wrote {sig['out']} ({o['format']}, policy {sig['policy']!r}): {signature_text(sig)}"
              + (f"; created the folder {sig['created']}" if sig["created"] else ""))
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
    from flowkit.tune import TuneArgs, main
    return _keyed("tune", argv, TuneArgs, main, flags=("-c", "--no-tuned"), config_words=True)


_CONFIG_FLAGS = ("-c", "--no-tuned", "--print-config", "--dry-run", "--mermaid", "--trust-config", "--take-over-lock")
COMMANDS: Dict[str, Callable[[List[str]], int]] = {  # train, plan, plugins: the config's words and flags
    **{c: functools.partial(_keyed, c, args_cls=None, act=functools.partial(_config_command, c), flags=_CONFIG_FLAGS)
       for c in ("train", "plan", "plugins")},
    "evaluate": _evaluate, "export": _export, "record": _record, "plot": _plot, "tune": _tune}


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
