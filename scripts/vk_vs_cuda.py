#!/usr/bin/env python3
"""Depthwise on Vulkan against the CUDA FMA kernels, case by case (issue 19: within 1.5x).

usage: scripts/vk_vs_cuda.py CUDA.json VK.json [--limit 1.5]

CUDA.json: `evokernel bench --suite S --json` (rows per case); VK.json: `evokernel bench
--op dense-conv --backend vulkan --suite S --json` (candidates per case), the same suite
in the same GPU call. For each case: the fastest CUDA FMA kernel that passed (no tensor
cores: the Vulkan shaders have none on this path), the fastest Vulkan shader that passed,
and Vulkan's time over CUDA's. Exits 1 when a case has no passing Vulkan shader or is
past the limit.
"""
import json
import sys

# Forward variants on FMA units (the tensor-core ones: tensor_core, streaming,
# streaming_cl, depth_reuse, depth_reuse_cl).
CUDA_FMA = {
    "naive",
    "channels_last",
    "smem_tile",
    "row_reuse",
    "large_kernel",
    "depth_reuse_fma",
    "depth_reuse_fma_cl",
    "row_rotation_cl",
    "row_window",
    "row_window_cl",
}


def best(items):
    """(ms, name) of the fastest passing item, or None."""
    timed = [(ms, name) for ms, name in items if ms is not None]
    return min(timed) if timed else None


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    limit = 1.5
    if "--limit" in argv:
        limit = float(argv[argv.index("--limit") + 1])
        args.remove(argv[argv.index("--limit") + 1])
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    cuda = json.load(open(args[0]))
    vk = json.load(open(args[1]))
    cuda_best = {}
    for case in cuda["cases"]:
        rows = [
            (r["timing"]["median_ms"] if r.get("timing") and r["verdict"]["passed"] else None, r["name"])
            for r in case["rows"]
            if r["name"] in CUDA_FMA
        ]
        cuda_best[case["name"]] = best(rows)
    failed = 0
    print(f"{'case':28} {'CUDA FMA best':>30} {'Vulkan best':>52} {'VK/CUDA':>8}")
    ratios = []
    for case in vk["cases"]:
        cands = [
            (c["timing"]["median_ms"] if c.get("timing") and c["passed"] else None, c["kernel"].split(":")[0])
            for c in case["candidates"]
        ]
        v = best(cands)
        c = cuda_best.get(case["name"])
        if v is None or c is None:
            print(f"{case['name']:28} {str(c):>30} {str(v):>52} {'-':>8}")
            failed += v is None
            continue
        r = v[0] / c[0]
        ratios.append(r)
        mark = "" if r <= limit else f"  > {limit}"
        failed += r > limit
        print(f"{case['name']:28} {c[0]:10.4f} {c[1]:>19} {v[0]:10.4f} {v[1]:>41} {r:8.2f}{mark}")
    if ratios:
        g = 1.0
        for r in ratios:
            g *= r
        print(f"{len(ratios)} cases, geometric mean VK/CUDA {g ** (1 / len(ratios)):.2f}, "
              f"{sum(r <= limit for r in ratios)} within {limit}x")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
