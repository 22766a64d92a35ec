"""End-to-end training steps of two real blocks, timed with and without
`evokernel.convert` (issue 20's measurement), and against the block's bound: the same
block with its depthwise convolution replaced by an identity.

  - video-VAE residual block around the seed-shaped layer: GroupNorm -> SiLU -> depthwise
    3x5x5 (padding 0,2,2, so the block crops depth by 2) -> pointwise 1x1x1, plus the
    cropped input (the residual); [1, 512, 61, 45, 80] bf16.
  - X3D-style inverted bottleneck: pointwise expand -> BN -> ReLU -> depthwise 3x3x3 ->
    BN -> SiLU -> pointwise project -> BN, plus the input; [4, 192, 16, 56, 56] bf16 with
    expansion 2.25 (x3d-m's stage 3 widths).

Usage: python3 train_blocks.py [--device cuda] [--small] [--iters N]
Prints one line per block and variant: median ms of forward + backward (+ SGD step), and
one line per block for its depthwise layer alone (forward + backward: grad-input,
grad-weight and grad-bias) through torch's nn.Conv3d and through evokernel's module.
`--small` shrinks every shape (a smoke run on the CPU; CI runs it that way)."""
import argparse
import statistics
import time

import torch
import torch.nn as nn

import evokernel


class Identity3d(nn.Module):
    """Stands in for the depthwise convolution (the bound): keeps the output shape."""

    def __init__(self, crop_depth: int = 0):
        super().__init__()
        self.crop = crop_depth

    def forward(self, x):
        return x[:, :, self.crop:x.shape[2] - self.crop] if self.crop else x


class VideoVaeBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.norm = nn.GroupNorm(32 if c % 32 == 0 else 1, c)
        self.act = nn.SiLU()
        self.dw = nn.Conv3d(c, c, (3, 5, 5), padding=(0, 2, 2), groups=c)
        self.pw = nn.Conv3d(c, c, 1)

    def forward(self, x):
        return self.pw(self.dw(self.act(self.norm(x)))) + x[:, :, 1:-1]


class X3dBottleneck(nn.Module):
    def __init__(self, c: int, expand: float = 2.25):
        super().__init__()
        m = int(c * expand)
        self.expand = nn.Sequential(nn.Conv3d(c, m, 1, bias=False), nn.BatchNorm3d(m), nn.ReLU())
        self.dw = nn.Conv3d(m, m, 3, padding=1, groups=m, bias=False)
        self.post = nn.Sequential(nn.BatchNorm3d(m), nn.SiLU(), nn.Conv3d(m, c, 1, bias=False), nn.BatchNorm3d(c))

    def forward(self, x):
        return self.post(self.dw(self.expand(x))) + x


def median_ms(step, cuda: bool, iters: int, warmup: int = 3) -> float:
    """Median wall time of `step()` after `warmup` untimed calls (synchronized on CUDA)."""
    times = []
    for i in range(warmup + iters):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def step_ms(model, x, iters: int) -> float:
    """One SGD training step of the block: forward, backward, update."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).float().square().mean().backward()
        opt.step()

    return median_ms(step, x.is_cuda, iters)


def layer_ms(layer, shape, dtype, dev, iters: int) -> float:
    """Forward + backward of one layer on a fresh input that needs its gradient."""
    x = torch.randn(*shape, device=dev, dtype=dtype, requires_grad=True)

    def step():
        x.grad = None
        layer.zero_grad(set_to_none=True)
        y = layer(x)
        y.backward(torch.ones_like(y))

    return median_ms(step, x.is_cuda, iters)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="tiny shapes (a smoke run)")
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    blocks = {
        "video-vae": (lambda: VideoVaeBlock(32 if args.small else 512),
                      (1, 32, 7, 9, 16) if args.small else (1, 512, 61, 45, 80), 1),
        "x3d": (lambda: X3dBottleneck(16 if args.small else 192),
                (2, 16, 4, 8, 8) if args.small else (4, 192, 16, 56, 56), 0),
    }
    # The depthwise layer's input: the block's input, widened by the X3D expansion.
    layer_inputs = {
        "video-vae": (1, 32, 7, 9, 16) if args.small else (1, 512, 61, 45, 80),
        "x3d": (2, 36, 4, 8, 8) if args.small else (4, 432, 16, 56, 56),
    }
    print(f"torch {torch.__version__}, evokernel {evokernel.__version__}, {dev}, {dtype}")
    results = {}
    for name, (make, shape, crop) in blocks.items():
        torch.manual_seed(0)
        base = make().to(dev, dtype)
        x = torch.randn(*shape, device=dev, dtype=dtype, requires_grad=True)
        converted = evokernel.convert(make().to(dev, dtype))
        converted.load_state_dict(base.state_dict())
        bound = make().to(dev, dtype)
        bound.load_state_dict(base.state_dict())
        bound.dw = Identity3d(crop)
        with torch.no_grad():
            same = (base(x) - converted(x)).float().norm() / base(x).float().norm()
        row = {
            "pytorch": step_ms(base, x, args.iters),
            "evokernel": step_ms(converted, x, args.iters),
            "bound (identity)": step_ms(bound, x, args.iters),
        }
        results[name] = row
        ratio = row["pytorch"] / row["evokernel"]
        print(f"{name:10} rel diff {same:.1e}  " + "  ".join(f"{k} {v:.3f} ms" for k, v in row.items())
              + f"  speedup {ratio:.1f}x, {row['evokernel'] / row['bound (identity)']:.2f}x the bound")
        torch_layer, evk_layer = base.dw, converted.dw
        layer = {
            "pytorch": layer_ms(torch_layer, layer_inputs[name], dtype, dev, args.iters),
            "evokernel": layer_ms(evk_layer, layer_inputs[name], dtype, dev, args.iters),
        }
        results[name + " layer"] = layer
        print(f"{name + ' dw':10} forward + backward: pytorch {layer['pytorch']:.3f} ms  "
              f"evokernel {layer['evokernel']:.3f} ms  speedup {layer['pytorch'] / layer['evokernel']:.1f}x")
    return results


if __name__ == "__main__":
    main()
