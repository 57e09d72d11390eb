"""Output files of the commands (evaluate, export, plot) and the run's ``result.json``: their
paths checked before any work starts, and written through a temporary file renamed into place.

- :func:`check_output`: a path that is an existing folder or anything else that is not a
  regular file (a device such as ``/dev/null``, a pipe, a socket: the rename would replace it),
  lies under a file, sits in a folder that cannot be written, or would replace a run's own file (``metrics.csv``, ``config.yaml``,
  ``result.json``, ``state.pt``, ... in a run or checkpoint folder) is a one-line
  :class:`~flowkit.ConfigError` naming the option (the CLI exits 2).
- :func:`write_atomic`: the file is written to ``.NAME.tmp-PID`` beside it, then renamed: a
  full disk or a killed process leaves the previous file intact and no partial or 0-byte file;
  a failure is one line, :class:`OutputError` (the CLI exits 1).
"""
from __future__ import annotations

import contextlib
import os
from typing import Callable, Optional

# the files a run folder or a checkpoint folder is made of (never an output of another command)
RUN_FILES = frozenset({"metrics.csv", "config.yaml", "result.json", "state.pt", "learning_curve.png", ".lock",
                       "tune_results.csv", "evaluation.json"})


class OutputError(Exception):
    """An output file could not be written (a full disk, a folder gone read-only): one line,
    naming the file and the reason."""


def is_run_folder(folder: str) -> bool:
    """A run folder (``metrics.csv``, ``result.json``, ``checkpoints/``) or a checkpoint folder
    (``state.pt``)."""
    return any(os.path.lexists(os.path.join(folder, n)) for n in ("metrics.csv", "result.json", "checkpoints",
                                                                     "state.pt"))


def check_output(path: str, what: str, own: bool = False) -> None:
    """Check, before any work, that ``path`` can be written as a new or replaced file.

    Args:
        path: the file to write.
        what: how the user named it (``--out``), for the message.
        own: the file is the command's own output in a run folder (``evaluation.json``):
            the run-file check is skipped.

    Raises:
        ConfigError: ``path`` is a folder (or ends with a path separator) or another file that is not a regular one (a device,
            a pipe, a socket), a folder on its way is a file, the folder that would hold it
            cannot be written, or it would replace a run's own file.
    """
    from flowkit.config import ConfigError
    ap = os.path.abspath(path)
    if os.path.isdir(ap) or path.endswith(("/", os.sep)):  # `new/` names a folder, existing or not
        raise ConfigError(f"{what} {path!r} is a folder: give a file name")
    if os.path.lexists(ap) and not os.path.isfile(ap):  # written to a temporary file, renamed over it as root
        raise ConfigError(f"{what} {path!r} is not a regular file (a device, a pipe, a socket or a broken link): "
                          "give a file name")
    folder, name = os.path.split(ap)
    if not own and name in RUN_FILES and is_run_folder(folder):
        raise ConfigError(f"{what} {path!r} would replace the run's own {name}: write it elsewhere")
    _check_creatable(folder, path, what)


def _check_creatable(d: str, path: str, what: str) -> None:
    """The nearest existing folder on the way to ``d`` (``d`` itself if it exists) is a folder
    this process can write in, else a ConfigError naming ``what`` and ``path``."""
    from flowkit.config import ConfigError
    while not os.path.lexists(d) and d != os.path.dirname(d):
        d = os.path.dirname(d)
    if not os.path.isdir(d):
        raise ConfigError(f"{what} {path!r}: {d!r} is a file, not a folder")
    if not os.access(d, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {path!r}: the folder {d!r} is not writable")


def check_output_folder(path: str, what: str) -> None:
    """Check, before any work, that ``path`` can be a folder of outputs (``flowkit record``'s
    dataset): an existing folder, or one that can be created.

    Raises:
        ConfigError: ``path`` is a file, a folder on its way is a file, or the folder that
            would hold it cannot be written.
    """
    from flowkit.config import ConfigError
    ap = os.path.abspath(path)
    if os.path.lexists(ap) and not os.path.isdir(ap):
        raise ConfigError(f"{what} {path!r} is a file, not a folder")
    _check_creatable(ap, path, what)


def write_atomic(path: str, write: Callable[[str], None], mkdirs: bool = False) -> None:
    """``write(tmp)`` to a temporary file beside ``path``, then rename it to ``path``.

    Raises:
        OutputError: writing or renaming failed (the temporary file removed; ``path`` as it was).
    """
    folder, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{name}.tmp-{os.getpid()}")
    try:
        if mkdirs:
            os.makedirs(folder, exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if isinstance(e, OSError):
            raise OutputError(f"cannot write {path}: {e.strerror or e}") from None
        raise


def write_text(path: str, text: str, encoding: Optional[str] = "utf-8", mkdirs: bool = False) -> None:
    """:func:`write_atomic` of ``text``, flushed to the disk before the rename."""
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding=encoding) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    write_atomic(path, write, mkdirs)
