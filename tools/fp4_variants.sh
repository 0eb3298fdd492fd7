#!/bin/bash
# fp4_variants.sh -- the FP4 kernels built with different knobs, each build's fp4bench run on the same GPU,
# builds interleaved run by run (docs/fp4.md: how the FP4 knob defaults were chosen). From the repository
# root, on a GPU machine with cmake, ninja, nvcc and torch:
#   VARIANTS="before=-DKVX_FP4_BULK_NV_LITE=0 unroll2=-DKVX_FP4_BULK_SB_UNROLL=2" \
#   BENCH_ARGS="--formats nvfp4,mxfp4 --io f16,bf16" REPS=3 bash tools/fp4_variants.sh
# The tree itself is installed by pip (`inst`, the defaults); VARIANTS: name=flag,flag ... (the flags
# become CMAKE_CUDA_FLAGS of a CMake build in /tmp/kvx-fp4-variants/NAME); BENCH_ARGS: fp4bench's options
# (default: every format and IO dtype); REPS: runs per build (default 2). Prints each run's rows, % of
# that run's roofline, and the roofline line; a row's "mismatches" must read 0.
set -u
export PYTHONUNBUFFERED=1
B=${BUILD_ROOT:-/tmp/kvx-fp4-variants}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
( python3 -m pip install -q --no-build-isolation --no-deps --config-settings=cmake.define.KVX_CUDA_ARCHITECTURES=${ARCH:-90} . \
    > "$B-install.log" 2>&1 || echo "install failed: $B-install.log" ) &
for v in ${VARIANTS:-}; do
  n=${v%%=*}; f=${v#*=}; f=${f//,/ }
  ( cmake -S . -B "$B/$n" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVX_CUDA_ARCHITECTURES=${ARCH:-90} "-DCMAKE_CUDA_FLAGS=$f" \
      > "$B-$n.log" 2>&1 && cmake --build "$B/$n" -j 8 --target kvx_reference >> "$B-$n.log" 2>&1 ||
    echo "build $n failed: $B-$n.log" ) &
done
wait
LIBS="inst=$(cd /tmp && python3 -c 'from kvx_conformance.abi import native; print(native.reference_provider())')"
for v in ${VARIANTS:-}; do n=${v%%=*}; LIBS="$LIBS $n=$B/$n/native/libkvx_reference.so"; done
for rep in $(seq "${REPS:-2}"); do
  for l in $LIBS; do
    echo "--- ${l%%=*} run $rep $(date -u +%T)"
    # from /tmp: the installed package (its roofline library), not the source tree
    (cd /tmp && timeout 150 python3 -m kvx_conformance.bench.fp4bench "${l#*=}" ${BENCH_ARGS:-} 2>&1 |
      grep -E "write|gather|roofline|rror")
  done
done
