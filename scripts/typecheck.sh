#!/usr/bin/env bash
# mypy --strict over the daemon (samplecache_service) and the wire format (samplecache.format): both are src-style
# packages under service/ and client/, so mypy follows every import to its file.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
MYPYPATH=client:service "$PY" -m mypy --strict --ignore-missing-imports --follow-imports=silent \
    --cache-dir=build/mypy-cache -p samplecache_service -p samplecache.format
