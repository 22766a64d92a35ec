"""The PyTorch face of evokernel: a `torch.library` custom op with a fake kernel
(torch.compile, export) and autograd, the DepthwiseConv1d/2d/3d modules, and `convert`.

The op runs the engine's plan for the problem: CUDA tensors in place on torch's current
stream (no copies, no synchronization), CPU tensors on the CPU backend. Gradients come
from PyTorch's own convolution backward until evokernel's backward kernels land (the
forward still runs on evokernel, and the activation is recomputed from evokernel's
pre-activation output).
"""

from __future__ import annotations

import warnings
from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from . import _evokernel as _ext

__all__ = [
    "depthwise_conv",
    "plan_name",
    "DepthwiseConv1d",
    "DepthwiseConv2d",
    "DepthwiseConv3d",
    "convert",
]

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
_ACTIVATIONS = ("none", "relu", "silu", "gelu-tanh")
IntOrSeq = Union[int, Sequence[int]]
Padding = Union[int, str, Sequence[int], Sequence[Sequence[int]]]


def _per_dim(name: str, value: IntOrSeq, dims: int) -> List[int]:
    if isinstance(value, int):
        return [value] * dims
    values = [int(v) for v in value]
    if len(values) == 1:
        return values * dims
    if len(values) != dims:
        raise ValueError(f"{name} has {len(values)} entries but the input has {dims} spatial dims")
    return values


def _padding_pairs(padding: Padding, kernel: List[int], dilation: List[int], dims: int) -> List[int]:
    """Padding as [before0, after0, before1, after1, ...] (outermost spatial dim first)."""
    if isinstance(padding, str):
        if padding == "valid":
            return [0] * (2 * dims)
        if padding == "same":
            pairs = []
            for k, d in zip(kernel, dilation):
                total = d * (k - 1)
                pairs += [total // 2, total - total // 2]  # PyTorch puts the odd one after
            return pairs
        raise ValueError(f"padding '{padding}' is not 'same', 'valid', an int or per-dim values")
    if isinstance(padding, int):
        return [padding, padding] * dims
    items = list(padding)
    if items and all(isinstance(p, (tuple, list)) for p in items):
        if len(items) != dims or any(len(p) != 2 for p in items):
            raise ValueError(f"padding {padding}: give one (before, after) pair per spatial dim ({dims})")
        return [int(v) for p in items for v in p]
    return [int(v) for p in _per_dim("padding", items, dims) for v in (p, p)]


def _channels_last(x: Tensor) -> bool:
    """Whether x is dense in NWC/NHWC/NDHWC order (and not plainly contiguous)."""
    if x.is_contiguous():
        return False
    perm = [0] + list(range(2, x.dim())) + [1]
    return x.permute(perm).is_contiguous()


def _empty(shape: Sequence[int], like: Tensor, channels_last: bool) -> Tensor:
    if not channels_last:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    d = len(shape)
    perm_shape = [shape[0]] + list(shape[2:]) + [shape[1]]
    inverse = [0, d - 1] + list(range(1, d - 1))
    return torch.empty(perm_shape, dtype=like.dtype, device=like.device).permute(inverse)


def _dense(t: Tensor, channels_last: bool) -> Tensor:
    """t dense in the layout, its data 16-byte aligned (a copy only where it is not)."""
    if channels_last:
        perm = [0] + list(range(2, t.dim())) + [1]
        if not t.permute(perm).is_contiguous() or t.data_ptr() % 16:
            d = t.dim()
            inverse = [0, d - 1] + list(range(1, d - 1))
            t = t.permute(perm).contiguous().clone().permute(inverse)
        return t
    if not t.is_contiguous() or t.data_ptr() % 16:
        t = t.contiguous().clone()
    return t


def _out_shape(x_shape, w_shape, stride, padding, dilation) -> List[int]:
    dims = len(x_shape) - 2
    out = [x_shape[0], x_shape[1]]
    for i in range(dims):
        span = dilation[i] * (w_shape[2 + i] - 1) + 1
        padded = x_shape[2 + i] + padding[2 * i] + padding[2 * i + 1]
        out.append((padded - span) // stride[i] + 1)
    return out


def _spec(x: Tensor, weight: Tensor, stride, padding, dilation, channels_last: bool = False):
    """The problem as the extension takes it (SpecArgs in src/lib.rs)."""
    dims = x.dim() - 2
    return (
        x.shape[0],
        x.shape[1],
        list(x.shape[2:]),
        list(weight.shape[2:]),
        list(stride),
        list(dilation),
        [(padding[2 * i], padding[2 * i + 1]) for i in range(dims)],
        channels_last,
        _DTYPES[x.dtype],
    )


def _validate(x: Tensor, weight: Tensor, stride, padding, dilation) -> None:
    _ext.output_dims(_spec(x, weight, stride, padding, dilation))


@torch.library.custom_op("evokernel::depthwise_conv", mutates_args=())
def _depthwise_conv(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    residual: Optional[Tensor],
    stride: List[int],
    padding: List[int],
    dilation: List[int],
    activation: str,
) -> Tensor:
    _validate(x, weight, stride, padding, dilation)  # before anything is allocated
    cl = _channels_last(x)
    x = _dense(x, cl)
    weight = _dense(weight, False)
    bias = None if bias is None else _dense(bias, False)
    residual = None if residual is None else _dense(residual, cl)
    shape = _out_shape(list(x.shape), list(weight.shape), stride, padding, dilation)
    y = _empty(shape, x, cl)
    if x.is_cuda:
        device = x.device.index if x.device.index is not None else torch.cuda.current_device()
        stream = torch.cuda.current_stream(x.device).cuda_stream
    else:
        device, stream = -1, 0
    _ext.conv_forward(
        x.data_ptr(),
        weight.data_ptr(),
        y.data_ptr(),
        0 if bias is None else bias.data_ptr(),
        0 if residual is None else residual.data_ptr(),
        device,
        stream,
        _spec(x, weight, stride, padding, dilation, cl),
        activation,
    )
    return y


@_depthwise_conv.register_fake
def _(x, weight, bias, residual, stride, padding, dilation, activation):
    shape = _out_shape(list(x.shape), list(weight.shape), stride, padding, dilation)
    return _empty(shape, x, _channels_last(x))


def _setup_context(ctx, inputs, output):
    x, weight, bias, residual, stride, padding, dilation, activation = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.conf = (stride, padding, dilation, activation, residual is not None)


def _device_stream(t: Tensor):
    """The extension's device (-1: the CPU) and torch's current stream on it."""
    if t.is_cuda:
        device = t.device.index if t.device.index is not None else torch.cuda.current_device()
        return device, torch.cuda.current_stream(t.device).cuda_stream
    return -1, 0


@torch.library.custom_op("evokernel::depthwise_conv_dgrad", mutates_args=())
def _depthwise_conv_dgrad(
    grad: Tensor,
    x: Tensor,
    weight: Tensor,
    stride: List[int],
    padding: List[int],
    dilation: List[int],
) -> Tensor:
    """grad-input of the plain convolution (x gives the shape, dtype and layout only)."""
    cl = _channels_last(x)
    grad = _dense(grad.to(x.dtype), cl)
    weight = _dense(weight, False)
    grad_x = _empty(list(x.shape), x, cl)
    device, stream = _device_stream(x)
    spec = _spec(x, weight, stride, padding, dilation, cl)
    ws = _workspace(x, device, spec, "dgrad")
    _ext.conv_dgrad(
        grad.data_ptr(),
        weight.data_ptr(),
        grad_x.data_ptr(),
        device,
        stream,
        spec,
        0 if ws is None else ws.data_ptr(),
    )
    return grad_x


@_depthwise_conv_dgrad.register_fake
def _(grad, x, weight, stride, padding, dilation):
    return _empty(list(x.shape), x, _channels_last(x))


@torch.library.custom_op("evokernel::depthwise_conv_wgrad", mutates_args=())
def _depthwise_conv_wgrad(
    grad: Tensor,
    x: Tensor,
    weight: Tensor,
    stride: List[int],
    padding: List[int],
    dilation: List[int],
) -> Tuple[Tensor, Tensor]:
    """grad-weight and grad-bias of the plain convolution, deterministic (weight gives
    the shape only)."""
    cl = _channels_last(x)
    x = _dense(x, cl)
    grad = _dense(grad.to(x.dtype), cl)
    grad_w = torch.empty(weight.shape, dtype=x.dtype, device=x.device)
    grad_b = torch.empty(weight.shape[0], dtype=x.dtype, device=x.device)
    device, stream = _device_stream(x)
    spec = _spec(x, weight, stride, padding, dilation, cl)
    ws = _workspace(x, device, spec, "wgrad")
    _ext.conv_wgrad(
        x.data_ptr(),
        grad.data_ptr(),
        grad_w.data_ptr(),
        grad_b.data_ptr(),
        device,
        stream,
        spec,
        0 if ws is None else ws.data_ptr(),
    )
    return grad_w, grad_b


@_depthwise_conv_wgrad.register_fake
def _(grad, x, weight, stride, padding, dilation):
    return (
        torch.empty(weight.shape, dtype=x.dtype, device=x.device),
        torch.empty(weight.shape[0], dtype=x.dtype, device=x.device),
    )


def _workspace(x, device, spec, pass_name):
    """The backward call's scratch (the flipped weight, grad-weight's partials) from
    torch's allocator on the current stream: under CUDA graph capture that is the
    capture's private pool. None where the call needs none. Asked of the plan on every
    call (a cached plan: a lookup), as tuning can change the plan and its scratch."""
    if device < 0:
        return None
    n = _ext.workspace_bytes(device, spec, pass_name)
    return torch.empty(n, dtype=torch.uint8, device=x.device) if n > 0 else None


# (device, spec, pass) -> whether a GPU kernel serves it: asked of the engine once per
# problem, not on every backward call.
_SUPPORTED = {}


def _backward_supported(x, weight, stride, padding, dilation, pass_name) -> bool:
    """Whether an evokernel GPU kernel computes this backward pass; where none does (the
    grad-weight kernel keeps at most 64 taps of 8 tap-row groups in registers: a 31x31
    kernel exceeds it) PyTorch's backward runs instead, with one warning per problem."""
    if not x.is_cuda or torch.compiler.is_compiling():
        return True
    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    spec = _spec(x, weight, stride, padding, dilation, _channels_last(x))
    key = (device, repr(spec), pass_name)
    if key not in _SUPPORTED:
        why = _ext.unsupported(device, spec, pass_name)
        _SUPPORTED[key] = why is None
        if why is not None:
            warnings.warn(f"evokernel: {pass_name} of this convolution runs on PyTorch's backward: {why}")
    return _SUPPORTED[key]


def _aten_backward(grad_z, x, weight, stride, padding, dilation, need_x, need_w):
    """PyTorch's convolution backward (symmetric padding only: the input is padded
    explicitly and grad-input cropped back)."""
    dims = x.dim() - 2
    pad = []
    for i in reversed(range(dims)):
        pad += [padding[2 * i], padding[2 * i + 1]]
    x_padded = torch.nn.functional.pad(x, pad) if any(pad) else x
    gx, gw, _ = torch.ops.aten.convolution_backward(
        grad_z.to(x.dtype), x_padded, weight, None, stride, [0] * dims, dilation, False,
        [0] * dims, x.shape[1], [need_x, need_w, False],
    )
    if need_x:
        index = [slice(None), slice(None)] + [
            slice(padding[2 * i], padding[2 * i] + x.shape[2 + i]) for i in range(dims)
        ]
        gx = gx[tuple(index)]
    return gx, gw


def _backward(ctx, grad):
    """evokernel's backward kernels: grad-input (the forward kernels on the flipped
    weight where strides are 1) and the deterministic grad-weight with grad-bias, on the
    gradient at the pre-activation (its derivative applied in PyTorch, the
    pre-activation recomputed with evokernel's forward)."""
    x, weight, bias = ctx.saved_tensors
    stride, padding, dilation, activation, has_residual = ctx.conf
    if activation != "none":
        z = _depthwise_conv(x, weight, bias, None, stride, padding, dilation, "none")
        if activation == "relu":
            grad_z = torch.where(z > 0, grad, torch.zeros_like(grad))
        elif activation == "silu":
            grad_z = torch.ops.aten.silu_backward(grad, z)
        else:
            grad_z = torch.ops.aten.gelu_backward(grad, z, approximate="tanh")
    else:
        grad_z = grad
    need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    need_b = bias is not None and ctx.needs_input_grad[2]
    grad_x = grad_w = grad_b = None
    if need_x:
        if _backward_supported(x, weight, stride, padding, dilation, "dgrad"):
            grad_x = _depthwise_conv_dgrad(grad_z, x, weight, stride, padding, dilation)
        else:
            grad_x = _aten_backward(grad_z, x, weight, stride, padding, dilation, True, False)[0]
    if need_w or need_b:
        if _backward_supported(x, weight, stride, padding, dilation, "wgrad"):
            gw, gb = _depthwise_conv_wgrad(grad_z, x, weight, stride, padding, dilation)
        else:
            gw = _aten_backward(grad_z, x, weight, stride, padding, dilation, False, True)[1]
            gb = grad_z.sum(dim=[0] + list(range(2, grad_z.dim())))
        grad_w = gw if need_w else None
        grad_b = gb.to(bias.dtype) if need_b else None
    grad_r = grad if has_residual and ctx.needs_input_grad[3] else None
    return grad_x, grad_w, grad_b, grad_r, None, None, None, None


_depthwise_conv.register_autograd(_backward, setup_context=_setup_context)


def _check(x: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor]) -> int:
    if not isinstance(x, Tensor) or not isinstance(weight, Tensor):
        raise TypeError("x and weight must be torch tensors")
    dims = x.dim() - 2
    if dims not in (1, 2, 3):
        raise ValueError(f"x must be [N, C, *spatial] with 1 to 3 spatial dims; got shape {tuple(x.shape)}")
    if x.dtype not in _DTYPES:
        raise TypeError(f"x is {x.dtype}; evokernel takes bfloat16, float16 or float32")
    for name, t in (("weight", weight), ("bias", bias), ("residual", residual)):
        if t is None:
            continue
        if t.dtype != x.dtype:
            raise TypeError(f"{name} is {t.dtype} but x is {x.dtype}; give them one dtype")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")
    if x.device.type not in ("cpu", "cuda"):
        raise ValueError(f"x is on {x.device}; evokernel runs on CUDA GPUs and the CPU")
    c = x.shape[1]
    if weight.dim() != x.dim() or weight.shape[0] != c or weight.shape[1] != 1:
        raise ValueError(
            f"weight must be [C, 1, *kernel] = [{c}, 1, ...] with {dims} kernel dims (a depthwise "
            f"convolution, groups == C); got {tuple(weight.shape)}"
        )
    if bias is not None and tuple(bias.shape) != (c,):
        raise ValueError(f"bias must be [{c}]; got {tuple(bias.shape)}")
    return dims


def _arguments(x, weight, bias, residual, stride, padding, dilation, activation):
    """The checked tensors' call arguments as the op takes them: per-dim strides,
    (before, after) padding pairs flattened, per-dim dilations, the activation's name."""
    dims = _check(x, weight, bias, residual)
    stride_l = _per_dim("stride", stride, dims)
    dilation_l = _per_dim("dilation", dilation, dims)
    pads = _padding_pairs(padding, list(weight.shape[2:]), dilation_l, dims)
    act = "none" if activation in (None, "none", "identity") else activation
    if act == "gelu":
        act = "gelu-tanh"
    if act not in _ACTIVATIONS:
        raise ValueError(f"activation '{activation}' is not one of None, 'relu', 'silu', 'gelu-tanh'")
    return stride_l, pads, dilation_l, act


def depthwise_conv(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    stride: IntOrSeq = 1,
    padding: Padding = 0,
    dilation: IntOrSeq = 1,
    activation: Optional[str] = None,
    residual: Optional[Tensor] = None,
) -> Tensor:
    """`act(conv(x, weight) + bias) + residual`, a depthwise convolution (groups == C).

    x: [N, C, W], [N, C, H, W] or [N, C, D, H, W], contiguous or channels_last (the output
    has x's memory format); weight: [C, 1, *kernel]; bias: [C]; residual: the output's
    shape. padding: an int, one int per dim, one (before, after) pair per dim, 'same' or
    'valid'. activation: None, 'relu', 'silu' or 'gelu-tanh' (GELU, tanh approximation).
    """
    stride_l, pads, dilation_l, act = _arguments(x, weight, bias, residual, stride, padding, dilation, activation)
    if not torch.compiler.is_compiling():
        # The engine validates the problem and says what is wrong; under torch.compile
        # the op does it when it runs.
        _validate(x, weight, stride_l, pads, dilation_l)
    if residual is not None:
        want = _out_shape(list(x.shape), list(weight.shape), stride_l, pads, dilation_l)
        if list(residual.shape) != want:
            raise ValueError(f"residual must have the output's shape {want}; got {list(residual.shape)}")
    return torch.ops.evokernel.depthwise_conv(x, weight, bias, residual, stride_l, pads, dilation_l, act)


def plan_name(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    stride: IntOrSeq = 1,
    padding: Padding = 0,
    dilation: IntOrSeq = 1,
    activation: Optional[str] = None,
    residual: bool = False,
) -> str:
    """The kernel instance evokernel runs for this call (e.g. depth_reuse_bf16_cf_...)."""
    stride_l, pads, dilation_l, act = _arguments(x, weight, bias, None, stride, padding, dilation, activation)
    device = (x.device.index or 0) if x.is_cuda else -1
    spec = _spec(x, weight, stride_l, pads, dilation_l, _channels_last(x))
    return _ext.plan_name(device, spec, act, bias is not None, residual)


def tune(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    stride: IntOrSeq = 1,
    padding: Padding = 0,
    dilation: IntOrSeq = 1,
    activation: Optional[str] = None,
    residual: bool = False,
    passes: Sequence[str] = ("forward", "dgrad", "wgrad"),
    search: str = "auto",
    max_seconds: float = 60.0,
) -> list:
    """Tunes the kernels of this call on x's GPU, for each pass in `passes` (forward,
    dgrad, wgrad; the backward passes are what autograd runs), verifying every candidate
    against the oracle. The best configs go to the tune cache the `evokernel` CLI shares
    (`$EVOKERNEL_CACHE_DIR/tune.json`); later calls use them. Returns the tuning reports
    (dicts: per variant the default and tuned config and their times)."""
    import json

    stride_l, pads, dilation_l, act = _arguments(x, weight, bias, None, stride, padding, dilation, activation)
    if not x.is_cuda:
        raise ValueError("tune needs CUDA tensors: the CPU backend has no kernel configs to tune")
    if isinstance(passes, str):
        passes = (passes,)
    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    spec = _spec(x, weight, stride_l, pads, dilation_l, _channels_last(x))
    torch.cuda.synchronize(x.device)
    return json.loads(_ext.tune(device, spec, act, bias is not None, residual, list(passes), search, float(max_seconds)))


def _module(base):
    class Depthwise(base):
        """A drop-in for the depthwise `torch.nn.ConvNd` (groups == in == out channels,
        zero padding): the same constructor, parameters and state_dict; the forward runs
        on evokernel."""

        def __init__(
            self,
            in_channels: int,
            out_channels: Optional[int] = None,
            kernel_size: IntOrSeq = 3,
            stride: IntOrSeq = 1,
            padding: Union[str, IntOrSeq] = 0,
            dilation: IntOrSeq = 1,
            groups: Optional[int] = None,
            bias: bool = True,
            padding_mode: str = "zeros",
            device=None,
            dtype=None,
        ):
            out_channels = in_channels if out_channels is None else out_channels
            groups = in_channels if groups is None else groups
            if not (out_channels == in_channels == groups):
                raise ValueError(
                    f"a depthwise convolution needs in_channels == out_channels == groups; got "
                    f"{in_channels}, {out_channels}, {groups}"
                )
            if padding_mode != "zeros":
                raise ValueError(f"padding_mode '{padding_mode}': evokernel pads with zeros only")
            super().__init__(
                in_channels,
                out_channels,
                kernel_size,
                stride=stride,
                padding=padding,
                dilation=dilation,
                groups=groups,
                bias=bias,
                padding_mode=padding_mode,
                device=device,
                dtype=dtype,
            )

        def forward(self, x: Tensor) -> Tensor:
            return depthwise_conv(x, self.weight, self.bias, self.stride, self.padding, self.dilation)

    return Depthwise


DepthwiseConv1d = _module(torch.nn.Conv1d)
DepthwiseConv1d.__name__ = DepthwiseConv1d.__qualname__ = "DepthwiseConv1d"
DepthwiseConv2d = _module(torch.nn.Conv2d)
DepthwiseConv2d.__name__ = DepthwiseConv2d.__qualname__ = "DepthwiseConv2d"
DepthwiseConv3d = _module(torch.nn.Conv3d)
DepthwiseConv3d.__name__ = DepthwiseConv3d.__qualname__ = "DepthwiseConv3d"

_REPLACEMENTS = {
    torch.nn.Conv1d: DepthwiseConv1d,
    torch.nn.Conv2d: DepthwiseConv2d,
    torch.nn.Conv3d: DepthwiseConv3d,
}


def _replaceable(m: torch.nn.Module) -> bool:
    return (
        type(m) in _REPLACEMENTS
        and m.groups == m.in_channels == m.out_channels
        and m.padding_mode == "zeros"
        and m.weight.dtype in _DTYPES
    )


def convert(model: torch.nn.Module) -> torch.nn.Module:
    """Swaps, in place, every depthwise nn.Conv1d/2d/3d (groups == in == out channels,
    zero padding, bf16/f16/f32) for evokernel's module with the same weights; leaves the
    rest alone. Returns the model (the model itself if it is such a conv)."""
    if _replaceable(model):
        return _converted(model)
    for name, child in list(model.named_children()):
        if _replaceable(child):
            setattr(model, name, _converted(child))
        else:
            convert(child)
    return model


def _converted(m: torch.nn.Module) -> torch.nn.Module:
    new = _REPLACEMENTS[type(m)](
        m.in_channels,
        m.out_channels,
        m.kernel_size,
        stride=m.stride,
        padding=m.padding,
        dilation=m.dilation,
        groups=m.groups,
        bias=m.bias is not None,
        device=m.weight.device,
        dtype=m.weight.dtype,
    )
    new.load_state_dict(m.state_dict())
    new.train(m.training)
    return new
