"""evokernel's PyTorch op against PyTorch's own convolution (float64 reference), on the
CPU here and on CUDA where there is one: forward over dims, strides, dilations,
asymmetric padding, layouts, dtypes and epilogues; gradients; opcheck; torch.compile;
the modules and `convert`; the error cases."""

import itertools

import pytest
import torch
import torch.nn.functional as F

import evokernel
from evokernel.torch import _padding_pairs

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
GATES = {torch.float32: 1e-5, torch.bfloat16: 5e-3, torch.float16: 1e-3}
CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def reference(x, w, b, stride, pads, dilation, activation, residual):
    """The same computation in float64 with PyTorch's ops (padding made explicit)."""
    dims = x.dim() - 2
    pad = []
    for i in reversed(range(dims)):
        pad += [pads[2 * i], pads[2 * i + 1]]
    x64 = F.pad(x.double(), pad)
    z = CONV[dims](x64, w.double(), None if b is None else b.double(), stride, 0, dilation, x.shape[1])
    if activation == "relu":
        z = F.relu(z)
    elif activation == "silu":
        z = F.silu(z)
    elif activation == "gelu-tanh":
        z = F.gelu(z, approximate="tanh")
    if residual is not None:
        z = z + residual.double()
    return z


def rel_l2(y, ref):
    return ((y.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


SPECS = [
    # (spatial, kernel, stride, dilation, padding)
    ((37,), (4,), 1, 1, ((3, 0),)),  # causal conv1d
    ((29,), (3,), 2, 2, 1),
    ((9, 12), (3, 3), 1, 1, 1),
    ((11, 10), (5, 3), (2, 1), (1, 2), ((2, 0), (1, 3))),
    ((4, 7, 9), (3, 3, 3), 1, 1, (1, 1, 1)),
    ((5, 6, 16), (3, 5, 5), 1, 1, (0, 2, 2)),
    ((5, 8, 8), (1, 3, 3), (1, 2, 2), 1, (0, 1, 1)),
    ((3, 8, 9), (2, 3, 4), 1, 1, "same"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: "x".join(map(str, s[0])) + "-k" + "x".join(map(str, s[1])))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_forward_matches_pytorch(device, spec, dtype, channels_last):
    spatial, kernel, stride, dilation, padding = spec
    torch.manual_seed(0)
    c = 6
    x = torch.randn(2, c, *spatial, device=device).to(dtype)
    if channels_last:
        perm = [0] + list(range(2, x.dim())) + [1]
        inverse = [0, x.dim() - 1] + list(range(1, x.dim() - 1))
        x = x.permute(perm).contiguous().permute(inverse)
    w = torch.randn(c, 1, *kernel, device=device).to(dtype)
    dims = len(spatial)
    for bias_on, activation, res_on in itertools.product([False, True], [None, "relu", "silu", "gelu-tanh"], [False, True]):
        if (activation in ("relu", "gelu-tanh")) and not bias_on:
            continue  # keep the grid small; every epilogue bit still runs
        b = torch.randn(c, device=device).to(dtype) if bias_on else None
        stride_l = [stride] * dims if isinstance(stride, int) else list(stride)
        dil_l = [dilation] * dims if isinstance(dilation, int) else list(dilation)
        pads = _padding_pairs(padding, list(kernel), dil_l, dims)
        out = [2, c] + [
            (spatial[i] + pads[2 * i] + pads[2 * i + 1] - dil_l[i] * (kernel[i] - 1) - 1) // stride_l[i] + 1
            for i in range(dims)
        ]
        r = torch.randn(*out, device=device).to(dtype) if res_on else None
        y = evokernel.depthwise_conv(x, w, b, stride, padding, dilation, activation, r)
        ref = reference(x, w, b, stride_l, pads, dil_l, activation, r)
        assert list(y.shape) == out
        assert y.dtype == dtype
        assert y.is_contiguous() != channels_last or c == 1
        err = rel_l2(y, ref)
        assert err <= GATES[dtype], f"{spec} {dtype} bias={bias_on} {activation} res={res_on}: {err}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", [None, "relu", "silu", "gelu-tanh"])
def test_gradients_match_pytorch(device, activation):
    torch.manual_seed(1)
    c = 5
    x = torch.randn(2, c, 7, 9, device=device, dtype=torch.float64).float().requires_grad_()
    w = torch.randn(c, 1, 3, 3, device=device).requires_grad_()
    b = torch.randn(c, device=device).requires_grad_()
    r = torch.randn(2, c, 4, 9, device=device).requires_grad_()
    pads = ((2, 0), (1, 1))
    y = evokernel.depthwise_conv(x, w, b, (2, 1), pads, 1, activation, r)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, w, b, r), g)
    xr, wr, br, rr = (t.detach().double().requires_grad_() for t in (x, w, b, r))
    ref = reference(xr, wr, br, [2, 1], [2, 0, 1, 1], [1, 1], activation, rr)
    want = torch.autograd.grad(ref, (xr, wr, br, rr), g.double())
    for name, a, e in zip("xwbr", got, want):
        assert rel_l2(a, e) < 1e-5, f"d{name}: {rel_l2(a, e)}"


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    torch.manual_seed(2)
    samples = [
        (torch.randn(1, 4, 6, 10, device=device), torch.randn(4, 1, 3, 3, device=device), torch.randn(4, device=device), None, [1, 1], [1, 1, 1, 1], [1, 1], "silu"),
        (torch.randn(2, 3, 11, device=device), torch.randn(3, 1, 4, device=device), None, torch.randn(2, 3, 11, device=device), [1], [3, 0], [1], "none"),
        (torch.randn(1, 8, 3, 5, 6, device=device).to(memory_format=torch.channels_last_3d), torch.randn(8, 1, 2, 3, 3, device=device), None, None, [1, 2, 1], [0, 0, 1, 1, 1, 1], [1, 1, 1], "relu"),
    ]
    for args in samples:
        args = tuple(a.requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        torch.library.opcheck(torch.ops.evokernel.depthwise_conv.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_backward_ops(device):
    """The backward kernels are ops of their own (so torch.compile traces the backward
    too): their schemas, fakes and dispatch pass opcheck."""
    torch.manual_seed(4)
    cases = [
        ((2, 3, 7, 9), (3, 1, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], None),
        ((1, 4, 11), (4, 1, 4), [2], [3, 0], [1], None),
        ((1, 8, 3, 5, 6), (8, 1, 2, 3, 3), [1, 2, 1], [0, 0, 1, 1, 1, 1], [1, 1, 1], torch.channels_last_3d),
    ]
    for xs, ws, stride, padding, dilation, fmt in cases:
        x = torch.randn(*xs, device=device)
        w = torch.randn(*ws, device=device)
        if fmt is not None:
            x = x.to(memory_format=fmt)
        y = evokernel.depthwise_conv(x, w, None, stride, [(padding[2 * i], padding[2 * i + 1]) for i in range(len(stride))], dilation)
        g = torch.randn_like(y)
        for op in (torch.ops.evokernel.depthwise_conv_dgrad.default, torch.ops.evokernel.depthwise_conv_wgrad.default):
            torch.library.opcheck(op, (g, x, w, stride, padding, dilation))


@pytest.mark.parametrize("device", DEVICES)
def test_weight_gradient_is_deterministic(device):
    torch.manual_seed(5)
    x = torch.randn(2, 16, 9, 20, 24, device=device, dtype=torch.bfloat16)
    w = torch.randn(16, 1, 3, 5, 5, device=device, dtype=torch.bfloat16)
    b = torch.randn(16, device=device, dtype=torch.bfloat16)
    g = torch.randn(2, 16, 7, 20, 24, device=device, dtype=torch.bfloat16)
    pads = [0, 0, 2, 2, 2, 2]
    first = torch.ops.evokernel.depthwise_conv_wgrad(g, x, w, [1, 1, 1], pads, [1, 1, 1])
    again = torch.ops.evokernel.depthwise_conv_wgrad(g, x, w, [1, 1, 1], pads, [1, 1, 1])
    for a, e in zip(first, again):
        assert torch.equal(a.view(torch.int16), e.view(torch.int16))
    want = torch.ops.aten.convolution_backward(g.double(), x.double(), w.double(), [16], [1, 1, 1], [0, 2, 2], [1, 1, 1], False, [0, 0, 0], 16, [False, True, True])
    assert rel_l2(first[0], want[1]) < 2e-2
    assert rel_l2(first[1], want[2]) < 2e-2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_backward_without_a_gpu_kernel_falls_back_with_a_warning():
    """A kernel row of 65 taps in f32 has no grad-weight kernel on the GPU (`wgrad` keeps
    at most 64 taps a row in registers, `wgrad_mma` takes 16-bit types only): its gradients
    come from PyTorch's backward, said once, and are right. (RepLKNet's 31x31 was the
    example until `wgrad` learned to split tap rows over blocks.)"""
    torch.manual_seed(7)
    x = torch.randn(2, 8, 6, 100, device="cuda", requires_grad=True)
    w = torch.randn(8, 1, 1, 65, device="cuda", requires_grad=True)
    y = evokernel.depthwise_conv(x, w, padding=(0, 32))
    with pytest.warns(UserWarning, match="wgrad"):
        gx, gw = torch.autograd.grad(y.square().sum(), (x, w))
    xr, wr = (t.detach().double().requires_grad_() for t in (x, w))
    ref = torch.nn.functional.conv2d(xr, wr, padding=(0, 32), groups=8)
    ex, ew = torch.autograd.grad(ref.square().sum(), (xr, wr))
    assert rel_l2(gx, ex) < 1e-4 and rel_l2(gw, ew) < 1e-4


def test_tune_needs_a_gpu_and_says_so():
    x = torch.randn(1, 4, 8, 8)
    w = torch.randn(4, 1, 3, 3)
    with pytest.raises(ValueError, match="CUDA"):
        evokernel.tune(x, w, padding=1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tune_records_results_the_next_call_uses(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOKERNEL_CACHE_DIR", str(tmp_path))
    x = torch.randn(2, 16, 12, 20, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(16, 1, 3, 3, device="cuda", dtype=torch.bfloat16)
    reports = evokernel.tune(x, w, padding=1, passes=("forward", "wgrad"), max_seconds=5)
    assert len(reports) == 2 and all(r["rows"] for r in reports)
    assert (tmp_path / "tune.json").exists()
    y = evokernel.depthwise_conv(x, w, padding=1)
    assert rel_l2(y, torch.nn.functional.conv2d(x.double(), w.double(), padding=1, groups=16)) < 1e-2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_capture_and_two_streams():
    """The op (forward and backward) replays inside a CUDA graph, and two streams running
    it at once get the same results as one."""
    torch.manual_seed(6)
    x = torch.randn(2, 32, 6, 16, 20, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(32, 1, 3, 5, 5, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    pads = (0, 2, 2)
    y0 = evokernel.depthwise_conv(x, w, padding=pads)
    gx0, gw0 = torch.autograd.grad(y0.float().square().sum(), (x, w))
    # Drop y0's graph: it holds x's and w's grad accumulators, which remember the stream of
    # their first forward (here the legacy default stream); a captured backward reaching
    # them would make that stream wait on the capture (cudaErrorStreamCaptureImplicit).
    # F.conv3d fails the same way (scripts/capture_probe.py autograd-torch-keep).
    y0 = y0.detach()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up on a side stream, as capture requires
        for _ in range(2):
            y = evokernel.depthwise_conv(x, w, padding=pads)
            torch.autograd.grad(y.float().square().sum(), (x, w))
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        yg = evokernel.depthwise_conv(x, w, padding=pads)
        gxg, gwg = torch.autograd.grad(yg.float().square().sum(), (x, w))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(yg, y0) and torch.equal(gxg, gx0) and torch.equal(gwg, gw0)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = [None, None]
    for i, st in enumerate(streams):
        st.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(st):
            outs[i] = evokernel.depthwise_conv(x.detach() * (i + 1), w.detach(), padding=pads)
    torch.cuda.synchronize()
    for i in range(2):
        want = evokernel.depthwise_conv(x.detach() * (i + 1), w.detach(), padding=pads)
        assert torch.equal(outs[i], want)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    torch.manual_seed(3)
    x = torch.randn(2, 8, 10, 12, device=device)
    w = torch.randn(8, 1, 5, 5, device=device)
    b = torch.randn(8, device=device)

    def block(x):
        y = evokernel.depthwise_conv(x, w, b, padding=2, activation="gelu-tanh")
        return y * 2 + 1

    compiled = torch.compile(block, fullgraph=True)
    torch.testing.assert_close(compiled(x), block(x))
    # The backward through the compiled graph too.
    xg = x.clone().requires_grad_()
    torch.compile(lambda t: block(t).square().sum(), fullgraph=True)(xg).backward()
    xe = x.clone().requires_grad_()
    block(xe).square().sum().backward()
    torch.testing.assert_close(xg.grad, xe.grad, rtol=1e-4, atol=1e-4)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.dw = torch.nn.Conv2d(16, 16, 7, padding=3, groups=16)
        self.pw = torch.nn.Conv2d(16, 32, 1)
        self.dw1d = torch.nn.Conv1d(8, 8, 4, padding=3, groups=8, bias=False)
        self.dense = torch.nn.Conv2d(16, 16, 3, padding=1)  # not depthwise: stays
        self.reflect = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16, padding_mode="reflect")

    def forward(self, x, s):
        h = self.reflect(self.dense(self.dw(x)))
        return self.pw(torch.relu(h)), self.dw1d(s)


def test_convert_swaps_only_depthwise_convs_and_keeps_outputs():
    torch.manual_seed(4)
    model = Block().eval()
    x, s = torch.randn(2, 16, 14, 14), torch.randn(3, 8, 20)
    before = model(x, s)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    evokernel.convert(model)
    assert isinstance(model.dw, evokernel.DepthwiseConv2d)
    assert isinstance(model.dw1d, evokernel.DepthwiseConv1d)
    assert type(model.dense) is torch.nn.Conv2d and type(model.reflect) is torch.nn.Conv2d
    assert model.state_dict().keys() == state.keys()
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    after = model(x, s)
    for a, b in zip(after, before):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_modules_take_the_nn_conv_constructor():
    m = evokernel.DepthwiseConv3d(4, 4, (3, 5, 5), padding=(0, 2, 2), groups=4)
    ref = torch.nn.Conv3d(4, 4, (3, 5, 5), padding=(0, 2, 2), groups=4)
    ref.load_state_dict(m.state_dict())
    x = torch.randn(1, 4, 5, 9, 9)
    torch.testing.assert_close(m(x), ref(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="groups"):
        evokernel.DepthwiseConv2d(4, 8, 3)
    with pytest.raises(ValueError, match="zeros"):
        evokernel.DepthwiseConv2d(4, 4, 3, padding_mode="circular")


def test_errors_are_python_exceptions_with_clear_messages(monkeypatch):
    x = torch.randn(1, 4, 8, 8)
    w = torch.randn(4, 1, 3, 3)
    with pytest.raises(TypeError, match="float64"):
        evokernel.depthwise_conv(x.double(), w.double())
    with pytest.raises(TypeError, match="one dtype"):
        evokernel.depthwise_conv(x, w.half())
    with pytest.raises(ValueError, match="groups == C"):
        evokernel.depthwise_conv(x, torch.randn(8, 1, 3, 3))
    with pytest.raises(ValueError, match="spatial dims"):
        evokernel.depthwise_conv(torch.randn(4, 8), w)
    with pytest.raises(ValueError, match="output's shape"):
        evokernel.depthwise_conv(x, w, padding=1, residual=torch.randn(1, 4, 7, 7))
    with pytest.raises(ValueError, match="activation"):
        evokernel.depthwise_conv(x, w, activation="tanh")
    with pytest.raises(ValueError, match="kernel along"):
        evokernel.depthwise_conv(torch.randn(1, 4, 2, 2), w)
    with pytest.raises(ValueError, match="stride"):
        evokernel.depthwise_conv(x, w, stride=0)
    # A problem past the memory evokernel may use is refused by the engine, not attempted.
    monkeypatch.setenv("EVOKERNEL_MEMORY_LIMIT", str(1 << 20))
    with pytest.raises(ValueError, match="memory"):
        evokernel.depthwise_conv(torch.randn(1, 64, 64, 65), torch.randn(64, 1, 1, 1))
    monkeypatch.delenv("EVOKERNEL_MEMORY_LIMIT")
    # Nothing half-written: the op returns a fresh tensor or raises.
    y = evokernel.depthwise_conv(x, w, padding=1)
    assert y.shape == x.shape


def test_padding_forms():
    assert _padding_pairs(1, [3, 3], [1, 1], 2) == [1, 1, 1, 1]
    assert _padding_pairs((0, 2), [3, 5], [1, 1], 2) == [0, 0, 2, 2]
    assert _padding_pairs(((2, 0), (1, 1)), [3, 3], [1, 1], 2) == [2, 0, 1, 1]
    assert _padding_pairs("same", [4], [1], 1) == [1, 2]
    with pytest.raises(ValueError):
        _padding_pairs(((1, 2, 3),), [3], [1], 1)
