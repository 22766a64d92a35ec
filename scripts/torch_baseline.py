"""PyTorch's F.conv3d on the seed problem, timed like evokernel times (CUDA events,
warm-up, median of many launches), to check that our in-process cuDNN baseline is no
weaker than what users already get. Runs on the GPU machine."""
import sys
import torch
import torch.nn.functional as F


def time_ms(fn, warmup=10, iters=50):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2], times[0], times[-1]


def main():
    torch.manual_seed(0)
    x = torch.randn(1, 512, 61, 45, 80, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(512, 1, 3, 5, 5, device="cuda", dtype=torch.bfloat16)
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    for bench in (False, True):
        torch.backends.cudnn.benchmark = bench
        med, lo, hi = time_ms(lambda: F.conv3d(x, w, padding=(0, 2, 2), groups=512))
        print(f"F.conv3d bf16 seed, cudnn.benchmark={bench}: median {med:.3f} ms (min {lo:.3f}, max {hi:.3f})")
    torch.backends.cudnn.enabled = False
    med, lo, hi = time_ms(lambda: F.conv3d(x, w, padding=(0, 2, 2), groups=512))
    print(f"F.conv3d bf16 seed, cuDNN off (native depthwise): median {med:.3f} ms")
    torch.backends.cudnn.enabled = True
    # cuDNN itself (PyTorch's frontend-API path), which F.conv3d does not pick for 3-D depthwise.
    for name, xx, ww in (("NCDHW", x, w),
                         ("NDHWC", x.to(memory_format=torch.channels_last_3d), w.to(memory_format=torch.channels_last_3d))):
        try:
            med, lo, hi = time_ms(lambda: torch.cudnn_convolution(xx, ww, (0, 2, 2), (1, 1, 1), (1, 1, 1), 512, True, False, False))
            print(f"torch.cudnn_convolution bf16 seed {name} (benchmark): median {med:.3f} ms")
        except Exception as e:  # noqa: BLE001
            print(f"torch.cudnn_convolution {name}: {e}")
        try:
            med, lo, hi = time_ms(lambda: F.conv3d(xx, ww, padding=(0, 2, 2), groups=512))
            print(f"F.conv3d bf16 seed {name}: median {med:.3f} ms")
        except Exception as e:  # noqa: BLE001
            print(f"F.conv3d {name}: {e}")


if __name__ == "__main__":
    sys.exit(main())
