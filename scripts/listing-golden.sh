#!/usr/bin/env bash
# The golden listing of one plan: the plan's leading comment lines (which say what the
# schedule follows: framework file and function), a blank line, then rank 0's listing.
#   scripts/listing-golden.sh BIN PLAN.yaml   (prints to stdout)
set -euo pipefail
bin=$1
plan=$2
sed -n '/^#/!q;p' "$plan"
echo
"$bin" schedule "$plan" --listing --rank 0
