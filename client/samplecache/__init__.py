"""samplecache: a per-host, growing local sample of a remote Parquet dataset.

``from samplecache import SampleCacheDataset`` is the training-side API. The
import is lazy so that ``samplecache.format.record`` and ``samplecache_service`` (the
daemon, which never imports torch) stay free of torch.
"""

from __future__ import annotations

from typing import Any

from samplecache.version import __version__

__all__ = ["SampleCacheDataset", "SampleCacheLoader", "DaemonError", "EpochGone", "MissingColumn", "MissingSource",
           "MixedColumns", "LossyValue", "collate", "decode_image", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "SampleCacheDataset":
        from samplecache.pytorch.dataset import SampleCacheDataset
        return SampleCacheDataset
    if name == "SampleCacheLoader":
        from samplecache.pytorch.loader import SampleCacheLoader
        return SampleCacheLoader
    if name == "collate":
        from samplecache.pytorch.collation import collate
        return collate
    if name == "decode_image":
        from samplecache.images import decode_image
        return decode_image
    if name in ("DaemonError", "EpochGone"):
        from samplecache.api import client as daemon_api
        return getattr(daemon_api, name)
    if name == "MissingColumn":  # a KeyError naming the column, the cached ones and those left out (no torch)
        from samplecache.reading.epoch_source import MissingColumn
        return MissingColumn
    if name == "MissingSource":  # a mixture's source that holds no sample: which, and why
        from samplecache.core import MissingSource
        return MissingSource
    if name in ("MixedColumns", "LossyValue"):  # a column one source of a mixture lacks, or holds as a type
        # that cannot be unified; a value a source holds that the unified type cannot hold exactly
        from samplecache.reading.blocks import layouts
        return getattr(layouts, name)
    raise AttributeError(f"module 'samplecache' has no attribute {name!r}")
