"""How samples become a batch, for every column the cache serves: it never raises.

Where DataLoader's ``default_collate`` works, the result is the same. Where it would raise:

* numbers (or arrays of one shape) with nulls among them: one tensor with NaN (floats) or 0 under the nulls,
  plus ``<name>__valid``, a bool tensor of the same shape, False where the value is null;
* datetime64 / timedelta64: int64 tensors of the column's unit (the unit and time zone are in ``/v1/schema``);
* arrays of different shapes (ragged lists): a list of tensors;
* strings, bytes, dicts (structs), lists with nulls inside, decimals, maps: a list of the samples' values.

``collate`` is the ``collate_fn`` for a plain ``DataLoader`` over a per-sample ``SampleCacheDataset``;
``SampleCacheLoader`` and the dataset's own ``batch_size=`` make the same batches with vectorised gathers.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from samplecache.reading.blocks.reader import VALID_SUFFIX

_NUMERIC = "biufMm"


def _tensor(arr: np.ndarray) -> torch.Tensor:
    if arr.dtype.kind in "Mm":
        arr = arr.view(np.int64)
    return torch.from_numpy(np.ascontiguousarray(arr))


def collate_values(values: Sequence[Any]) -> tuple[Any, torch.Tensor | None]:
    """(batch value, validity mask or None) of one column's values."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, (np.ndarray, np.generic)) for v in present):
        shapes = {np.shape(v) for v in present}
        dtypes = {v.dtype for v in present}
        if len(shapes) == 1 and len(dtypes) == 1 and next(iter(dtypes)).kind in _NUMERIC:
            shape, dtype = shapes.pop(), dtypes.pop()
            if len(present) == len(values):
                return _tensor(np.stack(present)), None
            out = np.zeros((len(values),) + shape, dtype)
            if dtype.kind == "f":
                out[...] = np.nan
            mask = np.zeros((len(values),) + shape, bool)
            for j, v in enumerate(values):
                if v is not None:
                    out[j], mask[j] = v, True
            return _tensor(out), torch.from_numpy(mask)
    return [_tensor(v) if isinstance(v, np.ndarray) and v.dtype.kind in _NUMERIC else v for v in values], None


def collate_into(batch: dict[str, Any], name: str, values: Sequence[Any]) -> None:
    """Put one column's collated values (and its mask, if any) into ``batch``."""
    value, mask = collate_values(values)
    batch[name] = value
    if mask is not None:
        batch[name + VALID_SUFFIX] = mask


def collate(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``collate_fn`` for a plain DataLoader over samplecache samples (dicts)."""
    out: dict[str, Any] = {}
    if not samples:
        return out
    for name in samples[0]:
        collate_into(out, name, [s[name] for s in samples])
    return out
