"""samplecache.reading.options: one object per concern, and every adapter taking them or their fields by name.

No daemon: the adapters are only made (the TensorFlow and DALI ones with the schema answered in-process).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from samplecache.core import BatchOptions, CacheOptions, Options, Reader, SplitOptions
from samplecache.format.record import FORMAT_VERSION

URL = "http://127.0.0.1:9"  # nothing listens: making an adapter asks the daemon nothing (but TF's and DALI's schema)

# every option with a value other than its default
GIVEN: dict[str, Any] = {
    "url": URL, "columns": ["id"], "job": "j", "token": "t", "deadline": 5.0, "retries": 2, "lease": False,
    "min_samples": 7, "wait": 3.0, "prefetch_next": False, "fill_missing": True,
    "shuffle": False, "seed": 11, "partial": "drop", "shuffle_buffer": 16,
    "mixture": {"web": 0.7, "code": 0.3}, "mix": "stratified", "epoch_samples": 1000, "stratum": 64,
    "batch_size": 32, "drop_last": True, "masks": False, "prefetch": 3, "copy_threads": 2,
}

# the option keywords each adapter declared before the options were declared once (README and docs name them)
DATASET = ["url", "columns", "shuffle", "seed", "batch_size", "drop_last", "shuffle_buffer", "partial", "min_samples",
           "wait", "token", "retries", "lease", "prefetch_next", "prefetch", "copy_threads", "job", "deadline"]
NUMPY = ["url", "batch_size", "columns", "shuffle", "seed", "partial", "shuffle_buffer", "drop_last", "masks",
         "prefetch", "copy_threads", "job", "token", "min_samples", "wait", "deadline", "retries", "lease"]
TF = ["url", "columns", "batch_size", "drop_last", "shuffle", "seed", "partial", "shuffle_buffer", "job", "token",
      "deadline", "retries", "lease", "min_samples", "wait", "prefetch", "copy_threads"]
DALI = ["batch_size", "drop_last", "prefetch", "copy_threads"]


def concerns(thing: Any) -> dict[str, Any]:
    """An adapter's options, by concern."""
    return {"cache": thing.reader.cache, "split": thing.reader.split, "batch": thing.batch}


def check_given(thing: Any, names: list[str]) -> None:
    got = concerns(thing)
    for name in names:
        owner = next(c for c in got.values() if name in type(c).__dataclass_fields__)
        assert getattr(owner, name) == GIVEN[name], name


@pytest.fixture
def answered_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Reader.schema`` answered here: the cache has one int64 column ``id``."""
    schema = {"format_version": FORMAT_VERSION, "columns": [{"name": "id", "kind": "fixed", "dtype": "<i8",
                                                             "shape": [], "nullable": False}]}
    monkeypatch.setattr(Reader, "schema", lambda self: schema)


# --------------------------------------------------------------------------------------------- the one constructor
def test_keywords_are_sorted_into_one_object_per_concern() -> None:
    opts = Options.from_keywords("X", GIVEN)
    assert opts.cache == CacheOptions(URL, ["id"], "j", "t", 5.0, 2, False, 7, 3.0, False, True)
    assert opts.split == SplitOptions(False, 11, "drop", 16, {"web": 0.7, "code": 0.3}, "stratified", 1000, 64)
    assert opts.batch == BatchOptions(32, True, False, 3, 2)
    assert Options.from_keywords("X", {}).batch == BatchOptions(None)  # None: one sample at a time


def test_keywords_go_over_the_objects_given() -> None:
    cache, split, batch = CacheOptions(URL, job="a"), SplitOptions(seed=1), BatchOptions(8, drop_last=True)
    same = Options.from_keywords("X", {"url": None, "seed": None}, cache=cache, split=split, batch=batch)
    assert (same.cache, same.split, same.batch) == (cache, split, batch)  # None: not given
    opts = Options.from_keywords("X", {"job": "b", "seed": 2, "batch_size": 16}, cache=cache, split=split, batch=batch)
    assert (opts.cache.url, opts.cache.job, opts.split.seed, opts.batch.batch_size, opts.batch.drop_last) == \
        (URL, "b", 2, 16, True)


def test_unknown_and_fixed_keywords_are_type_errors_naming_the_adapter() -> None:
    with pytest.raises(TypeError, match=r"^Feed\(\) got an unexpected keyword argument 'seeed'$"):
        Options.from_keywords("Feed", {"seeed": 1})
    with pytest.raises(TypeError, match="'masks'"):
        Options.from_keywords("Feed", {"masks": False}, fixed={"masks": True})
    assert Options.from_keywords("Feed", {}, batch=BatchOptions(4, masks=False), fixed={"masks": True}).batch.masks


def test_each_object_validates_once_with_its_message() -> None:
    with pytest.raises(ValueError, match="partial must be one of"):
        Options.from_keywords("X", {"partial": "even"})
    with pytest.raises(ValueError, match="batch_size must be a positive integer or None, not 0"):
        Options.from_keywords("X", {"batch_size": 0})
    with pytest.raises(ValueError, match="copy_threads must be a positive integer or None"):
        Options.from_keywords("X", {"copy_threads": 0})
    with pytest.raises(ValueError, match="batch_size must be a positive integer, not None"):
        Options.from_keywords("X", {}, batched=True)  # NumPy, TensorFlow and DALI make batches only


def test_values_are_kept_as_plain_python() -> None:
    opts = Options.from_keywords("X", {"seed": np.int64(3), "shuffle_buffer": np.int32(4), "batch_size": np.int64(5),
                                       "min_samples": np.int64(6), "wait": 2})
    assert [type(v) for v in (opts.split.seed, opts.split.shuffle_buffer, opts.batch.batch_size,
                              opts.cache.min_samples, opts.cache.wait)] == [int, int, int, int, float]


# --------------------------------------------------------------------------------------------- the adapters
def test_the_torch_dataset_takes_its_keywords_or_the_objects() -> None:
    pytest.importorskip("torch")
    from samplecache import SampleCacheDataset

    with SampleCacheDataset(**{k: GIVEN[k] for k in DATASET}) as ds:
        check_given(ds, DATASET)
        # every option is read on the dataset as given, from its options object (ds.job: the job read)
        assert all(getattr(ds, k) == GIVEN[k] for k in DATASET if k != "job") and ds.job == "j"
        assert ds.masks is True  # the torch adapter's batches always carry their masks
    opts = Options.from_keywords("X", {k: GIVEN[k] for k in DATASET})
    with SampleCacheDataset(cache=opts.cache, split=opts.split, batch=opts.batch) as ds:
        assert concerns(ds) == concerns(SampleCacheDataset(**{k: GIVEN[k] for k in DATASET}))
    with SampleCacheDataset(URL, ["id"], None, False, 5) as ds:  # positionally, as before
        assert (ds.url, ds.columns, ds.shuffle, ds.seed, ds.batch_size) == (URL, ["id"], False, 5, None)
    with pytest.raises(TypeError, match="unexpected keyword argument 'masks'"):
        SampleCacheDataset(URL, masks=False)


def test_numpy_batches_take_their_keywords_or_the_objects() -> None:
    from samplecache.arrays import NumpyBatches

    with NumpyBatches(**{k: GIVEN[k] for k in NUMPY}) as it:
        check_given(it, NUMPY)
    with NumpyBatches(URL) as it:
        assert it.batch.batch_size == 256
    with NumpyBatches(URL, batch=BatchOptions(8), cache=CacheOptions(job="x"), seed=4) as it:
        assert (it.batch.batch_size, it.reader.cache.url, it.job, it.reader.split.seed) == (8, URL, "x", 4)


def test_the_tf_feed_takes_its_keywords_or_the_objects(answered_schema: None) -> None:
    sctf = pytest.importorskip("samplecache.tf")
    with sctf.Feed(**{k: GIVEN[k] for k in TF}) as feed:
        check_given(feed, TF)
        assert feed.batch.masks  # the feed's own masks= picks the columns that come with <name>__valid
    with sctf.Feed(cache=CacheOptions(URL), batch=BatchOptions(16, drop_last=True), seed=2) as feed:
        assert feed.element_spec["id"].shape.as_list() == [16] and feed.reader.split.seed == 2
    with pytest.raises(ValueError, match="batch_size must be a positive integer, not None"):
        sctf.Feed(URL)


def test_the_dali_source_takes_its_keywords_or_the_objects(answered_schema: None) -> None:
    dali = pytest.importorskip("samplecache.dali")
    cache, split = CacheOptions(**{k: GIVEN[k] for k in CacheOptions.__dataclass_fields__}), SplitOptions(seed=11)
    with dali.DaliSource(cache, 32, split=split, **{k: GIVEN[k] for k in DALI[1:]}) as source:
        check_given(source, DALI)
        assert source.reader.cache == cache and source.reader.split == split
    with dali.DaliSource(batch_size=8, url=URL, columns=["id"], seed=11, partial="drop") as source:
        assert (source.reader.cache.url, source.reader.split.seed, source.reader.split.partial) == (URL, 11, "drop")
