#!/bin/bash
# Final check of the decode-sized kernels on the device machine (docs/cuda-reference.md,
# "Decode-sized calls"): one build, the native differential, the GPU tests that cover the
# changed paths, the decode preset and a filtered standard preset. From the repository root.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/final.log
mkdir -p kvx_conformance/_native && echo "HAVE_CUDA = True" > kvx_conformance/_native/__init__.py
ln -sfn ../reference_impl kvx_conformance/reference_impl; ln -sfn ../suites kvx_conformance/suites
t0=$SECONDS
cmake -S . -B build/final -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVX_CUDA_ARCHITECTURES=90 > /tmp/cfg.log 2>&1 &&
  cmake --build build/final -j 16 --target kvx_reference kvx_cuda_vs_host > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "build: $((SECONDS-t0)) s" | tee -a $OUT/final.log
export PYTHONPATH=$PWD KVX_CONFORM_NATIVE_DIR=$PWD/build/final/native
N=build/final/native
for seed in 1 4; do
  t1=$SECONDS; $N/kvx_cuda_vs_host --cases 3000 --seed $seed > /tmp/vs.log 2>&1
  echo "kvx_cuda_vs_host --cases 3000 --seed $seed: exit $? in $((SECONDS-t1)) s: $(tail -1 /tmp/vs.log)" | tee -a $OUT/final.log
done
t1=$SECONDS
python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_differential.py tests/test_fp4_provider.py tests/test_fp4_fuzz.py > /tmp/pytest.log 2>&1
echo "pytest: exit $? in $((SECONDS-t1)) s: $(tail -1 /tmp/pytest.log)" | tee -a $OUT/final.log
t1=$SECONDS
python3 -m kvx_conformance.cli bench $N/libkvx_reference.so --preset decode --memory device --no-peers \
  --output-dir $OUT/decode > /tmp/decode.log 2>&1
echo "bench --preset decode: exit $? in $((SECONDS-t1)) s" | tee -a $OUT/final.log
grep -A200 "^decode-sized calls" /tmp/decode.log > $OUT/decode-table.txt; grep -E "^(roofline|cases|floor)" /tmp/decode.log | tee -a $OUT/final.log
t1=$SECONDS
python3 -m kvx_conformance.cli bench $N/libkvx_reference.so --preset standard --memory device --no-peers --quiet \
  --output-dir /tmp/std ${STD_ARGS:-} > /tmp/std.log 2>&1
echo "bench --preset standard (filtered): exit $? in $((SECONDS-t1)) s" | tee -a $OUT/final.log
python3 - /tmp/std/results.json <<'PY' | tee -a $OUT/final.log
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["cases"]:
    p = r["impls"]["provider"]
    print(f"  {r['case']['id']:<64s} {p.get('time_s', 0) * 1e6:9.2f} us {p.get('pct_roofline', 0):6.1f}% "
          f"verified={(p.get('verified') or {}).get('ok')}")
PY
rm -f $OUT/decode/results.partial.jsonl
