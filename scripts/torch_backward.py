"""PyTorch's backward per pass on every case of a suite, timed like evokernel times
(CUDA events, warm-up, median): torch.ops.aten.convolution_backward with one output
mask at a time (grad-input, then grad-weight), cuDNN on and off, the faster kept.
Writes JSON ({case: {dgrad_ms, wgrad_ms, ...}}) to argv[2]. Runs on the GPU machine.
Usage: python3 scripts/torch_backward.py SUITE.json OUT.json"""
import json
import sys

import torch

from torch_baseline import time_ms  # one timing protocol for every PyTorch reference

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def out_size(i, k, s, d, pb, pa):
    return (i + pb + pa - d * (k - 1) - 1) // s + 1


def case_tensors(c):
    dims = len(c["input"])
    ones = [1] * dims
    stride, dil = c.get("stride") or ones, c.get("dilation") or ones
    pads = c.get("padding") or [[0, 0]] * dims
    dtype = DTYPES[c["dtype"]]
    n, ch = c.get("n", 1), c["c"]
    x = torch.randn(n, ch, *c["input"], device="cuda", dtype=dtype)
    w = torch.randn(ch, 1, *c["kernel"], device="cuda", dtype=dtype)
    sym = all(p[0] == p[1] for p in pads)
    if not sym:
        # convolution_backward takes symmetric padding: pad the input explicitly.
        flat = []
        for p in reversed(pads):
            flat += [p[0], p[1]]
        x = torch.nn.functional.pad(x, flat)
        padding = [0] * dims
    else:
        padding = [p[0] for p in pads]
    osz = [out_size(x.shape[2 + j], c["kernel"][j], stride[j], dil[j], padding[j], padding[j]) for j in range(dims)]
    gy = torch.randn(n, ch, *osz, device="cuda", dtype=dtype)
    if c.get("layout") == "channels-last":
        fmt = {1: None, 2: torch.channels_last, 3: torch.channels_last_3d}[dims]
        if fmt is not None:
            x, gy, w = (t.to(memory_format=fmt) for t in (x, gy, w))
    return x, w, gy, stride, padding, dil, ch


def main():
    suite, out = sys.argv[1], sys.argv[2]
    cases = json.load(open(suite))
    cases = cases["cases"] if isinstance(cases, dict) else cases
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    results = {}
    for c in cases:
        x, w, gy, stride, padding, dil, groups = case_tensors(c)
        row = {}
        for pass_name, mask in (("dgrad", [True, False, False]), ("wgrad", [False, True, False])):
            best = None
            for cudnn in (True, False):
                torch.backends.cudnn.enabled = cudnn
                torch.backends.cudnn.benchmark = cudnn
                try:
                    # time_ms gives (median, min, max): the median, as evokernel reports.
                    ms = time_ms(lambda: torch.ops.aten.convolution_backward(
                        gy, x, w, None, stride, padding, dil, False, [0] * len(stride), groups, mask))[0]
                except Exception as e:  # noqa: BLE001
                    print(f"{c['name']} {pass_name} cudnn={cudnn}: {e}")
                    continue
                row[f"{pass_name}_ms_cudnn_{'on' if cudnn else 'off'}"] = ms
                best = ms if best is None else min(best, ms)
            row[f"{pass_name}_ms"] = best
        torch.backends.cudnn.enabled = True
        results[c["name"]] = row
        print(f"{c['name']:<20} dgrad {row['dgrad_ms']:.3f} ms  wgrad {row['wgrad_ms']:.3f} ms")
    json.dump(results, open(out, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
