"""The demo's chart (matplotlib, the ``demo`` extra that ``scripts/demo.sh`` installs): per epoch, the samples it
trained on (those the previous epoch had, and the new ones) against the cache's size, and below, the daemon's
coverage of the remote, the share of the remote that training has seen, and the validation accuracy."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from samplecache_tools.demo import EpochLine


def missing() -> str | None:
    """None when matplotlib can be imported, else what to install."""
    if importlib.util.find_spec("matplotlib") is None:
        return "matplotlib is not installed; install: .venv/bin/pip install -e '.[demo]'"
    return None


def draw(history: Sequence[EpochLine], remote_samples: int, title: str, out: Path) -> None:
    """Writes the chart of ``history`` (the demo's epochs over a remote of ``remote_samples``) to ``out``, a PNG."""
    import matplotlib
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    epochs = [h.epoch for h in history]
    kept = [h.samples - h.new for h in history]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), dpi=100, sharex=True)
    top.bar(epochs, kept, color="tab:blue", label="samples the previous epoch had")
    top.bar(epochs, [h.new for h in history], bottom=kept, color="tab:orange", label="new samples")
    top.plot(epochs, [h.cache_samples for h in history], color="black", marker="o",
             label="samples in the cache at the epoch's end")
    for h in history:
        if h.evicted:
            top.annotate(f"{h.evicted} shards\nevicted", (h.epoch, h.samples), textcoords="offset points",
                         xytext=(0, 3), ha="center", fontsize=7)
    # room above the bars for the legend
    top.set(ylabel="samples", title=title, ylim=(0, 1.5 * max(h.cache_samples for h in history)))
    top.legend(fontsize=8, loc="upper left", ncol=2)
    top.grid(alpha=0.3)
    bottom.plot(epochs, [100 * (h.coverage or 0) for h in history], marker="o",
                label="remote sampled by the daemon (coverage)")
    bottom.plot(epochs, [100 * min(1.0, h.seen / remote_samples) for h in history], marker="o",
                label="remote seen in training")
    bottom.plot(epochs, [100 * h.val_acc for h in history], marker="o", label="validation accuracy")
    bottom.set(xlabel="epoch", ylabel="%", ylim=(0, 105))
    bottom.set_xticks(epochs)
    bottom.legend(fontsize=8, loc="lower right")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
