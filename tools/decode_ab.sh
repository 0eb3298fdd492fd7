#!/bin/bash
# A/B of the decode-sized kernels on the device machine (docs/cuda-reference.md, "Decode-sized
# calls"): builds the reference with each knob setting named in VARIANTS (NAME=CUDA flags, comma-separated), runs
# `kvx-conform bench --preset decode --memory device` on each (ORDER: names, repeats allowed),
# then the GPU differential tests on the first build of DIFF. From the repository root.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
VARIANTS=${VARIANTS:-"old=-DKVX_CUDA_DECODE=0 new="}
ORDER=${ORDER:-"old new"}
DIFF=${DIFF:-new}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
mkdir -p kvx_conformance/_native && echo "HAVE_CUDA = True" > kvx_conformance/_native/__init__.py
ln -sfn ../reference_impl kvx_conformance/reference_impl; ln -sfn ../suites kvx_conformance/suites
t0=$SECONDS
for v in $VARIANTS; do
  n=${v%%=*}; f=${v#*=}; f=${f//,/ }
  ( cmake -S . -B build/$n -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVX_CUDA_ARCHITECTURES=90 "-DCMAKE_CUDA_FLAGS=$f" > /tmp/cfg-$n.log 2>&1 &&
    cmake --build build/$n -j 16 --target kvx_reference > /tmp/build-$n.log 2>&1 && echo "built $n" || { echo "BUILD FAILED $n"; tail -30 /tmp/build-$n.log; } ) &
done
wait
echo "builds: $((SECONDS-t0)) s"
export PYTHONPATH=$PWD
i=0
for n in $ORDER; do
  i=$((i+1)); t1=$SECONDS
  python3 -m kvx_conformance.cli bench build/$n/native/libkvx_reference.so --preset decode --memory device \
    --no-peers --quiet --output-dir /tmp/bench-$n-$i ${BENCH_ARGS:-} > /tmp/bench-$n-$i.log 2>&1
  echo "bench $n run $i: exit $? in $((SECONDS-t1)) s"; grep -E "cases|floor" /tmp/bench-$n-$i.log | head -3
  cp /tmp/bench-$n-$i/results.json $OUT/decode-$n-$i.json
done
for n in ${STD:-}; do
  t1=$SECONDS
  python3 -m kvx_conformance.cli bench build/$n/native/libkvx_reference.so --preset standard --memory device \
    --no-peers --quiet --output-dir /tmp/std-$n $STD_ARGS > /tmp/std-$n.log 2>&1
  echo "standard (filtered) $n: exit $? in $((SECONDS-t1)) s"
  python3 - /tmp/std-$n/results.json $n <<'PY' | tee -a $OUT/compare.txt
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["cases"]:
    p = r["impls"]["provider"]
    print(f"std {sys.argv[2]:6s} {r['case']['id']:<62s} {p.get('time_s', 0) * 1e6:9.2f} us {p.get('pct_roofline', 0):6.1f}% "
          f"verified={(p.get('verified') or {}).get('ok')}")
PY
done
cp /tmp/bench-$DIFF-*/bench.html $OUT/bench-$DIFF.html 2>/dev/null
args=""; i=0; for n in $ORDER; do i=$((i+1)); args="$args $n$i=$OUT/decode-$n-$i.json"; done
python3 tools/decode_compare.py $args | tee -a $OUT/compare.txt > /dev/null
if [ -n "${TESTS:-1}" ]; then
  export KVX_CONFORM_NATIVE_DIR=$PWD/build/$DIFF/native
  t1=$SECONDS; cmake --build build/$DIFF --target kvx_cuda_vs_host > /dev/null 2>&1
  build/$DIFF/native/kvx_cuda_vs_host --cases 3000 --seed 1 > /tmp/vs.log 2>&1; echo "kvx_cuda_vs_host: exit $? in $((SECONDS-t1)) s"; tail -2 /tmp/vs.log
  t1=$SECONDS; python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_differential.py > $OUT/pytest.log 2>&1
  echo "pytest differential: exit $? in $((SECONDS-t1)) s"; tail -2 $OUT/pytest.log
fi
cat $OUT/compare.txt
