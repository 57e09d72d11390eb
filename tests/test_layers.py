"""Issue 22 item 1: flowkit's layers only point down, and its modules import no circle.

Every module under ``flowkit/`` is parsed with :mod:`ast` (nothing is imported), and every
import statement counts: module level, inside functions and under ``if TYPE_CHECKING:``.
- ``flowkit.core.*`` imports only ``flowkit.core.*`` and ``flowkit.config`` (and third-party
  packages);
- ``flowkit.hooks.*`` only ``flowkit.core.*``, ``flowkit.config`` and ``flowkit.hooks.*``;
- the graph of these imports (a package's ``__init__`` is a module of its own; an import of
  ``pkg.mod`` is an edge to ``pkg.mod``) has no cycle. Left out of it: the ``TYPE_CHECKING``
  imports of a package's ``__init__`` (``flowkit``, ``flowkit.core``, ``flowkit.testing``),
  which only type the names that its ``__getattr__`` imports on first use; everywhere else
  they count (a circle of type hints is a circle of modules that need each other).
"""
import ast
import os
from typing import Dict, List, Set, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _modules(root: str = ROOT) -> Dict[str, str]:
    """``{dotted module name: file path}`` of every ``.py`` file under ``root``/flowkit/."""
    mods = {}
    for d, dirs, files in os.walk(os.path.join(root, "flowkit")):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                name = os.path.relpath(os.path.join(d, f), root)[:-3].replace(os.sep, ".")
                mods[name[: -len(".__init__")] if name.endswith(".__init__") else name] = os.path.join(d, f)
    return mods


def _type_checking_lines(tree: ast.AST) -> Set[int]:
    """Lines inside ``if TYPE_CHECKING:`` blocks."""
    return {line for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for stmt in node.body for line in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)}


def _imports(mods: Dict[str, str]) -> Dict[str, Set[Tuple[str, int, bool]]]:
    """``{module: {(imported flowkit module, line, under TYPE_CHECKING)}}``, every import
    statement of each file."""
    def resolve(name: str) -> str:
        while name not in mods:
            name = name.rpartition(".")[0]
        return name

    out: Dict[str, Set[Tuple[str, int, bool]]] = {m: set() for m in mods}
    for m, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        typing_only = _type_checking_lines(tree)
        package = m if path.endswith("__init__.py") else m.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                # `from pkg import mod` imports the module pkg.mod; `from mod import name` the module mod
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            out[m].update((resolve(n), node.lineno, node.lineno in typing_only) for n in names
                          if (n == "flowkit" or n.startswith("flowkit.")) and resolve(n) != m)
    return out


def _allowed(src: str, dst: str) -> bool:
    def within(m: str, pkg: str) -> bool:
        return m == pkg or m.startswith(pkg + ".")
    if within(src, "flowkit.core"):
        return within(dst, "flowkit.core") or dst == "flowkit.config"
    if within(src, "flowkit.hooks"):
        return within(dst, "flowkit.core") or within(dst, "flowkit.hooks") or dst == "flowkit.config"
    return True


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_parser_sees_every_kind_of_import(tmp_path):
    """The checks below stand on this: module-level, function-level, TYPE_CHECKING, relative
    and ``from package import module`` imports are all found, in a package written here."""
    files = {
        "__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from flowkit.core.a import A\n",
        "core/__init__.py": "",
        "core/a.py": "import os\nfrom flowkit.core import b\n\ndef f():\n    from flowkit import engine\n",
        "core/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\nfrom ..config import X\n",
        "config.py": "import flowkit.core.b.nothing\n",
        "engine.py": "import json\n",
    }
    for name, text in files.items():
        (tmp_path / "flowkit" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "flowkit" / name).write_text(text)
    mods = _modules(str(tmp_path))
    assert set(mods) == {"flowkit", "flowkit.core", "flowkit.core.a", "flowkit.core.b", "flowkit.config", "flowkit.engine"}
    assert _imports(mods) == {
        "flowkit": {("flowkit.core.a", 3, True)}, "flowkit.core": set(), "flowkit.engine": set(),
        "flowkit.core.a": {("flowkit.core.b", 2, False), ("flowkit.engine", 5, False)},  # the module, not `flowkit`
        "flowkit.core.b": {("flowkit.core.a", 3, True), ("flowkit.config", 4, False)},
        "flowkit.config": {("flowkit.core.b", 1, False)}}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_core_and_hooks_import_only_what_is_below_them():
    imports = _imports(_modules())
    bad = sorted(f"{src} -> {dst} (line {line})" for src, ts in imports.items() for dst, line, _ in ts
                 if not _allowed(src, dst))
    assert not bad, "imports that point up a layer:\n" + "\n".join(bad)


def test_no_import_cycle_in_flowkit():
    mods = _modules()
    graph = {m: {t for t, _, typing_only in ts if not (typing_only and mods[m].endswith("__init__.py"))}
             for m, ts in _imports(mods).items()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" ".join(c) for c in cycles)


def test_bench_scripts_and_examples_import_names_that_exist():
    """A bench script is not run by the tests; its imports of flowkit names are checked here so
    that a refactor moving a name breaks a test, not the next benchmark run (function-level
    imports included)."""
    import importlib.util
    repo = ROOT
    missing = []
    for folder in ("bench", "examples"):
        for dirpath, _, files in os.walk(os.path.join(repo, folder)):
            for f in sorted(files):
                if not f.endswith(".py"):
                    continue
                path = os.path.join(dirpath, f)
                with open(path, encoding="utf-8") as fh:
                    tree = ast.parse(fh.read(), path)
                for node in ast.walk(tree):
                    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                            node.module.split(".")[0].startswith("flowkit") and \
                            importlib.util.find_spec(node.module.split(".")[0]) is not None:  # an example's own package may not be installed
                        mod = importlib.import_module(node.module)
                        missing += [f"{os.path.relpath(path, repo)}:{node.lineno}: {node.module}.{a.name}"
                                    for a in node.names if a.name != "*" and not hasattr(mod, a.name)
                                    and not (hasattr(mod, "__path__") and importlib.util.find_spec(f"{node.module}.{a.name}") is not None)]
    assert not missing, "names imported by bench/ and examples/ that do not exist:\n" + "\n".join(missing)


def _private_flowkit_imports(path: str) -> List[str]:
    """``line: name`` of each import in the file at ``path`` that reaches a private part of
    flowkit: a dotted path with an ``_underscore`` part (``flowkit.core._runner``,
    ``flowkit._trust``), or an ``_underscore`` name taken from a flowkit module (``from
    flowkit.core import _envs``); function-level and ``TYPE_CHECKING`` imports included."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    def private(name: str) -> bool:
        return name.split(".")[0] == "flowkit" and any(p.startswith("_") for p in name.split(".")[1:])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if private(node.module) else [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found += [f"{node.lineno}: {n}" for n in names if private(n)]
    return found


PRIVATE_IMPORTS_LEFT: set = set()  # (path, module) pairs allowed to stay: none


def test_the_private_import_check_sees_every_form(tmp_path):
    path = tmp_path / "plugin.py"
    path.write_text("import flowkit\nimport flowkit.core._runner\nfrom flowkit._trust import x\n"
                    "from flowkit.core import _envs, ObsEncoder\nfrom flowkit.core.encoders import ObsEncoder\n"
                    "def f():\n    from flowkit.core.returns import _private\n    from flowkit_dqn._acting import y\n")
    assert _private_flowkit_imports(str(path)) == [
        "2: flowkit.core._runner", "3: flowkit._trust", "4: flowkit.core._envs", "7: flowkit.core.returns._private"]


def test_plugins_and_examples_import_no_private_flowkit_module():
    """Plugins build on flowkit's public surface (the names of ``flowkit``, ``flowkit.core``'s
    ``__all__`` and its public modules: encoders, distributions, models, recurrent, returns,
    target_network); a module or name with a leading underscore may change without notice."""
    bad = []
    for folder in ("plugins", "examples"):
        for dirpath, dirs, files in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = [d for d in dirs if d not in ("build", "__pycache__") and not d.endswith(".egg-info")]
            for f in sorted(files):
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dirpath, f), ROOT)
                    bad += [f"{rel}:{hit}" for hit in _private_flowkit_imports(os.path.join(dirpath, f))
                            if (rel, hit.partition(": ")[2]) not in PRIVATE_IMPORTS_LEFT]
    assert not bad, "plugin imports of private flowkit modules:\n" + "\n".join(bad)
