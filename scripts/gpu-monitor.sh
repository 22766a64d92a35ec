#!/usr/bin/env bash
# On the GPU machine: sample the GPU's SM clock, power, temperature and clock-event
# (throttle) reasons every 500 ms while a call measures, and say afterwards whether any
# sample was slowed by heat or power, because timings taken then are not comparable: an
# H100 at 84-92 C under SW thermal slowdown timed identical code at 0.81 and 1.21 ms
# (docs/perf.md, run 280).
# Usage: scripts/gpu-monitor.sh start DIR   (samples into DIR/smi.csv)
#        scripts/gpu-monitor.sh stop DIR    (stops; prints one line, a WARNING if slowed)
set -u
cmd=$1 dir=$2
case $cmd in
  start)
    mkdir -p "$dir"
    nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu,utilization.gpu,clocks_throttle_reasons.active \
      --format=csv,noheader,nounits -lms 500 > "$dir/smi.csv" 2>&1 &
    echo $! > "$dir/smi.pid" ;;
  stop)
    [ -f "$dir/smi.pid" ] && kill "$(cat "$dir/smi.pid")" 2>/dev/null
    rm -f "$dir/smi.pid"
    python3 - "$dir/smi.csv" <<'PY'
import sys
# Reasons that slow a busy GPU: SW power cap, HW slowdown, SW/HW thermal, power brake.
SLOW = {0x4: "sw-power-cap", 0x8: "hw-slowdown", 0x20: "sw-thermal", 0x40: "hw-thermal", 0x80: "power-brake"}
# Heat and hardware slowdowns always void a call (run 280: 0.81 vs 1.21 ms). The power
# cap flags a few samples of most calls, mostly at 1920-1965 of 1980 MHz (runs 287-289;
# one at 1665 in run 287's tuning): that
# voids a call only when it is frequent (> 5% of busy samples) or deep (a flagged
# sample's SM clock under 95% of the call's highest).
ALWAYS = {"hw-slowdown", "sw-thermal", "hw-thermal", "power-brake"}
n = busy = slowed = 0; seen = set(); tmax = 0; clk_max = 0; clk_flagged = None
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split(",")]
    if len(f) != 5 or not f[4].startswith("0x"):
        continue
    n += 1
    tmax = max(tmax, int(float(f[2])))
    clk = int(float(f[0])); clk_max = max(clk_max, clk)
    busy += float(f[3]) > 0
    bits = int(f[4], 16)
    hit = [name for b, name in SLOW.items() if bits & b]
    if hit:
        slowed += 1; seen.update(hit)
        clk_flagged = clk if clk_flagged is None else min(clk_flagged, clk)
msg = f"gpu-monitor: {n} samples, max {tmax} C, slowed in {slowed}"
if seen:
    msg += f" ({', '.join(sorted(seen))}; lowest SM clock then {clk_flagged} of {clk_max} MHz)"
    if seen & ALWAYS or slowed > 0.05 * max(busy, 1) or clk_flagged < 0.95 * clk_max:
        msg += ": WARNING: timings of this call are not comparable"
    else:
        msg += ": brief and shallow, timings comparable"
print(msg)
PY
    ;;
  *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
