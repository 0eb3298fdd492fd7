#!/usr/bin/env bash
# kvx-certify.sh -- certify a KVX provider in any CI (the GitHub and GitLab templates call it).
#
# Usage: ci/kvx-certify.sh PROVIDER.so [OUTPUT_DIR]        (OUTPUT_DIR default: kvx-results)
#
# Steps: install kvx-conform (or use $KVX_CONFORM), `kvx-conform run PROVIDER` with the
# claims and expectations files, `kvx-conform verify` the certificate it wrote, and with
# KVX_BENCH set `kvx-conform bench` + `kvx-conform compare` against a committed baseline.
# Artifacts in OUTPUT_DIR: report.html, junit.xml, results.json, certificate.json, and
# bench/results.json + bench/bench.html when benchmarking. Walkthrough: docs/certify-in-ci.md.
#
# Environment (all optional):
#   KVX_CONFORM           path to an existing kvx-conform executable: no venv, no install
#   KVX_CONFORM_INSTALL   pip requirement to install kvx-conform from, for instance
#                           "kvx-conform @ git+https://git.acme.example/mirrors/kvx-conform.git@v0.1.0"
#                         or a wheel file or a checkout path. Default: the kvx-conform checkout
#                         this script lives in (an error if the script was copied elsewhere).
#   KVX_VENV              virtual environment to create for the install (default .kvx-venv)
#   KVX_PYTHON            interpreter that creates it (default python3)
#   KVX_VENV_SYSTEM_SITE  1: the venv sees the system's packages (reuse a CUDA torch on GPU runners)
#   KVX_CLAIMS            claims file: profiles and optional features claimed
#   KVX_EXPECTATIONS      expectations file: waivers for known failures, by test id
#   KVX_MEMORY            host | device | unified | auto (default auto)
#   KVX_PROFILES          space-separated profiles to run (default: every profile; the
#                         verdict is over the claimed ones either way)
#   KVX_WORKERS           worker processes (default: kvx-conform's, min(cpus, 4), or one per GPU)
#   KVX_GPUS              GPU indexes for device/unified runs (`--gpus`, default every visible GPU)
#   KVX_BENCH             quick | standard | full: also run the bandwidth benchmark
#   KVX_BENCH_BASELINE    committed bench results.json to gate against (implies KVX_BENCH=quick
#                         when KVX_BENCH is unset); it must exist
#   KVX_MAX_REGRESSION    percent a bandwidth figure may drop against the baseline (default 5)
#   KVX_FAIL_BELOW        also fail when a case reaches less than this percent of the roofline
#   KVX_MIN_BYTES         gate only cases moving at least this many bytes (small calls are noisy)
#   KVX_BENCH_ARGS        extra `kvx-conform bench` arguments, e.g. "--filter 'write-*' --repeats 21"
#   KVX_VERIFY            0: skip `kvx-conform verify` of the fresh certificate (default 1)
#   KVX_SHARD             K/N: run only part K of N (`kvx-conform run --shard`, one CI machine of N);
#                         a shard is not a certificate: no verify, no bench; its exit status says
#                         whether its own tests passed. Join the parts with KVX_MERGE_FROM.
#   KVX_DURATIONS         with KVX_SHARD: a committed results.json whose durations balance the parts
#   KVX_MERGE_FROM        space-separated shard output directories (globs allowed, e.g. "parts/*"):
#                         instead of running, `kvx-conform merge` them into OUTPUT_DIR, then verify
#                         the merged certificate (and bench, when asked) as after a whole run
#
# Exit status: 0 certified, certificate verified and (with a baseline) no regression.
# Otherwise the first failing step's code: the run's (1 not certified, 2+ usage or load
# errors, docs/exit-codes.md), verify's (1 mismatch), bench's or compare's (non-zero),
# or 9 when an input file (claims, expectations, baseline) is missing.
set -euo pipefail

usage="usage: kvx-certify.sh PROVIDER.so [OUTPUT_DIR]"
provider=${1:?$usage}
out=${2:-kvx-results}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

say() { echo "kvx-certify: $*"; }
die() { local code=$1; shift; echo "kvx-certify: error: $*" >&2; exit "$code"; }

[ -f "$provider" ] || die 3 "provider not found: $provider (build it first)"
for f in "${KVX_CLAIMS:-}" "${KVX_EXPECTATIONS:-}" "${KVX_DURATIONS:-}"; do
  [ -z "$f" ] || [ -f "$f" ] || die 9 "input file not found: $f"
done
if [ -n "${KVX_BENCH_BASELINE:-}" ] && [ ! -f "$KVX_BENCH_BASELINE" ]; then
  die 9 "bench baseline not found: $KVX_BENCH_BASELINE (record one with: kvx-conform bench $provider" \
        "--preset ${KVX_BENCH:-quick} --output-dir kvx-bench, then commit kvx-bench/results.json there)"
fi

# ---------------------------------------------------------------- kvx-conform
if [ -n "${KVX_CONFORM:-}" ]; then
  [ -x "$KVX_CONFORM" ] || die 2 "KVX_CONFORM=$KVX_CONFORM is not an executable"
  kvx=$KVX_CONFORM
else
  spec=${KVX_CONFORM_INSTALL:-}
  if [ -z "$spec" ]; then
    grep -qs '^name = "kvx-conform"' "$here/pyproject.toml" \
      || die 2 "set KVX_CONFORM_INSTALL to a pip requirement for kvx-conform (your mirror, a wheel or a checkout)"
    spec=$here
  fi
  venv=${KVX_VENV:-.kvx-venv}
  venv_args=()
  [ "${KVX_VENV_SYSTEM_SITE:-0}" = 1 ] && venv_args+=(--system-site-packages)
  say "installing kvx-conform from $spec into $venv"
  "${KVX_PYTHON:-python3}" -m venv ${venv_args[@]+"${venv_args[@]}"} "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "$spec"
  kvx=$venv/bin/kvx-conform
fi
say "$("$kvx" --version)"

# ---------------------------------------------------------------- conformance
mkdir -p "$out"
status=0
if [ -n "${KVX_MERGE_FROM:-}" ]; then
  # shellcheck disable=SC2206 # globs in KVX_MERGE_FROM expand here on purpose
  parts=(${KVX_MERGE_FROM})
  "$kvx" merge "${parts[@]}" --output-dir "$out" --junit-xml "$out/junit.xml" || status=$?
  say "merge exit code $status (${#parts[@]} parts; report $out/report.html, certificate $out/certificate.json)"
else
  args=(run "$provider" --output-dir "$out" --junit-xml "$out/junit.xml" --memory "${KVX_MEMORY:-auto}"
        --progress lines)
  [ -n "${KVX_CLAIMS:-}" ] && args+=(--claims "$KVX_CLAIMS")
  [ -n "${KVX_EXPECTATIONS:-}" ] && args+=(--expectations "$KVX_EXPECTATIONS")
  [ -n "${KVX_WORKERS:-}" ] && args+=(-n "$KVX_WORKERS")
  [ -n "${KVX_GPUS:-}" ] && args+=(--gpus "$KVX_GPUS")
  [ -n "${KVX_SHARD:-}" ] && args+=(--shard "$KVX_SHARD")
  [ -n "${KVX_SHARD:-}" ] && [ -n "${KVX_DURATIONS:-}" ] && args+=(--durations-from "$KVX_DURATIONS")
  for p in ${KVX_PROFILES:-}; do args+=(--profile "$p"); done
  "$kvx" "${args[@]}" || status=$?
  say "conformance exit code $status (report $out/report.html, certificate $out/certificate.json)"
fi
if [ -n "${KVX_SHARD:-}" ] && [ -z "${KVX_MERGE_FROM:-}" ]; then
  say "shard $KVX_SHARD done: merge the parts (KVX_MERGE_FROM) to certify"
  exit "$status"
fi

if [ "$status" -eq 0 ] && [ "${KVX_VERIFY:-1}" != 0 ]; then
  "$kvx" verify "$out/certificate.json" --provider "$provider" || status=$?
  say "verify exit code $status"
fi

# ---------------------------------------------------------------- bandwidth gate
bench=${KVX_BENCH:-}
[ -z "$bench" ] && [ -n "${KVX_BENCH_BASELINE:-}" ] && bench=quick
if [ "$status" -eq 0 ] && [ -n "$bench" ]; then
  extra=()
  [ -n "${KVX_BENCH_ARGS:-}" ] && eval "extra=(${KVX_BENCH_ARGS})"
  "$kvx" bench "$provider" --preset "$bench" --memory "${KVX_MEMORY:-auto}" --output-dir "$out/bench" \
    ${extra[@]+"${extra[@]}"} || status=$?
  say "bench exit code $status (results $out/bench/results.json)"
  if [ "$status" -eq 0 ] && [ -n "${KVX_BENCH_BASELINE:-}" ]; then
    cmp=(compare "$KVX_BENCH_BASELINE" "$out/bench/results.json" --max-regression "${KVX_MAX_REGRESSION:-5}")
    [ -n "${KVX_FAIL_BELOW:-}" ] && cmp+=(--fail-below "$KVX_FAIL_BELOW")
    [ -n "${KVX_MIN_BYTES:-}" ] && cmp+=(--min-bytes "$KVX_MIN_BYTES")
    "$kvx" "${cmp[@]}" || status=$?
    say "compare exit code $status (baseline $KVX_BENCH_BASELINE)"
  fi
fi

if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then  # GitHub Actions job summary
  echo "kvx-conform on \`$(basename "$provider")\`: exit status $status; report, JUnit XML, results.json and" \
       "certificate are in the job's artifacts" >> "$GITHUB_STEP_SUMMARY" || true
fi
exit "$status"
