"""DatasetReader throughput (issue 26's reader bench, small form): batches/s of
``input.dataset`` reading against the same rows shuffled from numpy arrays in memory, and the
reader's peak memory. Not run in CI.

Usage: python bench/offline_reader.py DATASET [DATASET ...] [--batch 256] [--buffer 100000]
"""
from __future__ import annotations

import argparse
import collections
import resource
import sys
import time
from types import SimpleNamespace

import numpy as np
from flowkit_offline import BCConfig
from flowkit_offline.marwil import MARWILPolicy
from flowkit_offline.reader import DatasetReader
from omegaconf import OmegaConf

from flowkit.core import batch as sb
from flowkit.datasets import open_dataset


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("datasets", nargs="+")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--buffer", type=int, default=100_000)
    a = p.parse_args(argv)
    for path in a.datasets:
        ds = open_dataset(path)
        pol = MARWILPolicy(ds.observation_space, ds.action_space, BCConfig())
        ctx = SimpleNamespace(policies={"default": pol}, counters=collections.Counter(), mark=lambda _: None,
                              config=OmegaConf.create({"seed": 0, "env": {"id": "dataset", "factory": None}}))
        reader = DatasetReader(ctx, path, "default", a.batch, a.buffer)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t = time.perf_counter()
        n0 = sum(1 for _ in reader.epoch_batches(0))
        dt0 = time.perf_counter() - t
        t = time.perf_counter()
        n = sum(1 for _ in reader.epoch_batches(1))
        dt_reader = time.perf_counter() - t
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # the same rows from numpy arrays in memory, shuffled into batches of the same size
        eps = list(ds.iterate_episodes())
        cols = {sb.OBS: np.concatenate([e.observations[:-1] for e in eps]).astype(np.float32),
                sb.ACTIONS: np.concatenate([e.actions for e in eps]),
                sb.REWARDS: np.concatenate([e.rewards for e in eps]).astype(np.float32)}
        t = time.perf_counter()
        perm = np.random.default_rng(0).permutation(len(cols[sb.OBS]))
        m = 0
        for i in range(0, len(perm), a.batch):
            idx = perm[i:i + a.batch]
            sb.SampleBatch({k: v[idx] for k, v in cols.items()})
            m += 1
        dt_np = time.perf_counter() - t
        print(f"{path}: {reader.num_rows} rows, {reader.num_episodes} episodes, buffer {a.buffer}; reader: first "
              f"epoch {n0 / dt0:.0f} batches/s, second {n / dt_reader:.0f} batches/s "
              f"({reader.num_rows / dt_reader:.0f} rows/s), numpy in memory {m / dt_np:.0f} batches/s: "
              f"{(n / dt_reader) / (m / dt_np):.3f}x; peak RSS +{(rss1 - rss0) / 1024:.0f} MiB while reading", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
