"""The README's Hugging Face image snippet: its transform, run on images of different sizes (as a real dataset has),
gives samples that torch's default collation stacks into one batch. No daemon needed: the transform is the part
that decides the shapes."""

from __future__ import annotations

import io
import re
from typing import Any, Callable

import numpy as np
import torch
from paths import REPO
from PIL import Image
from torch.utils.data import default_collate

README = REPO / "README.md"


def _readme_transform() -> Callable[[dict[str, Any]], dict[str, Any]]:
    section = README.read_text().split("### Hugging Face image datasets", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, "the README's Hugging Face section has no python example"
    # everything up to the dataset (which needs a daemon): the imports, SIZE and the transform
    head = code.group(1).split("\nds = ", 1)[0]
    scope: dict[str, Any] = {}
    exec(compile(head, str(README), "exec"), scope)  # noqa: S102 - the README's own code
    return scope["to_tensors"]  # type: ignore[no-any-return]


def _png(width: int, height: int, mode: str = "RGB") -> dict[str, Any]:
    buf = io.BytesIO()
    pixels = np.random.default_rng(width * height).integers(0, 255, (height, width, 3), np.uint8)
    Image.fromarray(pixels).convert(mode).save(buf, format="PNG")
    return {"bytes": buf.getvalue(), "path": f"{width}x{height}.png"}


def test_the_readme_transform_makes_images_of_any_size_collate() -> None:
    to_tensors = _readme_transform()
    samples = [{"image": _png(w, h, mode), "label": i} for i, (w, h, mode) in
               enumerate([(64, 48, "RGB"), (30, 90, "RGB"), (224, 224, "L"), (500, 333, "RGBA")])]
    batch = default_collate([to_tensors(s) for s in samples])
    assert batch["image"].shape == (4, 3, 224, 224) and batch["image"].dtype == torch.float32
    assert 0.0 <= float(batch["image"].min()) and float(batch["image"].max()) <= 1.0
    assert batch["label"].tolist() == [0, 1, 2, 3]
