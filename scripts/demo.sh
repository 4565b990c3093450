#!/usr/bin/env bash
# The main job: the daemon on the embedded dataset, with the demo training loop.
# The demo extra: s3fs, and matplotlib for the demo's chart.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo
exec .venv/bin/samplecache demo "$@"
