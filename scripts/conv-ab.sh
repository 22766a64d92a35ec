#!/usr/bin/env bash
# On the GPU machine: two builds' depthwise kernels on the same suite cases, interleaved
# A B A B (clocks drift between runs by more than the changes measured). Usage:
#   scripts/conv-ab.sh OLD_BINARY NEW_BINARY FILE [ROUNDS]
# FILE lines: "CASE PASS VARIANT CONFIG" (CASE of the public suite, or SUITE/CASE, e.g.
# models/video-vae-decoder; PASS forward|dgrad|wgrad; CONFIG a --config text for
# VARIANT or "-" for its default; "OLD|NEW" gives each side its own). Prints "CASE
# round old_ms new_ms" and, last, each line's median new / old. BENCH_ARGS (e.g.
# --sweep-l2) go to every bench.
old=$1 new=$2 list=$3 rounds=${4:-3}
tmp=$(mktemp -d)
scripts/gpu-monitor.sh start "$tmp"  # a throttled round is no A/B
ms() { # binary case pass variant config -> ms (or FAIL)
  local suite=public c=$2
  [[ $c == */* ]] && suite=${c%%/*} c=${c#*/}
  local cfg=(); [ "$5" != - ] && cfg=(--config "$4:$5")
  timeout 120 "$1" bench --suite "$suite" --case "$c" --pass "$3" --only "$4" "${cfg[@]}" ${BENCH_ARGS:-} \
    --json "$tmp/r.json" > "$tmp/r.log" 2>&1 || { echo FAIL; return; }
  python3 - "$tmp/r.json" "$4" <<'PY'
import json, sys
case = json.load(open(sys.argv[1]))["cases"][0]
rows = [r for r in case["rows"] if r["name"] == sys.argv[2] and r.get("timing") and r["verdict"]["passed"]]
print(f'{rows[0]["timing"]["median_ms"]:.4f}' if rows else "FAIL")
PY
}
: > "$tmp/rows"
for round in $(seq "$rounds"); do
  while read -r c pass variant config; do
    [ -z "$c" ] && continue
    a=$(ms "$old" "$c" "$pass" "$variant" "${config%%|*}")
    b=$(ms "$new" "$c" "$pass" "$variant" "${config##*|}")
    echo "$c/$pass/$variant/${config//|/→} $round $a $b" | tee -a "$tmp/rows"
  done < "$list"
done
python3 - "$tmp/rows" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    name, _, a, b = line.split()
    try: pair = (float(a), float(b))
    except ValueError: print(f"{name:<70} {a} {b}"); continue
    rows.setdefault(name, []).append(pair)
for name, r in rows.items():
    q = [b / a for a, b in r]
    print(f"{name:<70} old {statistics.median(a for a, _ in r):.4f} new {statistics.median(b for _, b in r):.4f} new/old {statistics.median(q):.3f} ({' '.join(f'{x:.3f}' for x in q)})")
PY
scripts/gpu-monitor.sh stop "$tmp"
rm -rf "$tmp"
