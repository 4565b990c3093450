"""samplecache.tf (the TensorFlow adapter) against a real daemon on a real S3 server (SeaweedFS): the
element_spec from /v1/schema, every value equal to the Parquet truth, a Keras model trained through it, every
sample of an epoch exactly once over two input pipelines, resume mid-epoch, the errors (a column the cache lacks,
a null without a mask, TensorFlow not installed)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any, Iterator

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up notes
import tensorflow as tf  # noqa: E402
from client_common import manifest_order_ids  # noqa: E402
from conftest import Daemons  # noqa: E402
from parquet_data import make_learnable_table, write_dataset  # noqa: E402
from paths import REPO

import samplecache.tf as sctf  # noqa: E402
from samplecache.core import MissingColumn, ResumeState  # noqa: E402

pytestmark = pytest.mark.e2e
B = 64
README = REPO / "README.md"


@pytest.fixture(scope="module")
def typed_url(s3: Any, typed_dataset: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One daemon on the typed dataset for the module, every sample cached (so every epoch holds them all)."""
    daemons = Daemons(s3, typed_dataset, tmp_path_factory.mktemp("tf-daemon"))
    try:
        d = daemons()
        sctf.Feed(d.url, ["id"], batch_size=1, min_samples=typed_dataset.rows, wait=60).close()
        yield d.url
    finally:
        daemons.teardown()


def feed(url: str, columns: list[str] | None = None, **kw: Any) -> sctf.Feed:
    return sctf.Feed(url, columns, **{"batch_size": B, "min_samples": 1800, "wait": 60, **kw})


def ids_of(ds: tf.data.Dataset) -> list[int]:
    return [int(i) for b in ds for i in b["id"].numpy().tolist()]


def samples_of(batch: dict[str, Any], schema: dict[str, Any]) -> list[dict[str, Any]]:
    """A batch of tensors as the client's per-sample values (README's representations), to compare with the truth."""
    kinds = {c["name"]: c for c in schema["columns"]}
    n = int(batch["id"].shape[0])
    cols: dict[str, list[Any]] = {}
    for name, t in batch.items():
        if name.endswith("__valid"):
            continue
        col = kinds[name]
        if isinstance(t, tf.RaggedTensor):
            depth = len(col["shape"])
            rows = []
            for r in t.to_list():
                a = np.asarray(r, dtype=col["dtype"])
                rows.append(a.reshape((0,) * depth) if a.ndim < depth else a)
        elif t.dtype == tf.string:
            rows = [v.decode("utf-8") if col["kind"] == "string" else v for v in t.numpy().tolist()]
        else:
            arr = t.numpy()
            rows = [arr[i] for i in range(n)]
        valid = batch.get(name + "__valid")
        if valid is not None:
            rows = [v if ok else None for v, ok in zip(rows, valid.numpy().tolist())]
        cols[name] = rows
    return [{k: v[i] for k, v in cols.items()} for i in range(n)]


# --------------------------------------------------------------------------------------------- no daemon
def test_without_tensorflow_the_error_names_the_extra() -> None:
    code = "import sys; sys.modules['tensorflow'] = None; import samplecache.tf"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and 'pip install "samplecache[tf]"' in out.stderr, out.stderr[-2000:]


def test_element_spec_of_every_kind() -> None:
    schema = {"columns": [
        {"name": "x", "kind": "fixed", "dtype": "<f2", "shape": [4, 3], "nullable": True},
        {"name": "t", "kind": "fixed", "dtype": "<M8[ms]", "shape": [], "nullable": True},
        {"name": "s", "kind": "string", "dtype": None, "shape": [], "nullable": True},
        {"name": "b", "kind": "binary", "dtype": None, "shape": [], "nullable": False},
        {"name": "v", "kind": "list", "dtype": "<i4", "shape": [-1], "nullable": True},
        {"name": "m", "kind": "list", "dtype": "<f8", "shape": [3, -1, 2], "nullable": True},
        {"name": "st", "kind": "nested", "dtype": None, "shape": [], "nullable": True,
         "type": {"t": "struct", "fields": [["a", {"t": "prim", "dtype": "<i8"}]]}, "arrow": "struct<a: int64>"},
    ]}
    spec = sctf.element_spec(schema, None, masks=["x", "s", "v"])
    assert spec == {
        "x": tf.TensorSpec([None, 4, 3], tf.float16), "x__valid": tf.TensorSpec([None, 4, 3], tf.bool),
        "t": tf.TensorSpec([None], tf.int64),
        "s": tf.TensorSpec([None], tf.string), "s__valid": tf.TensorSpec([None], tf.bool),
        "b": tf.TensorSpec([None], tf.string),
        "v": tf.RaggedTensorSpec([None, None], tf.int32, ragged_rank=1), "v__valid": tf.TensorSpec([None], tf.bool),
        "m": tf.RaggedTensorSpec([None, None, None, 2], tf.float64, ragged_rank=2),
    }
    assert set(sctf.element_spec(schema, 8, masks=True)) == set(spec) | {"t__valid", "m__valid"}
    assert sctf.element_spec(schema, 8)["x"] == tf.TensorSpec([8, 4, 3], tf.float16)


def test_a_uuid_column_is_a_string_tensor_of_its_16_bytes() -> None:
    """The core serves a uuid column's cells as uuid.UUID; tf.string takes their bytes (issue 22, item 6)."""
    import uuid

    schema = {"columns": [{"name": "u", "kind": "binary", "dtype": None, "shape": [], "nullable": True,
                           "type": {"t": "binary", "ext": "uuid"}, "arrow": "extension<arrow.uuid>"}]}
    forms, _ = sctf._plan_columns(schema, False, True)
    one = uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
    out = sctf._convert(forms, {"u": [one, None]})
    assert tf.constant(out["u"]).numpy().tolist() == [one.bytes, b""] and out["u__valid"].tolist() == [True, False]


def test_buffers_are_aligned_and_reused_only_when_nothing_holds_them() -> None:
    pool, shape, f4 = sctf.Buffers(), (64, 1024), np.dtype("<f4")
    assert pool.alloc("x", (10,), f4) is None  # small: numpy's allocator
    a = pool.alloc("x", shape, f4)
    assert a is not None and a.ctypes.data % sctf.ALIGN == 0 and a.shape == shape and a.dtype == np.float32
    a[:] = 1.0
    first = a.ctypes.data
    batches = iter(tf.data.Dataset.from_generator(lambda: iter([a[:32]]), output_signature=tf.TensorSpec([32, 1024])))
    t = next(batches)  # TensorFlow adopts the aligned array (no copy): the tensor holds the buffer
    # `a` rebound rather than deleted: the generator's lambda reads the same name; either way the buffer is let go
    a = None
    del batches
    b = pool.alloc("x", shape, f4)
    assert b is not None and b.ctypes.data != first
    b[:] = 2.0
    assert float(tf.reduce_sum(t)) == 32 * 1024  # untouched
    del t, b
    c = pool.alloc("x", shape, f4)
    assert c is not None and c.ctypes.data == first  # free again: reused, not faulted in again


# --------------------------------------------------------------------------------------------- end to end
def test_element_spec_and_values_match_the_cache(typed_url: str, typed_dataset: Any, truth: Any, get: Any) -> None:
    schema = get(typed_url + "/v1/schema").json()
    with feed(typed_url, masks=["maybe_text"]) as f:
        ds = f.dataset()
        assert ds.element_spec == f.element_spec == sctf.element_spec(schema, None, ["maybe_text"])
        assert f.left_out == {}
        by_name = {c["name"]: c for c in schema["columns"]}
        for name, spec in ds.element_spec.items():  # dtype and shape per column, as /v1/schema says
            col = by_name[name.removesuffix("__valid")]
            if name.endswith("__valid"):
                assert spec == tf.TensorSpec([None], tf.bool)
            elif col["kind"] in ("string", "binary"):
                assert spec == tf.TensorSpec([None], tf.string), name
            else:
                assert spec.dtype == tf.as_dtype(np.dtype(col["dtype"])), name
                assert spec.shape.as_list() == [None, *[None if d < 0 else d for d in col["shape"]]], name
                assert isinstance(spec, tf.RaggedTensorSpec) == (col["kind"] == "list"), name
        samples, sizes = [], []
        for batch in ds:
            sizes.append(int(batch["id"].shape[0]))
            samples += samples_of(batch, schema)
        ids = truth.check_samples(samples, typed_dataset.by_id)  # every column, bit for bit
        truth.check_exactly_once(ids, typed_dataset.rows)
        assert sizes == [B] * (1800 // B) + [1800 % B]
        assert any(s["maybe_text"] is None for s in samples) and any(s["maybe_text"] for s in samples)

    # drop_last: a static batch dimension, every batch full
    with feed(typed_url, ["id", "tensor"], drop_last=True) as f:
        assert f.element_spec["tensor"] == tf.TensorSpec([B, 4, 3], tf.float32)
        assert len(ids_of(f.dataset())) == 1800 // B * B


def test_exactly_once_per_epoch_over_two_input_pipelines(typed_url: str) -> None:
    with feed(typed_url, ["id", "f32"], seed=3) as f:
        pipes = [f.dataset(tf.distribute.InputContext(2, i, 2)) for i in range(2)]
        orders = []
        for epoch in range(2):  # each iteration of the pipelines: the job's next epoch, the same for both
            got = [ids_of(p) for p in pipes]
            assert [len(g) for g in got] == [900, 900] == [f.count(epoch, tf.distribute.InputContext(2, i, 2))
                                                          for i in range(2)]
            every = got[0] + got[1]
            manifest = f.reader.plan(epoch).manifest
            assert len(set(every)) == len(every) == manifest["samples"] == 1800
            assert sorted(every) == sorted(manifest_order_ids(manifest))
            orders.append(every)
        assert f.reader.current_epoch() == 1 and orders[0] != orders[1]  # shuffled per epoch


def test_resume_mid_epoch_delivers_exactly_the_rest(typed_url: str) -> None:
    with feed(typed_url, ["id"], seed=5, job="tf-resume") as f:
        whole = ids_of(f.dataset(epoch=0))  # the reference: job epoch 0 in order
        f.set_epoch(0)
        got = []
        for k, batch in enumerate(f.dataset()):
            got += batch["id"].numpy().tolist()
            if k == 4:
                break  # the training loop stops after 5 batches (tf.data has read ahead of it)
        saved = json.dumps(f.state(5).to_dict())
    assert got == whole[:5 * B]
    state = ResumeState.from_dict(json.loads(saved))
    assert (state.job, state.epoch, state.position, state.extra["adapter"]) == ("tf-resume", 0, 5 * B, "tf")
    with feed(typed_url, ["id"], seed=5, resume=state) as g:
        ds = g.dataset()
        rest = ids_of(ds)
        assert got + rest == whole  # nothing repeated, nothing skipped
        assert g.reader.current_epoch() == 0 and len(ids_of(ds)) == 1800  # then the job's next epoch, whole
        assert g.reader.current_epoch() == 1
    # the same state read by 3 input pipelines (another topology): together, the rest of the epoch once each
    with feed(typed_url, ["id"], seed=5, resume=state, partial="uneven") as h:
        parts = [ids_of(h.dataset(tf.distribute.InputContext(3, i, 3))) for i in range(3)]
        assert sorted(i for p in parts for i in p) == sorted(whole[5 * B:])


def test_dataset_function_with_an_input_context(typed_url: str) -> None:
    ds = sctf.dataset(typed_url, ["id"], batch_size=B, input_context=tf.distribute.InputContext(3, 2, 3), epoch=0,
                      min_samples=1800, wait=60)
    f = ds.samplecache_feed
    ids = ids_of(ds)
    assert len(ids) == 600 and ids == ids_of(ds)  # epoch=0: the same epoch at every iteration
    assert f.state(2, tf.distribute.InputContext(3, 2, 3)).to_dict() == {
        "adapter": "tf", "pipelines": 3, "pipeline": 2, "job": f.job, "epoch": 0, "position": 2 * 3 * B, "seed": 0,
        "shuffle": True, "shuffle_buffer": 0, "samples": 1800, "daemon_epoch": f.reader.plan(0).daemon_epoch,
        "version": 2}
    f.close()


def test_missing_column_and_unmasked_null_are_named(typed_url: str) -> None:
    with pytest.raises(MissingColumn, match="'nope'.*the cache has") as e:
        feed(typed_url, ["id", "nope"])
    assert e.value.missing == ["nope"]
    with pytest.raises(MissingColumn, match="nope"):
        feed(typed_url, ["id"], masks=["nope"])
    with feed(typed_url, ["id", "maybe_text"]) as f:
        with pytest.raises(tf.errors.OpError, match="'maybe_text' holds a null.*masks"):
            ids_of(f.dataset())


def test_a_null_in_a_fixed_column_stops_at_its_batch_with_the_batches_before_it_delivered(
        daemon: Any, s3: Any, bucket: str) -> None:
    """Fixed-shape columns come in chunks of stacked batches: a chunk with a null in an unmasked column goes out
    batch by batch up to the batch that holds it, then the error names the column, as without chunks."""
    import pyarrow as pa
    prefix = f"{bucket}/tf-fixed-null"
    null_id = 437

    def make(n: int, seed: int, off: int) -> pa.Table:
        ids = np.arange(off, off + n, dtype=np.int64)
        return pa.table({"id": ids, "maybe_int": pa.array([None if i == null_id else int(i) * 3 for i in ids],
                                                          pa.int64())})
    write_dataset(s3.fs(), prefix, 1, 600, 600, make=make)
    d = daemon(f"s3://{prefix}")
    with sctf.Feed(d.url, ["id", "maybe_int"], batch_size=16, min_samples=600, wait=60, masks=["maybe_int"]) as f:
        order = ids_of(f.dataset(epoch=0))  # with the mask: every sample, in the epoch's order
    assert sorted(order) == list(range(600))
    holds = order.index(null_id) // 16  # the batch that holds the null
    with sctf.Feed(d.url, ["id", "maybe_int"], batch_size=16, min_samples=600, wait=60) as f:
        assert f.element_spec["maybe_int"].dtype == tf.int64
        got: list[int] = []
        with pytest.raises(tf.errors.OpError, match="'maybe_int' holds a null.*masks"):
            for b in f.dataset(epoch=0):
                assert b["id"].shape == (16,) and np.array_equal(b["maybe_int"].numpy(), b["id"].numpy() * 3)
                got += b["id"].numpy().tolist()
    assert got == order[:holds * 16]


@pytest.mark.filterwarnings("ignore:.shuffle=True. was passed:UserWarning",  # Keras: the feed shuffles
                            "ignore:Your input ran out of data:UserWarning")  # Keras: an epoch's length is not static
def test_a_keras_model_trains_through_it(daemon: Any, s3: Any, bucket: str) -> None:
    prefix = f"{bucket}/tf-learnable"
    write_dataset(s3.fs(), prefix, 2, 1000, 250, seed=7, make=lambda n, seed, off: make_learnable_table(n, seed=seed))
    d = daemon(f"s3://{prefix}")
    with sctf.Feed(d.url, ["features", "label"], batch_size=32, min_samples=2000, wait=60) as f:
        ds = f.dataset().map(lambda b: (b["features"], b["label"]))
        import keras
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(4)])
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        history = model.fit(ds, epochs=2, verbose=0)
        acc = history.history["accuracy"]
        assert len(acc) == 2 and acc[-1] > 0.9, history.history
        assert history.history["loss"][1] < history.history["loss"][0]
        assert f.reader.current_epoch() == 1  # one job epoch per Keras epoch

    # the README's example, as written
    section = README.read_text().split("### TensorFlow", 1)[1].split("\n## ", 1)[0]
    code = re.findall(r"```python\n(.*?)```", section, re.S)
    assert code, "the README's TensorFlow section has no python example"
    env: dict[str, Any] = {"url": d.url}
    exec(compile(code[0], "README.md (TensorFlow)", "exec"), env)
    assert env["step"] == 3 and env["rest"] == 2000 - 4 * 256
    assert env["model"].built and env["ds"].samplecache_feed.reader.current_epoch() == 1
    env["feed"].close()
    env["ds"].samplecache_feed.close()
