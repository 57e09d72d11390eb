"""The tuned configs against their stated targets: every ``configs/<algo>/<env-id>.yaml`` with a
``# target: METRIC >= THRESHOLD within BUDGET env steps on seeds S ...`` line is trained on each of
its seeds in a fresh process (bench/acceptance.py's ``run_check``: stop at the threshold or the
budget) and one table says, per config and seed, the env steps at which the metric reached the
threshold, or the best value within the budget. Learning runs: minutes each; run them on a quiet
machine and copy the figures into the configs' comments. A config that learns from a dataset
(``input.dataset``, e.g. configs/cql_sac/Pendulum-v1.yaml) gets it made first when it is missing
and bench/offline_acceptance.py knows how (its ``DATASETS``).

    python bench/tuned_configs.py                          # every config with a target line
    python bench/tuned_configs.py --only dqn/CartPole-v1 --seeds 1
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import acceptance  # noqa: E402  (bench/ is not a package)

TARGET = re.compile(r"^# target: (\S+) >= (-?[\d.]+) within (\d+) env steps on seeds ([\d ]+)", re.M)


def targets() -> dict:
    """``{"algo/env-id": (config path, metric, threshold, budget, seeds, [])}`` of the configs
    with a target line."""
    out = {}
    for path in sorted(glob.glob(os.path.join(REPO, "configs", "*", "*.yaml"))):
        with open(path) as f:
            m = TARGET.search(f.read())
        if m:
            name = os.path.relpath(path, os.path.join(REPO, "configs"))[:-5]
            out[name] = (path, m[1], float(m[2]), int(m[3]), [int(s) for s in m[4].split()], [])
    return out


def ensure_dataset(config: str) -> None:
    """Make the ``input.dataset`` of ``config`` if it names a missing dataset that
    bench/offline_acceptance.py can make."""
    from omegaconf import OmegaConf
    path = OmegaConf.select(OmegaConf.load(config), "input.dataset")
    if path and not os.path.exists(path):
        import offline_acceptance
        make = offline_acceptance.DATASETS.get(os.path.basename(os.path.normpath(path)))
        if make is None:
            raise SystemExit(f"{config}: input.dataset={path} is missing and bench/offline_acceptance.py cannot make it")
        make(path)


def main() -> None:
    found = targets()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=sorted(found), default=None)
    ap.add_argument("--seeds", type=int, nargs="*", default=None, help="instead of each config's seeds")
    ap.add_argument("--out", default="runs/bench-tuned")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    acceptance.CHECKS.update(found)
    rows = []
    print("| config | seed | target | budget | reached at env steps | best | wall s | pass |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.only or list(found):
        ensure_dataset(found[name][0])
        for seed in args.seeds if args.seeds is not None else found[name][4]:
            r = acceptance.run_check(name, seed, os.path.join(args.out, name.replace("/", "-")))
            rows.append(acceptance.print_row(name, seed, r, train_s=False))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    sys.exit(0 if all(r["passed"] for r in rows) else 1)


if __name__ == "__main__":
    main()
