"""evokernel: fast, verified depthwise convolution for PyTorch.

    import evokernel
    y = evokernel.depthwise_conv(x, weight, bias, padding=(0, 2, 2), activation="silu")

`x` is [N, C, *spatial] (1-3 spatial dims), contiguous or channels_last; `weight` is
[C, 1, *kernel] (groups == C); bf16, f16 or f32; CUDA tensors run on the engine's GPU
kernels on torch's current stream with no copies, CPU tensors on its CPU backend.
`evokernel.torch` holds the custom op, the DepthwiseConv1d/2d/3d modules and `convert`.
"""

from . import _evokernel  # noqa: F401  (the compiled extension)
from .torch import (  # noqa: F401
    DepthwiseConv1d,
    DepthwiseConv2d,
    DepthwiseConv3d,
    convert,
    depthwise_conv,
    plan_name,
    tune,
)

__version__ = _evokernel.__version__
