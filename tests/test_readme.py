"""Issue 11, part 5: every code block of the README runs, with small budgets.

Python blocks run in a fresh process each (with ``import json, os, flowkit`` in front, for the
fragments), shell blocks line by line (``flowkit ...`` commands; set-up and benchmark lines are
skipped). Budgets are cut: ``stop.env_steps`` to 2000, every ``flowkit train`` and every
``flowkit tune`` trial to one iteration on the local backend, one worker, in a temporary run
folder (``flowkit plot`` draws the previous sweep); ``resume=`` of a
placeholder resumes the previous command's run (skipped without one). Blocks without a language are output, not
code, and are skipped.
"""
import os
import re
import shlex
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = ("bash scripts/", "python bench/", ". .venv", "pip ")
SMALL = ["stop.iterations=1", "runtime.backend=local", "runtime.num_workers=1", "evaluation.interval=0",
         "stop.evaluation_return_mean=null",  # (a config that stops on greedy evaluations: DQN's CartPole)
         "evaluation.final=false", "checkpoint.every_iters=0", "run.reporters=[checkpoint]"]


def _blocks():
    """``(line, language, code)`` of every fenced block (indented ones too)."""
    out, lines = [], open(os.path.join(REPO, "README.md")).read().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if m:
            indent, lang, start = len(m[1]), m[2], i + 1
            i += 1
            while not lines[i].strip().startswith("```"):
                i += 1
            out.append((start, lang, "\n".join(x[indent:] for x in lines[start:i])))
        i += 1
    return out


BLOCKS = _blocks()
PYTHON = [b for b in BLOCKS if b[1] == "python"]
SHELL = [b for b in BLOCKS if b[1] == "bash"]


def _small(code):
    code = re.sub(r"stop\.env_steps=\d+", "stop.env_steps=2000", code)
    return code.replace("flowkit.train([", 'flowkit.train(["runtime.backend=local", "runtime.num_workers=1", ')


def test_the_readme_has_code_blocks():
    assert len(PYTHON) >= 3 and len(SHELL) >= 4


@pytest.mark.parametrize("line,lang,code", [pytest.param(*b, id=f"line{b[0]}", marks=[pytest.mark.slow] * (
    "flowkit.train(" in b[2])) for b in PYTHON])
def test_readme_python_block_runs(line, lang, code, tmp_path):
    p = subprocess.run([sys.executable, "-c", "import json, os, flowkit\n" + _small(code)], capture_output=True,
                       text=True, timeout=600, cwd=str(tmp_path))
    assert p.returncode == 0, f"README line {line}:\n{p.stderr[-3000:]}"


def _commands(code):
    for cmd in code.replace("\\\n", " ").splitlines():
        cmd = cmd.split(" #")[0].strip()
        if cmd and not cmd.startswith(SKIP) and cmd.startswith("flowkit ") and "[" not in cmd and " FILE" not in cmd:
            yield shlex.split(cmd)


@pytest.mark.slow
@pytest.mark.parametrize("line,lang,code", SHELL, ids=[f"line{b[0]}" for b in SHELL])
def test_readme_shell_block_runs(line, lang, code, tmp_path):
    last = None
    for n, args in enumerate(_commands(code)):
        if args[1] == "train" and "--help" not in args:
            if last is None and any(re.match(r"resume=.*(\.\.\.|RUN_DIR)", a) for a in args):
                continue  # a placeholder, with no run before it in the block to resume
            args = [re.sub(r"^resume=.*(\.\.\.|RUN_DIR).*$", f"resume={last}", a) for a in args]
            if not any(a.startswith("resume=") for a in args):
                last = str(tmp_path / f"run{n}")
                args += [f"run.dir={last}"]
            args += SMALL
        elif args[1] == "tune":  # a sweep of one-iteration local trials, in a temporary folder
            last = str(tmp_path / f"sweep{n}")
            args = [a for a in args if not a.startswith("run.dir=")] + [f"run.dir={last}", *SMALL[:-1],
                                                                         "run.reporters=[csv]"]
        elif args[1] in ("evaluate", "export") and any("..." in a for a in args):  # the quick start's run
            if last is None:
                last = str(tmp_path / "run")
                subprocess.run([sys.executable, "-m", "flowkit.cli", "train", "-c", "configs/ppo/CartPole-v1.yaml",
                                f"run.dir={last}", *SMALL], check=True, capture_output=True,
                               timeout=600, cwd=REPO)
            args = [last if "..." in a else a for a in args]
        elif args[1] == "plot":  # the previous command's runs; the figure in the temporary folder
            args = [last if a.startswith("runs/") else f"out={tmp_path / a[4:]}" if a.startswith("out=") else a
                    for a in args]
        p = subprocess.run([sys.executable, "-m", "flowkit.cli", *args[1:]], capture_output=True, text=True,
                           timeout=600, cwd=REPO)
        assert p.returncode == 0, f"README line {line}: {shlex.join(args)}\n{p.stderr[-3000:]}"
