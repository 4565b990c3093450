"""The example trainer of deploy/compose.yaml, in the trainer image (deploy/compose/trainer.Dockerfile).

    python example.py upload s3://BUCKET/PREFIX/   # the demo dataset into the S3 store (the `dataset` service)
    python example.py train [EPOCHS]              # the demo model, trained through the daemon (the `trainer` service)

S3 endpoint and keys come from the standard AWS_* variables. `train` talks to the daemon on 127.0.0.1:8750: the
trainer shares the daemon's network namespace, and it reads the daemon's token file from the shared cache volume.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

URL = "http://127.0.0.1:8750"


def upload(target: str) -> int:
    import s3fs

    from samplecache_tools.demo import write_dataset

    fs = s3fs.S3FileSystem()
    bucket = target.removeprefix("s3://").split("/", 1)[0]
    deadline = time.monotonic() + 120
    while True:  # the store may still be starting
        try:
            if not fs.exists(bucket):
                fs.mkdir(bucket)
            break
        except Exception as e:  # noqa: BLE001 - any failure: not up yet
            if time.monotonic() > deadline:
                print(f"upload: the S3 store did not answer within 120 s: {e!r}", file=sys.stderr)
                return 1
            time.sleep(2)
    if fs.exists(target) and fs.ls(target):
        print(f"upload: {target} already holds data; nothing to do", flush=True)
        return 0
    with tempfile.TemporaryDirectory() as d:
        rows = write_dataset(Path(d), files=8, rows_per_file=2500, row_group=500)
        fs.put(f"{d}/", target.rstrip("/") + "/", recursive=True)
    print(f"upload: {rows} rows in {len(fs.ls(target))} files at {target}", flush=True)
    return 0


def wait_for_daemon(seconds: float = 120) -> bool:
    """True once the daemon answers /healthz; compose starts the trainer as soon as the daemon's container runs,
    which is before its API listens."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(URL + "/healthz", timeout=5):
                return True
        except urllib.error.HTTPError:
            return True  # it answers (503 while it starts up is an answer: the client waits for samples)
        except OSError as e:
            if time.monotonic() > deadline:
                print(f"train: the daemon at {URL} did not answer within {seconds:.0f} s: {e!r}", file=sys.stderr)
                return False
            time.sleep(1)


def train(epochs: int) -> int:
    from samplecache_tools.demo import train as train_demo

    if not wait_for_daemon():
        return 1
    history = train_demo(URL, epochs=epochs, workers=2, min_samples=2000)
    final = history[-1]
    print(f"train: epoch sample {history[0].samples} -> {final.samples}, "
          f"validation accuracy {final.val_acc:.3f}", flush=True)
    return 0 if final.val_acc > 0.7 else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "upload":
        sys.exit(upload(sys.argv[2]))
    if len(sys.argv) in (2, 3) and sys.argv[1] == "train":
        sys.exit(train(int(sys.argv[2]) if len(sys.argv) == 3 else 3))
    sys.exit(__doc__)
