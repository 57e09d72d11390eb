"""``python -m flowkit ARGS``: the ``flowkit`` command (:mod:`flowkit.cli`), for an environment
whose scripts folder is not on PATH."""
import sys

from flowkit.cli import _entry

sys.exit(_entry())
