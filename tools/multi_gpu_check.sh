#!/bin/bash
# multi_gpu_check.sh -- the runs of docs/scale.md ("Two GPUs") on a host with two or more GPUs,
# the package installed there with its CUDA backend:
#   python3 -m pip install -q --no-build-isolation --no-deps . && OUT=/tmp/mgpu bash tools/multi_gpu_check.sh
# 1. kvx-conform run --memory device on GPUs 0,1 then on GPU 0 alone (same workers): verdict, counts,
#    wall time, the GPU named by each test's record;
# 2. the device-placement tests (placement.other_gpu: cache and IO on a GPU other than the current
#    one) from the two-GPU run's results;
# 3. kvx-conform bench --preset standard --memory device --gpus 0,1, then on GPU 0 alone: wall time,
#    the per-GPU probe figures, cases per GPU.
# Writes summary.txt and the runs' results under $OUT (run-0,1/, run-0/, bench-0,1/, bench-0/).
# Python runs from a scratch folder, so the installed package is the one imported.
set -u
OUT=${OUT:-/tmp/kvx-multigpu}
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
WORKERS=${WORKERS:-8}
export PYTHONUNBUFFERED=1
cd "$(mktemp -d)" || exit 1
S=$OUT/summary.txt
{ nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; } | tee $S
for g in 0,1 0; do
  t0=$(date +%s.%N)
  timeout ${RUN_TIMEOUT:-300} kvx-conform run --memory device -n $WORKERS --gpus $g --output-dir $OUT/run-$g > $OUT/run-$g.log 2>&1
  rc=$?; t1=$(date +%s.%N)
  echo "run --memory device -n $WORKERS --gpus $g: exit $rc, wall $(python3 -c "print(round($t1-$t0,1))") s" | tee -a $S
  python3 - "$OUT/run-$g/results.json" <<'PY' | tee -a $S
import collections, json, sys
d = json.load(open(sys.argv[1]))
tests = d.get("tests", [])
print("  verdict:", d.get("verdict"), "counts:", d.get("counts"))

print("  tests per GPU:", dict(collections.Counter(str(t.get("gpu")) for t in tests)))
for t in tests:
    if "placement" in (t.get("id") or t.get("nodeid") or ""):
        print(f"  {t.get('id') or t.get('nodeid')}: {t.get('outcome')} (GPU {t.get('gpu')}) {(t.get('message') or '')[:160]}")
PY
done
for g in 0,1 0; do
  t0=$(date +%s.%N)
  timeout ${BENCH_TIMEOUT:-300} kvx-conform bench --preset standard --memory device --no-peers --quiet --gpus $g \
    --output-dir $OUT/bench-$g > $OUT/bench-$g.log 2>&1
  rc=$?; t1=$(date +%s.%N)
  echo "bench --preset standard --memory device --no-peers --gpus $g: exit $rc, wall $(python3 -c "print(round($t1-$t0,1))") s" | tee -a $S
  python3 - "$OUT/bench-$g/results.json" <<'PY' | tee -a $S
import collections, json, sys
d = json.load(open(sys.argv[1]))
s = d["summary"]
print(f"  cases {s['cases']}, timed {s['timed']}, verification failures {len(s['verification_failures'])}, "
      f"errors {len(s['errors'])}; large median {s.get('large_pct_roofline_median')} %; small median {s.get('small_time_us_median')} us")
print("  cases per GPU:", dict(collections.Counter(str(c.get("gpu")) for c in d["cases"])))
print("  probe:", json.dumps(d.get("gpu_probe")))
for k, v in (d.get("gpus") or {}).items():
    print(f"  GPU {k}: roofline {v['roofline']['bandwidth_Bps'] / 1e9:.0f} GB/s, cases {v['cases']}, elapsed {v['elapsed_s']:.1f} s, error {v['error']}")
PY
done
