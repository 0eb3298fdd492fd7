#!/bin/bash
# final GPU verification of the tree (docs/cuda-reference.md, "Final verification"):
# run on the device machine from the repository root after building build/final here:
#   cmake -S . -B build/final -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVX_CUDA_ARCHITECTURES=90
#   cmake --build build/final && cmake --build build/final --target kvx_cuda_vs_host
# suites on DEVICE + UNIFIED, GPU tests, native differential, memcheck over the remaining profiles
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
N=$PWD/build/final/native
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
mkdir -p kvx_conformance/_native && echo "HAVE_CUDA = True" > kvx_conformance/_native/__init__.py
ln -sfn ../reference_impl kvx_conformance/reference_impl; ln -sfn ../suites kvx_conformance/suites
export PYTHONPATH=$PWD KVX_CONFORM_NATIVE_DIR=$N
python3 -c "import kvx_conformance, torch; from kvx_conformance.abi import native; print(kvx_conformance.__file__, torch.__version__, native.have_cuda())"
summ() { python3 - "$1" <<'PY'
import json, sys, collections
r = json.load(open(sys.argv[1])); t = r["tests"]
print("verdict:", r["verdict"], dict(collections.Counter(x["outcome"] for x in t)))
print("profiles:", {k: v["verdict"] for k, v in r["profiles"].items()})
for x in t:
    if x["outcome"] not in ("pass", "skip", "unsupported"):
        print("  ", x["outcome"], x["level"], x["id"], x["message"][:300].replace("\n", " | "))
PY
}
for mem in device unified; do
  echo "=== kvx-conform run --memory $mem $(date -u +%T)"; t0=$SECONDS
  python3 -m kvx_conformance.cli run --memory $mem -n 8 --progress none --output-dir /tmp/suite-$mem > /tmp/suite-$mem.log 2>&1
  echo "exit $? after $((SECONDS-t0)) s"; tail -4 /tmp/suite-$mem.log; summ /tmp/suite-$mem/results.json
  cp /tmp/suite-$mem/results.json $OUT/suite-$mem.json
done
echo "=== pytest GPU tests $(date -u +%T)"; t0=$SECONDS
python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_differential.py tests/test_fp4_provider.py tests/test_fp4_fuzz.py tests/test_model_paged.py tests/test_adapters_common.py > $OUT/pytest.log 2>&1
echo "exit $? after $((SECONDS-t0)) s"; tail -4 $OUT/pytest.log
echo "=== kvx_cuda_vs_host --cases 3000 $(date -u +%T)"; t0=$SECONDS
$N/kvx_cuda_vs_host --cases 3000 --seed 1 > /tmp/vs.log 2>&1; echo "exit $? after $((SECONDS-t0)) s"; tail -3 /tmp/vs.log
echo "=== memcheck: kvx_cuda_vs_host --cases 400 $(date -u +%T)"; t0=$SECONDS
compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 $N/kvx_cuda_vs_host --cases 400 --seed 7 > /tmp/vsan.log 2>&1
echo "exit $? after $((SECONDS-t0)) s"; grep -E "ERROR SUMMARY" /tmp/vsan.log; tail -1 /tmp/vsan.log
SAN_PROFILES=${SAN_PROFILES:-concurrency generated engines fp4 fp4_exact}
echo "=== memcheck: suite profiles $SAN_PROFILES on DEVICE $(date -u +%T)"; t0=$SECONDS
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${SAN_T:-200} compute-sanitizer --tool memcheck --leak-check no --target-processes all --error-exitcode 9 \
  python3 -m kvx_conformance.cli run --memory device -n 8 --progress none --timeout 300 --output-dir /tmp/san \
  $(for x in $SAN_PROFILES; do printf -- '--profile %s ' $x; done) > /tmp/san.log 2>&1
echo "exit $? after $((SECONDS-t0)) s"
grep -E "ERROR SUMMARY" /tmp/san.log | sort | uniq -c | head; grep -cE "^========= (Invalid|Program hit|Out-of-range)" /tmp/san.log
grep -E "^=========" /tmp/san.log | grep -v "ERROR SUMMARY\|COMPUTE-SANITIZER" | head -10; tail -5 /tmp/san.log
[ -f /tmp/san/results.json ] && { summ /tmp/san/results.json; cp /tmp/san/results.json $OUT/san.json; }
if [ -x $N/kvx_cuda_bench ]; then
  echo "=== kvx_cuda_bench $(date -u +%T)"; t0=$SECONDS
  $N/kvx_cuda_bench > $OUT/bench.txt 2>&1; echo "exit $? after $((SECONDS-t0)) s"; grep -E "summary|copy 1024" $OUT/bench.txt
fi
echo "=== tools/cuda_perf.py (decode-sized calls through ctypes) $(date -u +%T)"; t0=$SECONDS
timeout 120 python3 tools/cuda_perf.py --provider $N/libkvx_reference.so > $OUT/cuda_perf.txt 2>&1
echo "exit $? after $((SECONDS-t0)) s"; tail -12 $OUT/cuda_perf.txt
echo "=== fp4bench $(date -u +%T)"; t0=$SECONDS
timeout 200 python3 -m kvx_conformance.bench.fp4bench $N/libkvx_reference.so --json $OUT/fp4bench.json > /tmp/fp4bench.log 2>&1
echo "exit $? after $((SECONDS-t0)) s"; tail -12 /tmp/fp4bench.log
echo "=== done $(date -u +%T)"
