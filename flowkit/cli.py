"""The ``flowkit`` command: train, plan, plugins.

Exit status: 0 success, 1 a failed run (a bad env, non-finite training or workers Ray could not
place: one line, no traceback), 2 a config error (short message, no traceback),
128 + the signal number for a run stopped by a signal after its clean save (130 SIGINT,
143 SIGTERM, 129 SIGHUP).
"""
from __future__ import annotations

import argparse
import atexit
import gc
import re
import signal
import sys
from typing import List, Optional

USAGE = """flowkit train [-c FILE ...] [--dry-run | --print-config] [key=value ...]
flowkit plan [-c FILE ...] [key=value ...]
flowkit plugins"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flowkit", description="Reinforcement learning as dataflow, on Ray.",
                                usage=USAGE, add_help=False)
    p.add_argument("command", nargs="?", choices=["train", "plan", "plugins"])
    p.add_argument("-c", "--config", dest="config_file", action="append", help="YAML config file (several: merged in order)")
    p.add_argument("--print-config", action="store_true", help="print the resolved config as YAML; start nothing")
    p.add_argument("--dry-run", action="store_true", help="validate the config and print the plan; start nothing")
    p.add_argument("--mermaid", action="store_true", help="plan: print only the Mermaid graph")
    p.add_argument("-h", "--help", action="store_true")
    p.add_argument("overrides", nargs="*", help="config overrides key=value")
    return p


def _help(overrides: List[str]) -> str:
    from flowkit.config import help_text, plugin_modules_from
    from flowkit.hooks import get_plugin_manager
    try:
        pm = get_plugin_manager(plugin_modules_from(overrides))
        secs = pm.config_sections()
    except Exception:
        secs = {}
    return (f"usage:\n  {USAGE.replace(chr(10), chr(10) + '  ')}\n\n"
            "Config keys (override with key=value; `env=ID` is short for env.id=ID; floats must be finite):" + help_text(secs))


def _early_signal(signum: int, frame: object) -> None:
    e = KeyboardInterrupt()
    e.reason = f"interrupted ({signal.Signals(signum).name})"  # type: ignore[attr-defined]
    raise e


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):  # while importing; the run takes them over
        signal.signal(sig, _early_signal)
    args, unknown = _parser().parse_known_args(argv)
    overrides = list(args.overrides) + [u for u in unknown if "=" in u]
    bad = [u for u in unknown if "=" not in u]
    if args.help or args.command is None:
        print(_help(overrides))
        return 0 if args.help else 2
    if bad:
        print(f"flowkit: error: unrecognised arguments {bad}", file=sys.stderr)
        return 2
    from flowkit.config import ConfigError, build_config, check_algo, plugin_modules_from
    from flowkit.hooks import PluginError, get_plugin_manager
    try:
        if args.command == "plugins":
            return _plugins()
        pm = get_plugin_manager(plugin_modules_from(overrides, args.config_file))
        cfg = build_config(overrides, args.config_file, pm.config_sections())  # errors before torch and Ray load
        if not cfg.resume:  # a resumed run's algo comes from its checkpoint
            check_algo(cfg, pm.algorithms(load=False))
        if args.print_config:  # resolved and validated, nothing started
            from omegaconf import OmegaConf
            print(OmegaConf.to_yaml(cfg), end="")
            return 0
        if args.command == "plan" or args.dry_run:
            from flowkit.engine import describe_plan
            d = describe_plan(overrides, args.config_file)
            if args.mermaid:
                print(d["mermaid"])
            else:
                if args.dry_run:
                    print("config OK\n")
                print(d["text"])
                print("\n```mermaid\n" + d["mermaid"] + "\n```")
            return 0
        if not cfg.resume:  # (a resumed run's runtime comes from its checkpoint)
            from flowkit import _ray
            from flowkit._guard import check_cpus, check_env_id
            check_cpus(cfg)  # config errors found without torch come before Ray starts
            check_env_id(cfg)
            _ray.start(cfg)  # Ray comes up while torch and the learner load
        from flowkit.engine import train
        res = train(overrides, args.config_file)
        m = res.metrics
        print(f"\nrun folder: {res.run_dir}")
        print(f"stopped: {res.stop_reason}")
        keys = ["iteration", "env_steps_sampled", "episode_return_mean", "evaluation_return_mean", "time_total_s"]
        print("  " + "  ".join(f"{k}={m[k]:.4g}" if isinstance(m.get(k), float) else f"{k}={m.get(k)}"
                                for k in keys if k in m))
        if res.checkpoint:
            print(f"checkpoint: {res.checkpoint}")
        return exit_status(res.stop_reason)
    except ConfigError as e:
        print(f"flowkit: config error: {e}", file=sys.stderr)
        return 2
    except PluginError as e:
        print(f"flowkit: plugin error: {e}", file=sys.stderr)
        return 2
    except MemoryError as e:  # a replay buffer or batch the config sizes too large
        print(f"flowkit: config error: out of memory, lower the sizes in the config: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a bad env, diverged training, no room: one line (torch is loaded by then)
        from flowkit.core import EnvError
        from flowkit.core.learner import NonFiniteError
        from flowkit.core.workers import StartTimeout
        if not isinstance(e, (EnvError, NonFiniteError, StartTimeout)):
            raise
        print(f"flowkit: error: {e}", file=sys.stderr)
        return 1


def exit_status(stop_reason: str) -> int:
    """0, or 128 + N for ``interrupted (SIGxxx)`` (the shell's convention for a signal)."""
    m = re.match(r"interrupted \((SIG[A-Z]+)\)", stop_reason or "")
    return 128 + int(signal.Signals[m[1]]) if m else 0


def _plugins() -> int:
    from flowkit.hooks import get_plugin_manager
    pm = get_plugin_manager()
    print(f"{'algorithm':<12} {'plugin':<18} {'distribution':<28} description")
    for name, a in sorted(pm.algorithms(load=False).items()):  # metadata only: no torch
        plug = pm.owner.get(name, "?")
        dist = pm.dists.get(plug, "flowkit (built-in)" if plug.startswith("flowkit") else "-")
        doc = (a.config_class or a).__doc__ or ""
        print(f"{name:<12} {plug:<18} {dist:<28} {doc.strip().splitlines()[0] if doc.strip() else ''}")
    return 0


def _entry() -> int:
    # runs after every other exit handler (Ray's shutdown, the run's files are done by then):
    # the interpreter's final garbage collections skip the heap that torch, Ray and
    # matplotlib built (seconds under load; objects still go as their references do)
    atexit.register(gc.freeze)
    try:
        return main()
    except BrokenPipeError:  # `flowkit train --help | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt as e:  # before the run took the signals (imports)
        return exit_status(getattr(e, "reason", "interrupted (SIGINT)"))


if __name__ == "__main__":
    sys.exit(_entry())
