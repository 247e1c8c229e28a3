#!/usr/bin/env bash
# Builds and runs every test: the release build (the Python module's tests and the three
# notebooks executed top to bottom included: ctest labels "python" and "notebooks"), then one
# clang build instrumented with AddressSanitizer + UndefinedBehaviorSanitizer (and libFuzzer's
# coverage) that runs the same tests (there without the Python module, which an instrumented
# build cannot load into python3) and a short run of each libFuzzer target over its corpus and
# the saved regression inputs. One sanitizer build serves tests and fuzzers, so CI compiles the
# sources twice, not three times. Each configuration is built once, in its own folder.
#   FUZZ_SECONDS=N  seconds per fuzz target (default 10: a smoke run in CI's budget; give 600 for
#                   a real campaign; 0 skips fuzzing)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
fuzz_seconds=${FUZZ_SECONDS:-10}

echo "== release build + tests"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHARDSCOPE_BENCH=ON >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"

echo "== ASan + UBSan (clang, with the fuzz targets) build + tests"
CC=clang-14 CXX=clang++-14 cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DSHARDSCOPE_FUZZ=ON -DSHARDSCOPE_BENCH=OFF >/dev/null
cmake --build build-asan -j "$jobs"
# Under the sanitizers, not the numerical suite (fidelity) nor the tests that repeat a release
# test's code paths on every example for an equality the release build already holds: the
# symmetry reduction against the full run on every example, for simulate, for hangs and for
# check's text (its randomized plans do run here), and the two-process determinism test.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -LE fidelity \
  -E '^(SymmetryExactness\.(EveryBundledExample|HangsOfEveryBundledExample|CheckTextOfSmallExamples)|cli_determinism)$'

if [ "$fuzz_seconds" -gt 0 ]; then
  echo "== fuzzers (${fuzz_seconds}s each)"
  for target in schedule_reader_fuzz:schedule trace_reader_fuzz:trace trace_gzip_fuzz:trace_gzip plan_loader_fuzz:plan \
      plan_sources_fuzz:plan_sources pickle_reader_fuzz:pickle flight_recorder_fuzz:flight_recorder \
      snapshot_reader_fuzz:snapshot simulate_fuzz:simulate tune_candidates_fuzz:tune; do
    name=${target%%:*}
    corpus=${target##*:}
    work=$(mktemp -d)
    cp -r "fuzz/corpus/$corpus/." "$work/"
    if [ -d "tests/regressions/$corpus" ]; then cp -r "tests/regressions/$corpus/." "$work/"; fi
    echo "-- $name"
    "./build-asan/bin/$name" -max_total_time="$fuzz_seconds" -max_len=8192 -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 "$work" 2>&1 | grep -E "^(Done|stat::number_of_executed_units|stat::peak_rss_mb)|ERROR|SUMMARY"
    rm -rf "$work"
  done
fi
echo "== all tests passed"
