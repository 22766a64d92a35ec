#!/usr/bin/env bash
# On the GPU machine (with .gpu carried): forced configs of one variant, one bench each.
# Usage: scripts/gpu-sweep.sh VARIANT FILE, FILE holding lines "[SUITE] CASE k=v,k=v"
# (SUITE defaults to public; channels-last names the other embedded suite); SWEEP_PASS
# (forward, dgrad, wgrad) picks the pass.
# Prints "CASE CONFIG verdict ms %floor" per line.
v=$1
while read -r f1 f2 f3; do
  [ -z "$f1" ] && continue
  if [ -n "$f3" ]; then suite=$f1 c=$f2 k=$f3; else suite=public c=$f1 k=$f2; fi
  r=$(timeout 60 .gpu/evokernel bench --suite "$suite" --case "$c" --only "$v" --config "$v:$k" ${SWEEP_PASS:+--pass $SWEEP_PASS} --iters 30 2>&1 |
    grep -E "┆ *$v:" | head -1 | awk -F'┆' '{print $3, $6, $11}' | tr -s ' ')
  echo "$c $k $r"
done < "$2"
