#!/usr/bin/env bash
# On the GPU machine (with .gpu carried): forced configs of one variant, one bench each.
# Usage: scripts/gpu-sweep.sh VARIANT FILE, FILE holding lines "CASE k=v,k=v" (public suite).
# Prints "CASE CONFIG verdict ms %floor" per line.
v=$1
while read -r c k; do
  [ -z "$c" ] && continue
  r=$(timeout 60 .gpu/evokernel bench --suite public --case "$c" --only "$v" --config "$v:$k" --iters 30 2>&1 |
    grep -E "┆ *$v:" | head -1 | awk -F'┆' '{print $3, $6, $11}' | tr -s ' ')
  echo "$c $k $r"
done < "$2"
