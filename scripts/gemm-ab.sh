#!/usr/bin/env bash
# On the GPU machine: two builds of the fp8 GEMM on the same problems, interleaved
# A B A B (clocks drift between runs by more than the changes measured). Usage:
#   scripts/gemm-ab.sh OLD_BINARY NEW_BINARY FILE [ROUNDS]
# FILE lines: "NAME SCALING MxNxK CONFIG" (CONFIG a scaled_mm_wgmma --config text, or
# "-" for the default; "OLD|NEW" gives each side its own, e.g. two configs of one build). Prints "NAME round old_ms new_ms old_cublaslt_ms new_cublaslt_ms"
# (cuBLASLt timed A/B in each process) and, last, each name's median new / old.
old=$1 new=$2 list=$3 rounds=${4:-3}
tmp=$(mktemp -d)
ms() { # binary scaling MxNxK config -> "ours_ms cublaslt_ms" (or FAIL)
  local m n k; IFS=x read -r m n k <<< "$3"
  local cfg=(); [ "$4" != - ] && cfg=(--config "scaled_mm_wgmma:$4")
  timeout 60 "$1" bench --op scaled-mm --m "$m" --n "$n" --k "$k" --scaling "$2" \
    "${cfg[@]}" --json "$tmp/r.json" > "$tmp/r.log" 2>&1 || { echo "FAIL FAIL"; return; }
  python3 - "$tmp/r.json" <<'PY'
import json, sys
case = json.load(open(sys.argv[1]))
case = case[0] if isinstance(case, list) else case
case = case.get("cases", [case])[0] if isinstance(case, dict) and "cases" in case else case
ours = [c for c in case["candidates"] if c["variant"] == "scaled_mm_wgmma" and c.get("timing") and c["passed"]]
ref = case.get("cublaslt") or {}
print(f'{ours[0]["timing"]["median_ms"]:.4f}' if ours else "FAIL", f'{ref.get("median_ms", float("nan")):.4f}')
PY
}
: > "$tmp/rows"
for round in $(seq "$rounds"); do
  while read -r name scaling shape config; do
    [ -z "$name" ] && continue
    read -r a ar < <(ms "$old" "$scaling" "$shape" "${config%%|*}")
    read -r b br < <(ms "$new" "$scaling" "$shape" "${config##*|}")
    echo "$name $round $a $b $ar $br" | tee -a "$tmp/rows"
  done < "$list"
done
python3 - "$tmp/rows" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    name, _, a, b, *_ = line.split()
    try: rows.setdefault(name, []).append(float(b) / float(a))
    except ValueError: pass
for name, r in rows.items():
    print(f"{name:<16} new/old median {statistics.median(r):.3f} over {len(r)} rounds ({' '.join(f'{x:.3f}' for x in r)})")
PY
rm -rf "$tmp"
