"""DatasetReader throughput (issue 26's reader bench): batches/s of ``input.dataset`` reading
against the same rows shuffled into batches from numpy arrays in memory, and the reader's peak
memory. Not run in CI.

For each dataset: one reader epoch (``epoch_batches(1)``: the dataset read, shuffled and cut
into batches of ``--batch`` rows as a run's reader does, through a ``--buffer``-row shuffle
buffer: a larger dataset is streamed), then the same rows as numpy arrays in memory (built
outside the timing), permuted and cut into batches of the same size, two ways:

- ``np3``: the columns ``obs``, ``actions``, ``rewards`` (the reference of the first version of
  this bench);
- ``same``: exactly the columns of the reader's batches (what the algorithm trains on:
  ``--algo`` bc: ``obs``, ``actions``; cql_sac: ``obs``, ``actions``, ``rewards``,
  ``terminateds``, ``next_obs``), each wrapped in a SampleBatch.

Batches/s by the wall clock, and the ratio reader / numpy by the wall clock and by process CPU
time (steadier on a machine shared with other work). ``--columns-build`` also times writing the
dataset's columnar copy (``flowkit.datasets.build_columns``, once per dataset) into a
temporary folder. ``--check`` times the load-time check of a run (issue 48,
``flowkit.datasets.check_contents``) on a copy of the dataset: the first load (the columnar copy
written with each episode's layout and sha256 checked, then the values), a later one (the
values on the kept copy), and the sha256 verification alone, every dataset read from the file
(the check hashes the arrays Minari has read where they are what the file stores). ``--readers K`` (default 2; 0: not) also times ``input.num_readers=K``
readers on a local Ray cluster (:class:`~flowkit_offline.reader.ShardedReader`: about an
epoch's batches, round-robin, after as many to warm up) and the driver's CPU time per batch
(what the learner's process spends on reading). ``--json PATH`` writes the figures.

Before/after comparisons run this script once per code version in fresh processes, alternating
(e.g. ``PYTHONPATH=/tmp/old:/tmp/old/plugins/offline python bench/offline_reader.py D`` for an
exported older tree), and take the median of each figure over the runs.

Usage: python bench/offline_reader.py DATASET [DATASET ...] [--algo bc|cql_sac] [--batch 256]
       [--buffer 100000] [--columns-build] [--check] [--readers 2] [--ray-cpus 2] [--json out.json]
"""
from __future__ import annotations

import argparse
import collections
import json
import resource
import sys
import tempfile
import time
from types import SimpleNamespace

import numpy as np
from omegaconf import OmegaConf

from flowkit.core import batch as sb
from flowkit.datasets import open_dataset


def make_policy(algo: str, ds):
    if algo == "cql_sac":
        from flowkit_offline import CQLSACConfig
        from flowkit_offline.cql import CQLSACPolicy
        return CQLSACPolicy(ds.observation_space, ds.action_space, CQLSACConfig())
    from flowkit_offline import BCConfig
    from flowkit_offline.marwil import MARWILPolicy
    return MARWILPolicy(ds.observation_space, ds.action_space, BCConfig())


def numpy_columns(ds) -> dict:
    """Every column a reader batch may hold, from the dataset's episodes, as arrays in memory."""
    eps = list(ds.iterate_episodes())
    n = sum(len(e.rewards) for e in eps)
    obs = np.concatenate([np.asarray(e.observations[:-1], np.float32).reshape(len(e.rewards), -1) for e in eps])
    return {sb.OBS: obs,
            sb.NEXT_OBS: np.concatenate([np.asarray(e.observations[1:], np.float32).reshape(len(e.rewards), -1)
                                         for e in eps]),
            sb.ACTIONS: np.concatenate([e.actions for e in eps]),
            sb.REWARDS: np.concatenate([e.rewards for e in eps]).astype(np.float32),
            sb.TERMINATEDS: np.concatenate([e.terminations for e in eps]),
            sb.TRUNCATEDS: np.concatenate([e.truncations for e in eps]),
            sb.EPS_ID: np.repeat(np.arange(len(eps)), [len(e.rewards) for e in eps]),
            sb.T: np.concatenate([np.arange(len(e.rewards)) for e in eps]),
            sb.VALUE_TARGETS: np.zeros(n, np.float32)}


def numpy_epoch(cols: dict, batch: int) -> tuple:
    """(batches, wall s, cpu s) of one shuffled pass over ``cols``."""
    n = len(next(iter(cols.values())))
    t, c = time.perf_counter(), time.process_time()
    perm = np.random.default_rng(0).permutation(n)
    m = 0
    for i in range(0, n, batch):
        idx = perm[i:i + batch]
        sb.SampleBatch({k: v[idx] for k, v in cols.items()})
        m += 1
    return m, time.perf_counter() - t, time.process_time() - c


def bench(path: str, a) -> dict:
    from flowkit_offline.reader import DatasetReader
    ds = open_dataset(path)
    pol = make_policy(a.algo, ds)
    ctx = SimpleNamespace(policies={"default": pol}, counters=collections.Counter(), mark=lambda _: None,
                          config=OmegaConf.create({"seed": 0, "env": {"id": "dataset", "factory": None}}))
    reader = DatasetReader(ctx, path, "default", a.batch, a.buffer)
    next(iter(reader.epoch_batches(0)))  # open (and, the first time, write the dataset's columnar copy)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t, c = time.perf_counter(), time.process_time()
    cols, n = None, 0
    for b in reader.epoch_batches(1):
        cols = cols or sorted(b.keys())
        n += 1
    dt, dc = time.perf_counter() - t, time.process_time() - c
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    every = numpy_columns(ds)
    m3, dt3, dc3 = numpy_epoch({k: every[k] for k in (sb.OBS, sb.ACTIONS, sb.REWARDS)}, a.batch)
    ms, dts, dcs = numpy_epoch({k: every[k] for k in cols}, a.batch)
    out = {"dataset": path, "rows": reader.num_rows, "episodes": reader.num_episodes, "buffer": a.buffer,
           "algo": a.algo, "columns": cols, "reader_batches_per_s": n / dt, "reader_rows_per_s": reader.num_rows / dt,
           "np3_batches_per_s": m3 / dt3, "same_batches_per_s": ms / dts,
           "ratio_np3": (n / dt) / (m3 / dt3), "ratio_same": (n / dt) / (ms / dts),
           "cpu_ratio_np3": (n / dc) / (m3 / dc3), "cpu_ratio_same": (n / dc) / (ms / dcs),
           "peak_rss_mib": (rss1 - rss0) / 1024}
    if a.columns_build:
        from flowkit.datasets import build_columns
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            build_columns(ds, f"{tmp}/columns")
            out["columns_build_s"] = time.perf_counter() - t
    if a.check:
        out.update(bench_check(path))
    return out


def bench_check(path: str) -> dict:
    """Seconds of ``check_contents`` on a copy of the dataset (no columnar copy yet): the first
    load, a later one, and the sha256 verification of every episode alone."""
    import os
    import shutil

    import h5py

    from flowkit.datasets import check_contents, data_dir, verify_checksums
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "ds")
        shutil.copytree(os.path.dirname(os.path.abspath(data_dir(path))), copy,
                        ignore=shutil.ignore_patterns("flowkit-columns*"))
        ds = open_dataset(copy)
        times = []
        for _ in range(2):
            t = time.perf_counter()
            check_contents(copy, ds)
            times.append(time.perf_counter() - t)
        t = time.perf_counter()
        with h5py.File(os.path.join(copy, "data", "main_data.hdf5"), "r") as f:
            for i in range(int(ds.total_episodes)):
                verify_checksums(f[f"episode_{i}"])
        sha = time.perf_counter() - t
    return {"check_first_s": times[0], "check_later_s": times[1], "sha256_s": sha}


def bench_sharded(path: str, a, batches: int) -> dict:
    """``--readers`` k :class:`ShardedReader` shards on Ray (local cluster, ``--ray-cpus``):
    batches/s of ``batches`` batches taken round-robin after as many taken to warm up (the
    actors started, each shard's first fill read)."""
    import ray
    from flowkit_offline.reader import ShardedReader

    from flowkit.config import ModelConfig
    from flowkit.core.workers import PolicySpec
    ds = open_dataset(path)
    pol = make_policy(a.algo, ds)
    spec = PolicySpec(type(pol), ds.observation_space, ds.action_space, pol.config, a.algo)
    cfg = OmegaConf.create({"seed": 0, "env": {"id": "dataset", "factory": None},
                            "model": OmegaConf.structured(ModelConfig),
                            "runtime": {"backend": "ray", "torch_threads": 1}})
    ctx = SimpleNamespace(policy_specs={"default": spec}, counters=collections.Counter(), mark=lambda _: None,
                          config=cfg)
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=a.ray_cpus, include_dashboard=False, log_to_driver=False)
    reader = ShardedReader(ctx, path, "default", a.batch, a.buffer, a.readers)
    it = iter(reader)
    try:
        for _ in range(batches):
            next(it)
        t, c = time.perf_counter(), time.process_time()
        rows = sum(len(next(it)["default"]) for _ in range(batches))
        dt, dc = time.perf_counter() - t, time.process_time() - c
    finally:
        reader.stop()
    return {"readers": a.readers, "sharded_batches_per_s": batches / dt, "sharded_rows_per_s": rows / dt,
            "sharded_driver_cpu_s_per_batch": dc / batches}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("datasets", nargs="+")
    p.add_argument("--algo", default="bc", choices=("bc", "cql_sac"), help="whose columns the reader hands out")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--buffer", type=int, default=100_000)
    p.add_argument("--columns-build", action="store_true", help="also time writing the columnar copy")
    p.add_argument("--check", action="store_true", help="also time the load-time check of the dataset")
    p.add_argument("--readers", type=int, default=2, help="also time input.num_readers=K readers on Ray (0: not)")
    p.add_argument("--ray-cpus", type=int, default=2, help="CPUs of the local Ray cluster the readers run on")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    res = []
    for path in a.datasets:
        r = bench(path, a)
        res.append(r)
        print(f"{path}: {r['rows']} rows, {r['episodes']} episodes, buffer {r['buffer']}, columns {','.join(r['columns'])}; "
              f"reader {r['reader_batches_per_s']:.0f} batches/s ({r['reader_rows_per_s']:.0f} rows/s); numpy in "
              f"memory: np3 {r['np3_batches_per_s']:.0f}/s -> {r['ratio_np3']:.3f}x (cpu {r['cpu_ratio_np3']:.3f}x), "
              f"same columns {r['same_batches_per_s']:.0f}/s -> {r['ratio_same']:.3f}x (cpu {r['cpu_ratio_same']:.3f}x); "
              f"peak RSS +{r['peak_rss_mib']:.0f} MiB while reading"
              + (f"; columnar copy written in {r['columns_build_s']:.1f} s" if "columns_build_s" in r else "")
              + (f"; check: first load {r['check_first_s']:.2f} s, later {r['check_later_s']:.3f} s, sha256 alone "
                 f"{r['sha256_s']:.2f} s (read from the file)" if "check_first_s" in r else ""), flush=True)
        if a.readers > 0:
            n = int(np.ceil(r["rows"] / a.batch))  # about an epoch's batches
            r.update(bench_sharded(path, a, n))
            print(f"{path}: input.num_readers={a.readers} on Ray ({a.ray_cpus} CPUs), {n} batches after {n} to warm up: "
                  f"{r['sharded_batches_per_s']:.0f} batches/s ({r['sharded_rows_per_s']:.0f} rows/s) -> "
                  f"{r['sharded_batches_per_s'] / r['reader_batches_per_s']:.2f}x the driver's reader; driver CPU "
                  f"{1e3 * r['sharded_driver_cpu_s_per_batch']:.2f} ms/batch", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
