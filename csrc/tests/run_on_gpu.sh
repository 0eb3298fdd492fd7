#!/bin/bash
# run_on_gpu.sh -- the CUDA reference provider's verification on a GPU machine
# (docs/cuda-reference.md). Run from the repository root:
#   bash csrc/tests/run_on_gpu.sh STEP...    (logs into $OUT, default /tmp/kvx-gpu)
# Steps: install | native | bench | suites | diff | sanitize | all
#   install   pip install -e . (builds the CUDA backend), the native test drivers,
#             and the embedded SASS/PTX list of the library
#   native    kvx_cuda_vs_host: CUDA backend vs host backend on random plans
#   bench     kvx_cuda_bench: bandwidth vs the device-to-device copy, graph replay;
#             tools/cuda_perf.py: host cost of one ctypes call
#   suites    kvx-conform run --memory device, then --memory unified
#   diff      tests/test_cuda_differential.py (CUDA vs host backend vs oracle)
#   sanitize  compute-sanitizer memcheck over kvx_cuda_vs_host and a suite run
set -u
OUT=${OUT:-/tmp/kvx-gpu}   # what to keep: bench/ctypes logs, results.json of the suite runs
LOG=${KVX_GPU_LOGS:-/tmp/kvx-gpu-logs}  # everything else
mkdir -p "$OUT" "$LOG"
export PYTHONUNBUFFERED=1
B=${KVX_GPU_BUILD:-/tmp/kvx-gpu-build}
PY=${PYTHON:-python3}
BIN=$(dirname "$(command -v $PY)")
fail=0
step() { echo; echo "=== $* ($(date -u +%T))"; }
note() { if [ "$1" != 0 ]; then echo "!!! $2 exited $1"; fail=1; fi; }

do_install() {
  step install
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -1
  $PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
  local t0=$SECONDS
  CMAKE_BUILD_PARALLEL_LEVEL=16 $PY -m pip install -q --no-build-isolation --no-deps -e . -C build-dir=$B \
    >"$LOG/install.log" 2>&1
  local rc=$?
  note $rc "pip install"
  [ $rc = 0 ] || { tail -40 "$LOG/install.log"; return 1; }
  echo "pip install -e . took $((SECONDS - t0)) s"
  cmake --build $B --target kvx_cuda_vs_host kvx_cuda_bench -j 16 >"$LOG/build_tests.log" 2>&1
  note $? "building the test drivers" || tail -30 "$LOG/build_tests.log"
  $PY -c "from kvx_conformance.abi import native; print('HAVE_CUDA', native.have_cuda(), native.reference_provider())"
  local lib
  lib=$($PY -c "from kvx_conformance.abi import native; print(native.reference_provider())")
  cuobjdump --list-elf --list-ptx "$lib" | sed 's/.*\.\(sm_[0-9a-z]*\)\.\(cubin\|ptx\)/\1 \2/' | sort | uniq -c
}

do_native() {
  step "kvx_cuda_vs_host --cases ${VS_CASES:-4000}"
  $B/native/kvx_cuda_vs_host --cases ${VS_CASES:-4000} --seed 1 >"$OUT/native.log" 2>&1
  local rc=$?
  tail -25 "$OUT/native.log"
  return $rc
}

do_bench() {
  step kvx_cuda_bench
  $B/native/kvx_cuda_bench 2>&1 | tee "$OUT/bench.log" | tail -80
  note ${PIPESTATUS[0]} kvx_cuda_bench
  step "tools/cuda_perf.py (ctypes host cost)"
  $PY tools/cuda_perf.py 2>&1 | tee "$OUT/ctypes.log"
  note ${PIPESTATUS[0]} cuda_perf.py
}

do_suites() {
  for mem in ${SUITE_MEMORIES:-device unified}; do
    step "kvx-conform run --memory $mem"
    local t0=$SECONDS
    $BIN/kvx-conform run --memory $mem -n ${WORKERS:-8} --progress none --output-dir "$LOG/suite-$mem" \
      >"$LOG/suite-$mem.log" 2>&1
    local rc=$?
    note $rc "suite $mem"
    echo "exit $rc after $((SECONDS - t0)) s"
    tail -15 "$LOG/suite-$mem.log"
    cp "$LOG/suite-$mem/results.json" "$OUT/suite-$mem.json" 2>/dev/null
    $PY - "$LOG/suite-$mem/results.json" <<'PY'
import json, sys, collections
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("no results.json:", e); sys.exit()
tests = r.get("tests", r if isinstance(r, list) else [])
c = collections.Counter(t.get("outcome") for t in tests)
print("verdict:", r.get("verdict"), "certifying:", r.get("certifying"), "outcomes:", dict(c))
for t in tests:
    if t.get("outcome") not in ("pass", "passed", "skip", "skipped", "unsupported", "waived", "not_applicable"):
        print(" ", t.get("outcome"), t.get("id") or t.get("nodeid"), (t.get("message") or t.get("longrepr") or "")[:600].replace("\n", " | "))
PY
  done
}

do_diff() {
  step "pytest tests/test_cuda_differential.py"
  $PY -m pytest tests/test_cuda_differential.py -q -n ${WORKERS:-8} -p no:cacheprovider 2>&1 | tail -30
  note ${PIPESTATUS[0]} test_cuda_differential
}

do_sanitize() {
  step "compute-sanitizer memcheck: kvx_cuda_vs_host --cases ${SAN_CASES:-600}"
  timeout ${SAN_NATIVE_TIMEOUT:-150} compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 \
    $B/native/kvx_cuda_vs_host --cases ${SAN_CASES:-600} --seed 7 >"$LOG/san-native.log" 2>&1
  note $? "sanitizer native"
  grep -E "ERROR SUMMARY|kvx_cuda_vs_host:" "$LOG/san-native.log" | tail -3
  step "compute-sanitizer memcheck: kvx-conform run --memory device ${SAN_SUITE_ARGS:-}"
  # torch without its caching allocator: every buffer its own cudaMalloc, so
  # memcheck sees each buffer's true bounds (the harness guards see the rest).
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${SAN_SUITE_TIMEOUT:-400} compute-sanitizer --tool memcheck --leak-check no --target-processes all \
    --error-exitcode 9 $BIN/kvx-conform run --memory device -n ${WORKERS:-8} --progress none --timeout 300 \
    --output-dir "$LOG/san-suite" ${SAN_SUITE_ARGS:-} >"$LOG/san-suite.log" 2>&1
  note $? "sanitizer suite"
  grep -cE "^========= (Invalid|Program hit|Out-of-range)" "$LOG/san-suite.log" | sed 's/^/memcheck error lines: /'
  grep -E "ERROR SUMMARY" "$LOG/san-suite.log" | sort | uniq -c | head
  grep -E "^=========" "$LOG/san-suite.log" | grep -v "ERROR SUMMARY\|COMPUTE-SANITIZER" | head -20
  tail -6 "$LOG/san-suite.log"
  cp "$LOG/san-suite/results.json" "$OUT/san-suite.json" 2>/dev/null
  grep -E "^=========" "$LOG/san-suite.log" | head -400 >"$OUT/san-suite-errors.log"
}

steps=("$@")
[ ${#steps[@]} = 0 ] && steps=(all)
for s in "${steps[@]}"; do
  case $s in
    all) do_install && { do_native; note $? kvx_cuda_vs_host; do_bench; do_suites; do_diff; do_sanitize; } ;;
    install) do_install ;;
    native) do_native; note $? kvx_cuda_vs_host ;;
    bench) do_bench ;;
    suites) do_suites ;;
    diff) do_diff ;;
    sanitize) do_sanitize ;;
    *) echo "unknown step $s"; fail=1 ;;
  esac
done
echo; echo "=== done, fail=$fail"
exit $fail
