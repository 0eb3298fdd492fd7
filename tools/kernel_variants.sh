#!/bin/bash
# kernel_variants.sh -- the CUDA reference built with different tuning knobs, each build timed on the
# same cases of the bench's standard preset, builds interleaved run by run (docs/cuda-reference.md,
# "Performance": how every knob default was chosen). From the repository root, on a GPU machine
# with cmake, ninja, nvcc and torch:
#   VARIANTS="base=-DKVX_NOP rows0=-DKVX_CUDA_ROWS=0 fp8u4=-DKVX_CUDA_ROWS_FP8_UNROLL=4,-DKVX_CUDA_ROWS_FP8_MIN_BLOCKS=4" \
#   CASES="write-nhd-f16-t65536-h8-d128-bs16-random-device gather-hnd-f16-t65536-h8-d128-bs16-packed-sl2048-device" \
#   OUT=/tmp/variants bash tools/kernel_variants.sh
# VARIANTS: name=flag,flag ... (the flags become CMAKE_CUDA_FLAGS; -DKVX_NOP builds the defaults);
# CASES: case ids or globs (as results.json names them: reports/h100-reference/results.json); REPS: runs per build (default "1 2");
# PRESET: the bench preset the cases come from (default standard; full has E5M2 and more token counts).
# PREBUILT=DIR: no build here; each variant's libkvx_reference.so and libkvx_bench_copy.so are taken from DIR/NAME/
# (built elsewhere with the same CMake line for sm_90 and carried to the GPU machine; VARIANTS then names them only).
# Writes $OUT/NAME-REP/results.json per run and $OUT/variants.txt: % of that run's roofline per case
# and build, "!" after a figure whose case failed verification.
set -u
OUT=${OUT:-/tmp/kvx-variants}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
# the source tree imported in place: its native libraries come from each variant's build folder
mkdir -p kvx_conformance/_native && echo "HAVE_CUDA = True" > kvx_conformance/_native/__init__.py
ln -sfn ../reference_impl kvx_conformance/reference_impl; ln -sfn ../suites kvx_conformance/suites
lib_dir() { if [ -n "${PREBUILT:-}" ]; then (cd "$PREBUILT/$1" && pwd); else echo "$PWD/build/variants/$1/native"; fi; }
for v in $VARIANTS; do
  [ -n "${PREBUILT:-}" ] && break
  n=${v%%=*}; f=${v#*=}; f=${f//,/ }
  ( cmake -S . -B build/variants/$n -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVX_CUDA_ARCHITECTURES=${ARCH:-90} \
      "-DCMAKE_CUDA_FLAGS=$f" > "$OUT/cmake-$n.log" 2>&1 &&
    cmake --build build/variants/$n -j "$(nproc)" --target kvx_reference kvx_bench_copy >> "$OUT/cmake-$n.log" 2>&1 ||
    echo "build $n failed: $OUT/cmake-$n.log" ) &
done
wait
FILT=""; for c in $CASES; do FILT="$FILT --filter $c"; done
for rep in ${REPS:-1 2}; do
  for v in $VARIANTS; do
    n=${v%%=*}
    d=$(lib_dir "$n")
    KVX_CONFORM_NATIVE_DIR=$d python3 -m kvx_conformance.cli bench \
      "$d/libkvx_reference.so" --preset "${PRESET:-standard}" --memory device --no-peers --quiet $FILT \
      --output-dir "$OUT/$n-$rep" > "$OUT/bench-$n-$rep.log" 2>&1
    echo "$n run $rep: exit $?"
  done
done
python3 - "$OUT" <<'PY' | tee "$OUT/variants.txt"
import collections, glob, json, os, sys
root = sys.argv[1]
table, names = collections.defaultdict(dict), []
for d in sorted(glob.glob(os.path.join(root, "*-[0-9]*"))):
    name = os.path.basename(d).rsplit("-", 1)[0]
    if not os.path.exists(os.path.join(d, "results.json")):
        continue
    names += [name] if name not in names else []
    for c in json.load(open(os.path.join(d, "results.json")))["cases"]:
        p = c["impls"]["provider"]
        pct = p.get("pct_roofline")
        fig = ("%.1f" % pct if pct else "-") + ("" if p.get("verified", {}).get("ok") else "!")
        table[c["case"]["id"]].setdefault(name, []).append(fig)
print("%-64s" % "case" + "".join("%14s" % n for n in names))
for cid in sorted(table):
    print("%-64s" % cid[:64] + "".join("%14s" % "/".join(table[cid].get(n, [])) for n in names))
PY
