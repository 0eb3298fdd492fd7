#!/bin/bash
# GPU check of the FP4 CUDA kernels (docs/fp4.md "CUDA figures"): run on the device machine
# from the repository root after building here
#   cmake -S . -B build/fp4 -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVX_CUDA_ARCHITECTURES=90
#   cmake --build build/fp4 --target kvx_reference
# (carry build/fp4/native). Bench against the copy roofline, the FP4 GPU tests, the fp4 and
# fp4_exact profiles on DEVICE memory. BUILDS="fp4 other" benches several builds; TESTS="fp4 other"
# runs the correctness checks on several (default: the first of BUILDS); EXTRA_FUZZ=N adds N more
# random cases of tests/test_fp4_fuzz.py on DEVICE memory to each. E4M3CHECK=1 first checks the
# hardware E4M3 conversion of fp4_fast.h's e4m3_sat (sm_89+) against convert.h's f32_to_e4m3 on
# every finite FP32 >= 0 (built with nvcc there; E4M3CHECK=path runs that binary, built here by
# `E4M3SRC=/tmp/e4m3check.cu bash tools/fp4_gpu_check.sh` and
# `nvcc -O2 -arch=sm_90 -Icsrc/reference -Icsrc/include /tmp/e4m3check.cu -o BIN`).
set -u
e4m3_src() {
cat > "$1" <<'CU'
#include <stdio.h>
#include <stdint.h>
#include "cuda/fp4_fast.h"
/* every finite FP32 w >= 0: the hardware form of e4m3_sat against f32_to_e4m3(min(w, 448)) */
__global__ void check(unsigned long long* bad, unsigned* first) {
  for (unsigned long long u = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; u < 0x7F800000ull;
       u += (unsigned long long)gridDim.x * blockDim.x) {
    const float w = __uint_as_float((unsigned)u);
    const unsigned want = kvx_ref::f32_to_e4m3(w < 448.0f ? w : 448.0f);
    if (kvx_fp4_fast::e4m3_sat(w) != want && atomicAdd(bad, 1ull) < 8) atomicMin(first, (unsigned)u);
  }
}
int main() {
  unsigned long long* bad; unsigned* first;
  cudaMallocManaged(&bad, 8); cudaMallocManaged(&first, 4); *bad = 0; *first = 0xFFFFFFFFu;
  cudaDeviceProp p; cudaGetDeviceProperties(&p, 0);
  check<<<p.multiProcessorCount * 8, 256>>>(bad, first);
  const cudaError_t e = cudaDeviceSynchronize();
  printf("e4m3_sat (hardware, sm_%d%d): %u finite FP32 >= 0, %llu mismatches (first %08x), %s\n", p.major, p.minor,
         0x7F800000u, *bad, *first, cudaGetErrorString(e));
  return e != cudaSuccess || *bad ? 1 : 0;
}
CU
}
if [ -n "${E4M3SRC:-}" ]; then e4m3_src "$E4M3SRC"; exit 0; fi
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
mkdir -p kvx_conformance/_native && echo "HAVE_CUDA = True" > kvx_conformance/_native/__init__.py
ln -sfn ../reference_impl kvx_conformance/reference_impl; ln -sfn ../suites kvx_conformance/suites
export PYTHONPATH=$PWD
if [ -n "${E4M3CHECK:-}" ]; then
  echo "=== hardware E4M3 conversion (fp4_fast.h e4m3_sat) $(date -u +%T)"
  bin=$E4M3CHECK
  if [ ! -x "$bin" ]; then
    e4m3_src /tmp/e4m3check.cu; bin=/tmp/e4m3check
    nvcc -O2 -arch=sm_90 -Icsrc/reference -Icsrc/include /tmp/e4m3check.cu -o $bin
  fi
  timeout 60 $bin; echo "exit $?"
fi
for b in ${BUILDS:-fp4}; do
  echo "=== fp4bench build/$b $(date -u +%T)"
  KVX_CONFORM_NATIVE_DIR=build/$b/native timeout 150 python3 -m kvx_conformance.bench.fp4bench \
    build/$b/native/libkvx_reference.so --json $OUT/fp4bench_$b.json > /tmp/bench_$b.log 2>&1
  echo "exit $?"; tail -10 /tmp/bench_$b.log
done
b=${BUILDS:-fp4}; b=${b%% *}
for b in ${TESTS:-$b}; do  # TESTS="a b": the correctness checks on several builds (default: the first bench build)
echo "=== pytest FP4 tests, build/$b $(date -u +%T)"
KVX_CONFORM_NATIVE_DIR=build/$b/native timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider \
  tests/test_fp4_provider.py tests/test_fp4_fuzz.py > /tmp/pytest_$b.log 2>&1
echo "exit $?"; tail -3 /tmp/pytest_$b.log
echo "=== kvx-conform run --profile fp4 --profile fp4_exact --memory device, build/$b $(date -u +%T)"
rm -rf /tmp/suite_$b
KVX_CONFORM_NATIVE_DIR=build/$b/native timeout 200 python3 -m kvx_conformance.cli run build/$b/native/libkvx_reference.so \
  --memory device --profile fp4 --profile fp4_exact -n 8 --progress none --output-dir /tmp/suite_$b > /tmp/suite_$b.log 2>&1
echo "exit $? (1 is expected: the core profile is not run; see the profiles)"
SUITE=/tmp/suite_$b python3 - <<'PY'
import json, collections, os
r = json.load(open(os.environ["SUITE"] + '/results.json')); t = r["tests"]
print(dict(collections.Counter(x["outcome"] for x in t)), {k: v["verdict"] for k, v in r["profiles"].items()})
for x in t:
    if x["outcome"] not in ("pass", "skip", "unsupported"):
        print("  ", x["outcome"], x["id"], x["message"][:300].replace("\n", " | "))
PY
if [ "${EXTRA_FUZZ:-0}" -gt 0 ]; then  # EXTRA_FUZZ=N: tests/test_fp4_fuzz.py's cases 60 .. 59+N on DEVICE memory too
echo "=== $EXTRA_FUZZ more random cases on DEVICE memory, build/$b $(date -u +%T)"
KVX_CONFORM_NATIVE_DIR=build/$b/native timeout 200 python3 - <<'PY'
import os, sys
sys.path.insert(0, "tests")
from test_fp4_fuzz import _case
from kvx_conformance.abi import native
from kvx_conformance.abi.header import Memory
from kvx_conformance.abi.loader import load_provider
prov = load_provider(native.reference_provider())
n = int(os.environ["EXTRA_FUZZ"]); bad = []
for seed in range(60, 60 + n):
    bad += _case(prov, seed, Memory.DEVICE)
print(f"cases 60..{59 + n} on DEVICE memory: {len(bad)} problems"); print("\n".join(bad[:10]))
PY
echo "exit $?"
fi
done
echo "=== done $(date -u +%T)"
