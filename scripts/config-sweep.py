"""On the GPU machine (with .gpu carried): one variant's default config on some suite
cases, then that config with some parameters changed, one bench each; prints a table of
ms and the ratio to the default. Every config is checked against the oracle by the bench
before it is timed (a failed check prints FAIL).

Usage: python3 scripts/config-sweep.py VARIANT PASS 'SUITE/CASE ...' 'k=v1|v2,k2=v3' ...
Each argument after the cases is one group of changes: its parameters take every
combination of their values, the rest stay at the default (e.g. 'planes=1,dchunk=4|8').
"""
import itertools
import json
import subprocess
import sys
import tempfile

variant, pazz, cases, groups = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4:]
tmp = tempfile.mkdtemp()


def bench(suite, case, config):
    cmd = [".gpu/evokernel", "bench", "--suite", suite, "--case", case, "--pass", pazz,
           "--only", variant, "--json", f"{tmp}/r.json"]
    if config:
        cmd += ["--config", config]
    try:
        subprocess.run(cmd, capture_output=True, timeout=120, check=True)
        rows = json.load(open(f"{tmp}/r.json"))["cases"][0]["rows"]
    except Exception as e:  # a refused config or a failed build: say so, go on
        return None, f"ERR {type(e).__name__}"
    rows = [r for r in rows if r["name"] == variant]
    if not rows:
        return None, "no row"
    r = rows[0]
    if not r["verdict"]["passed"]:
        return None, "FAIL"
    return r["timing"]["median_ms"], r["config"]


for sc in cases:
    suite, case = sc.split("/")
    base_ms, base = bench(suite, case, None)
    print(f"{sc} default {base} {base_ms}", flush=True)
    if base_ms is None:
        continue
    values = dict(kv.split("=") for kv in base.split(":", 1)[1].split(","))
    for g in groups:
        keys, choices = zip(*[(k, v.split("|")) for k, v in (kv.split("=") for kv in g.split(","))])
        for combo in itertools.product(*choices):
            cfg = dict(values)
            cfg.update(zip(keys, combo))
            text = f"{variant}:" + ",".join(f"{k}={v}" for k, v in cfg.items())
            ms, note = bench(suite, case, text)
            ratio = f"{ms / base_ms:.3f}" if ms else "-"
            print(f"{sc} {','.join(f'{k}={v}' for k, v in zip(keys, combo))} {ms} {ratio} {note if ms is None else ''}",
                  flush=True)
