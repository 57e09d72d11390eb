"""Build-time code of the docs site (mkdocs.yml names this file twice):

- an mkdocs hook that fills in what the code knows, so the pages cannot drift from it:
  ``<!-- config-reference -->``, the config reference, from the config dataclasses (the core
  schema in :mod:`flowkit.config` and every section the installed plugins contribute:
  algorithms' sections and ``flowkit_add_config_sections``) through
  :func:`flowkit.config.describe_keys`, the rows ``flowkit train --help`` prints;
  ``<!-- hooks-table -->``, every hookspec of :mod:`flowkit.hooks.specs` with where it runs;
  ``<!-- run-loop -->``, the run loop of :mod:`flowkit.engine`'s docstring;
  ``<!-- plan: key=value ... -->``, the plan of a config as ``flowkit plan`` prints it;
- a griffe extension (``RstRoles``) that turns the Sphinx roles of flowkit's docstrings
  (``:class:`~flowkit.core.ops.X```) into Markdown code spans and a closing ``::`` into
  ``:`` (the literal block after it is an indented code block in Markdown too).

The site documents the checkout it is built from: the repository root and its plugin folders
go first on ``sys.path``.
"""
from __future__ import annotations

import dataclasses
import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import griffe

ROOT = Path(__file__).resolve().parent.parent
MARKER = "<!-- config-reference -->"


def _default(v: Any) -> str:
    if isinstance(v, str):
        return f"`{v}`" if v else '`""`'
    return f"`{json.dumps(v)}`"


def _cell(text: str) -> str:
    """``text`` for a table cell: pipes escaped, ``<`` and ``>`` outside code spans too (not
    HTML tags), one line."""
    parts = text.replace("|", "\\|").replace("\n", " ").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;") for i, p in enumerate(parts))


def config_reference() -> str:
    """The config reference as Markdown: one section per top-level config section (core
    first, then plugin sections by name), each a table of key, type, allowed values, default
    and description."""
    from flowkit.config import describe_keys, make_schema_class
    from flowkit.hooks import get_plugin_manager

    pm = get_plugin_manager(include_registered=False)
    sections = pm.config_sections()
    owners = {name: pm.owner.get(name) for name in pm.algorithms(load=False)}
    for impl in pm.hook.flowkit_add_config_sections.get_hookimpls():
        owners.update(dict.fromkeys(impl.function() or {}, impl.plugin_name))
    helps = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(make_schema_class(sections))}
    groups: dict = {}
    for row in describe_keys(sections):
        groups.setdefault(row[0].split(".")[0] if "." in row[0] else "", []).append(row)
    core = [g for g in groups if g not in sections]
    out = []
    for sec in core + sorted(g for g in groups if g in sections):
        if sec:
            out.append(f"## `{sec}`\n")
            doc = helps.get(sec, "").removeprefix(f"{sec}: ")
            doc = doc[:1].upper() + doc[1:]
            if sec in sections:
                plug = owners.get(sec) or "?"
                dist = pm.dists.get(plug, "flowkit (built-in)" if plug.startswith("flowkit.") else plug)
                doc = f"{doc.rstrip('.')}. Contributed by `{dist}`."
            out.append(doc + "\n")
        else:
            out.append("## Top level\n")
        out.append("| key | type | allowed | default | description |\n|---|---|---|---|---|")
        for key, tp, allowed, default, hlp in groups[sec]:
            out.append(f"| `{key}` | {_cell(tp)} | {_cell(f'`{allowed}`') if allowed else ''} "
                       f"| {_cell(_default(default))} | {_cell(hlp)} |")
        out.append("")
    return "\n".join(out)


def hooks_table() -> str:
    """A Markdown table of every hook: name and arguments, kind, where it runs (the
    docstring's "Runs on:" line) and its first sentence."""
    import inspect

    from flowkit.hooks import specs
    out = ["| hook | kind | runs on | what |", "|---|---|---|---|"]
    for name, fn in vars(specs).items():
        opts = getattr(fn, "flowkit_spec", None)
        if not name.startswith("flowkit_") or opts is None:
            continue
        doc = inspect.getdoc(fn) or ""
        where = re.search(r"^Runs on: (.*?)(?:\.\s|\.?$)", doc, flags=re.M)
        first = " ".join(doc.split("\n\n")[0].split())
        first = first.split(". ")[0].rstrip(".") + "."
        args = ", ".join(inspect.signature(fn).parameters)
        out.append(f"| [`{name}({args})`](api/hooks.md#flowkit.hooks.specs.{name}) "
                   f"| {'firstresult' if opts.get('firstresult') else 'all results'} "
                   f"| {_cell(where[1]) if where else ''} | {_cell(rst_to_markdown(first))} |")
    return "\n".join(out)


def run_loop() -> str:
    """The run-loop pseudocode of :mod:`flowkit.engine`'s docstring (read without importing
    the engine)."""
    import ast
    doc = ast.get_docstring(ast.parse((ROOT / "flowkit" / "engine.py").read_text(encoding="utf-8"))) or ""
    return "```text\n" + textwrap.dedent(doc.split("::\n", 1)[1]).strip("\n") + "\n```"


def plan(args: str) -> str:
    """The plan of a config (``flowkit plan ARGS``: ``-c FILE`` and overrides, paths from
    the repository root), as text and Mermaid."""
    from flowkit.engine import describe_plan
    words = args.split()
    files = [str(ROOT / w) for i, w in enumerate(words) if i and words[i - 1] == "-c"]
    overrides = [w for i, w in enumerate(words) if w != "-c" and not (i and words[i - 1] == "-c")]
    d = describe_plan(overrides, files)
    return f"```text\n{d['text']}\n```\n\n```mermaid\n{d['mermaid']}\n```"


def on_config(config: Any, **kwargs: Any) -> Any:
    """mkdocs hook: the checkout's flowkit and plugins first on ``sys.path`` (mkdocs restores
    ``sys.path`` after importing this file, hence here)."""
    for p in reversed([ROOT, *sorted((ROOT / "plugins").glob("*/"))]):
        if str(p) not in sys.path:
            sys.path.insert(0, str(p))
    return config


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """mkdocs hook: fill in the generated config reference."""
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, config_reference())
    markdown = markdown.replace("<!-- hooks-table -->", hooks_table()) if "<!-- hooks-table -->" in markdown else markdown
    markdown = markdown.replace("<!-- run-loop -->", run_loop())
    return re.sub(r"<!-- plan: (.*?) -->", lambda m: plan(m[1]), markdown)


# ---- griffe extension: Sphinx roles -> Markdown ------------------------------------------------
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")


_SECTIONS = re.compile(r"(Args|Arguments|Parameters|Keyword Args|Other Parameters|Returns?|Yields|Raises|Warns|"
                       r"Attributes|Examples?|Notes?|Warnings?|See Also|Methods|Functions|Classes|Modules):")


def rst_to_markdown(text: str) -> str:
    """``:class:`~a.b.C``` -> ```C```, ``:func:`f``` -> ```f```; a line ending in ``::``
    ends in ``:``; an indented block right under a line ending in ``:`` (formulas, a plan)
    gets the blank line before it that makes it a code block in Markdown (Google section
    headers excepted), and so does a section header (griffe needs it)."""
    text = _ROLE.sub(lambda m: f"`{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}`", text)
    lines = re.sub(r"(?<=\S)::$", ":", text, flags=re.M).split("\n")
    out = lines[:1]
    for prev, line in zip(lines, lines[1:]):
        if ((prev.endswith(":") and not prev.startswith(" ") and not _SECTIONS.fullmatch(prev)
                and line.startswith("    ")) or (_SECTIONS.fullmatch(line) and prev.strip())):
            out.append("")
        out.append(line)
    return "\n".join(out)


class RstRoles(griffe.Extension):
    """Rewrite each docstring with :func:`rst_to_markdown` as griffe loads it."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rst_to_markdown(obj.docstring.value)
