"""The docs site: the tutorial's code runs as written, and ``mkdocs build --strict`` passes
with a config reference generated from the schema (every key of every installed section)."""
import html
import os
import re
import subprocess
import sys
import time

import pytest

import flowkit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")


def fenced_blocks(path):
    """``[(language, code)]`` of the fenced code blocks of a Markdown file, in order."""
    with open(path, encoding="utf-8") as f:
        return re.findall(r"^```(\w*)\n(.*?)^```", f.read(), flags=re.S | re.M)


def test_the_tutorial_runs_as_written(tmp_path, monkeypatch):
    """Its python blocks, in order in one namespace: an A2C plugin registered through the
    plugin manager, its plan, 5 iterations on the local backend and a checkpoint load."""
    monkeypatch.chdir(tmp_path)  # the run folder goes under runs/ here
    blocks = fenced_blocks(os.path.join(DOCS, "tutorial.md"))
    ns = {"__name__": "tutorial"}
    try:
        for lang, code in blocks:
            if lang == "python":
                exec(compile(code, "docs/tutorial.md", "exec"), ns)
    finally:
        if "plugin" in ns:
            flowkit.unregister(ns["plugin"])
    assert ns["result"].stop_reason == "stop.iterations=5 reached"
    assert "learner/default/pg_loss" in ns["result"].metrics
    # the plan the page shows is the plan the code prints
    shown = [code for lang, code in blocks if lang == ""]
    assert ns["plan"]["text"].strip() in [s.strip() for s in shown]


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    """The site builds with no warning (broken links, docstring problems) in well under the
    suite's budget; the config reference lists every key of every installed section."""
    from flowkit.config import describe_keys
    from flowkit.hooks import get_plugin_manager
    site = tmp_path / "site"
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    took = time.perf_counter() - t0
    assert p.returncode == 0, p.stdout + p.stderr
    assert took < 120, f"mkdocs build took {took:.1f} s"  # ~3 s of CPU; wall time on a busy machine varies
    ref = (site / "config" / "index.html").read_text(encoding="utf-8")
    missing = [k for k, *_ in describe_keys(get_plugin_manager(include_registered=False).config_sections())
               if f"<code>{html.escape(k, quote=False)}</code>" not in ref]
    assert not missing, f"keys missing from the config reference: {missing}"
    api = (site / "api" / "ops" / "index.html").read_text(encoding="utf-8")
    assert "TrainOneStep" in api and ":class:" not in api  # docstrings rendered, Sphinx roles converted


def test_the_concepts_examples_run():
    ns = {"__name__": "concepts"}
    for lang, code in fenced_blocks(os.path.join(DOCS, "concepts.md")):
        if lang == "python":
            exec(compile(code, "docs/concepts.md", "exec"), ns)


@pytest.mark.slow
def test_the_multiagent_recipes_pass_dry_run(capsys, monkeypatch):
    """Every ``flowkit train`` line of the bash blocks of the multi-agent page is a valid
    config with a plan (``--dry-run``: nothing starts)."""
    import shlex

    from flowkit.cli import main
    cmds = [shlex.split(c, comments=True) for lang, code in fenced_blocks(os.path.join(DOCS, "multiagent.md"))
            if lang == "bash" for c in code.replace("\\\n", " ").splitlines() if c.startswith("flowkit train")]
    assert len(cmds) >= 5
    monkeypatch.chdir(ROOT)  # the pages give config paths from the repository root
    for cmd in cmds:
        assert main(cmd[1:] + ["--dry-run"]) == 0, (cmd, capsys.readouterr().err)


def test_sb3_page_names_only_real_keys():
    """docs/sb3.md (issue 27 item 11): every flowkit key it names is in the config schema."""
    import re

    from flowkit.config import make_schema_class, schema_keys
    from flowkit.hooks import get_plugin_manager
    keys = set(schema_keys(make_schema_class(get_plugin_manager().config_sections())))
    text = open(os.path.join(ROOT, "docs", "sb3.md")).read()
    named = set(re.findall(r"`((?:ppo|sac|td3|dqn|model|runtime|stop|evaluation)\.[a-z_]+)", text))
    named |= {f"{a}.{k}" for a in ("sac", "td3") for k in re.findall(
        r"`(buffer_size|learning_starts|train_batch_size|tau|gamma|training_intensity)`", text)}
    assert len(named) > 40
    assert sorted(named - keys) == []
    assert "sb3.md" in open(os.path.join(ROOT, "mkdocs.yml")).read()
