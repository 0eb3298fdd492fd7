#!/bin/bash
# roofline_check.sh -- the bench roofline's copy methods on a GPU (docs/benchmarks.md, "Method").
# From the repository root, the package installed there with its CUDA backend:
#   python3 -m pip install -q --no-build-isolation --no-deps . && OUT=/tmp/roof bash tools/roofline_check.sh
# 1. device_copy_roofline three times (1 GiB, 20 rounds): every method's figure and the winner,
#    the copy kernel's variants, each verified;
# 2. the GPU tests of tests/test_bench_roofline.py (methods verified, the kernel on unaligned buffers);
# 3. kvx-conform bench --preset standard --memory device on a few cases (two large, two that fit
#    in the L2): the roofline block and the L2-resident marks of results.json.
# Writes three files under $OUT: roofline.json, results.json, check.log. About a minute on an H100.
# Python runs from a scratch folder, so the installed package (with its native build) is the one
# imported, not the source tree of the repository root.
set -u
OUT=${OUT:-/tmp/kvx-roofline-check}
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
PY=${PYTHON:-python3}
REPO=$(pwd)
export PYTHONUNBUFFERED=1
W=$(mktemp -d)
cd "$W" || exit 1
main() {
t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.mem,power.limit --format=csv,noheader
$PY - <<'PY'
from kvx_conformance.abi import native
from kvx_conformance.bench import copies
lib, why = copies.load_library()
print(f"CUDA build: {native.have_cuda()}; {copies.LIBRARY}: {lib.path if lib else why}")
PY
echo "== 1. roofline methods (1 GiB, 20 rounds each), three times"
OUT="$OUT" timeout 120 $PY - <<'PY'
import json, os
import torch
from kvx_conformance.bench.run import roofline_line
from kvx_conformance.bench.timing import device_copy_roofline

gb = lambda x: "-" if x is None else f"{x / 1e9:7.0f}"
runs = []
for i in range(3):
    r = device_copy_roofline()
    runs.append(r)
    print(f"run {i + 1}: {roofline_line(r)}")
    for m in r["methods"]:
        print(f"  {m['id']:<16} {gb(m['bandwidth_Bps'])} GB/s  p10-p90 {gb(m['bandwidth_p10_Bps'])} -"
              f"{gb(m['bandwidth_p90_Bps'])}  verified {m['verified']}  {m.get('error', '')}")
        for v in m.get("variants") or []:
            print(f"    {v['id']:<22} {gb(v['bandwidth_Bps'])} GB/s  verified {v['verified']}  grid "
                  f"{(v.get('variant') or {}).get('grid')}")
p = torch.cuda.get_device_properties(0)
json.dump({"device": p.name, "sm_count": p.multi_processor_count, "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "runs": runs},
          open(os.path.join(os.environ["OUT"], "roofline.json"), "w"), indent=1, default=float)
PY
echo "roofline methods: exit $?, $((SECONDS - t0)) s"
echo "== 2. GPU tests of tests/test_bench_roofline.py"
timeout 120 $PY -m pytest -q -p no:cacheprovider --rootdir "$REPO" "$REPO/tests/test_bench_roofline.py" \
  -k "device_roofline or unaligned" 2>&1 | tail -n 4
echo "== 3. bench, standard preset, device memory, four cases"
timeout 150 $PY -m kvx_conformance.cli bench --preset standard --memory device --output-dir "$W/bench" \
  --filter 'write-nhd-f16-t262144-*' --filter 'gather-nhd-f16-t262144-*-packed-*' \
  --filter 'write-nhd-f16-t16-*' --filter 'gather-hnd-f16-t1-*-packed-*' --label "roofline check" 2>&1 | tail -n 14
echo "bench: exit ${PIPESTATUS[0]}, $((SECONDS - t0)) s"
cp "$W/bench/results.json" "$OUT/results.json" 2>/dev/null || echo "no results.json"
$PY - "$OUT/results.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
r = d["roofline"]
print(f"results.json roofline: {r['bandwidth_Bps'] / 1e9:.0f} GB/s, winner {r.get('winner')}, drift {r['drift_pct']:.2f}%")
for tag in ("start", "end"):
    print(f"  {tag}: " + ", ".join(f"{m['id']} {(m['bandwidth_Bps'] or 0) / 1e9:.0f}" for m in r[tag]["methods"])
          + f"; notes {r[tag]['notes']}")
for c in d["cases"]:
    p = c["impls"].get("provider", {})
    print(f"  {c['case']['id']:<64} {p.get('pct_roofline', 0):6.1f}%  l2_resident {c.get('l2_resident')}  "
          f"verified {(p.get('verified') or {}).get('ok')}")
s = d["summary"]
print(f"summary: large_cases {s['large_cases']}, median {s['large_pct_roofline_median']}, "
      f"l2_resident_cases {s['l2_resident_cases']}, large_l2_resident {s['large_l2_resident']}")
PY
echo "total $((SECONDS - t0)) s"
}
main 2>&1 | tee "$OUT/check.log"
cd / && rm -rf "$W"
