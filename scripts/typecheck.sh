#!/usr/bin/env bash
# mypy --strict over the daemon (samplecache.service) and the wire format (samplecache.record, .nested).
# The package maps client/ -> samplecache and service/ -> samplecache.service, which mypy cannot follow through
# the editable install: it checks a tree of links with the installed layout instead (build/typecheck, ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[[ "$PY" = /* ]] || PY="$PWD/$PY"  # not realpath: a venv's python is a link to the base interpreter
tree=build/typecheck
rm -rf "$tree"
mkdir -p "$tree/samplecache"
for f in client/*.py; do ln -s "$PWD/$f" "$tree/samplecache/$(basename "$f")"; done
ln -s "$PWD/service" "$tree/samplecache/service"
cd "$tree"
"$PY" -m mypy --strict --ignore-missing-imports --follow-imports=silent --cache-dir=../mypy-cache --config-file=../../pyproject.toml \
    -p samplecache.service -m samplecache.record -m samplecache.nested
