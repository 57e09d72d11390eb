"""Cost of the workers' finite check (issue 13, part 4) against a fragment's sampling time.

One in-process RolloutWorker with the main job's sampling layout (configs/ppo/CartPole-v1.yaml:
4 sub-envs x 32 steps = 128 transitions per fragment): times ``runner.sample()`` (the
fragment, without the check) and ``RolloutWorker._check_finite`` on the fragment it returned
(observations, next observations and rewards), median over ``--repeats`` fragments, and
prints a table. The check must stay under 2% of the fragment's sampling time. A second row
does the same with a Dict observation (the env of the non-finite tests), to show the check
does not depend on the space.

Run: python bench/finite_check.py [--repeats 200]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

warnings.filterwarnings("ignore")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measure(overrides: list, repeats: int) -> dict:
    from flowkit.core.workers import RolloutWorker
    from flowkit.engine import load_config, setup
    pm, cfg = load_config(["runtime.backend=local", *overrides], os.path.join(REPO, "configs", "ppo", "CartPole-v1.yaml"))
    ctx = setup(cfg, pm)
    w = RolloutWorker(cfg, 0, 1, ctx.policy_specs, pm=pm)
    for _ in range(5):  # warm up
        w._check_finite(w.runner.sample())
    sample, check = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        b = w.runner.sample()
        t1 = time.perf_counter()
        w._check_finite(b)
        t2 = time.perf_counter()
        sample.append(t1 - t0)
        check.append(t2 - t1)
    s, c = statistics.median(sample), statistics.median(check)
    return {"rows": b.env_steps, "sample_ms": 1e3 * s, "check_us": 1e6 * c, "pct": 100 * c / s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(REPO, "tests"))  # envs:NonFiniteEnv
    cases = [("CartPole-v1 (Box(4,))", []),
             ("Dict obs (speed, position)", ["env.id=null", "env.factory=envs:NonFiniteEnv", "env.kwargs={mode: none}"])]
    print(f"{'env':<28} {'transitions':>11} {'sample ms':>10} {'check us':>9} {'check / sample':>15}")
    for name, extra in cases:
        r = measure(extra, args.repeats)
        print(f"{name:<28} {r['rows']:>11} {r['sample_ms']:>10.3f} {r['check_us']:>9.1f} {r['pct']:>14.2f}%")


if __name__ == "__main__":
    main()
