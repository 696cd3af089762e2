#!/bin/bash
# `make test-quick` with four CPU-bound processes beside it (issue 34: the quick tier under load, without a failure).
# The busy loops run at the same priority as the tests, each bounded by `timeout`, and are killed when the quick
# tier ends. Usage: bash benchmarks/quick_under_load.sh [LOG]   (default /tmp/quick_under_load.log)
set -u
cd "$(dirname "$0")/.."
log=${1:-/tmp/quick_under_load.log}
pids=()
for _ in 1 2 3 4; do
  timeout 1800 python3 -c "
import itertools
x = 0
for i in itertools.count():
    x = (x * 31 + i) % 1000003
" &
  pids+=($!)
done
( time make test-quick ) > "$log" 2>&1
rc=$?
kill "${pids[@]}" 2>/dev/null
tail -5 "$log"
exit $rc
