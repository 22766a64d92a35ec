"""The training-step example runs (tiny shapes on the CPU) and its converted blocks
compute what the PyTorch blocks do."""
import pathlib
import runpy
import sys

import torch


def test_train_blocks_example_runs_small(monkeypatch, capsys):
    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "train_blocks.py"
    monkeypatch.setattr(sys, "argv", [str(path), "--small", "--iters", "1", "--device", "cpu"])
    module = runpy.run_path(str(path))
    results = module["main"]()
    assert set(results) == {"video-vae", "x3d", "video-vae layer", "x3d layer"}
    for row in results.values():
        assert all(v > 0 for v in row.values())
    out = capsys.readouterr().out
    assert "rel diff" in out and torch.__version__ in out
    assert out.count("forward + backward") == 2
