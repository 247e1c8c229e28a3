#!/usr/bin/env bash
# Regenerates tests/golden/listings/*.txt from the plans beside them; review
# `git diff tests/golden/listings` against the framework sources the comments cite.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/bin/shardscope}
for plan in tests/golden/listings/*.yaml; do
  scripts/listing-golden.sh "$bin" "$plan" > "${plan%.yaml}.txt.tmp"
  mv "${plan%.yaml}.txt.tmp" "${plan%.yaml}.txt"
  echo "regenerated ${plan%.yaml}.txt"
done
