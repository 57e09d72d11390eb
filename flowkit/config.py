"""flowkit's configuration: a closed, typed OmegaConf schema built from dataclasses.

Sources, merged in this order: the schema's defaults, an optional YAML file (``-c FILE``),
then dotlist overrides (``ppo.lr=3e-4``). Each algorithm adds its own section keyed by its
name (``ppo.*``); plugins may add further sections (``multiagent.*``) through the
``flowkit_add_config_sections`` hook. ``env=ID`` is a shorthand for ``env.id=ID``.

Each field declares the values it allows where it is declared (``F(3e-4, "Adam learning
rate", gt=0)``; floats must be finite, ints fit in 64 bits) and :func:`check_values` checks
them all once the config is built; a section's ``validate`` keeps only checks that relate
several keys (:func:`validate_section`). Every problem is a :class:`ConfigError` raised before anything starts:
one line naming the key, what was expected and what was given, and for an unknown key the
closest valid one.

The schema's declarations (:func:`F`, :class:`Allowed`, the core section dataclasses,
:func:`schema_keys`) are in :mod:`flowkit._config_schema` and re-exported here; this module
builds, merges and checks a config and writes its help text.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import re
import typing
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, InterpolationResolutionError, OmegaConfBaseException, ValidationError

# The schema (field declarations, core sections, the flat view of keys) lives in
# flowkit._config_schema; every name of it is importable from here, as before.
from flowkit._config_schema import (  # noqa: F401
    ACTIVATIONS,
    INT64_MAX,
    INT64_MIN,
    MAX_BATCH_ROWS,
    MAX_EPISODES,
    Allowed,
    CheckpointConfig,
    Config,
    EnvConfig,
    EvaluationConfig,
    F,
    LearnerConfig,
    LRConfig,
    ModelConfig,
    RandomConfig,
    RunConfig,
    RuntimeConfig,
    StopConfig,
    _field,
    _leaf_type,
    _type_name,
    _unwrap_optional,
    action_space_error,
    model_error,
    normalize_obs_on,
    schema_allowed,
    schema_keys,
)


class ConfigError(ValueError):
    """A configuration problem; the message names the key(s) and value(s) involved."""


def schedule_keys(section: Any) -> Tuple[str, ...]:
    """The schedules a config section declares: its keys named ``*_schedule`` (each
    ``constant`` or ``linear``; a linear one takes its value from the section's base key to 0
    over ``schedule_env_steps`` env steps sampled, default ``stop.env_steps``). ``section``: a
    DictConfig or a dataclass (class or instance)."""
    names = [f.name for f in dataclasses.fields(section)] if dataclasses.is_dataclass(section) else list(section)
    return tuple(str(k) for k in names if str(k).endswith("_schedule"))


def check_schedules(section: Any, name: str, run_config: Any) -> None:
    """A linear schedule ``<name>.<key>=linear`` (``key`` in :func:`schedule_keys`) needs a
    horizon: ``<name>.schedule_env_steps`` or ``stop.env_steps``. Run by :func:`validate_section`
    for each section a run uses, so an algorithm declares a schedule by its field alone.

    Raises:
        ConfigError: ``<name>.<key>=linear needs a horizon: ...``.
    """
    for key in schedule_keys(section):
        if _field(section, key) == "linear" and _field(section, "schedule_env_steps") is None \
                and run_config.stop.env_steps is None:
            raise ConfigError(f"{name}.{key}=linear needs a horizon: set {name}.schedule_env_steps or stop.env_steps")


def schedule_horizon(section: Any, run_config: Any) -> Optional[int]:
    """Env steps sampled at which the section's linear schedules reach 0, or None when none
    of its :func:`schedule_keys` is ``linear``."""
    if section is None or "linear" not in [_field(section, k) for k in schedule_keys(section)]:
        return None
    return int(_field(section, "schedule_env_steps") or run_config.stop.env_steps)


def round_env_steps(run_config: Any) -> int:
    """Env steps of one sampling round: ``runtime.num_workers`` (0 counts as 1: the local
    worker samples) x ``num_envs_per_worker`` x ``rollout_fragment_length``."""
    rt = run_config.runtime
    return max(1, int(rt.num_workers)) * int(rt.num_envs_per_worker) * int(rt.rollout_fragment_length)


def check_values(cfg: Any, schema_cls: Any, prefix: str = "") -> None:
    """Check every value of ``cfg`` (a DictConfig or dict shaped like the dataclass
    ``schema_cls``) against what its field allows (see :func:`F`); nested sections and
    ``Dict[str, <dataclass>]`` fields are walked.

    Raises:
        ConfigError: one line naming the full key, the value and what is allowed, e.g.
            ``ppo.lr=inf must be finite and > 0``.
    """
    hints = typing.get_type_hints(schema_cls)
    for f in dataclasses.fields(schema_cls):
        if f.name not in cfg or cfg[f.name] is None:
            continue
        key, tp, val = prefix + f.name, hints[f.name], cfg[f.name]
        base: Any = _unwrap_optional(tp)[0]
        if dataclasses.is_dataclass(base):
            check_values(val, base, key + ".")
            continue
        leaf: Any = _leaf_type(tp)
        if typing.get_origin(base) in (dict, Dict) and dataclasses.is_dataclass(leaf):
            for k in val:
                check_values(val[k], leaf, f"{key}.{k}.")
            continue
        allowed = f.metadata.get("allowed") or Allowed()
        if leaf not in (int, float, str):  # e.g. Dict[str, Any]: open, checked by its reader
            continue
        if typing.get_origin(base) in (list, List):
            items = [(f"{key}[{i}]", v) for i, v in enumerate(val)]
        elif typing.get_origin(base) in (dict, Dict):
            items = [(f"{key}.{k}", val[k]) for k in val]
        else:
            items = [(key, val)]
        for k, v in items:
            if isinstance(v, (list, dict, ListConfig, DictConfig)):  # e.g. a nested list in YAML
                raise ConfigError(f"`{k}` must be {_KINDS[leaf]}, got {_short(OmegaConf.to_object(v) if isinstance(v, (ListConfig, DictConfig)) else v)}")
            if not allowed.ok(v, leaf is float):
                what = allowed.describe(leaf is float)
                if leaf is int and ((v > INT64_MAX and allowed.le is None and allowed.lt is None)
                                    or (v < INT64_MIN and allowed.ge is None and allowed.gt is None)):
                    what = f"{what} and " if what else ""
                    what += f"fit in 64 bits ([{INT64_MIN}, {INT64_MAX}])"
                need = f"match {allowed.pattern}" if allowed.pattern is not None else f"be {what}"
                raise ConfigError(f"{k}={v!r} must {need}")


def make_schema_class(sections: Dict[str, type]) -> type:
    """The Config dataclass extended with one field per extra section."""
    extra = [(name, cls, F(help=(cls.__doc__ or name).strip().splitlines()[0], factory=cls))
             for name, cls in sections.items()]
    for name in set(sections) & {f.name for f in dataclasses.fields(Config)}:
        raise ConfigError(f"plugin config section {name!r} clashes with a core section")
    return dataclasses.make_dataclass("FlowkitConfig", extra, bases=(Config,))


class Sections(Dict[str, type]):
    """``{name: dataclass}`` of the sections a config may hold beside the core ones (what
    ``PluginManager.config_sections`` returns). Each of ``algorithms`` is read only by the
    algorithm of its name: a config holds it only where it is needed (:func:`held_sections`)."""

    def __init__(self, sections: Any = (), algorithms: Iterable[str] = ()):
        super().__init__(sections)
        self.algorithms = frozenset(algorithms)


_INTERPOLATED = re.compile(r"\$\{\s*(\w+)\.")


def held_sections(layers: Sequence[Dict[str, Any]], sections: Dict[str, type]) -> Dict[str, type]:
    """The sections of ``sections`` that a config built from ``layers`` (its sources as nested
    dicts, in order) holds: every plugin section, and an algorithm's section (``sections.algorithms``)
    where the run uses the algorithm (``algo``, ``multiagent.policies.<id>.algo``), a source sets
    it or an interpolation names it. What every section costs is the config's build (OmegaConf
    makes a node per key: 430 keys for the 25 sections installed on 2026-12-07), so a run builds
    only its own; a section left out reads as its defaults (:func:`section_object`)."""
    algos = getattr(sections, "algorithms", frozenset())
    used = [layer["algo"] for layer in layers if "algo" in layer][-1:] or [Config.algo]
    for layer in layers:
        ma = layer.get("multiagent")
        pols = ma.get("policies") if isinstance(ma, dict) else None
        used += [p.get("algo") for p in pols.values() if isinstance(p, dict)] if isinstance(pols, dict) else []
    if any(a is not None and (not isinstance(a, str) or "${" in a) for a in used):  # known once resolved
        return dict(sections)
    named = set(used) | {k for layer in layers for k in layer} | set(_INTERPOLATED.findall(str(layers)))
    return {k: v for k, v in sections.items() if k not in algos or k in named}


def used_sections(cfg: Any, algos: Any, pm: Any, keep_packages: Any = ()) -> Dict[str, Any]:
    """``cfg`` as a plain dict with the core sections, the sections of the algorithms named in
    ``algos`` (those that train or act for a policy), and the plugin sections that differ from
    their defaults or belong to a package in ``keep_packages`` (the plugin that made the policy
    specs, e.g. ``flowkit_multiagent``); other algorithms' sections are left out. What a run's
    ``config.yaml`` and ``flowkit train --print-config`` show."""
    data: Any = OmegaConf.to_container(cfg, resolve=True)
    base = {f.name for f in dataclasses.fields(Config)} | set(algos)
    registered, sections = pm.algorithms(load=False), pm.config_sections()
    return {k: v for k, v in data.items() if k in base or (k in sections and k not in registered and (
            sections[k].__module__.split(".")[0] in keep_packages
            or changed_keys(v, sections[k])))}


def changed_keys(given: Dict[str, Any], section: type) -> List[str]:
    """The keys of ``given`` (a config section as plain data, ``OmegaConf.to_container``) whose
    values differ from the defaults of ``section`` (its dataclass). A section equal to the
    dataclass's own defaults is told without OmegaConf (``OmegaConf.structured`` takes tens of ms
    a section, and every run checks each installed algorithm's section before Ray starts)."""
    try:
        if dataclasses.asdict(section()) == given:
            return []
    except TypeError:  # a field without a default: OmegaConf's MISSING
        pass
    default: Dict[str, Any] = OmegaConf.to_container(OmegaConf.structured(section), resolve=True)  # type: ignore[assignment]
    return [k for k in given if given[k] != default.get(k)]


def run_algorithms(cfg: Any) -> List[str]:
    """The algorithms a config's policies use, before any env is built: ``algo`` and each
    ``multiagent.policies.<id>.algo`` given."""
    names = [str(cfg.algo)]
    pols = OmegaConf.select(cfg, "multiagent.policies", default=None)
    if isinstance(pols, DictConfig):
        names += [str(p.algo) for p in pols.values() if isinstance(p, DictConfig) and p.get("algo")]
    return list(dict.fromkeys(names))


def did_you_mean(word: Any, options: Iterable[str], prefix: str = "") -> str:
    """``"; did you mean `<prefix><closest option>`?"``, or "" when none is close (letter case
    ignored: ``PPO`` finds ``ppo``)."""
    lower = {str(o).lower(): str(o) for o in options}
    close = difflib.get_close_matches(str(word).lower(), list(lower), n=1)
    return f"; did you mean `{prefix}{lower[close[0]]}`?" if close else ""


def check_algo(cfg: Any, algos: Any) -> None:
    """``algo`` is one of ``algos`` (names), else a ConfigError naming the closest."""
    if cfg.algo not in algos:
        raise ConfigError(f"algo={cfg.algo!r} is not an installed algorithm ({', '.join(sorted(algos))})"
                          f"{did_you_mean(cfg.algo, algos)}")


def check_unused_sections(cfg: Any, algos: Any, sections: Dict[str, type]) -> List[str]:
    """Sections set (differing from their defaults) for algorithms that no policy of the run
    uses (:func:`run_algorithms`). A section is read only by the algorithm of its name; a
    registered subclass does not read its parent's section. Where the run's ``algo`` takes the
    same settings class as the unused section (or a subclass of it: a variant such as
    ``ppo_l2``, registered from PPO, under a tuned file's ``ppo:``) the user meant them for this
    run: a config error. Other algorithms' sections (a base file shared by several runs) give a
    warning each.

    Returns:
        the warnings (one line each).
    Raises:
        ConfigError: naming the section, a key it sets, and the algorithms the run uses.
    """
    used, out = run_algorithms(cfg), []
    mine = sections.get(str(cfg.algo))
    for name in algos:
        if name in used or name not in sections or name not in cfg:
            continue
        given: Dict[str, Any] = OmegaConf.to_container(cfg[name], resolve=True)  # type: ignore[assignment]
        diff = changed_keys(given, sections[name])
        if not diff:
            continue
        what = (f"config section `{name}` ({name}.{diff[0]}={given[diff[0]]!r}) is not used by this run, which trains "
                f"with {', '.join(f'algo={a}' for a in used)}")
        if mine is not None and issubclass(mine, sections[name]):
            raise ConfigError(f"{what}; `{cfg.algo}` takes the same settings: give them as `{cfg.algo}.*` (rename "
                              f"`{name}:` to `{cfg.algo}:` in the file)")
        out.append(f"{what}: it has no effect")
    return out


def check_run(cfg: Any, pm: Any) -> None:
    """The checks of a run's config that need neither torch, Ray nor the env, made before those
    load (``flowkit train``, :func:`flowkit.train`) and again at set-up: ``algo`` installed,
    no section of a variant of ``algo`` set in its place (:func:`check_unused_sections`), exactly one of ``env.id`` and ``env.factory``, ``run.reporters`` known (and each one's
    ``validate_config``), ``model.recurrent`` and ``model.normalize_obs`` against what ``algo``
    declares (:func:`model_error`), and the checks of ``algo``'s section
    (:func:`validate_section`), whose warnings are given at set-up.

    Raises:
        ConfigError: the first problem found.
    """
    algos = pm.algorithms(load=False)
    check_algo(cfg, algos)
    check_unused_sections(cfg, algos, pm.config_sections())
    if bool(cfg.env.id) == bool(cfg.env.factory):
        hint = ("; e.g. `flowkit train algo=ppo env=CartPole-v1` (its tuned config is used when there is one) "
                "or a config file, `flowkit train -c FILE`") if not cfg.env.factory else ""
        raise ConfigError("give exactly one of env.id (env=ID) and env.factory "
                          f"(got env.id={cfg.env.id!r}, env.factory={cfg.env.factory!r}){hint}")
    check_sizes(cfg)
    if cfg.stop.evaluation_return_mean is not None and not cfg.evaluation.interval:
        raise ConfigError(f"stop.evaluation_return_mean={cfg.stop.evaluation_return_mean} needs periodic evaluation: "
                          "set evaluation.interval (e.g. evaluation.interval=5)")
    known = pm.reporters()
    twice = sorted({r for r in cfg.run.reporters if list(cfg.run.reporters).count(r) > 1})
    if twice:
        raise ConfigError(f"run.reporters: {', '.join(map(repr, twice))} listed more than once")
    for name in cfg.run.reporters:
        if name not in known:
            raise ConfigError(f"run.reporters: unknown reporter {name!r} (known: {', '.join(sorted(known))})")
        check = getattr(known[name], "validate_config", None)
        if callable(check):
            check(cfg)
    a = algos[cfg.algo]
    section = section_object(cfg, a.name, a.config_class)
    if why := model_error(a, "default", cfg.model, section, [n for n, r in algos.items() if r.recurrent]):
        raise ConfigError(why)
    validate_section(a.name, cfg, section)
    check_learner_group(cfg, algos)
    for name, cls in pm.config_sections().items():
        if name not in algos:  # the plugins' own sections (input.*, multiagent.*)
            validate_section(name, cfg, section_object(cfg, name, cls))


def check_learner_group(cfg: Any, algos: Any) -> None:
    """``learner.num_learners`` > 0 needs Ray (``runtime.backend=ray``), feed-forward policies and
    algorithms that declare ``learner_group`` (:class:`flowkit.AlgorithmRef`)."""
    n = int(cfg.learner.num_learners)
    if n == 0:
        return
    if cfg.runtime.backend != "ray":
        raise ConfigError(f"learner.num_learners={n} runs learner processes on Ray: it needs runtime.backend=ray "
                          f"(got {cfg.runtime.backend}); learner.num_learners=0 trains in this process")
    if bad := [a for a in run_algorithms(cfg) if a in algos and not getattr(algos[a], "learner_group", False)]:
        ok = sorted(k for k, r in algos.items() if getattr(r, "learner_group", False))
        raise ConfigError(f"learner.num_learners={n}: algo {bad[0]} does not train through a learner group "
                          f"(those that do: {', '.join(ok)}); set learner.num_learners=0")
    if cfg.model.recurrent:
        raise ConfigError(f"learner.num_learners={n}: a learner group trains feed-forward policies only "
                          f"(model.recurrent={cfg.model.recurrent})")


def validate_section(name: str, run_config: Any, section: Any) -> List[str]:
    """The one validation of a section ``name`` (``section``: an instance of its dataclass;
    None: the run has none): the linear schedules' horizon (:func:`check_schedules`), the section's own
    ``validate(run_config, name)`` where its class has one (the checks that relate several keys,
    torch-free, written as a table: :func:`config_checks`), and a warning when its
    ``learning_starts`` is not below ``stop.env_steps`` (the run stops in the replay warm-up).
    Each key's own range or choices are declared in its field (:func:`F`), checked before.
    Run before torch and Ray load (:func:`check_run`: ``algo``'s section and the plugins' own
    sections), at set-up for each algorithm of a run, and for a multi-agent policy's own section.

    Returns:
        the warnings (one line each).
    Raises:
        ConfigError: naming the keys and values.
    """
    if section is None:
        return []
    check_schedules(section, name, run_config)
    check = getattr(section, "validate", None)
    out = list(check(run_config, name) or []) if check is not None else []
    starts, budget = getattr(section, "learning_starts", None), run_config.stop.env_steps
    if starts is not None and budget is not None and starts >= budget:
        out.append(f"{name}.learning_starts={starts} >= stop.env_steps={budget}: the run stops in the "
                   "replay warm-up and trains nothing")
    return out


def config_checks(errors: Iterable[Tuple[Any, str]], warnings: Iterable[Tuple[Any, str]] = ()) -> List[str]:
    """A section's combination checks as one table: ``errors`` and ``warnings`` are rows
    ``(condition, message)``. The first error whose condition holds is raised; otherwise the
    messages of the warnings whose condition holds are returned (what a config class's
    ``validate`` returns).

    Raises:
        ConfigError: the message of the first error that holds.
    """
    for bad, message in errors:
        if bad:
            raise ConfigError(message)
    return [message for bad, message in warnings if bad]


def check_sizes(cfg: Any) -> None:
    """The sizes that multiply: one sampling round holds num_workers (0 counts as 1) x
    num_envs_per_worker x rollout_fragment_length env steps, at most :data:`MAX_BATCH_ROWS`
    (each key's own bound is declared in its field).

    Raises:
        ConfigError: naming the product and its factors.
    """
    rt, rows = cfg.runtime, round_env_steps(cfg)
    if rows > MAX_BATCH_ROWS:
        raise ConfigError(f"one sampling round of runtime.num_workers={rt.num_workers} x num_envs_per_worker="
                          f"{rt.num_envs_per_worker} x rollout_fragment_length={rt.rollout_fragment_length} = "
                          f"{rows} env steps is over flowkit's limit of {MAX_BATCH_ROWS}; lower one of them")


_KINDS = {int: "an int", float: "a float", bool: "true or false", str: "a string"}


def _config_error(e: Exception, keys: Dict[str, Tuple[Any, str, Any]], layer: Any = None,
                  algo: Optional[str] = None) -> ConfigError:
    """An OmegaConf error as one line: an unknown key with the closest valid one (an unknown
    section of ``layer`` named with the first key given under it: `xppo.lr`), a value of the
    wrong type naming the key, the value and the expected type, else OmegaConf's words. A
    section's key given bare (`lr`) is pointed to ``algo``'s section (the run's algorithm)."""
    key = str(getattr(e, "full_key", None) or "")
    if isinstance(e, ConfigKeyError):
        node = layer
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        while isinstance(node, dict) and node and isinstance(first := next(iter(node)), str):
            key, node = f"{key}.{first}", node[first]
        close = difflib.get_close_matches(key, list(keys), n=1, cutoff=0.6)
        hint = f"; did you mean `{close[0]}`?" if close else ""
        if "." not in key:  # a section's key given bare (`lr=1e-3`): name the sections that have it
            algo = (layer.get("algo") if isinstance(layer, dict) else None) or algo
            owners = sorted((k for k in keys if k.endswith(f".{key}") and k.count(".") == 1),
                            key=lambda k: (k.split(".")[0] != algo, k))
            if owners:
                hint = (f"; did you mean `{owners[0]}`?" if owners[0].split(".")[0] == algo or len(owners) == 1 else
                        f"; it is a key of a section: {', '.join(f'`{k}`' for k in owners[:4])}"
                        f"{', ...' if len(owners) > 4 else ''}")
        shown = key if key.isprintable() and key.strip() == key else repr(key)  # e.g. a stray '\xa0'
        return ConfigError(f"unknown config key `{shown}`{hint}")
    k = re.sub(r"\[\d+\]$", "", key)
    item = k != key or (k not in keys and k.rpartition(".")[0] in keys)  # a list or a mapping item
    tp = keys.get(k) or keys.get(k.rpartition(".")[0])
    if tp is not None and isinstance(e, ValidationError) and not isinstance(e, InterpolationResolutionError):
        base = _leaf_type(tp[0]) if item else _unwrap_optional(tp[0])[0]
        origin, v = typing.get_origin(base), getattr(e, "value", None)
        want = (f"a list, e.g. {key}={_list_example(base, tp[2])}" if origin in (list, List)
                else "a mapping" if origin in (dict, Dict) else _KINDS.get(base, _type_name(base)))
        return ConfigError(f"`{key}` must be {want}, got {'null' if v is None else repr(v)}")
    return ConfigError(f"config key `{key or '?'}`: {str(e).splitlines()[0]}")


def _list_example(tp: Any, default: Any) -> str:
    """A list value for an error's example: the key's default when it has items, else two
    items of its element type (``[1,2]``, ``[a,b]``)."""
    if isinstance(default, (list, tuple)) and default and all(isinstance(d, (str, int, float)) for d in default):
        return "[" + ",".join(map(str, default)) + "]"
    elem = (typing.get_args(tp) or (int,))[0]
    return {str: "[a,b]", float: "[0.5,1.0]"}.get(elem, "[1,2]")


def _dotlist(items: Sequence[Any]) -> Dict[str, Any]:
    """``["a.b=1", ...]`` as a nested dict, each value read as YAML by OmegaConf (text that is
    not YAML stays a string). ``env=ID`` is ``env.id=ID``; both spellings together are an error."""
    layer, seen = OmegaConf.create(), typing.cast(Dict[str, str], {})
    for item in items:
        spelling, _, raw = item.partition("=") if isinstance(item, str) else ("", "", "")
        if not (spelling := spelling.strip()) or "=" not in item:
            hint = (" (a config file goes after -c: `flowkit train -c FILE key=value ...`)"
                    if isinstance(item, str) and item.endswith((".yaml", ".yml")) else "")
            raise ConfigError(f"override {item!r} is not of the form key=value{hint}")
        key = "env.id" if spelling == "env" and not raw.lstrip().startswith("{") else spelling
        if seen.setdefault(key, item).split("=", 1)[0].strip() != spelling:  # no silent winner
            raise ConfigError(f"`{key}` is given twice: `{seen[key]}` and `{item}`")
        try:  # the same key repeated: the last one wins
            try:
                layer.merge_with_dotlist([f"{key}={raw}"])
            except yaml.YAMLError:
                OmegaConf.update(layer, key, raw)
        except Exception as e:
            raise ConfigError(f"override {item!r}: {str(e).splitlines()[0]}") from None
    return typing.cast(Dict[str, Any], OmegaConf.to_container(layer))


def _load_yaml(path: str) -> Dict[str, Any]:
    try:
        if not os.path.isdir(path) and os.path.exists(path) and not os.path.isfile(path):  # open() would wait
            raise ConfigError(f"config file {path!r} is not a regular file (a pipe, a device or a socket); give a "
                              "YAML file")  # for a writer (a FIFO) or read forever (/dev/zero)
        with open(path, encoding="utf-8") as f:
            data = OmegaConf.load(f)  # its YAML reads 1e-5 as a float and refuses duplicate keys
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path!r} is a directory; give a YAML file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path!r} is not a UTF-8 text file (byte {e.start}: "
                          f"{e.object[e.start:e.start + 1]!r}); give a YAML file") from None
    except yaml.MarkedYAMLError as e:  # one line: where, what, and in what
        def at(mark: Any) -> str:
            return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "?"
        what = " ".join(str(e.problem or e.context or "syntax error").split())
        ctx = f" ({' '.join(e.context.split())} at {at(e.context_mark)})" if e.context and e.problem else ""
        raise ConfigError(f"config file {path!r} is not valid YAML: {at(e.problem_mark)}: {what}{ctx}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path!r} is not valid YAML: {' '.join(str(e).split())}") from None
    except OmegaConfBaseException as e:  # YAML OmegaConf cannot hold: a `null:` or `[1]:` key
        raise ConfigError(f"config file {path!r} is not a config: {str(e).splitlines()[0]} "
                          "(keys must be strings or ints)") from None
    except OSError as e:
        if e.strerror:
            raise ConfigError(f"config file {path!r} cannot be read: {e.strerror}") from None
        data = None  # OmegaConf's answer to a number at the top
    if not isinstance(data, DictConfig):
        raise ConfigError(f"config file {path!r} must hold a mapping at the top")
    return _env_shorthand(typing.cast(Dict[str, Any], OmegaConf.to_container(data)))


def _env_shorthand(data: Dict[str, Any]) -> Dict[str, Any]:
    """``env: ID`` -> ``env: {id: ID}`` (a copy)."""
    return {**data, "env": {"id": data["env"]}} if isinstance(data.get("env"), str) else data


def _as_source(user: Any) -> Tuple[Dict[str, Any], List[str]]:
    """``(nested dict, overrides)`` of a config given as overrides (a list or a string), a dict
    or a DictConfig; interpolations stay as they are (resolved in the merged config)."""
    if isinstance(user, str):
        user = user.split()
    if isinstance(user, (DictConfig, ListConfig)):
        user = OmegaConf.to_container(user)
    if user is None or isinstance(user, dict):
        return dict(_env_shorthand(user or {})), []
    if isinstance(user, (list, tuple)):
        return _dotlist(user), list(user)
    raise ConfigError(f"config must be a dict, a DictConfig or a list of overrides, got {type(user).__name__}")


def _layers(user: Any, config_file: Union[str, Sequence[str], None]) -> Tuple[List[Dict[str, Any]], List[str]]:
    """(each config file (in order), then ``user``; the overrides of ``user``)."""
    source, items = _as_source(user)
    files = [config_file] if isinstance(config_file, str) else list(config_file or [])
    return [_load_yaml(f) for f in files] + [source], items


def plugin_modules_from(user: Any, config_file: Union[str, Sequence[str], None] = None) -> List[str]:
    """The ``plugins`` list of a config source (needed before the schema can be built)."""
    mods: List[str] = []
    for src in _layers(user, config_file)[0]:
        given = src.get("plugins")
        if given is not None and (not isinstance(given, (list, tuple)) or not all(isinstance(m, str) for m in given)):
            raise ConfigError(f"`plugins` must be a list of module paths, e.g. plugins=[my_pkg.plugin], got {given!r}")
        mods += list(given or [])
    return mods


def build_config(user: Any = None, config_file: Union[str, Sequence[str], None] = None,
                 sections: Optional[Dict[str, type]] = None) -> DictConfig:
    """Merge defaults, YAML files and overrides into a typed DictConfig (struct mode), with
    every ``${...}`` interpolation resolved and every value checked.

    Args:
        user: dotlist overrides (list of ``key=value``), a dict, or a DictConfig.
        config_file: YAML file(s), merged in order before ``user``.
        sections: extra sections ``{name: dataclass}`` (algorithm and plugin sections).
    Raises:
        ConfigError: unknown key (with the closest valid one), wrong type, a value outside
            what its field allows (:func:`check_values`), an interpolation that does not
            resolve, ``env=`` and ``env.id=`` given together, or a config file that is
            missing, unreadable or not YAML.
    """
    layers, items = _layers(user, config_file)
    schema_cls = make_schema_class(held_sections(layers, sections or {}))
    _decimal_for_int(items, schema_keys(schema_cls))
    merged = OmegaConf.structured(schema_cls)
    for layer in layers:
        merged = merge_overrides(merged, layer, schema_cls, known=sections or {})
    OmegaConf.set_struct(merged, True)
    try:
        OmegaConf.resolve(merged)  # validates each result against its field's type
    except OmegaConfBaseException as e:
        raise _config_error(e, {}) from None
    check_values(merged, schema_cls)
    return merged


def merge_overrides(base: DictConfig, overrides: Dict[str, Any], schema: type,
                    known: Optional[Dict[str, type]] = None) -> DictConfig:
    """``base`` with the nested dict ``overrides`` merged in by OmegaConf, which checks every
    key and type against the dataclass ``schema``; an integral float (``1e4``) for an int
    field becomes an int; a section given as null (``ppo:`` in YAML) is skipped. ``known``:
    the sections whose keys an unknown key's hint may name (default: those of ``schema``).

    Raises:
        ConfigError: an unknown key (with the closest valid one) or a value of the wrong type.
    """
    keys = schema_keys(schema)
    layer = dict(overrides)
    if (err := _text_for_number(layer, keys)) is not None:
        raise err
    for name in [k for k in layer if any(s.startswith(f"{k}.") for s in keys)]:  # whole sections
        if layer[name] is None:
            del layer[name]
        elif not isinstance(layer[name], dict):
            raise ConfigError(f"`{name}` is a config section: give a mapping of its keys "
                              f"(e.g. `{name}.<key>=value`), got {layer[name]!r}")
    try:
        node = OmegaConf.create(layer)
        while True:
            try:
                return typing.cast(DictConfig, OmegaConf.merge(base, node))
            except ValidationError as e:
                v = getattr(e, "value", None)
                if not (isinstance(v, float) and v.is_integer() and "to Integer" in str(e)):
                    raise
                OmegaConf.update(node, str(e.full_key), int(v), merge=False)
    except OmegaConfBaseException as e:
        raise _config_error(e, keys if known is None else schema_keys(make_schema_class(known)), layer,
                            base.get("algo") if isinstance(base, DictConfig) else None) from None
    except TypeError as e:  # OmegaConf: "Cannot merge incompatible container types"
        raise _container_error(layer, keys) or ConfigError(f"config: {e}") from None


def _container_error(layer: Any, keys: Dict[str, Tuple[Any, str, Any]], prefix: str = "") -> Optional[ConfigError]:
    """The first key of ``layer`` (a nested dict) given a list where the schema has a mapping
    (or a section), or a mapping where it has a list; None if there is none."""
    items = layer.items() if isinstance(layer, dict) else ()
    for k, v in items:
        key = f"{prefix}{k}"
        tp = keys.get(key)
        origin = typing.get_origin(_unwrap_optional(tp[0])[0]) if tp else None
        section = tp is None and any(s.startswith(f"{key}.") for s in keys)
        want = ("a mapping" if origin in (dict, Dict) or (section and isinstance(v, list))
                else "a list" if origin in (list, List) and isinstance(v, dict) else None)
        if want and (isinstance(v, list) or want == "a list"):
            return ConfigError(f"`{key}` must be {want}, got {_short(v)}")
        if isinstance(v, dict) and (section or origin in (dict, Dict)):
            sub = {f"{key}.{s[len(key) + 1:]}": t for s, t in keys.items() if s.startswith(f"{key}.")}
            if (err := _container_error(v, {**keys, **sub}, f"{key}.")) is not None:
                return err
    return None


def _text_for_number(layer: Any, keys: Dict[str, Tuple[Any, str, Any]], prefix: str = "") -> Optional[ConfigError]:
    """The first int, float or bool key of ``layer`` (a nested dict) given as text (``"64"``
    in YAML quotes), which OmegaConf would convert without a word; interpolations (``${...}``)
    are text by nature. None if there is none."""
    for k, v in (layer.items() if isinstance(layer, dict) else ()):
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            if (err := _text_for_number(v, keys, f"{key}.")) is not None:
                return err
            continue
        leaf = _leaf_type(keys[key][0]) if key in keys else None
        if leaf not in (int, float, bool):
            continue
        items = [(f"{key}[{i}]", x) for i, x in enumerate(v)] if isinstance(v, list) else [(key, v)]
        for name, x in items:
            if isinstance(x, str) and "${" not in x:
                return ConfigError(f"`{name}` must be {_KINDS[leaf]}, got the text {x!r} (write it without quotes)")
    return None


_DECIMAL = re.compile(r"[+-]?(\d+\.\d*|\.\d+)([eE][+-]?\d+)?")


def _decimal_for_int(items: Sequence[Any], keys: Dict[str, Tuple[Any, str, Any]]) -> None:
    """An override giving an int key a number with a decimal point (``stop.env_steps=1.5e3``:
    a float, which OmegaConf would round to an int without a word); a count in e-notation is
    written with a whole mantissa (``1e5``, ``15e2``).

    Raises:
        ConfigError: naming the key and the text.
    """
    for item in items:
        key, _, raw = item.partition("=") if isinstance(item, str) else ("", "", "")
        key = key.strip()
        if key in keys and _leaf_type(keys[key][0]) is int and _DECIMAL.fullmatch(raw.strip()):
            raise ConfigError(f"`{key}` must be an int, got {raw.strip()} (a float; a count in e-notation has a whole "
                              "mantissa: 1e5, 15e2)")


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def section_object(cfg: DictConfig, name: str, cls: Optional[type]) -> Any:
    """Section ``name`` of ``cfg`` as an instance of its dataclass ``cls``: the one form of a
    section that algorithms, policies and validation read (None where ``cls`` is None; its
    defaults where ``cfg`` holds no such section: :func:`held_sections`)."""
    if cls is None:
        return None
    return cls(**(typing.cast(Dict[str, Any], OmegaConf.to_container(cfg[name], resolve=True)) if name in cfg else {}))


def describe_keys(sections: Optional[Dict[str, type]] = None) -> List[Tuple[str, str, str, Any, str]]:
    """Every config key of the schema with ``sections`` as ``(key, type, allowed, default,
    help)`` rows, in schema order: ``("ppo.lr", "float", "> 0", 0.0003, "Adam learning rate")``.
    ``allowed`` is "" when any value of the type goes (floats must also be finite); for a
    list or a mapping it applies to each item. The fields of a ``Dict[str, <dataclass>]``
    key follow it as ``<key>.<id>.<field>`` rows. What ``flowkit train --help`` and the docs'
    config reference show."""
    def rows(cls: Any, prefix: str) -> Iterator[Tuple[str, str, str, Any, str]]:
        allowed_values = schema_allowed(cls, prefix)
        for key, (tp, hlp, default) in schema_keys(cls, prefix).items():
            allowed = allowed_values.get(key)
            rng = allowed.describe(_leaf_type(tp) is float, say_finite=False) if allowed else ""
            if rng and typing.get_origin(_unwrap_optional(tp)[0]) in (list, List, dict, Dict):
                rng = f"each {rng}"
            yield key, _type_name(tp), rng, default, hlp
            if typing.get_origin(_unwrap_optional(tp)[0]) in (dict, Dict) and dataclasses.is_dataclass(_leaf_type(tp)):
                yield from rows(_leaf_type(tp), f"{key}.<id>.")
    return list(rows(make_schema_class(sections or {}), ""))


def help_text(sections: Optional[Dict[str, type]] = None) -> str:
    """Every config key with its type, allowed values, default and help, grouped by section
    (floats must also be finite)."""
    lines, last = [], None
    for key, tp, rng, default, hlp in describe_keys(sections):
        sec = key.split(".")[0] if "." in key else ""
        if sec != last:
            lines.append(f"\n[{sec or 'top level'}]")
            last = sec
        lines.append(f"  {key} ({tp}{', ' + rng if rng else ''}, default {default!r}): {hlp}")
    return "\n".join(lines)
