#!/usr/bin/env bash
# Regenerates the table in docs/FIDELITY.md (between the fidelity-table markers) from the
# fidelity suite; review `git diff docs/FIDELITY.md` after. Usage: scripts/regen-fidelity.sh [build dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
table=$(mktemp)
trap 'rm -f "$table"' EXIT
SHARDSCOPE_FIDELITY_TABLE="$table" "$build/bin/shardscope_fidelity_tests" > /dev/null || true
python3 - "$table" <<'PY'
import sys
table = open(sys.argv[1]).read()
path = "docs/FIDELITY.md"
doc = open(path).read()
begin, end = "<!-- fidelity-table:begin -->", "<!-- fidelity-table:end -->"
head, rest = doc.split(begin, 1)
_, tail = rest.split(end, 1)
open(path, "w").write(head + begin + "\n" + table + end + tail)
PY
echo "regenerated docs/FIDELITY.md"
