"""Decoding image cells (Hugging Face ``Image()``: ``{"bytes": ..., "path": ...}``) for training.

``decode_image`` is a ``transform``-friendly helper: PIL when installed, else torchvision's
``decode_image`` when installed; a clear ImportError names both when neither is.
"""

from __future__ import annotations

import io
from typing import Any, Mapping

import numpy as np


def image_bytes(cell: Any) -> bytes:
    """The encoded bytes of an image cell: a ``{"bytes", "path"}`` dict (Hugging Face) or bytes."""
    if isinstance(cell, Mapping):
        raw = cell.get("bytes")
        if raw is None:
            raise ValueError(f"image cell has no bytes (path {cell.get('path')!r}): samplecache serves the "
                             f"remote's cells; an image stored by path only is not in the dataset")
        return bytes(raw)
    if isinstance(cell, (bytes, bytearray, memoryview)):
        return bytes(cell)
    raise TypeError(f"not an image cell: {type(cell).__name__}")


def decode_image(cell: Any, mode: str | None = "RGB") -> np.ndarray:
    """An image cell as an (H, W, C) uint8 array (``mode`` as PIL's ``convert``; None keeps the file's)."""
    raw = image_bytes(cell)
    try:
        from PIL import Image
    except ImportError:
        Image = None  # noqa: N806
    if Image is not None:
        with Image.open(io.BytesIO(raw)) as im:
            im = im.convert(mode) if mode else im
            arr = np.asarray(im)
        return arr if arr.ndim == 3 else arr[:, :, None]
    try:
        import torch
        from torchvision.io import ImageReadMode
        from torchvision.io import decode_image as tv_decode
    except ImportError:
        raise ImportError("decode_image needs Pillow (pip install pillow) or torchvision") from None
    read_mode = ImageReadMode.RGB if mode == "RGB" else ImageReadMode.UNCHANGED
    out = tv_decode(torch.frombuffer(bytearray(raw), dtype=torch.uint8), mode=read_mode)
    return out.permute(1, 2, 0).numpy()
