"""Per pass: evokernel's pick (from `evokernel bench --pass all --json`) against
PyTorch's backward (scripts/torch_backward.py) measured in the same GPU call; the ratio,
% of the floor, and the geometric mean per pass.
Usage: backward_summary.py TORCH.json EVK.json [EVK.json ...]"""
import json
import math
import sys


def main():
    torch_ref = json.load(open(sys.argv[1]))
    cases = []
    for path in sys.argv[2:]:
        try:
            cases += json.load(open(path))["cases"]
        except (OSError, ValueError) as e:
            print(f"{path}: {e}")
    per_pass = {}
    print(f"{'case':<22}{'pass':<7}{'pick':<60}{'ms':>8}{'floor%':>8}{'torch ms':>10}{'x torch':>9}")
    for case in cases:
        p = case.get("pass", "forward")
        name = case["name"].rsplit(" ", 1)[0] if p != "forward" else case["name"]
        pick = (case.get("dispatch") or {}).get("config")
        rows = [r for r in case["rows"] if r.get("config") == pick and r.get("timing")]
        if not rows:
            continue
        ms = rows[0]["timing"]["median_ms"]
        floor = case.get("floor_ms")
        ref = torch_ref.get(name, {}).get(f"{p}_ms")
        ratio = ref / ms if ref else None
        pct = 100 * floor / ms if floor else None
        s = per_pass.setdefault(p, {"logs": [], "half": 0, "big": 0, "slower": []})
        if ratio:
            s["logs"].append(math.log(ratio))
            if ratio < 1:
                s["slower"].append(name)
        if floor and floor >= 0.02:
            s["big"] += 1
            s["half"] += pct >= 50
        print(f"{name:<22}{p:<7}{pick:<60}{ms:>8.3f}{pct or 0:>8.0f}{ref or float('nan'):>10.3f}{ratio or float('nan'):>9.1f}")
    for p, s in per_pass.items():
        g = math.exp(sum(s["logs"]) / len(s["logs"])) if s["logs"] else float("nan")
        print(f"{p}: geometric mean {g:.1f}x PyTorch over {len(s['logs'])} cases; "
              f">= 50% of floor: {s['half']} of {s['big']} cases with floor >= 20 us; slower than PyTorch: {s['slower'] or 'none'}")


if __name__ == "__main__":
    sys.exit(main())
