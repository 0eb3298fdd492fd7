#!/usr/bin/env bash
# kvx-certify.sh -- certify a KVX provider in any CI (the GitHub and GitLab templates call it).
#
# Usage: ci/kvx-certify.sh PROVIDER.so [OUTPUT_DIR]
# Environment (all optional):
#   KVX_CONFORM_INSTALL   pip requirement for kvx-conform (default: the checkout this script is in)
#   KVX_CLAIMS            claims file (features/profiles the provider claims)
#   KVX_EXPECTATIONS      expectations file (waivers: known failures by test id)
#   KVX_MEMORY            host | device | unified | auto (default auto)
#   KVX_PROFILES          space-separated profiles to certify (default: all)
#   KVX_BENCH             quick | standard | full: also run the bandwidth benchmark
#   KVX_BENCH_BASELINE    committed bench results.json to compare against
#   KVX_MAX_REGRESSION    percent a bandwidth figure may drop against the baseline (default 5)
#   KVX_VENV              where to create the virtual environment (default .kvx-venv)
# Exit: 0 certified (and no bandwidth regression); the run's exit code otherwise
# (1 not certified, 2+ usage or load errors, see docs/exit-codes.md).
set -euo pipefail

provider=${1:?usage: kvx-certify.sh PROVIDER.so [OUTPUT_DIR]}
out=${2:-kvx-results}
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${KVX_VENV:-.kvx-venv}

python3 -m venv "$venv"
"$venv/bin/pip" install -q "${KVX_CONFORM_INSTALL:-$here}"
kvx="$venv/bin/kvx-conform"

args=(run "$provider" --output-dir "$out" --junit-xml "$out/junit.xml" --memory "${KVX_MEMORY:-auto}")
[ -n "${KVX_CLAIMS:-}" ] && args+=(--claims "$KVX_CLAIMS")
[ -n "${KVX_EXPECTATIONS:-}" ] && args+=(--expectations "$KVX_EXPECTATIONS")
for p in ${KVX_PROFILES:-}; do args+=(--profile "$p"); done

status=0
"$kvx" "${args[@]}" || status=$?
echo "kvx-certify: conformance exit code $status (report: $out/report.html, certificate: $out/certificate.json)"

if [ "$status" -eq 0 ] && [ -n "${KVX_BENCH:-}" ]; then
  "$kvx" bench "$provider" --preset "$KVX_BENCH" --output-dir "$out/bench" || status=$?
  if [ "$status" -eq 0 ] && [ -n "${KVX_BENCH_BASELINE:-}" ]; then
    "$kvx" compare "$KVX_BENCH_BASELINE" "$out/bench/results.json" \
      --max-regression "${KVX_MAX_REGRESSION:-5}" || status=$?
  fi
fi
exit "$status"
