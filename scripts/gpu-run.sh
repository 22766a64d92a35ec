#!/usr/bin/env bash
# One call on the GPU machine (with .gpu carried): tests, devices, the seed run, the
# PyTorch reference, and memcheck. Logs go to $OUT/logs.tgz (the device returns at most
# 8 files); a short summary prints last.
set -uo pipefail
out=/tmp/evk-out
rm -rf "$out"; mkdir -p "$out"
export EVOKERNEL_CACHE_DIR=/tmp/evk-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > "$out/smi.txt" 2>&1
step() { local name=$1; shift; local t0=$SECONDS; timeout "${LIMIT:-300}" "$@" > "$out/$name.log" 2>&1; local rc=$?; printf '%-12s rc=%-3s %5ss\n' "$name" "$rc" "$((SECONDS - t0))" >> "$out/summary.txt"; return $rc; }
: > "$out/summary.txt"
for s in ${STEPS:-tests devices run torch memcheck racecheck}; do
  case $s in
    tests) LIMIT=450 step tests bash .gpu/run-tests.sh ;;
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
    ncucsv)
      # Raw counter CSV per ladder variant on the seed: the sample the profile parser is
      # tested against. Metric names are filtered against what this ncu knows.
      ncu --query-metrics > "$out/ncu-metrics.txt" 2>&1
      want="gpu__time_duration dram__throughput dram__bytes_read dram__bytes_write gpu__compute_memory_throughput sm__throughput l1tex__throughput lts__throughput lts__t_sector_hit_rate sm__warps_active sm__maximum_warps_per_active_cycle_pct sm__pipe_fma_cycles_active sm__pipe_alu_cycles_active sm__pipe_fp16_cycles_active sm__pipe_tensor_op_hmma_cycles_active sm__pipe_tensor_cycles_active sm__pipe_shared_cycles_active sm__inst_executed_pipe_lsu smsp__issue_active l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st l1tex__data_pipe_lsu_wavefronts_mem_shared launch__registers_per_thread launch__block_size launch__grid_size launch__shared_mem_per_block_static launch__shared_mem_per_block_dynamic launch__occupancy_limit_registers launch__occupancy_limit_shared_mem launch__occupancy_limit_blocks launch__occupancy_limit_warps launch__waves_per_multiprocessor"
      list=""
      for m in $want; do grep -qE "^ *$m( |$)" "$out/ncu-metrics.txt" && list="$list $m" || echo "missing $m" >> "$out/ncu-missing.txt"; done
      stalls=$(grep -oE "^ *smsp__average_warps_issue_stalled_[a-z0-9_]+_per_issue_active" "$out/ncu-metrics.txt" | tr -d ' ' | sed 's/$/.ratio/' | tr '\n' ',')
      full=""
      for m in $list; do case $m in launch__*|*_pct|lts__t_sector_hit_rate) full="$full,$m";; *_op_ld|*_op_st|*_shared|dram__bytes_*) full="$full,$m.sum";; gpu__time_duration) full="$full,$m.sum";; sm__warps_active|sm__pipe_*|sm__inst_executed_pipe_*|smsp__issue_active|l1tex__throughput) full="$full,$m.avg.pct_of_peak_sustained_active";; *) full="$full,$m.avg.pct_of_peak_sustained_elapsed";; esac; done
      full="${full#,},${stalls%,}"
      full=$(echo "$full" | sed 's/lts__t_sector_hit_rate/lts__t_sector_hit_rate.pct/')
      echo "$full" > "$out/ncu-metric-list.txt"
      for v in naive smem_tile tensor_core streaming channels_last; do
        case_=seed-bf16; [ $v = channels_last ] && case_=seed-bf16-ndhwc
        LIMIT=120 step "ncucsv-$v" ncu --csv --page raw --log-file "$out/ncu-$v.csv" --kernel-name "regex:${v}_dwconv" --launch-count 1 --metrics "$full" .gpu/evokernel bench --suite public --case $case_ --only $v --iters 1
      done
      LIMIT=120 step ncucsv-details ncu --csv --page details --log-file "$out/ncu-streaming-details.csv" --kernel-name regex:streaming_dwconv --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis .gpu/evokernel bench --suite public --case seed-bf16 --only streaming --iters 1
      head -c 3000 "$out/ncu-streaming.csv" > "$out/ncu-head.txt" ;;
    suite) LIMIT=400 step suite .gpu/evokernel bench --suite public --json "$out/suite.json" ;;
    tunefma)
      # The FMA variants' spaces, exhaustively, on the cases they win.
      export EVOKERNEL_CACHE_DIR=/tmp/evk-tune-cache
      for c in seed-bf16-ndhwc mobilenet-s2; do LIMIT=200 step "tune-cl-$c" .gpu/evokernel tune --suite public --case "$c" --only channels_last --search exhaustive --retune --json "$out/tune-cl-$c.json"; done
      for c in seed-f32 causal-conv1d; do LIMIT=200 step "tune-st-$c" .gpu/evokernel tune --suite public --case "$c" --only smem_tile --search exhaustive --retune --json "$out/tune-st-$c.json"; done
      cat "$out"/tune-cl-*.log "$out"/tune-st-*.log | grep -E "channels_last|smem_tile" > "$out/tune-summary.log"
      export EVOKERNEL_CACHE_DIR=/tmp/evk-cache ;;
    profile) LIMIT=400 step profile .gpu/evokernel profile --json "$out/profile.json" --out "$out/profile-plots" ;;
    tune)
      # Evolutionary vs exhaustive on the streaming space, then a second process that
      # must reuse the cache, then a run that must pick the tuned configs up.
      export EVOKERNEL_CACHE_DIR=/tmp/evk-tune-cache
      for c in ${TUNE_CASES:-seed-bf16 x3d-3x3x3 video-vae-causal seed-f16}; do
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
for f in devices torch run suite; do [ -f "$out/$f.log" ] && tail -25 "$out/$f.log"; done
[ -f "$out/sweep.log" ] && cut -c1-200 "$out/sweep.log"
[ -f "$out/tune-summary.log" ] && cut -c1-230 "$out/tune-summary.log"
[ -f "$out/ncu-head.txt" ] && cut -c1-600 "$out/ncu-head.txt" | head -8; cat "$out/ncu-missing.txt" 2>/dev/null
[ -f "$out/ncu.log" ] && grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Theoretical Occupancy|Registers Per|Stall|L2 Hit|Block Limit" "$out/ncu.log" | head -30
[ -f "$out/profile.log" ] && grep -vE "^[│┌└╞├]" "$out/profile.log" | grep -E "^seed|verdict|next|occupancy|counters" | cut -c1-260 | tail -40
cat "$out/summary.txt"
[ -n "${OUT:-}" ] && tar czf "$OUT/logs.tgz" -C "$out" . && cp "$out/summary.txt" "$OUT/"
