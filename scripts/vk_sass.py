#!/usr/bin/env python3
# SASS of NVIDIA Vulkan pipelines from shader-disk-cache entries (scripts/vk-sass-capture.sh).
# An entry holds zstd frames; the pipeline's frame holds the raw sm_90 instruction stream
# after a header. The stream is found by its last EXIT (the 16-byte phase) and the first
# offset from which nvdisasm decodes 2 KB without error. Needs `zstd` and nvdisasm
# (scripts/sass.sh fetches it from PyPI into .nvrtc/tools).
# Usage: scripts/vk_sass.py ENTRY.bin [--arch SM90] [--steps] > listing.sass
# --steps: instead of the listing, the instruction mix between consecutive barriers (a
# K step of a staged loop), each distinct mix once with how often it occurs.
import collections, os, re, subprocess, sys, tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVDISASM = os.environ.get("NVDISASM", os.path.join(root, ".nvrtc/tools/nvidia/cu13/bin/nvdisasm"))
MAGIC = b"\x28\xb5\x2f\xfd"
EXIT = bytes.fromhex("4d79000000000000")  # EXIT's low word, unpredicated (sm_90)


def frames(data):
    offs = [i for i in range(len(data) - 3) if data[i:i + 4] == MAGIC] + [len(data)]
    for a, b in zip(offs, offs[1:]):
        r = subprocess.run(["zstd", "-d", "-c"], input=data[a:b], capture_output=True)
        if r.stdout:  # trailing bytes past the frame make zstd complain, not fail to decode
            yield r.stdout


def decodes(code, arch):
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        f.write(code)
        f.flush()
        r = subprocess.run([NVDISASM, "-b", arch, f.name], capture_output=True, text=True)
        return r.returncode == 0 and "error" not in r.stderr, r.stdout


def listing(raw, arch):
    exits = [i for i in range(len(raw) - 8) if raw[i:i + 8] == EXIT]
    if not exits:
        return None
    end = exits[-1] + 16
    for start in range(end % 16, end, 16):
        ok, _ = decodes(raw[start:min(start + 2048, end)], arch)
        if ok:
            ok, text = decodes(raw[start:end], arch)
            if ok:
                return start, text
    return None


def steps(text):
    """The opcode counts of each stretch between BAR.SYNCs, distinct ones with a count."""
    ops = []
    for line in text.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m:
            ops.append(m.group(1))
    stretches, cur = [], collections.Counter()
    for op in ops:
        cur[op] += 1
        if op == "BAR":
            stretches.append(cur)
            cur = collections.Counter()
    seen = collections.Counter(tuple(sorted(c.items())) for c in stretches)
    out = []
    for key, n in seen.most_common():
        c = dict(key)
        main = " ".join(f"{op} {c[op]}" for op in ("HMMA", "LDSM", "LDS", "LDG", "STS", "BAR") if op in c)
        out.append(f"  x{n}: {sum(c.values())} instructions: {main}")
    return "\n".join(out)


def main():
    args = sys.argv[1:]
    arch = "SM90"
    summary = "--steps" in args
    args = [a for a in args if a != "--steps"]
    if "--arch" in args:
        i = args.index("--arch")
        arch = args[i + 1]
        del args[i:i + 2]
    for path in args:
        data = open(path, "rb").read()
        found = 0
        for k, raw in enumerate(frames(data)):
            got = listing(raw, arch)
            if got:
                found += 1
                start, text = got
                print(f"// {path} frame {k}: code at {start}, {len(raw)} bytes decompressed")
                print(steps(text) if summary else text)
        if not found:
            print(f"// {path}: no instruction stream found", file=sys.stderr)


if __name__ == "__main__":
    main()
