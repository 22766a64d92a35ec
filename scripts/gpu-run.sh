#!/usr/bin/env bash
# One call on the GPU machine (with .gpu carried): tests, devices, the seed run, the
# PyTorch reference, and memcheck. Logs go to $OUT; a short summary prints last.
set -uo pipefail
out=${OUT:-/tmp/evk-out}
mkdir -p "$out"
export EVOKERNEL_CACHE_DIR=/tmp/evk-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > "$out/smi.txt" 2>&1
step() { local name=$1; shift; local t0=$SECONDS; timeout "${LIMIT:-300}" "$@" > "$out/$name.log" 2>&1; local rc=$?; printf '%-12s rc=%-3s %5ss\n' "$name" "$rc" "$((SECONDS - t0))" >> "$out/summary.txt"; return $rc; }
: > "$out/summary.txt"
for s in ${STEPS:-tests devices run torch memcheck racecheck}; do
  case $s in
    tests) step tests bash .gpu/run-tests.sh ;;
    devices) step devices .gpu/evokernel devices --json "$out/devices.json" ;;
    run) step run .gpu/evokernel run --json "$out/run.json" ;;
    torch) step torch python3 scripts/torch_baseline.py ;;
    memcheck) LIMIT=400 step memcheck compute-sanitizer --tool memcheck --print-limit 20 .gpu/evokernel verify --suite public --only naive --only channels_last --only smem_tile --only tensor_core --only streaming ;;
    sweep)
      # Hand sweep of config spaces on the seed problem until the tuner exists.
      : > "$out/sweep.log"
      for cfg in ${SWEEP:-streaming:warps=4,dchunk=8,stages=1 streaming:warps=4,dchunk=8,stages=2 streaming:warps=4,dchunk=16,stages=2 streaming:warps=4,dchunk=16,stages=3 streaming:warps=8,dchunk=16,stages=2}; do
        v=${cfg%%:*}
        timeout 120 .gpu/evokernel bench --suite public --case seed-bf16 --only "$v" --config "$cfg" --iters 20 2>&1 | grep -E "^│ +┆ $v|^│ seed-bf16 +┆ $v" >> "$out/sweep.log"
      done
      for cfg in ${SWEEP_CL:-}; do
        timeout 120 .gpu/evokernel bench --suite public --case seed-bf16-ndhwc --only channels_last --config "$cfg" --iters 20 2>&1 | grep -E "channels_last" >> "$out/sweep.log"
      done
      echo "sweep        done" >> "$out/summary.txt" ;;
    ncu)
      LIMIT=200 step ncu ncu --kernel-name regex:streaming --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats .gpu/evokernel bench --suite public --case seed-bf16 --only streaming --iters 1 ;;
    tune)
      # Evolutionary vs exhaustive on the streaming space, then a second process that
      # must reuse the cache, then a run that must pick the tuned configs up.
      export EVOKERNEL_CACHE_DIR=/tmp/evk-tune-cache
      for c in ${TUNE_CASES:-seed-bf16 x3d-3x3x3 convnext-7x7 causal-conv1d}; do
        LIMIT=200 step "tune-evo-$c" .gpu/evokernel tune --suite public --case "$c" --only streaming --search evolutionary --retune --json "$out/tune-evo-$c.json"
        LIMIT=200 step "tune-exh-$c" .gpu/evokernel tune --suite public --case "$c" --only streaming --search exhaustive --retune --json "$out/tune-exh-$c.json"
      done
      LIMIT=200 step tune-all .gpu/evokernel tune --suite public --case seed-bf16
      LIMIT=200 step tune-again .gpu/evokernel tune --suite public --case seed-bf16
      LIMIT=200 step run-tuned .gpu/evokernel run
      cat "$out"/tune-evo-*.log "$out"/tune-exh-*.log | grep -E "streaming" > "$out/tune-summary.log"
      tail -12 "$out/tune-again.log" >> "$out/tune-summary.log"; tail -14 "$out/run-tuned.log" >> "$out/tune-summary.log"
      export EVOKERNEL_CACHE_DIR=/tmp/evk-cache ;;
    racecheck) LIMIT=400 step racecheck compute-sanitizer --tool racecheck --print-limit 20 .gpu/evokernel verify --input 5x20x40 --channels 4 --kernel 3x5x5 --padding 0,2,2 --only smem_tile --only tensor_core --only streaming
      LIMIT=200 step racecheck_cl compute-sanitizer --tool racecheck --print-limit 20 .gpu/evokernel verify --input 5x20x40 --channels 128 --kernel 3x5x5 --padding 0,2,2 --layout channels-last --only channels_last ;;
  esac
done
cat "$out/smi.txt"
grep -E "test result|FAILED|panicked|^== " "$out/tests.log" 2>/dev/null | head -30
for f in memcheck racecheck racecheck_cl; do [ -f "$out/$f.log" ] && grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error|Hazard" "$out/$f.log" | head -5; done
for f in devices torch run; do [ -f "$out/$f.log" ] && tail -25 "$out/$f.log"; done
[ -f "$out/sweep.log" ] && cut -c1-200 "$out/sweep.log"
[ -f "$out/tune-summary.log" ] && cut -c1-230 "$out/tune-summary.log"
[ -f "$out/ncu.log" ] && grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Theoretical Occupancy|Registers Per|Stall|L2 Hit|Block Limit" "$out/ncu.log" | head -30
cat "$out/summary.txt"
