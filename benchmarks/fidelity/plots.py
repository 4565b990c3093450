"""The plots of ``benchmarks.fidelity`` (matplotlib, the ``bench`` extra): validation accuracy against steps for
the three modes (mean over seeds, a band of one standard deviation), and the cache mode's coverage of the remote
set and epoch sizes."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np


def missing() -> str | None:
    """None when matplotlib can be imported, else what to install."""
    if importlib.util.find_spec("matplotlib") is None:
        return "matplotlib not installed; install: .venv/bin/pip install -e '.[bench]'"
    return None


def plot(report: dict[str, Any], out: Path) -> list[str]:
    """Writes fidelity-accuracy.png and fidelity-cache.png under ``out``; returns their names."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    for m, color in zip("abc", ("tab:blue", "tab:green", "tab:red")):
        name = report["modes"][m]["name"]
        runs = report["modes"][m]["runs"]
        steps = np.array([s for s, _ in runs[0]["history"]])
        acc = np.array([[a for _, a in r["history"]] for r in runs]) * 100
        mean, std = acc.mean(0), acc.std(0, ddof=1 if len(runs) > 1 else 0)
        ax.plot(steps, mean, color=color, label=f"({m}) {name}")
        ax.fill_between(steps, mean - std, mean + std, color=color, alpha=0.2, linewidth=0)
    ax.axhline(report["bayes_accuracy"] * 100, color="gray", linestyle="--", label="Bayes accuracy")
    ax.set(xlabel="optimizer step", ylabel="validation accuracy (%)",
           title=f"mean over {len(report['seeds'])} seeds (band: ±1 std)")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    names = ["fidelity-accuracy.png", "fidelity-cache.png"]
    fig.savefig(out / names[0])
    plt.close(fig)

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5.5), dpi=100, sharex=True)
    n = report["dataset"]["samples"]
    for k, r in enumerate(report["modes"]["b"]["runs"]):
        ep, color = [e for e in r["epochs"] if e["complete"]], f"C{k}"
        steps = [e["step"] + e["samples"] / report["batch"] for e in ep]
        top.plot(steps, [e["seen_fraction"] * 100 for e in ep], color=color,
                 label=f"seen in training, seed {r['seed']}")
        top.plot(steps, [(e["daemon_row_fraction"] or 0) * 100 for e in ep], color=color, linestyle=":",
                 label=f"sampled by the daemon, seed {r['seed']}")
        bottom.step([e["step"] for e in ep], [e["samples"] / n * 100 for e in ep], where="post", color=color,
                    label=f"seed {r['seed']}")
    top.set(ylabel="% of the remote set", title="(b): coverage of the remote set (at each epoch's end)")
    top.legend(fontsize=7, ncol=2)
    top.grid(alpha=0.3)
    bottom.axhline(report["dataset"]["budget_fraction"] * 100, color="gray", linestyle="--", label="budget")
    bottom.set(xlabel="optimizer step", ylabel="epoch size (% of the set)", title="(b): samples per epoch")
    bottom.legend(fontsize=7)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / names[1])
    plt.close(fig)
    return names
