#!/usr/bin/env bash
# Golden listings: for every strategy, rank 0's schedule of a 2-block toy model must equal
# the reviewed listing in tests/golden/listings/ byte for byte. Regenerate (then review):
#   scripts/regen-listings.sh
set -euo pipefail
bin=$1
cd "$(dirname "$0")/../.."
status=0
count=0
for plan in tests/golden/listings/*.yaml; do
  count=$((count + 1))
  golden=${plan%.yaml}.txt
  if [ ! -f "$golden" ]; then
    echo "missing golden $golden (run scripts/regen-listings.sh)"
    status=1
    continue
  fi
  if ! diff <(scripts/listing-golden.sh "$bin" "$plan") "$golden" > /tmp/listing-diff.$$; then
    echo "golden mismatch: $golden (regenerate with scripts/regen-listings.sh and review the diff)"
    head -20 /tmp/listing-diff.$$
    status=1
  fi
done
rm -f /tmp/listing-diff.$$
[ "$count" -gt 0 ] || { echo "no plans in tests/golden/listings"; exit 1; }
[ $status -eq 0 ] && echo "$count golden listings match"
exit $status
