"""samplecache.dali: NVIDIA DALI pipelines fed from the cache, on CPU (``device_id=None``: no GPU here), against
a real daemon on a real S3 server, over a Hugging Face-style image dataset (``image`` struct<bytes, path> of PNG
and JPEG bytes, ``label`` int64)."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from nvidia.dali import fn, pipeline_def, types
from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
from paths import REPO
from PIL import Image

from samplecache.core import CacheOptions, MissingColumn, SplitOptions
from samplecache.dali import DaliSource, UnsupportedColumn, column_feed, external_source

pytestmark = pytest.mark.e2e

N = 96  # samples; a JPEG for every odd id, a PNG for every even one
BATCH = 16
SIZE = 24  # the example pipeline resizes every image to SIZE x SIZE
README = REPO / "README.md"


def encode(pixels: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


@pytest.fixture
def images(s3: Any, bucket: str, tmp_path: Path) -> Iterator[tuple[str, list[bytes], list[float | None]]]:
    """(source URL, each id's encoded image, each id's nullable score) of a fresh prefix, removed at the end."""
    prefix = f"{bucket}/dali-{uuid.uuid4().hex[:12]}"
    rng = np.random.default_rng(13)
    encoded = [encode(rng.integers(0, 256, (8 + i % 9, 6 + i % 7, 3), dtype=np.uint8), "JPEG" if i % 2 else "PNG")
               for i in range(N)]
    scores = [None if i % 10 == 3 else float(i) / 2 for i in range(N)]
    image_t = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({
        "id": pa.array(range(N), pa.int64()),
        "image": pa.array([{"bytes": b, "path": f"img/{i}.{'jpg' if i % 2 else 'png'}"}
                           for i, b in enumerate(encoded)], image_t),
        "label": pa.array([i % 7 for i in range(N)], pa.int64()),
        "score": pa.array(scores, pa.float64()),
        "tags": pa.array([{"k": str(i)} for i in range(N)], pa.struct([("k", pa.string())])),
    })
    path = tmp_path / "images.parquet"
    pq.write_table(table, path, row_group_size=32)
    s3.fs().pipe(f"{prefix}/images.parquet", path.read_bytes())
    try:
        yield f"s3://{prefix}", encoded, scores
    finally:
        try:
            s3.fs().rm(prefix, recursive=True)
        except FileNotFoundError:
            pass


def readme_example() -> str:
    text = README.read_text()
    section = text[text.index("### NVIDIA DALI"):]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, "the README's DALI section has no python example"
    return found.group(1)


def example_pipeline(source: DaliSource) -> Any:
    """The README's pipeline (NVIDIA DALI), on CPU, also returning the decoded images to compare with PIL."""
    @pipeline_def(batch_size=BATCH, num_threads=2, device_id=None)
    def train_pipe() -> Any:
        cols = external_source(source)
        decoded = fn.decoders.image(cols["image"], device="cpu", output_type=types.RGB)
        images = fn.resize(decoded, resize_x=SIZE, resize_y=SIZE)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mean=[0.485 * 255, 0.456 * 255, 0.406 * 255],
                                          std=[0.229 * 255, 0.224 * 255, 0.225 * 255])
        return images, cols["label"], decoded, cols["id"]

    pipe = train_pipe()
    pipe.build()
    return pipe


def run_epoch(pipe: Any) -> list[tuple[Any, ...]]:
    """The batches of one epoch (each as numpy arrays / lists of arrays), then ``pipe.reset()``."""
    out = []
    try:
        while True:
            got = pipe.run()
            out.append(tuple(o.as_array() if o.is_dense_tensor() else [np.asarray(o.at(j)) for j in range(len(o))]
                             for o in got))
    except StopIteration:
        pipe.reset()
    return out


def pil_decode(raw: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(raw)) as im:
        return np.asarray(im.convert("RGB"))


def test_example_pipeline_decodes_the_cached_images_on_cpu(daemon: Any, images: Any) -> None:
    url, encoded, _ = images
    d = daemon(source=url)
    cache = CacheOptions(d.url, columns=["id", "image", "label"], min_samples=N, wait=60)
    with DaliSource(cache, BATCH, split=SplitOptions(seed=5)) as source:
        assert source.outputs == ["id", "image", "label"]
        pipe = example_pipeline(source)
        orders = []
        for epoch in range(2):
            batches = run_epoch(pipe)
            assert [len(b[3]) for b in batches] == [BATCH] * (N // BATCH)
            ids = [int(i) for b in batches for i in b[3]]
            assert sorted(ids) == list(range(N)), f"epoch {epoch}: not every sample once"
            orders.append(ids)
            for images_, labels, decoded, id_ in batches:
                assert images_.shape == (len(id_), 3, SIZE, SIZE) and images_.dtype == np.float32
                assert labels.tolist() == [i % 7 for i in id_.tolist()]
                for i, img in zip(id_.tolist(), decoded):
                    expected = pil_decode(encoded[i])
                    assert img.dtype == np.uint8 and np.array_equal(img, expected), (
                        f"id {i} ({'JPEG' if i % 2 else 'PNG'}): DALI's decoding differs from PIL's "
                        f"{img.shape} vs {expected.shape}")
        assert orders[0] != orders[1], "the second epoch has the first one's order"
        del pipe

    # the README's example as written, on CPU (device_id=None and the "cpu" decoder instead of "mixed")
    code = readme_example()
    for gpu, cpu in (('"http://127.0.0.1:8750"', repr(d.url)), ("device_id=0", "device_id=None"),
                     ('device="mixed"', 'device="cpu"')):
        assert gpu in code, gpu
        code = code.replace(gpu, cpu)
    env: dict[str, Any] = {}
    exec(compile(code, "README.md (NVIDIA DALI)", "exec"), env)
    assert env["epoch"] == 2 and env["step"] == 2, "96 samples in batches of 64: 2 steps per epoch"
    assert env["images"].as_array().shape == (32, 3, 224, 224) and env["labels"].as_array().shape == (32,)
    assert env["state"]["epoch"] == 3 and env["state"]["position"] == 0, env["state"]
    del env

    # a column the cache lacks: one error naming it, and the columns there are
    with pytest.raises(MissingColumn) as err:
        DaliSource(CacheOptions(d.url, columns=["image", "lable"]), BATCH)
    assert "lable" in str(err.value) and "label" in str(err.value)
    # a column DALI cannot take (a struct of strings): named at construction
    with pytest.raises(UnsupportedColumn, match="'tags'"):
        DaliSource(CacheOptions(d.url, columns=["image", "tags"]), BATCH)


def collect(pipe: Any, batches: int | None = None) -> list[list[int]]:
    """The ids of each batch the pipeline hands out: ``batches`` of them, or to the end of the epoch."""
    out: list[list[int]] = []
    try:
        while batches is None or len(out) < batches:
            ids = pipe.run()[0]
            out.append([int(i) for i in ids.as_array()])
    except StopIteration:
        pipe.reset()
    return out


def id_pipeline(source: DaliSource, batch: int = BATCH) -> Any:
    @pipeline_def(batch_size=batch, num_threads=1, device_id=None)
    def ids_pipe() -> Any:
        cols = external_source(source)
        return tuple(cols[name] for name in source.outputs)

    pipe = ids_pipe()
    pipe.build()
    return pipe


def test_two_shards_read_every_sample_once_per_epoch_and_resume(daemon: Any, images: Any) -> None:
    url, _, scores = images
    d = daemon(source=url)
    cache = CacheOptions(d.url, columns=["id", "score"], min_samples=N, wait=60)
    with pytest.raises(ValueError, match="run="):
        DaliSource(cache, BATCH, shard_id=0, num_shards=2)
    with pytest.raises(ValueError, match="'score' holds nulls"):
        with DaliSource(cache, 50) as unmasked:
            id_pipeline(unmasked, 50).run()
    run = uuid.uuid4().hex  # what a launcher hands every shard of a training run
    first = DaliSource(cache, 10, shard_id=0, num_shards=2, run=run, masks=["score"])
    second = DaliSource(cache, 10, shard_id=1, num_shards=2, run=run, masks=["score"])
    try:
        assert first.outputs == ["id", "score", "score__valid"] and first.job == second.job
        pipes = [id_pipeline(first, 10), id_pipeline(second, 10)]
        for epoch in range(2):
            per_shard = [collect(p) for p in pipes]
            sizes = [[len(b) for b in s] for s in per_shard]
            assert sizes == [[10] * 4 + [8]] * 2, sizes  # 48 each: the last batch is partial
            ids = [i for s in per_shard for b in s for i in b]
            assert sorted(ids) == list(range(N)), f"epoch {epoch}: {len(ids)} ids, {len(set(ids))} distinct"
        # the score column and its mask: nulls are NaN with valid False
        out = pipes[0].run()
        got_ids, got_scores, valid = (o.as_array() for o in out)
        for i, s, v in zip(got_ids.tolist(), got_scores.tolist(), valid.tolist()):
            assert v == (scores[i] is not None) and (s == scores[i] if v else np.isnan(s)), (i, s, v)
        del pipes
    finally:
        first.close()
        second.close()

    # PyTorch's DALIGenericIterator over the pipeline: one epoch per loop (it resets the pipeline itself)
    with DaliSource(replace(cache, columns=["id"]), BATCH) as source:
        loader = DALIGenericIterator(id_pipeline(source), ["id"], last_batch_policy=LastBatchPolicy.PARTIAL)
        for epoch in range(2):
            ids = [i for b in loader for i in b[0]["id"].tolist()]
            assert sorted(ids) == list(range(N)), f"epoch {epoch} through DALIGenericIterator"
        del loader

    # resume mid-epoch: a new source goes on after the batches the pipeline handed out
    with DaliSource(replace(cache, columns=["id"], job="dali-resume"), BATCH, split=SplitOptions(seed=9)) as source:
        pipe = id_pipeline(source)
        head = collect(pipe, 2)
        state = source.state_dict(consumed=2)
        assert state["position"] == 2 * BATCH and state["epoch"] == 0 and state["job"] == "dali-resume"
        rest_here = collect(pipe)
        del pipe
    with DaliSource(replace(cache, columns=["id"]), BATCH, split=SplitOptions(seed=9)) as again:
        again.load_state_dict(state)
        pipe = id_pipeline(again)
        rest = collect(pipe)
        assert rest == rest_here, "the resumed epoch differs from the rest of the saved one"
        assert sorted(i for b in head + rest for i in b) == list(range(N))
        # between epochs (the pipeline reset, the next epoch not started): the next epoch's start
        assert again.state_dict(consumed=0)["epoch"] == 1 and again.state_dict(consumed=0)["position"] == 0
        assert again.state_dict(consumed=len(rest)) == again.state_dict(consumed=0)
        del pipe


def test_column_feeds() -> None:
    fixed = {"name": "x", "kind": "fixed", "dtype": "<f4", "shape": [2, 3], "nullable": True}
    assert [o[0] for o in column_feed(fixed)] == ["x"]
    assert [(o[0], o[2]) for o in column_feed(fixed, mask=True)] == [("x", 2), ("x__valid", 2)]
    feed = column_feed({"name": "b", "kind": "binary", "dtype": None, "shape": [], "nullable": True})[0][3]
    assert feed is not None and [a.tolist() for a in feed([b"\x01\x02", b""])] == [[1, 2], []]
    with pytest.raises(ValueError, match="'b' is null"):
        feed([b"x", None])
    # a uuid column's cells are uuid.UUID: DALI gets their 16 bytes
    feed = column_feed({"name": "u", "kind": "binary", "dtype": None, "shape": [], "nullable": False,
                        "type": {"t": "binary", "ext": "uuid"}, "arrow": "extension<arrow.uuid>"})[0][3]
    one = uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
    assert feed is not None and [a.tobytes() for a in feed([one])] == [one.bytes]
    ragged = {"t": "list", "child": {"t": "list", "child": {"t": "prim", "dtype": "<i4"}}}
    name, _, ndim, feed = column_feed({"name": "r", "kind": "list", "dtype": "<i4", "shape": [-1, -1],
                                       "type": ragged})[0]
    assert ndim == 2 and feed is not None and feed([[[1, 2], [3, 4]]])[0].dtype == np.int32
    with pytest.raises(UnsupportedColumn, match="'m'"):
        column_feed({"name": "m", "kind": "nested", "type": {"t": "map", "key": {"t": "string"},
                                                               "value": {"t": "string"}}})


def test_the_adapter_imports_no_other_framework() -> None:
    code = ("import sys, samplecache.dali\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'tensorflow', 'jax'}))")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert got.stdout.strip() == "[]", got.stdout


def test_without_dali_the_error_names_the_extra() -> None:
    code = "import sys\nsys.modules['nvidia.dali'] = None\nimport samplecache.dali\n"
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert got.returncode != 0 and 'pip install "samplecache[dali]"' in got.stderr, got.stderr
