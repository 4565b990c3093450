#!/usr/bin/env bash
# Installs the peers of the benchmark suite (python -m benchmarks.suite) into .venv (or $PYTHON)
# without touching its torch.
#
# mosaicml-streaming and litdata require torchvision, and every torchvision wheel pins a torch
# other than the pinned CPU torch==2.13.0 (pip would replace it). So: the `peers` extra
# (webdataset and the runtime deps of the other two, none of which needs torch), then the two
# packages themselves with --no-deps. The suite never imports torchvision (see benchmarks/suite/peers.py).
# Runs from any directory: it works in the repository root, where the package benchmarks is importable.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
torch_before="$("$py" -c 'import torch; print(torch.__version__)')"
PYTHONWARNINGS="ignore:Editable installation" "$py" -m pip install -q -e ".[peers]"  # no setuptools box (see scripts/setup.sh)
"$py" -m pip install -q --no-deps "mosaicml-streaming==0.13.0" "litdata==0.2.76"
torch_after="$("$py" -c 'import torch; print(torch.__version__)')"
if [ "$torch_before" != "$torch_after" ]; then
  echo "install_peers.sh: torch changed from $torch_before to $torch_after" >&2
  exit 1
fi
"$py" - <<'PY'
import sys
from benchmarks.harness import missing, versions
bad = {p: missing(p) for p in ("streaming", "litdata", "webdataset")}
bad = {p: why for p, why in bad.items() if why}
if bad:
    sys.exit(f"install_peers.sh: peers still missing: {bad}")
print("peers installed:", versions(("mosaicml-streaming", "litdata", "webdataset")))
PY
