#!/usr/bin/env bash
# On the GPU machine: Nsight Compute on the first launch of one kernel variant of one
# suite case (forced config or its default), written to $OUT as the details page and a
# gzipped per-SASS-instruction page (warp-state samples, executed instructions; read with
# scripts/sass_profile.py). Usage: [SUITE=models] scripts/ncu-sass.sh NAME CASE VARIANT [CONFIG] [PASS]
name=$1 c=$2 variant=$3 cfg=${4:--} pass=${5:-forward} suite=${SUITE:-public}  # SUITE: another suite
bin=${BIN:-.gpu/evokernel}  # BIN: another build (A/B); KERNEL: a regex for another kernel name
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
force=(); [ "$cfg" != - ] && force=(--config "$variant:$cfg")
timeout 150 "$NCU" --kernel-name "regex:${KERNEL:-${variant}_dwconv}" --launch-count 1 --set full --import-source no \
  -o "/tmp/$name" "$bin" bench --suite "$suite" --case "$c" --pass "$pass" --only "$variant" "${force[@]}" \
  > "$OUT/$name-ncu.log" 2>&1
"$NCU" -i "/tmp/$name.ncu-rep" --page details --csv > "$OUT/$name-details.csv" 2>&1
"$NCU" -i "/tmp/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/$name-sass.csv" 2>&1
gzip -f "$OUT/$name-sass.csv"
