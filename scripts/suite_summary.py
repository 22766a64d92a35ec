"""A short table of `evokernel bench --json` reports: per case the engine's pick, its
time, the fastest evokernel row, the fastest reference (cuDNN rows that passed and the
`--reference` times), the ratio best reference / pick and the pick's % of floor; last,
the geometric mean of the ratios per report. Usage: python3 scripts/suite_summary.py
REPORT.json [REPORT.json ...]"""
import json
import math
import sys

REFERENCE_ROWS = ("cudnn", "cudnn-legacy")

for path in sys.argv[1:]:
    report = json.load(open(path))
    ratios = []
    print(f"== {path}")
    print(f"{'case':22} {'pass':8} {'pick':20} {'ms':>8} {'fastest ours':>24} {'best reference':>28} {'x':>6} {'%floor':>6}")
    for case in report["cases"]:
        rows = {r["name"]: r for r in case["rows"]}
        timed = lambda r: r.get("timing") and r["verdict"]["passed"]
        ours = [(r["timing"]["median_ms"], n) for n, r in rows.items() if n not in REFERENCE_ROWS and timed(r)]
        refs = [(r["timing"]["median_ms"], n) for n, r in rows.items() if n in REFERENCE_ROWS and timed(r)]
        refs += [(r["median_ms"], r["name"]) for r in case.get("references", [])]
        pick = (case.get("dispatch") or {}).get("variant", "-")
        ms = rows[pick]["timing"]["median_ms"] if pick in rows and timed(rows[pick]) else None
        best = min(ours) if ours else None
        ref = min(refs) if refs else None
        x = ref[0] / ms if ref and ms else None
        if x:
            ratios.append(x)
        floor = 100 * case["floor_ms"] / ms if ms and case.get("floor_ms") else None
        fmt = lambda v, f: f"{v:{f}}" if v is not None else "-"
        print(f"{case['name']:22} {case.get('pass', '-'):8} {pick:20} {fmt(ms, '8.4f')} "
              f"{(f'{best[1]} {best[0]:.4f}' if best else '-'):>24} {(f'{ref[1]} {ref[0]:.4f}' if ref else '-'):>28} "
              f"{fmt(x, '6.2f')} {fmt(floor, '6.0f')}")
    if ratios:
        gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
        slower = sum(r < 1 for r in ratios)
        print(f"geometric mean {gm:.2f}x over {len(ratios)}; slower than the best reference on {slower}")
