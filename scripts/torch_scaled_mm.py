"""torch._scaled_mm on the GEMM suite (suite/gemm.json), timed like evokernel times (CUDA
events, warm-up, median of many launches): issue 18's cross-check that the cuBLASLt
baseline `evokernel bench --op scaled-mm` measures in process is no weaker than what
PyTorch users get. Not an A/B pair (another process): compare it with the cuBLASLt column
of a bench run in the same GPU call. Runs on the GPU machine.

Usage: python3 scripts/torch_scaled_mm.py OUT.json [--scaling per-tensor|rowwise|blockwise]...
"""
import json
import sys

import torch

from torch_baseline import time_ms  # CUDA events, warm-up, median (same script dir)


def operands(m, n, k, scaling):
    """A [M, K] row-major and B [K, N] column-major (cuBLASLt's layout for fp8), e4m3,
    with their scales for `scaling` (fp32; block-wise: 1x128 on A, 128x128 on B)."""
    a = (torch.randn(m, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, device="cuda") * 0.5).to(torch.float8_e4m3fn).t()
    kb, nb = (k + 127) // 128, (n + 127) // 128
    if scaling == "per-tensor":
        sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(0.25, device="cuda")
    elif scaling == "rowwise":
        sa = torch.rand(m, 1, device="cuda") + 0.5
        sb = torch.rand(1, n, device="cuda") + 0.5
    else:
        # PyTorch's block-wise form: scale_a [M, K/128] (outer dim-major), scale_b
        # [K/128, N/128]; the recipe is inferred from the shapes.
        sa = (torch.rand(kb, m, device="cuda") + 0.5).t()
        sb = (torch.rand(nb, kb, device="cuda") + 0.5).t()
    return a, b, sa, sb


def main():
    out_path = sys.argv[1]
    scalings = [sys.argv[i + 1] for i, v in enumerate(sys.argv) if v == "--scaling"] or [
        "per-tensor",
        "rowwise",
        "blockwise",
    ]
    suite = json.load(open("suite/gemm.json"))["cases"]
    torch.manual_seed(0)
    report = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(),
        "cases": [],
    }
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {report['device']}")
    for scaling in scalings:
        for case in suite:
            m, n, k = case["m"], case["n"], case["k"]
            row = {"name": case["name"], "scaling": scaling, "m": m, "n": n, "k": k}
            try:
                a, b, sa, sb = operands(m, n, k, scaling)
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            # Each accumulation mode apart: one PyTorch refuses is a row entry, not a crash.
            for fast in ((False, True) if "error" not in row else ()):
                key = "fast_accum" if fast else "default"
                try:
                    fn = lambda: torch._scaled_mm(
                        a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast
                    )
                    ms = time_ms(fn)[0]
                    row[f"{key}_ms"] = ms
                    row[f"{key}_tflops"] = 2.0 * m * n * k / ms / 1e9
                except Exception as e:
                    row[f"{key}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            report["cases"].append(row)
            cols = []
            for key in ("default", "fast_accum"):
                if f"{key}_ms" in row:
                    cols.append(f"{key} {row[f'{key}_ms']:9.4f} ms {row[f'{key}_tflops']:7.1f} TFLOP/s")
                else:
                    cols.append(f"{key} unsupported ({row.get(f'{key}_error', row.get('error'))[:60]})")
            print(f"{scaling:10} {case['name']:26} " + "   ".join(cols))
            torch.cuda.empty_cache()
    json.dump(report, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main()
