"""The peer loaders of ``benchmarks.suite``: each peer's local format, written from the same
Parquet data, and the dataset that reads it back.

Every loader yields the same per-sample dict ``{"x": np.ndarray (width,), "y": int64}`` so that
``default_collate`` makes the same ``{"x": (B, width), "y": (B,)}`` batches for all of them,
which the suite verifies (count + checksums) on every pass.

Peers (optional: ``bash benchmarks/install_peers.sh`` = ``pip install -e '.[peers]'`` then
``pip install --no-deps mosaicml-streaming==0.13.0 litdata==0.2.76``, which keeps the pinned CPU torch;
whether each one can run here, and the install command when not, is ``benchmarks.harness.needs``):

* ``lmdb-pickle``   the naive baseline: an LMDB with one ``pickle.dumps({"x", "y"})`` per key,
                    a map-style Dataset (one read transaction and one ``pickle.loads`` per item)
                    under ``DataLoader(sampler=RandomSampler)``. Needs only ``lmdb`` (a core dep).
* ``parquet-arrow`` a hand-written pyarrow IterableDataset over the Parquet files themselves:
                    (file, row group) units shuffled and dealt round-robin to workers, each row
                    group read with ``read_row_group``, its rows permuted (one vectorised gather),
                    then yielded sample by sample. Needs only ``pyarrow`` (a core dep).
* ``streaming``     MosaicML Streaming: ``MDSWriter`` shards (``ndarray:<dtype>:<width>`` + ``int64``,
                    no compression, <= 64 MB each) read by ``StreamingDataset(local=..., shuffle=True)``.
* ``litdata``       LitData: ``BinaryWriter`` chunks (the writer ``optimize()`` uses; <= 64 MB each)
                    read by ``litdata.StreamingDataset(dir, shuffle=True)`` through
                    ``litdata.StreamingDataLoader`` (a DataLoader subclass, LitData's recommended loader).
* ``webdataset``    WebDataset: tar shards (<= 64 MB; ``x.bin`` raw bytes + ``y.cls``; plain ustar members,
                    no per-member PAX header) read by
                    ``wds.WebDataset(shards, shardshuffle=..., seed=...).shuffle(buffer).map(decode)``.

Shard, chunk and row-group sizes are capped so that every dataset has at least 8 of them (so two
DataLoader workers both get work even at the ``--quick`` sizes).

MosaicML Streaming imports torchvision (``streaming.vision``) and transformers (``streaming.text``,
``streaming.base.dataloader``) from its package ``__init__``s, and no CPU torchvision can be
installed next to the pinned torch here. ``import_streaming()`` works around that without any fake
module: it registers ``streaming`` and ``streaming.base`` as bare packages (a module object with
the right ``__path__``, i.e. the two aggregating ``__init__.py`` files are not executed) and then
imports only the submodules the suite uses (``streaming.base.dataset``, ``streaming.base.format.mds
.writer``); none of those import torchvision or transformers. Nothing else in ``sys.modules`` is
touched, and a real ``import streaming`` elsewhere in the process is left alone if it already
happened. DataLoader workers are forked (the suite sets ``multiprocessing_context="fork"`` for every
loader), so they inherit the registered modules.

Streaming keeps per-dataset state in ``/dev/shm`` (``NNNNNN_locals``, ``_barrier``, ``_epoch_shape`` ...)
and file locks in ``tempfile.gettempdir()``; the suite points ``TMPDIR`` at its workdir and, after
each streaming row, has Streaming's own ``SharedMemory.cleanup`` release what the dataset holds, then
unlinks whatever of those patterns is still left and appeared during the row (``StreamingShm``),
never what was there before.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import math
import os
import pickle
import re
import shutil
import struct
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow.parquet as pq
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from ..harness import arrow_xy, parquet_files

CONVERT_FORMAT = 2            # bump when a converter's output changes
SHARD_BYTES = 64 << 20        # target size of one shard / chunk of the peer formats (their usual 64 MB)
MIN_SHARDS = 8                # ... but at least this many, so that two workers both get work


# --- the data, row group by row group ------------------------------------------------------------

def iter_row_groups(pq_dir: Path, width: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(x (n, width), y (n,)) of every row group of the Parquet files, in file order."""
    for f in parquet_files(pq_dir):
        pf = pq.ParquetFile(f, memory_map=True)
        for rg in range(pf.num_row_groups):
            yield arrow_xy(pf.read_row_group(rg, columns=["x", "y"]), width)


def per_shard(samples: int, payload: int) -> int:
    """Samples per shard: SHARD_BYTES worth, but at least MIN_SHARDS shards."""
    return max(1, min(SHARD_BYTES // max(1, payload + 8), math.ceil(samples / MIN_SHARDS)))


# --- converters: reused while the source and the converter are unchanged ----------------------------

def converted(out: Path, params: dict[str, Any], write: Callable[[Path], None], log: Callable[[str], None],
              what: str) -> Path:
    """``out`` holding ``what`` for ``params``: reused if ``out/.suite-params.json`` matches, else rebuilt."""
    stamp = out / ".suite-params.json"
    want = {"convert_format": CONVERT_FORMAT, **params}
    try:
        if json.loads(stamp.read_text()) == want:
            log(f"  {what}: reusing {out}")
            return out
    except (OSError, ValueError):
        pass
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    write(out)
    stamp.write_text(json.dumps(want, sort_keys=True))
    log(f"  {what}: written to {out} in {time.perf_counter() - t0:.1f}s")
    return out


def write_lmdb_pickle(pq_dir: Path, out: Path, samples: int, payload: int, width: int) -> None:
    import lmdb
    env = lmdb.open(str(out), map_size=2 * samples * (payload + 256) + (64 << 20), subdir=True,
                    readahead=False, writemap=False, meminit=False)
    i = 0
    try:
        for xs, ys in iter_row_groups(pq_dir, width):
            with env.begin(write=True) as txn:
                for x, y in zip(xs, ys.tolist()):
                    txn.put(struct.pack(">Q", i), pickle.dumps({"x": x.copy(), "y": y}), append=True)
                    i += 1
    finally:
        env.close()


def write_mds(pq_dir: Path, out: Path, samples: int, payload: int, width: int, dtype: str) -> None:
    import_streaming()
    from streaming.base.format.mds.writer import MDSWriter
    size_limit = per_shard(samples, payload) * (payload + 64)  # MDS rolls over on bytes
    with MDSWriter(out=str(out), columns={"x": f"ndarray:{dtype}:{width}", "y": "int64"}, compression=None,
                   size_limit=size_limit) as w:
        for xs, ys in iter_row_groups(pq_dir, width):
            for x, y in zip(xs, ys):
                w.write({"x": x, "y": y})


def write_litdata(pq_dir: Path, out: Path, samples: int, payload: int, width: int) -> None:
    from litdata.streaming.writer import BinaryWriter
    w = BinaryWriter(str(out), chunk_size=per_shard(samples, payload))
    i = 0
    for xs, ys in iter_row_groups(pq_dir, width):
        for x, y in zip(xs, ys.tolist()):
            w[i] = {"x": x, "y": y}
            i += 1
    w.done()
    w.merge()


def write_wds(pq_dir: Path, out: Path, samples: int, payload: int, width: int) -> None:
    import webdataset as wds
    n = per_shard(samples, payload)
    i = 0
    # mtime=0: an integer mtime, so no PAX header per member (ShardWriter's default float time.time()
    # adds one, doubling the header parsing of every read)
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxcount=n, maxsize=float(1 << 40), verbose=0, mtime=0) as w:
        for xs, ys in iter_row_groups(pq_dir, width):
            for x, y in zip(xs, ys.tolist()):
                w.write({"__key__": f"{i:09d}", "x.bin": x.tobytes(), "y.cls": y})
                i += 1


# --- loaders -------------------------------------------------------------------------------------------

class LmdbPickleDataset(Dataset):  # type: ignore[type-arg]
    """The naive map-style loader: one read transaction and one pickle.loads per sample."""

    def __init__(self, path: Path, samples: int) -> None:
        self.path, self.samples = str(path), samples
        self._env: Any = None
        self._pid = -1

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> Any:
        if self._env is None or self._pid != os.getpid():
            import lmdb
            self._env = lmdb.open(self.path, readonly=True, lock=False, readahead=False, subdir=True)
            self._pid = os.getpid()
        with self._env.begin() as txn:
            return pickle.loads(txn.get(struct.pack(">Q", i)))


class ParquetIterable(IterableDataset):  # type: ignore[type-arg]
    """pyarrow over the Parquet files: shuffled (file, row group) units dealt to workers, rows permuted."""

    def __init__(self, pq_dir: Path, width: int, seed: int = 0) -> None:
        super().__init__()
        self.files = [str(f) for f in parquet_files(pq_dir)]
        self.units = [(fi, rg) for fi, f in enumerate(self.files) for rg in range(pq.ParquetFile(f).num_row_groups)]
        self.width, self.seed, self.epoch = width, seed, 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        epoch = self.epoch
        self.epoch += 1  # every worker's copy advances once per pass, so they agree
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.units))
        for k in order[wid::nw].tolist():
            fi, rg = self.units[k]
            table = pq.ParquetFile(self.files[fi], memory_map=True).read_row_group(rg, columns=["x", "y"])
            xs, ys = arrow_xy(table, self.width)
            perm = np.random.default_rng([self.seed, epoch, k]).permutation(len(ys))
            xs, ys = xs[perm], ys[perm]  # one gather: owned, writable arrays
            for i in range(len(ys)):
                yield {"x": xs[i], "y": ys[i]}


def wds_decode(s: dict[str, Any], dtype: str) -> dict[str, Any]:
    return {"x": np.frombuffer(s["x.bin"], dtype=dtype), "y": int(s["y.cls"])}


def wds_dataset(out: Path, dtype: str, payload: int, seed: int = 0) -> Any:
    import webdataset as wds
    urls = [str(p) for p in sorted(out.glob("shard-*.tar"))]
    buffer = int(max(16, min(1000, (64 << 20) // payload)))  # a shuffle buffer of <= 64 MiB (1000 samples max)
    return (wds.WebDataset(urls, shardshuffle=len(urls), seed=seed, nodesplitter=wds.single_node_only,
                           empty_check=False)
            .shuffle(buffer, initial=buffer).map(functools.partial(wds_decode, dtype=dtype)))


# --- MosaicML Streaming without torchvision / transformers -----------------------------------------

def import_streaming() -> types.ModuleType:
    """``streaming.base.dataset`` without running ``streaming/__init__.py`` (torchvision, transformers)
    and ``streaming/base/__init__.py`` (transformers). See the module docstring."""
    spec = importlib.util.find_spec("streaming")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("mosaicml-streaming is not installed")
    root = list(spec.submodule_search_locations)[0]
    for name, path in (("streaming", root), ("streaming.base", os.path.join(root, "base"))):
        if name not in sys.modules:
            pkg = types.ModuleType(name, f"{name} (package __init__ skipped by benchmarks.suite.peers)")
            pkg.__path__ = [path]
            pkg.__package__ = name
            pkg.__spec__ = importlib.util.spec_from_file_location(name, os.path.join(path, "__init__.py"),
                                                                  submodule_search_locations=[path])
            sys.modules[name] = pkg
    importlib.import_module("streaming.base.format.mds.writer")
    return importlib.import_module("streaming.base.dataset")


class StreamingShm:
    """MosaicML Streaming's leftovers: its ``/dev/shm`` entries (``NNNNNN_<name>``) and its file locks
    (``NNNNNN_barrier_filelock`` ... in ``tempfile.gettempdir()``) that appear while it is in use.
    ``release(dataset)`` first lets Streaming's own ``SharedMemory.cleanup`` unlink what the dataset holds
    (so the multiprocessing resource tracker is told), then unlinks whatever of that pattern is still
    left and was not there before (Streaming is known to leave entries behind)."""

    SHM = re.compile(r"^\d{6}_(locals|barrier|next_epoch|cache_usage|shard_states|shard_access_times|"
                     r"resume|epoch_shape|epoch_data)$")
    LOCKS = re.compile(r"^\d{6}_(barrier|cache)_filelock$")

    def __init__(self, shm_root: str = "/dev/shm") -> None:
        import tempfile
        self.roots = [(shm_root, self.SHM), (tempfile.gettempdir(), self.LOCKS)]
        self.before = [self._entries(root, pat) for root, pat in self.roots]

    @staticmethod
    def _entries(root: str, pat: re.Pattern[str]) -> set[str]:
        try:
            return {n for n in os.listdir(root) if pat.match(n)}
        except OSError:
            return set()

    def release(self, dataset: Any = None) -> list[str]:
        """Clean up after ``dataset`` (drop every other reference to it, and stop the workers, first)."""
        if dataset is not None:
            from streaming.base.shared.memory import SharedMemory
            seen: set[int] = set()

            def walk(obj: Any, depth: int) -> None:
                if id(obj) in seen or depth > 3:
                    return
                seen.add(id(obj))
                if isinstance(obj, SharedMemory):
                    obj.cleanup()
                    return
                for v in (vars(obj).values() if hasattr(obj, "__dict__") else ()):
                    walk(v, depth + 1)

            walk(dataset, 0)
        left = []
        for (root, pat), before in zip(self.roots, self.before):
            for n in sorted(self._entries(root, pat) - before):
                try:
                    os.unlink(os.path.join(root, n))
                    left.append(n)
                except OSError:
                    pass
        return left


def mds_dataset(out: Path, batch_size: int, seed: int = 0) -> Any:
    mod = import_streaming()
    return mod.StreamingDataset(local=str(out), remote=None, shuffle=True, shuffle_seed=seed + 1,
                                batch_size=batch_size)


def litdata_dataset(out: Path, seed: int = 0) -> Any:
    import litdata
    return litdata.StreamingDataset(str(out), shuffle=True, seed=seed)
