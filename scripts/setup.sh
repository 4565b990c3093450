#!/usr/bin/env bash
# Creates .venv and installs samplecache with the given extras (default: test).
# The pinned CPU torch goes in first, so that nothing pulls a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q torch==2.13.0
# setuptools notes every editable install of this layout (client/ and service/ mapped to samplecache.*) with an
# "Editable installation" box that pip shows even with -q: known and harmless here, so filtered by its message
PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install -q -e ".[${extras}]"
