"""Training fidelity: does the growing, rolling cache train as well as the full data?

One generated classification task with a known Bayes accuracy: x ~ N(0, I_16), the label is the argmax of a
fixed random teacher network (tanh hidden layer, 4 classes), then flipped to a uniformly random other class with
probability ``flip``; the teacher's label is still the likeliest, so the Bayes accuracy is exactly 1 - flip.
A small MLP (16 -> 256 -> 256 -> 4, Adam) trains for the same number of optimizer steps, batch 256, in three ways:

  a  full     the whole training set from local memory, a fresh permutation per epoch;
  b  cache    through samplecache: a real SeaweedFS S3 server holds the set as Parquet, a real ``samplecache serve``
              subprocess caches it with ``--max-bytes`` = 25% of the set's cached size (measured by a first daemon
              that caches all of it), so the cache fills, then rolls (evicts old shards for new ones, paced per
              epoch); the model reads through SampleCacheDataset + SampleCacheLoader, one epoch = one manifest;
  c  subset   a fixed random 25% of the training set from local memory.

Per run: validation accuracy (held-out, same generator) every ``eval_every`` steps, its final and best value, and
the seconds blocked in the loader's next() against the seconds of compute. For (b) per epoch: its sample count,
the fraction of the remote set ever seen in training, the daemon's /v1/status coverage, evictions; every batch's
ids and values are checked against the ground truth and every epoch's ids must be unique.

    .venv/bin/python -m benchmarks.fidelity [--quick] [--seeds 0 1 2] [--json out.json] [--plots docs]
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn

from benchmarks.harness import cli, http_json, s3_server, start_daemon, stop_daemon
from benchmarks.harness import report as harness_report
from samplecache import SampleCacheDataset, SampleCacheLoader
from samplecache_tools.launch import DaemonProcess

from . import plots

if TYPE_CHECKING:
    from samplecache_tools.s3server import S3Server

DIM, CLASSES, HIDDEN, BATCH, LR = 16, 4, 256, 256, 1e-3
MODES = {"a": "full (local memory)", "b": "samplecache (25% budget, rolling)", "c": "fixed 25% subset"}
# (b) runs the daemon with its default settings (lease_ttl None: its own) and unpadded steps (step_ms 0): since pins
# follow readers (issue 22), the cache rolls with the epochs, however short, not with the lease TTL
FULL = dict(samples=120_000, val=20_000, steps=4_000, eval_every=100, row_group=1_000, files=12, flip=0.2,
            budget=0.25, min_samples=2_000, lease_ttl=None, workers=1, step_ms=0)
QUICK = dict(samples=24_000, val=4_000, steps=800, eval_every=100, row_group=400, files=4, flip=0.2,
             budget=0.25, min_samples=800, lease_ttl=None, workers=1, step_ms=0)


# ----------------------------------------------------------------------------- the task
def teacher(seed: int = 7) -> Callable[[np.ndarray], np.ndarray]:
    g = np.random.default_rng(seed)
    w1 = g.normal(0, 1.5 / np.sqrt(DIM), (DIM, 64))
    b1 = g.normal(0, 1, 64)
    w2 = g.normal(0, 1 / 8, (64, CLASSES))
    return lambda x: np.argmax(np.tanh(x @ w1 + b1) @ w2, 1)


def generate(n: int, seed: int, flip: float) -> tuple[np.ndarray, np.ndarray]:
    """n examples: x (float32) and the teacher's label, flipped to a random other class with probability flip."""
    g = np.random.default_rng(seed)
    x = g.normal(0, 1, (n, DIM)).astype(np.float32)
    y = teacher()(x)
    flipped = g.random(n) < flip
    y[flipped] = (y[flipped] + g.integers(1, CLASSES, int(flipped.sum()))) % CLASSES
    return x, y.astype(np.int64)


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, CLASSES))


def upload(fs: Any, prefix: str, x: np.ndarray, y: np.ndarray, files: int, row_group: int) -> None:
    """The training set as ``files`` Parquet files (columns id, x: 16 x float32, y) of row groups of row_group."""
    per = -(-len(y) // files)
    for f in range(files):
        lo, hi = f * per, min(len(y), (f + 1) * per)
        t = pa.table({"id": pa.array(np.arange(lo, hi, dtype=np.int64)),
                      "x": pa.FixedSizeListArray.from_arrays(pa.array(x[lo:hi].reshape(-1)), DIM),
                      "y": pa.array(y[lo:hi])})
        with fs.open(f"{prefix}/part-{f:03d}.parquet", "wb") as out:
            pq.write_table(t, out, row_group_size=row_group)


# ----------------------------------------------------------------------------- the daemon
def status(url: str) -> dict[str, Any]:
    return http_json(url + "/v1/status")  # type: ignore[no-any-return]


def daemon(s3: "S3Server", source: str, cache: Path, max_bytes: int, seed: int, extra: list[str] | None = None
           ) -> DaemonProcess:
    """One sampler process (the machine has 2 cores: one trains, one serves the cache)."""
    return start_daemon(source, cache, samplers=1, max_bytes=max_bytes, env=s3.env(),
                        log_path=cache.parent / f"{cache.name}.log", extra=["--seed", str(seed), *(extra or [])])


def cached_size(s3: "S3Server", source: str, work: Path, samples: int) -> int:
    """Bytes the whole training set takes in the cache: a daemon with room for all of it, until it holds all."""
    d = daemon(s3, source, work / "cache-all", 1 << 30, 0)
    try:
        deadline = time.monotonic() + 600
        while (st := status(d.url))["samples"] < samples:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the sizing daemon cached {st['samples']} of {samples} samples")
            time.sleep(0.3)
        return int(st["bytes"])
    finally:
        stop_daemon(d)
        shutil.rmtree(work / "cache-all", ignore_errors=True)


# ----------------------------------------------------------------------------- training
class Clock:
    """Seconds blocked in the data iterator's next() and seconds of compute (forward, backward, step)."""

    def __init__(self) -> None:
        self.wait = self.compute = self.padded = 0.0


def local_batches(x: torch.Tensor, y: torch.Tensor, seed: int) -> Iterator[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    while True:
        perm = torch.randperm(len(y), generator=g)
        for i in range(0, len(y) - BATCH + 1, BATCH):
            b = perm[i:i + BATCH]
            yield {"x": x[b], "y": y[b]}


def train(batches: Iterator[dict[str, torch.Tensor]], cfg: dict[str, Any], seed: int,
          val: tuple[torch.Tensor, torch.Tensor], on_batch: Callable[[dict[str, Any]], None] | None = None,
          step_s: float = 0.0) -> dict[str, Any]:
    """``step_s``: every step padded (sleeping) to last at least this long, as a larger model's would."""
    torch.manual_seed(seed)
    net, loss_fn = model(), nn.CrossEntropyLoss()
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    clock, history, t0 = Clock(), [], time.perf_counter()
    for step in range(1, cfg["steps"] + 1):
        t = time.perf_counter()
        batch = next(batches)
        t1 = time.perf_counter()
        clock.wait += t1 - t
        if on_batch is not None:
            on_batch(batch)
        loss = loss_fn(net(batch["x"]), batch["y"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        t2 = time.perf_counter()
        clock.compute += t2 - t1
        if t2 - t < step_s:
            time.sleep(step_s - (t2 - t))
            clock.padded += time.perf_counter() - t2
        if step % cfg["eval_every"] == 0 or step == cfg["steps"]:
            with torch.no_grad():
                acc = float((net(val[0]).argmax(1) == val[1]).float().mean())
            history.append([step, acc])
    accs = [a for _, a in history]
    return {"seed": seed, "final": accs[-1], "best": max(accs), "history": history, "wait_s": clock.wait,
            "compute_s": clock.compute, "padded_s": clock.padded, "wall_s": time.perf_counter() - t0}


class CacheFeed:
    """Mode (b): the README loop as an endless batch iterator, one epoch = one manifest, with per-epoch records
    (samples, coverage of the remote seen in training, the daemon's coverage) and every batch checked."""

    def __init__(self, url: str, seed: int, truth: tuple[np.ndarray, np.ndarray], min_samples: int,
                 workers: int = 0) -> None:
        self.url, self.x, self.y = url, truth[0], truth[1]
        self.ds = SampleCacheDataset(url, columns=["id", "x", "y"], seed=seed, min_samples=min_samples, wait=300)
        self.loader = SampleCacheLoader(self.ds, batch_size=BATCH, num_workers=workers,
                                        persistent_workers=workers > 0)
        self.seen = np.zeros(len(self.y), bool)
        self.visits = np.zeros(len(self.y), np.int32)  # epochs each sample was trained in
        self.epochs: list[dict[str, Any]] = []
        self.bad = self.steps = 0
        self.wait = 0.0  # seconds in the loader's next() (and iter(): the epoch's manifest and lease)
        self.t0 = time.perf_counter()

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        epoch = 0
        while True:
            t, waited = time.perf_counter(), self.wait
            rec = {"epoch": epoch, "step": self.steps, "t": t - self.t0}
            self.ds.set_epoch(epoch)  # on a fresh daemon epoch 0 waits here for min_samples
            ids: list[np.ndarray] = []
            for batch in self.loader:
                self.wait += time.perf_counter() - t  # the loader alone: not the checks and records below
                rec.setdefault("first_batch_s", self.wait - waited)  # the epoch's manifest, lease and first batch
                rec["wait_s"] = self.wait - waited
                i = batch["id"].numpy()
                ids.append(i.copy())
                self.check(i, batch["x"].numpy(), batch["y"].numpy())
                self.steps += 1
                yield {"x": batch["x"], "y": batch["y"]}
                self.note(rec, ids, complete=False)  # keeps the record current if training stops mid-epoch
                t = time.perf_counter()
            self.wait += time.perf_counter() - t  # the last next(), which ended the epoch
            rec["wait_s"] = self.wait - waited
            self.note(rec, ids, complete=True)
            epoch += 1

    def check(self, ids: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
        ok = (ids >= 0) & (ids < len(self.y))
        self.bad += int((~ok).sum())
        i = ids[ok]
        self.bad += int((~(self.x[i] == x[ok]).all(1)).sum() + (self.y[i] != y[ok]).sum())
        self.seen[i] = True
        self.visits[i] += 1  # ids are unique within an epoch (checked), so this counts epochs

    def note(self, rec: dict[str, Any], ids: list[np.ndarray], complete: bool) -> None:
        if not complete and self.steps % 50:
            return
        allids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        unique = len(np.unique(allids))
        st = status(self.url) if complete else None
        rec.update(samples=len(allids), unique=unique, complete=complete,
                   seen_fraction=float(self.seen.mean()))
        if st is not None:
            cov = st.get("coverage") or {}
            rec.update(daemon_row_fraction=cov.get("row_fraction"), daemon_unit_fraction=cov.get("unit_fraction"),
                       cache_samples=st["samples"], cache_bytes=st["bytes"], evictions=st["evictions"])
        if not self.epochs or self.epochs[-1] is not rec:
            self.epochs.append(rec)

    def close(self) -> None:
        self.loader.close()


def run_cache(s3: "S3Server", source: str, work: Path, budget: int, cfg: dict[str, Any], seed: int,
              truth: tuple[np.ndarray, np.ndarray], val: tuple[torch.Tensor, torch.Tensor]) -> dict[str, Any]:
    extra = [] if cfg["lease_ttl"] is None else ["--lease-ttl", str(cfg["lease_ttl"])]
    if cfg.get("replace_per_epoch") is not None:
        extra += ["--replace-per-epoch", str(cfg["replace_per_epoch"])]
    d = daemon(s3, source, work / f"cache-b-{seed}", budget, seed, extra)
    try:
        feed = CacheFeed(d.url, seed, truth, cfg["min_samples"], cfg["workers"])
        try:
            out = train(iter(feed), cfg, seed, val, step_s=cfg["step_ms"] / 1000)
        finally:
            feed.close()
        st = status(d.url)
        out.update(wait_with_checks_s=out["wait_s"], wait_s=feed.wait, epochs=feed.epochs, bad_samples=feed.bad,
                   duplicate_samples=sum(e["samples"] - e["unique"] for e in feed.epochs),
                   seen_fraction=float(feed.seen.mean()), evictions=st["evictions"],
                   epochs_per_sample=np.bincount(feed.visits).tolist(),  # [k]: samples trained in k epochs
                   daemon_coverage=st.get("coverage"), cache_bytes=st["bytes"], max_bytes=st["max_bytes"],
                   remote_bytes_read=st["remote"]["bytes_read"])
        return out
    finally:
        stop_daemon(d)
        shutil.rmtree(work / f"cache-b-{seed}", ignore_errors=True)


# ----------------------------------------------------------------------------- report
def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def ms(key: str) -> list[float]:
        v = [r[key] for r in runs]
        return [statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0]
    return {"final": ms("final"), "best": ms("best"), "wait_s": ms("wait_s"), "compute_s": ms("compute_s"),
            "padded_s": ms("padded_s"),
            "wait_fraction": statistics.fmean(r["wait_s"] / (r["wait_s"] + r["compute_s"] + r["padded_s"])
                                              for r in runs)}


def claim(modes: dict[str, Any]) -> dict[str, Any]:
    a, b, c = (modes[m]["summary"] for m in "abc")
    return {"b_minus_a_final": b["final"][0] - a["final"][0], "b_minus_a_best": b["best"][0] - a["best"][0],
            "b_minus_c_final": b["final"][0] - c["final"][0], "b_minus_c_best": b["best"][0] - c["best"][0],
            "within_1pt_of_a": abs(b["final"][0] - a["final"][0]) <= 0.01,
            "better_than_c": b["final"][0] > c["final"][0]}


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__)
    p.prog = "python -m benchmarks.fidelity"
    cli.common(p, workdir=cli.BENCH_DATA / "fidelity", quick="a small smoke run (under a minute and a half)")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2 (--quick: 0)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run")
    p.add_argument("--modes", default="abc", help="which of a, b, c to run (default all; the claim needs all)")
    p.add_argument("--plots", type=Path, help="write fidelity-accuracy.png and fidelity-cache.png here")
    p.add_argument("--lease-ttl", type=float, help="(b)'s daemon --lease-ttl (default: the daemon's, 60 s)")
    p.add_argument("--replace-per-epoch", type=float, help="(b)'s daemon --replace-per-epoch (default: the daemon's)")
    p.add_argument("--workers", type=int, help="(b)'s DataLoader workers (default 1)")
    p.add_argument("--step-ms", type=float, help="(b)'s steps padded to this many ms, as a larger model's (default 0)")
    a = p.parse_args(argv)
    cfg = dict(QUICK if a.quick else FULL)
    for key in ("steps", "lease_ttl", "replace_per_epoch", "workers", "step_ms"):
        if getattr(a, key) is not None:
            cfg[key] = getattr(a, key)
    seeds = a.seeds if a.seeds is not None else ([0] if a.quick else [0, 1, 2])
    torch.set_num_threads(1)  # 2 threads on 2 busy cores: 20x slower steps (spinning threads); the daemon gets a core
    work = a.workdir
    work.mkdir(parents=True, exist_ok=True)
    load_start, t0 = harness_report.loadavg(), time.perf_counter()

    def log(msg: str) -> None:
        cli.log(f"[{time.perf_counter() - t0:7.1f}s] {msg}")

    x, y = generate(cfg["samples"], 1, cfg["flip"])
    vx, vy = generate(cfg["val"], 2, cfg["flip"])
    val = (torch.from_numpy(vx), torch.from_numpy(vy))
    X, Y = torch.from_numpy(x), torch.from_numpy(y)
    out: dict[str, Any] = {"benchmark": "fidelity", "config": cfg, "seeds": seeds, "bayes_accuracy": 1 - cfg["flip"],
                           "batch": BATCH,
                           "model": f"MLP {DIM}-{HIDDEN}-{HIDDEN}-{CLASSES}, Adam lr {LR}, batch {BATCH}, 1 thread",
                           "modes": {m: {"name": MODES[m], "runs": []} for m in a.modes}}
    with s3_server(work) as s3:
        s3.make_bucket("fidelity")
        source = "s3://fidelity/train"
        upload(s3.fs(), "fidelity/train", x, y, cfg["files"], cfg["row_group"])
        size = cached_size(s3, source, work, cfg["samples"])
        budget = int(size * cfg["budget"])
        out["dataset"] = {"samples": cfg["samples"], "val_samples": cfg["val"], "cached_bytes": size,
                          "budget_bytes": budget, "budget_fraction": cfg["budget"],
                          "row_groups": -(-cfg["samples"] // cfg["row_group"]),
                          "teacher_agreement_val": float((teacher()(vx) == vy).mean())}
        log(f"dataset: {cfg['samples']} samples, {size} bytes cached in full, budget {budget} bytes")
        for seed in seeds:
            sub = np.random.default_rng(1000 + seed).choice(len(y), int(len(y) * cfg["budget"]), replace=False)
            for m in a.modes:
                if m == "b":
                    r = run_cache(s3, source, work, budget, cfg, seed, (x, y), val)
                else:
                    idx = torch.from_numpy(sub) if m == "c" else torch.arange(len(y))
                    r = train(local_batches(X[idx], Y[idx], seed), cfg, seed, val)
                out["modes"][m]["runs"].append(r)
                log(f"seed {seed} ({m}) final {r['final']:.4f} best {r['best']:.4f} wait {r['wait_s']:.1f}s "
                    f"compute {r['compute_s']:.1f}s" + (f" epochs {len(r['epochs'])} evictions {r['evictions']} "
                                                        f"seen {r['seen_fraction']:.2f}" if m == "b" else ""))
    for m in a.modes:
        out["modes"][m]["summary"] = summary(out["modes"][m]["runs"])
    out["claim"] = claim(out["modes"]) if len(out["modes"]) == 3 else None
    out["seconds"] = time.perf_counter() - t0
    out["host"] = harness_report.host(load_start, ("numpy", "pyarrow", "torch"),
                                      git=harness_report.git_state())
    if a.plots and out["claim"] is not None:
        why = plots.missing()
        if why:
            log(f"no plots: {why}")
        out["plots"] = why or plots.plot(out, a.plots)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=1))
    print(table(out))
    print(json.dumps(out["claim"]))
    return 0


def table(out: dict[str, Any]) -> str:
    """The summary as a Markdown table (docs/fidelity.md shows it)."""
    lines = ["| mode | final val. acc. (%) | best val. acc. (%) | waiting for data | per seed (final) |",
             "|---|---|---|---|---|"]
    for m, mode in out["modes"].items():
        s = mode["summary"]
        per = ", ".join(f"{r['final'] * 100:.2f}" for r in mode["runs"])
        lines.append(f"| ({m}) {MODES[m]} | {s['final'][0] * 100:.2f} ± {s['final'][1] * 100:.2f} | "
                     f"{s['best'][0] * 100:.2f} ± {s['best'][1] * 100:.2f} | {s['wait_fraction'] * 100:.1f}% "
                     f"({s['wait_s'][0]:.1f} s of "
                     f"{s['wait_s'][0] + s['compute_s'][0] + s['padded_s'][0]:.1f} s) | {per} |")
    return "\n".join(lines)
