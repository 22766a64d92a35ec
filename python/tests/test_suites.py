"""The benchmark suites through the PyTorch op: every case of suite/public.json,
suite/channels-last.json and suite/models.json, forward and backward (grad-input,
grad-weight, grad-bias), against PyTorch's convolution in float64. On a GPU the cases
run at their full sizes; on the CPU (CI) at shrunk sizes (batch 1, at most 8 channels,
spatial sizes cut down) with the same kernels, strides, dilations, paddings, layouts and
dtypes."""

import json
import pathlib
import warnings

import pytest
import torch

import evokernel
from test_torch import GATES, reference, rel_l2

SUITES = pathlib.Path(__file__).resolve().parents[2] / "suite"
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def cases():
    out = []
    for suite in ("public", "channels-last", "models"):
        for case in json.loads((SUITES / f"{suite}.json").read_text())["cases"]:
            out.append(pytest.param(case, id=f"{suite}-{case['name']}"))
    return out


def shrunk(case):
    """The case at a size the CPU backend checks in well under a second: the kernel's
    span plus a few outputs per dim (strided dims keep at least two outputs)."""
    c = dict(case, n=1, c=min(case["c"], 8))
    c["input"] = [
        min(size, (k - 1) * d + 2 * s + 3)
        for size, k, d, s in zip(case["input"], case["kernel"], case["dilation"], case["stride"])
    ]
    return c


def tensors(case, device, seed):
    """x (in the case's layout), weight and bias, as leaves that want gradients."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    dtype = DTYPES[case["dtype"]]
    n, c, spatial, kernel = case["n"], case["c"], case["input"], case["kernel"]
    x = torch.randn(n, c, *spatial, generator=gen).to(device=device, dtype=dtype)
    if case["layout"] == "channels-last":
        perm = [0] + list(range(2, x.dim())) + [1]
        inverse = [0, x.dim() - 1] + list(range(1, x.dim() - 1))
        x = x.permute(perm).contiguous().permute(inverse)
    w = torch.randn(c, 1, *kernel, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(c, generator=gen).to(device=device, dtype=dtype)
    return [t.requires_grad_() for t in (x, w, b)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", cases())
def test_suite_case_forward_and_backward(case, device):
    if device == "cpu":
        case = shrunk(case)
    dtype = DTYPES[case["dtype"]]
    x, w, b = tensors(case, device, seed=len(case["name"]))
    padding = tuple(tuple(p) for p in case["padding"])
    with warnings.catch_warnings():
        # A kernel beyond the GPU grad-weight kernel's register budget (31x31) takes
        # PyTorch's backward for that pass, with a warning: still checked here.
        warnings.filterwarnings("ignore", message="evokernel: .* runs on PyTorch's backward")
        y = evokernel.depthwise_conv(x, w, b, case["stride"], padding, case["dilation"])
        gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(7)).to(device=device, dtype=dtype)
        got = torch.autograd.grad(y, (x, w, b), gy)
    assert y.dtype == dtype
    assert y.is_contiguous() == (case["layout"] == "channels-first" or case["c"] == 1)
    assert got[0].is_contiguous() == x.is_contiguous()
    pads = [p for pair in case["padding"] for p in pair]
    ref_in = [t.detach().double().requires_grad_() for t in (x, w, b)]
    ref = reference(*ref_in, case["stride"], pads, case["dilation"], None, None)
    want = torch.autograd.grad(ref, ref_in, gy.double())
    gate = GATES[dtype]
    errors = {"forward": rel_l2(y, ref)}
    errors.update({f"grad_{n}": rel_l2(a, e) for n, a, e in zip(("input", "weight", "bias"), got, want)})
    bad = {k: v for k, v in errors.items() if not v <= gate}
    assert not bad, f"{case['name']} ({device}): rel L2 above {gate}: {bad}"
