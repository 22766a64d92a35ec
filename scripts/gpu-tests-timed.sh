#!/usr/bin/env bash
# On the GPU machine: the staged CUDA GPU test binary one test at a time, each timed,
# within a deadline (the device's 10-minute calls cannot hold the whole binary). Tests
# named in SKIP_FILE (one per line) are skipped; those the deadline leaves are listed as
# LEFT, to pass to the next call.
# Usage: scripts/gpu-tests-timed.sh DEADLINE_S [SKIP_FILE] [PATTERN...]
deadline=$1; skip=${2:-/dev/null}; shift 2 2>/dev/null
T=$(ls .gpu/tests/gpu-* | head -1)
start=$(date +%s)
for t in $($T --list --include-ignored 2>/dev/null | sed -n 's/: test$//p'); do
  if [ $# -gt 0 ] && ! printf '%s\n' "$@" | grep -qx "$t"; then continue; fi
  grep -qx "$t" "$skip" 2>/dev/null && continue
  left=$((deadline - ($(date +%s) - start)))
  if [ $left -lt 20 ]; then echo "LEFT $t"; continue; fi
  s=$(date +%s)
  out=$(timeout $left $T --include-ignored --test-threads=1 --exact "$t" 2>&1); rc=$?
  r=$(echo "$out" | grep -E "^test result" | cut -c1-40)
  [ $rc -eq 124 ] && r="CUT (deadline)"
  echo "$t $(( $(date +%s) - s ))s rc=$rc $r"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && echo "$out" | tail -30
done
