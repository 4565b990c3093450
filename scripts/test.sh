#!/usr/bin/env bash
# The test suite, from a fresh clone: installs what it needs, then runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v systemd-analyze >/dev/null 2>&1; then
  # the unit-file tests use systemd-analyze (Debian package systemd)
  (apt-get update -qq && apt-get install -y -qq systemd >/dev/null) || echo "warning: could not install systemd" >&2
fi
if ! command -v ip >/dev/null 2>&1; then
  # tests/e2e/test_multinode.py makes network namespaces (Debian package iproute2)
  (apt-get update -qq && apt-get install -y -qq iproute2 >/dev/null) || echo "warning: could not install iproute2" >&2
fi
if ! command -v chromium >/dev/null 2>&1; then
  # tests/e2e/test_status_page.py and tests/e2e/test_docs_offline.py render pages in headless Chromium (Debian package chromium)
  (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "warning: could not install chromium" >&2
fi
if ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
  # tests/deploy/test_container.py builds the image on a base made from Debian packages and runs it
  # (runc: crun refuses hybrid cgroup v1+v2 hosts)
  (apt-get update -qq && apt-get install -y -qq podman runc debootstrap >/dev/null) || echo "warning: could not install podman" >&2
fi
if command -v podman >/dev/null 2>&1; then
  export SAMPLECACHE_TEST_PODMAN=require  # installed: the container tests must run, not skip
fi
bash scripts/setup.sh test
# tests/client/test_tf.py: samplecache.tf needs TensorFlow, the `tf` extra (tensorflow-cpu: ~25 s; leaves numpy and torch be)
PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install -q -e ".[tf]"
# tests/client/test_arrays.py runs the README's JAX example on CPU: the `jax` extra (jax + jaxlib + scipy, ~0.5 GB,
# ~30 s; leaves numpy and torch be)
PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install -q -e ".[jax]"
# tests/bench/test_fidelity.py: benchmarks/fidelity/plots.py draws the plots with matplotlib, the `bench` extra
PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install -q -e ".[bench]"
# tests/client/test_dali.py: samplecache.dali needs NVIDIA DALI, the `dali` extra (nvidia-dali-cuda120, a 425 MB wheel that
# runs CPU-only pipelines too: ~30 s; leaves numpy and torch be)
PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install -q -e ".[dali]"
# tests/e2e/test_e2e_lake.py reads a dataset Spark wrote: pyspark (~300 MB; the JVM, Java 17, comes with the image's
# JDK), then required, not skipped
if PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install -q "pyspark>=4.0,<5"; then
  export SAMPLECACHE_TEST_SPARK=require
else
  echo "warning: could not install pyspark; the Spark test will skip" >&2
fi
# the peers of the benchmark suite (its CI smoke run verifies every loader row); never fatal
bash benchmarks/install_peers.sh || echo "warning: benchmark peers not installed; their rows will say so" >&2
# A private temp dir for the run, which must be empty at the end: tests keep their files under their own dirs and
# pytest removes its base temp dir after a run that passed (a failed run keeps the failed tests' tmp_path).
run_tmp="$(mktemp -d "${TMPDIR:-/tmp}/samplecache-tests.XXXXXX")"
code=0
TMPDIR="$run_tmp" .venv/bin/python -m pytest -q "$@" || code=$?
if [ "$code" -ne 0 ]; then
  echo "tests failed; their temp files are in $run_tmp" >&2
elif [ -n "$(ls -A "$run_tmp")" ]; then
  echo "FAILED: the test run left files in its temp dir (TMPDIR):" >&2
  (cd "$run_tmp" && find . -mindepth 1 -maxdepth 3 | sort | head -50) >&2
  rm -rf "$run_tmp"
  code=1
else
  rmdir "$run_tmp"
fi
exit "$code"
