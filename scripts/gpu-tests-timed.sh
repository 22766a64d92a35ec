#!/usr/bin/env bash
# On the GPU machine: the staged CUDA GPU test binary one test a process, each timed,
# within a deadline (the device's 10-minute calls cannot hold the whole binary one test
# at a time). JOBS=N runs N tests at once (default 1): the tests share the GPU safely
# (the kernel cache is written atomically) and much of their time is host work (oracles,
# NVRTC), so a few at once shorten the call. Tests named in SKIP_FILE (one per line) are
# skipped; those the deadline leaves are listed as LEFT, to pass to the next call.
# TIMES=FILE (an earlier run's output, "NAME Ns ..." lines; default
# scripts/gpu-test-times.txt) starts the longest tests first, so the parallel jobs finish
# together.
# Usage: [JOBS=N] [TIMES=FILE] scripts/gpu-tests-timed.sh DEADLINE_S [SKIP_FILE] [PATTERN...]
deadline=$1; skip=${2:-/dev/null}; shift 2 2>/dev/null
T=$(ls .gpu/tests/gpu-* | head -1)
export T deadline start=$(date +%s)
run_one() {
  local t=$1 left s out rc r
  left=$((deadline - ($(date +%s) - start)))
  if [ $left -lt 20 ]; then echo "LEFT $t"; return; fi
  s=$(date +%s)
  out=$(timeout $left $T --include-ignored --test-threads=1 --exact "$t" 2>&1); rc=$?
  r=$(echo "$out" | grep -E "^test result" | cut -c1-40)
  [ $rc -eq 124 ] && r="CUT (deadline)"
  # One write per test so parallel jobs do not interleave their lines.
  if [ $rc -ne 0 ] && [ $rc -ne 124 ]; then
    printf '%s\n%s\n' "$t $(( $(date +%s) - s ))s rc=$rc $r" "$(echo "$out" | tail -30)"
  else
    echo "$t $(( $(date +%s) - s ))s rc=$rc $r"
  fi
}
export -f run_one
for t in $($T --list --include-ignored 2>/dev/null | sed -n 's/: test$//p'); do
  if [ $# -gt 0 ] && ! printf '%s\n' "$@" | grep -qx "$t"; then continue; fi
  grep -qx "$t" "$skip" 2>/dev/null && continue
  # Unknown tests first (as if long), then by the earlier run's seconds, longest first.
  echo "$(awk -v t="$t" '$1 == t && $2 ~ /s$/ && $2 + 0 >= m {m = $2 + 0; f = 1}
    END {print f ? m : 99999}' "${TIMES:-scripts/gpu-test-times.txt}") $t"
done | sort -k1,1 -n -r -s | cut -d' ' -f2 | xargs -P "${JOBS:-1}" -I{} bash -c 'run_one "$@"' _ {}
