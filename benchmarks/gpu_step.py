"""A training step fed by the cache on a GPU: how much of the step time does the GPU spend waiting for data?

    python -m benchmarks.gpu_step [--large 1000] [--batch 8] [--workers 0,4] [--epochs 3] [--ratios 1.0,1.25]
                                  [--json out.json] [--workdir DIR] [--quick] [--device cuda|cpu]

The LARGE cache of ``benchmarks.feed`` (the harness's: 1 MiB float32 ``x`` + int64 ``y`` per sample, reused under
``--workdir``) read by ``SampleCacheLoader(ds, device="cuda")`` (pinned host batches, each copied on a side stream
one batch ahead, ``non_blocking``) into a small bf16 model: an MLP of ``depth`` Linear(1024, 1024) + GELU layers
over the batch seen as tokens of 1024 features (B x 256 tokens), forward, loss, backward and an SGD step.

For each worker count, in one run:

1. ``loader``: the loader alone, each batch's checksum summed on the GPU (no model): ms per batch;
2. ``h2d``: a reused pinned batch copied to the GPU alone (``non_blocking``): ms per batch (``benchmarks.feed``'s
   reference);
3. the model's depth is calibrated so that one step alone takes ``ratio`` x the loader's ms per batch: the loader
   and the model are as fast as each other at 1.0, the hardest case for hiding the feed;
4. ``train``: ``--epochs`` epochs of loader + step. CUDA events on the training stream mark each step's start
   (once its batch is handed over: the stream has queued the wait for its copy) and end. The GPU waits between
   the end of one step and the start of the next; ``wait`` = those gaps over the steps' span (gaps + steps,
   within each epoch: an epoch's first batch is not counted; the goal is under 5%). ``overlap`` = (loader + step
   - train) / min(loader, step) per batch: 1 when the feed hides fully behind the step, 0 when they run one after
   the other.

Every epoch is verified (count, sum of ``y`` and the checksum of ``x``, summed on the GPU, against the Parquet
truth). ``--device cpu`` runs the same on the CPU with wall-clock marks (a smoke run of the code, not a figure).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from .harness import (
    BENCH_FORMAT,
    LARGE_STRIDE,
    build_cache,
    cli,
    fmt,
    generate,
    make_specs,
    report,
    serve,
    stop_daemon,
    text_table,
)
from .harness.cli import log

FEATURES = 1024  # a token's width: x (262,144 floats) is 256 tokens


class Marks:
    """Timestamps on the training stream (CUDA events), or wall-clock ones on the CPU."""

    def __init__(self, cuda: bool) -> None:
        self.cuda, self.points = cuda, []  # type: ignore[var-annotated]

    def mark(self) -> None:
        import torch
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.points.append(e)
        else:
            self.points.append(time.perf_counter())

    def ms(self) -> list[float]:
        """Each mark in ms after the first (synchronises)."""
        import torch
        if not self.points:
            return []
        if self.cuda:
            torch.cuda.synchronize()
            return [self.points[0].elapsed_time(e) for e in self.points]
        return [(t - self.points[0]) * 1e3 for t in self.points]


def make_model(depth: int, device: Any) -> tuple[Any, Any]:
    import torch
    layers: list[Any] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(FEATURES, FEATURES), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).to(device=device, dtype=torch.bfloat16)
    return model, torch.optim.SGD(model.parameters(), lr=1e-6)


def step(model: Any, opt: Any, x: Any) -> None:
    tokens = x.view(-1, FEATURES).to(dtype=next(model.parameters()).dtype)
    loss = model(tokens).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def sync(device: Any) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize()


def step_ms(depth: int, x: Any, n: int = 12) -> float:
    """One step's time alone, on a batch already on the device (median of ``n`` after warm-ups)."""
    model, opt = make_model(depth, x.device)
    for _ in range(3):
        step(model, opt, x)
    times = []
    for _ in range(n):
        sync(x.device)
        t0 = time.perf_counter()
        step(model, opt, x)
        sync(x.device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def calibrate(target_ms: float, x: Any) -> tuple[int, float]:
    """The depth whose step takes about ``target_ms`` (a line through depths 2 and 8, then checked); its ms."""
    a, b = step_ms(2, x), step_ms(8, x)
    per = max((b - a) / 6, 1e-3)
    depth = int(min(1024, max(1, round(2 + (target_ms - a) / per))))
    return depth, step_ms(depth, x)


def epoch_pass(ds: Any, dl: Any, epoch: int, model: Any = None, opt: Any = None,
               marks: Marks | None = None) -> tuple[dict[str, int], int]:
    """One epoch through ``dl`` (with a step per batch if ``model``); its tally and batches."""
    import torch
    ds.set_epoch(epoch)
    parts, n, batches = [], 0, 0
    for b in dl:
        if marks is not None:
            marks.mark()
        y, x = b["y"], b["x"]
        n += int(y.shape[0])
        parts.append(torch.stack([y.sum(), x.view(torch.int32)[:, ::LARGE_STRIDE].sum(dtype=torch.int64)]))
        if model is not None:
            step(model, opt, x)
        if marks is not None:
            marks.mark()
        batches += 1
    tot = torch.stack(parts).sum(0).cpu() if parts else torch.zeros(2, dtype=torch.int64)
    return {"samples": n, "y_sum": int(tot[0]), "x_check": int(tot[1])}, batches


def h2d_ms(b: int, width: int, device: Any, n: int = 20) -> float | None:
    import torch
    if device.type != "cuda":
        return None
    host = torch.empty((b, width), dtype=torch.float32, pin_memory=True)
    dev = torch.empty_like(host, device=device)
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / n


def waits(ms: list[float]) -> tuple[float, float, float]:
    """(GPU busy, GPU waiting between steps, the longest wait), in ms, from start/end mark pairs."""
    starts, ends = ms[0::2], ms[1::2]
    busy = sum(e - s for s, e in zip(starts, ends))
    gaps = [s - e for e, s in zip(ends[:-1], starts[1:])]
    return busy, sum(gaps), max(gaps, default=0.0)


def run_workers(ds_args: tuple[str, int], workers: int, truth: dict[str, int], spec: Any, epochs: int,
                ratios: list[float], device: Any) -> list[dict[str, Any]]:
    from samplecache import SampleCacheDataset, SampleCacheLoader

    url, b = ds_args
    cuda = device.type == "cuda"
    ds = SampleCacheDataset(url, shuffle=True, batch_size=b)
    dl = SampleCacheLoader(ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0,
                           device=device if cuda else None)
    rows: list[dict[str, Any]] = []
    epoch = 0
    try:
        def verified(got: dict[str, int]) -> None:
            if got != truth:
                raise RuntimeError(f"epoch {epoch}: got {got}, expected {truth}")

        got, batches = epoch_pass(ds, dl, epoch)  # warm-up: workers started, pages mapped
        verified(got)
        sync(device)
        times = []
        for _ in range(epochs):
            epoch += 1
            t0 = time.perf_counter()
            got, batches = epoch_pass(ds, dl, epoch)
            sync(device)
            times.append(time.perf_counter() - t0)
            verified(got)
        load = statistics.median(times) * 1e3 / batches
        h2d = h2d_ms(b, spec.width, device)
        x = __import__("torch").rand((b, spec.width), device=device)
        log(f"  w={workers}: loader {load:.3f} ms/batch, h2d {fmt(h2d, '.3f')} ms/batch")
        for ratio in ratios:
            depth, alone = calibrate(ratio * load, x)
            model, opt = make_model(depth, device)
            step(model, opt, x)
            busy = gap = longest = wall = 0.0
            for _ in range(epochs):
                epoch += 1
                marks = Marks(cuda)
                sync(device)
                t0 = time.perf_counter()
                got, batches = epoch_pass(ds, dl, epoch, model, opt, marks)
                sync(device)
                wall += time.perf_counter() - t0
                verified(got)
                ms = marks.ms()
                bz, gp, lg = waits(ms)
                busy, gap, longest = busy + bz, gap + gp, max(longest, lg)
            per_batch = wall * 1e3 / (epochs * batches)
            overlap = (load + alone - per_batch) / min(load, alone)
            row = {"workers": workers, "batch": b, "ratio": ratio, "depth": depth, "loader_ms": load, "h2d_ms": h2d,
                   "step_ms": alone, "train_ms": per_batch, "wait": gap / (busy + gap) if busy + gap else None,
                   "longest_wait_ms": longest, "overlap": overlap, "epochs": epochs, "batches": batches,
                   "verified": True}
            log(f"  w={workers} ratio {ratio}: depth {depth}, step {alone:.3f} ms, train {per_batch:.3f} ms/batch, "
                f"wait {fmt(row['wait'], '.1%')}, overlap {overlap:.2f}")
            rows.append(row)
    except Exception as e:  # reported; the other worker counts still run
        log(f"  w={workers}: {type(e).__name__}: {e}")
        rows.append({"workers": workers, "batch": b, "error": f"{type(e).__name__}: {e}", "verified": False})
    finally:
        dl.close()
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = [("workers", 7), ("batch", 5), ("ratio", 5), ("depth", 5), ("loader ms", 9), ("h2d ms", 7),
            ("step ms", 8), ("train ms", 8), ("wait", 6), ("max wait", 8), ("overlap", 7), (" verified", -9)]
    return text_table(head, [[(str(r["workers"]), 7), (str(r["batch"]), 5), (fmt(r.get("ratio"), '.2f'), 5),
                              (str(r.get("depth", "-")), 5), (fmt(r.get("loader_ms"), '.3f'), 9),
                              (fmt(r.get("h2d_ms"), '.3f'), 7), (fmt(r.get("step_ms"), '.3f'), 8),
                              (fmt(r.get("train_ms"), '.3f'), 8), (fmt(r.get("wait"), '.1%'), 6),
                              (fmt(r.get("longest_wait_ms"), '.2f'), 8), (fmt(r.get("overlap"), '.2f'), 7),
                              (" " + ("yes" if r["verified"] else "ERROR " + r.get("error", "")), -9)]
                             for r in rows])


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__)
    cli.common(p, quick="CI smoke sizes (64 samples), 1 epoch per row")
    p.add_argument("--large", type=int, default=None, help="LARGE samples (default 1000; --quick: 64)")
    p.add_argument("--batch", type=int, default=8, help="samples per batch (default 8)")
    p.add_argument("--workers", default="0,4", help="DataLoader worker counts (default 0,4)")
    p.add_argument("--epochs", type=int, default=None, help="timed epochs per row (default 3; --quick 1)")
    p.add_argument("--ratios", default="1.0,1.25", help="step time over the loader's batch time (default 1.0,1.25)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (a smoke run of the code)")
    a = p.parse_args(argv)
    import torch

    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA GPU here (torch.cuda.is_available() is False): use a GPU host, or --device cpu for a "
                "smoke run")
    n_large = a.large if a.large is not None else (64 if a.quick else 1000)
    epochs = a.epochs if a.epochs is not None else (1 if a.quick else 3)
    spec = make_specs(1, n_large, a.quick)["large"]
    t0, load_start = time.perf_counter(), report.loadavg()
    a.workdir.mkdir(parents=True, exist_ok=True)
    root = (Path(a.workdir) / spec.name).resolve()
    truth = generate(spec, root, log)
    manifest = build_cache(spec, root, log)
    truth = {k: truth[k] for k in ("samples", "y_sum", "x_check")}
    d = serve(spec, root, manifest)
    rows: list[dict[str, Any]] = []
    try:
        for w in cli.ints(p, "--workers", a.workers):
            rows += run_workers((d.url, a.batch), w, truth, spec, epochs,
                                [float(v) for v in a.ratios.split(",")], device)
    finally:
        stop_daemon(d)
    print(table(rows))
    print("\nwait = the GPU's time between steps over the run's (goal < 5%); overlap = (loader + step - train) / "
          "min(loader, step) per batch (1 = the feed hidden behind the step)")
    result = {"benchmark": "gpu_step", "bench_format": BENCH_FORMAT, "quick": a.quick, "epochs": epochs,
              "seconds": time.perf_counter() - t0, "dataset": spec.params(), "batch": a.batch,
              "host": report.host(load_start, ("numpy",), torch=torch.__version__, cuda=torch.cuda.is_available(),
                                  gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None),
              "rows": rows}
    report.write_report(a.json, result)
    return 0 if rows and all(r["verified"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
