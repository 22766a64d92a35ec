"""Which evokernel op breaks CUDA graph capture (run on the GPU machine): captures one op
per process (forward, grad-input, grad-weight) after a warm-up on a side stream, as
test_cuda_graph_capture_and_two_streams does, and prints ok or the error.
Usage: python3 scripts/capture_probe.py [forward|dgrad|wgrad]  (no argument: all three)"""
import subprocess
import sys

import torch


def run(which):
    import evokernel  # noqa: F401  (registers torch.ops.evokernel)
    torch.manual_seed(6)
    x = torch.randn(2, 32, 6, 16, 20, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(32, 1, 3, 5, 5, device="cuda", dtype=torch.bfloat16)
    gy = torch.randn(2, 32, 4, 16, 20, device="cuda", dtype=torch.bfloat16)
    pads, ones = [0, 0, 2, 2, 2, 2], [1, 1, 1]
    ops = {
        "forward": lambda: evokernel.depthwise_conv(x, w, padding=(0, 2, 2)),
        "dgrad": lambda: torch.ops.evokernel.depthwise_conv_dgrad(gy, x, w, ones, pads, ones),
        "wgrad": lambda: torch.ops.evokernel.depthwise_conv_wgrad(gy, x, w, ones, pads, ones),
    }
    op = ops[which]
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
        for w in ("forward", "dgrad", "wgrad"):
            subprocess.run([sys.executable, __file__, w], check=False)
