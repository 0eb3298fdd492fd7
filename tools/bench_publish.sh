#!/bin/bash
# bench_publish.sh -- the published bandwidth report (docs/benchmarks.md), on a GPU machine.
# From the repository root:  OUT=/tmp/pub bash tools/bench_publish.sh
# Builds the package (CUDA backend included), runs the bench preset (default standard) twice on
# device memory with the bundled reference, renders run 1's report with the run-to-run agreement
# table against run 2, and prints the agreement on large cases.
set -u
OUT=${OUT:-/tmp/kvx-bench-publish}
PY=${PYTHON:-python3}
PRESET=${PRESET:-standard}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit --format=csv
t0=$SECONDS
CMAKE_BUILD_PARALLEL_LEVEL=16 $PY -m pip install -q --no-build-isolation --no-deps -e . -C build-dir=/tmp/kvx-bench-build \
  >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "build: $((SECONDS - t0)) s; CUDA: $($PY -c 'from kvx_conformance.abi import native; print(native.have_cuda())')"
rc=0
for i in 1 2; do
  t1=$SECONDS
  $PY -m kvx_conformance.cli bench --preset "$PRESET" --memory device --output-dir "$OUT/run$i" \
    --label "run $i of 2" >"$OUT/run$i.log" 2>&1
  r=$?; [ $r = 0 ] || rc=$r
  echo "run $i: exit $r, $((SECONDS - t1)) s"; tail -n 7 "$OUT/run$i.log"
done
$PY -m kvx_conformance.bench.report "$OUT/run1/results.json" --second "$OUT/run2/results.json" \
  -o "$OUT/run1/bench.html" >/dev/null
$PY -m kvx_conformance.cli compare "$OUT/run1/results.json" "$OUT/run2/results.json" --agreement \
  --min-bytes 256e6 | tail -n 3
if [ "${UNIFIED:-1}" = 1 ]; then  # a smoke run of the unified-memory path (quick preset, a few cases)
  $PY -m kvx_conformance.cli bench --preset quick --memory unified --output-dir /tmp/kvx-bench-unified \
    --filter 'write-nhd-f16-*' --filter 'gather-hnd-f16-t512-*' >"$OUT/unified.log" 2>&1
  echo "unified smoke: exit $?"; tail -n 4 "$OUT/unified.log"
fi
exit $rc
