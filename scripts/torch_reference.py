"""PyTorch's times on every case of some suites, per pass, for `evokernel bench
--reference FILE` (which reports them beside each case and divides by the fastest
reference). Runs on the GPU machine, in the same call as the bench.

Per case and pass, two rows:
  pytorch-native  torch.backends.cudnn.enabled = False (ATen's own depthwise kernels)
  pytorch-cudnn   cuDNN enabled with benchmark = True (PyTorch picks cuDNN's fastest
                  engine, or its native kernel where it prefers that)
The forward is F.conv{1,2,3}d; grad-input and grad-weight are
torch.ops.aten.convolution_backward with one output mask at a time.

Made as strong as we can: f32 runs without TF32 (our f32 kernels are exact, so is the
oracle gate), asymmetric padding is applied to the input before timing (only the
convolution is timed), and input sets rotate past the L2 as evokernel's protocol does
(CUDA events, 10 warm-up launches, median of 50), and each time is the faster of two
timings: launches one at a time (an event pair around each, waited for), and runs of
back-to-back launches of >= 2 ms (events around the run, over its launches; a 40 us
kernel alone leaves the GPU between launches, and its clocks can drop: run 149 saw
cuDNN's ResNet-50 layers at 0.055 ms one at a time, 0.037-0.045 in an earlier call).

Dense and grouped cases (suite/dense.json: "out_channels" and "groups" given) take
weights [out_channels, c / groups, k...]; the depthwise suites' cases are groups = c.

cuDNN's benchmark mode picks an engine by timing each once per process, and the pick
varies between processes: on the H200 ResNet-50's 56 x 56 3x3 layer ran 0.0245 ms in some
calls and 0.031 in others, our kernels unchanged (runs 379-383). --selections N times every
case in N fresh processes and keeps each time's fastest, so the reference is the best
engine cuDNN finds, not one process's pick.

Writes {"source": ..., "cases": {case: {pass: {impl: ms}}}}.
Usage: python3 scripts/torch_reference.py OUT.json SUITE.json [SUITE.json ...]
       [--passes forward,dgrad,wgrad] [--selections N]"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
# Bytes of inputs to rotate through (twice the H100's 50 MB L2).
ROTATE_BYTES = 100 << 20


def time_ms(fn, warmup=10, iters=50, sample_ms=2.0, samples=15):
    """Median, min and max a launch of fn(i): the faster (by median) of launches timed one
    at a time by CUDA events and of runs of back-to-back launches (>= sample_ms each)."""
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    single = []
    for i in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(i)
        b.record()
        b.synchronize()
        single.append(a.elapsed_time(b))
    single.sort()
    reps = max(1, min(1000, int(sample_ms / max(single[0], 1e-3)) + 1))
    runs = []
    for s in range(samples):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(reps):
            fn(s * reps + i)
        b.record()
        b.synchronize()
        runs.append(a.elapsed_time(b) / reps)
    runs.sort()
    best = min((single, runs), key=lambda t: t[len(t) // 2])
    return best[len(best) // 2], best[0], best[-1]


def out_size(i, k, s, d, pb, pa):
    return (i + pb + pa - d * (k - 1) - 1) // s + 1


def case_tensors(c):
    """Input sets, weight, grad-output sets and the convolution's arguments."""
    dims = len(c["input"])
    ones = [1] * dims
    stride, dil = c.get("stride") or ones, c.get("dilation") or ones
    pads = c.get("padding") or [[0, 0]] * dims
    dtype = DTYPES[c["dtype"]]
    n, ch = c.get("n", 1), c["c"]
    per_set = n * ch
    for v in c["input"]:
        per_set *= v
    per_set *= torch.tensor([], dtype=dtype).element_size()
    sets = max(1, min(16, -(-ROTATE_BYTES // per_set)))
    fmt = None
    if c.get("layout") == "channels-last":
        fmt = {1: None, 2: torch.channels_last, 3: torch.channels_last_3d}[dims]

    def fresh(shape):
        if c.get("layout") == "channels-last" and dims == 1:
            # NWC: a [N, W, C] tensor seen as [N, C, W], as a user's channels-last 1-D is.
            t = torch.randn(shape[0], shape[2], shape[1], device="cuda", dtype=dtype)
            return t.transpose(1, 2)
        t = torch.randn(*shape, device="cuda", dtype=dtype)
        return t.to(memory_format=fmt) if fmt is not None else t

    sym = all(p[0] == p[1] for p in pads)
    padding = [p[0] for p in pads] if sym else [0] * dims
    xs = []
    for _ in range(sets):
        x = fresh([n, ch, *c["input"]])
        if not sym:
            flat = []
            for p in reversed(pads):
                flat += [p[0], p[1]]
            x = F.pad(x, flat)
            x = x.to(memory_format=fmt) if fmt is not None else x
        xs.append(x)
    # Depthwise suites: one channel a group; the dense suite names its channels and groups.
    co = c.get("out_channels", ch)
    groups = c.get("groups", 1) if "out_channels" in c else ch
    w = fresh([co, ch // groups, *c["kernel"]])
    osz = [out_size(xs[0].shape[2 + j], c["kernel"][j], stride[j], dil[j], padding[j], padding[j])
           for j in range(dims)]
    gys = [fresh([n, co, *osz]) for _ in range(sets)]
    return xs, w, gys, stride, padding, dil, groups, dims


def measure(c, passes):
    xs, w, gys, stride, padding, dil, groups, dims = case_tensors(c)
    k = len(xs)
    conv = CONV[dims]
    row = {}
    for p in passes:
        for impl, cudnn in (("pytorch-native", False), ("pytorch-cudnn", True)):
            torch.backends.cudnn.enabled = cudnn
            torch.backends.cudnn.benchmark = cudnn
            if p == "forward":
                fn = lambda i: conv(xs[i % k], w, None, stride, padding, dil, groups)  # noqa: E731
            else:
                mask = [p == "dgrad", p == "wgrad", False]
                fn = lambda i: torch.ops.aten.convolution_backward(  # noqa: E731
                    gys[i % k], xs[i % k], w, None, stride, padding, dil, False,
                    [0] * dims, groups, mask)
            try:
                row.setdefault(p, {})[impl] = time_ms(fn)[0]
            except Exception as e:  # noqa: BLE001
                print(f"{c['name']} {p} {impl}: {e}", file=sys.stderr)
    torch.backends.cudnn.enabled = True
    torch.backends.cudnn.benchmark = False
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("suites", nargs="+")
    ap.add_argument("--passes", default="forward,dgrad,wgrad")
    ap.add_argument("--selections", type=int, default=1,
                    help="fresh processes to time every case in (each time is their fastest)")
    a = ap.parse_args()
    if a.selections > 1:
        return select_fastest(a)
    passes = a.passes.split(",")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    source = (f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
              f"{torch.cuda.get_device_name()}")
    print(source)
    results = {}
    for path in a.suites:
        cases = json.load(open(path))
        cases = cases["cases"] if isinstance(cases, dict) else cases
        for c in cases:
            row = measure(c, passes)
            results[c["name"]] = row
            cells = "  ".join(f"{p} " + " ".join(f"{i.split('-')[1]} {ms:.3f}" for i, ms in v.items())
                              for p, v in row.items())
            print(f"{c['name']:<22} {cells}", flush=True)
            torch.cuda.empty_cache()
    json.dump({"source": source, "cases": results}, open(a.out, "w"), indent=1)


def select_fastest(a):
    """Runs this script in `a.selections` fresh processes (cuDNN picks its engines anew in
    each) and writes each case's fastest time of theirs."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.selections):
            out = os.path.join(tmp, f"selection-{i}.json")
            print(f"selection {i + 1} of {a.selections}", flush=True)
            subprocess.run([sys.executable, __file__, out, *a.suites, "--passes", a.passes],
                           check=True)
            runs.append(json.load(open(out)))
    cases = {}
    for run in runs:
        for case, passes in run["cases"].items():
            for p, impls in passes.items():
                for impl, ms in impls.items():
                    best = cases.setdefault(case, {}).setdefault(p, {})
                    best[impl] = min(ms, best.get(impl, ms))
    source = f"{runs[0]['source']}, fastest of {a.selections} processes"
    for case, passes in cases.items():
        cells = "  ".join(f"{p} " + " ".join(f"{i.split('-')[1]} {ms:.4f}" for i, ms in v.items())
                          for p, v in passes.items())
        print(f"{case:<22} {cells}")
    json.dump({"source": source, "cases": cases}, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
