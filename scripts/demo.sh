#!/usr/bin/env bash
# The main job: the daemon on the embedded dataset, with the demo training loop.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh s3
exec .venv/bin/samplecache demo "$@"
