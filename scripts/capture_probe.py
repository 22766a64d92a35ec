"""Which evokernel op breaks CUDA graph capture (run on the GPU machine): captures one op
per process (forward, grad-input, grad-weight; then forward + autograd.grad through
evokernel and, as a control, through F.conv3d) after a warm-up on a side stream, as
test_cuda_graph_capture_and_two_streams does, and prints ok or the error.
Usage: python3 scripts/capture_probe.py [forward|dgrad|wgrad|autograd|autograd-torch][-first|-keep]
(-first: once on the default stream before the warm-up; -keep: that first output, and so
its graph, kept alive through the capture; no argument: all of them).
Run 79 (H100): every one captures and replays. The test failed (run 81) because it kept
its first output alive: that graph holds the leaves' grad accumulators, which remember
the legacy stream of their first forward, and the captured backward then makes the legacy
stream wait on the capture (CUDAGuardImpl::block in autograd's evaluate_function). The
-keep cases show it for evokernel and F.conv3d alike."""
import subprocess
import sys

import torch


def run(which):
    import evokernel  # registers torch.ops.evokernel
    torch.manual_seed(6)
    grad = which.startswith("autograd")
    x = torch.randn(2, 32, 6, 16, 20, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
    w = torch.randn(32, 1, 3, 5, 5, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
    gy = torch.randn(2, 32, 4, 16, 20, device="cuda", dtype=torch.bfloat16)
    pads, ones = [0, 0, 2, 2, 2, 2], [1, 1, 1]
    ops = {
        "forward": lambda: evokernel.depthwise_conv(x, w, padding=(0, 2, 2)),
        "dgrad": lambda: torch.ops.evokernel.depthwise_conv_dgrad(gy, x, w, ones, pads, ones),
        "wgrad": lambda: torch.ops.evokernel.depthwise_conv_wgrad(gy, x, w, ones, pads, ones),
        "autograd": lambda: torch.autograd.grad(
            evokernel.depthwise_conv(x, w, padding=(0, 2, 2)).float().square().sum(), (x, w)),
        "autograd-torch": lambda: torch.autograd.grad(
            torch.nn.functional.conv3d(x, w, padding=(0, 2, 2), groups=32).float().square().sum(),
            (x, w)),
    }
    op = ops[which.replace("-first", "").replace("-keep", "")]
    kept = None
    if which.endswith("-first"):
        op()  # once on the default (legacy) stream first
        torch.cuda.synchronize()
    elif which.endswith("-keep"):
        fwd = evokernel.depthwise_conv if "torch" not in which else (
            lambda a, b, padding: torch.nn.functional.conv3d(a, b, padding=padding, groups=32))
        kept = fwd(x, w, padding=(0, 2, 2))  # its graph stays alive, as a test's y0 would
        torch.autograd.grad(kept.float().square().sum(), (x, w), retain_graph=True)
        torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            op()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            op()
        graph.replay()
        torch.cuda.synchronize()
        print(f"{which}: capture ok")
    except Exception as e:  # noqa: BLE001
        print(f"{which}: {type(e).__name__}: {str(e).splitlines()[0]}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        run(sys.argv[1])
    else:
        for w in ("forward", "dgrad", "wgrad", "autograd", "autograd-torch", "autograd-first",
                  "autograd-torch-first", "forward-first", "dgrad-first", "wgrad-first",
                  "autograd-keep", "autograd-torch-keep"):
            subprocess.run([sys.executable, __file__, w], check=False)
