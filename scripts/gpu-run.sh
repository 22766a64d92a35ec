#!/usr/bin/env bash
# One call on the GPU machine (with .gpu carried): tests, devices, the seed run, the
# PyTorch reference, the suite, profile, tuning, the sanitizers and the fp8 GEMM's test
# (STEPS picks).
# Logs go to $OUT/logs.tgz (the device returns at most 8 files); a summary prints last.
set -uo pipefail
out=/tmp/evk-out
rm -rf "$out"; mkdir -p "$out"
export EVOKERNEL_CACHE_DIR=/tmp/evk-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > "$out/smi.txt" 2>&1
scripts/gpu-monitor.sh start "$out"  # throttle reasons sampled through the call
# Each step's log is tarred into $OUT as soon as it ends: a call cut off by its limit
# still returns the steps that finished.
step() { local name=$1; shift; local t0=$SECONDS; timeout "${LIMIT:-300}" "$@" > "$out/$name.log" 2>&1; local rc=$?; printf '%-12s rc=%-3s %5ss\n' "$name" "$rc" "$((SECONDS - t0))" >> "$out/summary.txt"; [ -n "${OUT:-}" ] && tar czf "$OUT/logs.tgz" -C "$out" . 2>/dev/null; return $rc; }
: > "$out/summary.txt"
for s in ${STEPS:-tests devices run torch memcheck racecheck}; do
  case $s in
    tests) LIMIT=450 step tests bash .gpu/run-tests.sh ;;
    devices) step devices .gpu/evokernel devices --json "$out/devices.json" ;;
    run) step run .gpu/evokernel run --json "$out/run.json" ;;
    torch) step torch python3 scripts/torch_baseline.py ;;
    memcheck) LIMIT=400 step memcheck compute-sanitizer --tool memcheck --print-limit 20 .gpu/evokernel verify --suite public --only naive --only channels_last --only smem_tile --only tensor_core --only streaming --only streaming_cl --only depth_reuse --only depth_reuse_fma --only depth_reuse_fma_cl ;;
    suite)
      # PyTorch's forward on the three suites first, then each suite against the best of
      # it and cuDNN in process (backend API search and legacy), all in this one call.
      # Every row with the L2 swept before each launch (cuDNN's engines leave L2 full of
      # dirty lines that the next row's launch pays for: docs/perf.md, runs 263 and 357).
      LIMIT=300 step torch_ref python3 scripts/torch_reference.py "$out/torch-ref.json" suite/public.json suite/channels-last.json suite/models.json --passes forward
      LIMIT=400 step suite .gpu/evokernel bench --suite public --sweep-l2 --reference "$out/torch-ref.json" --json "$out/suite.json"
      LIMIT=300 step suite_cl .gpu/evokernel bench --suite channels-last --sweep-l2 --reference "$out/torch-ref.json" --json "$out/suite-cl.json"
      LIMIT=300 step suite_models .gpu/evokernel bench --suite models --sweep-l2 --reference "$out/torch-ref.json" --json "$out/suite-models.json"
      # The bench's own line per suite: geometric mean against the best reference, the
      # cases slower than it, the cases at 50% and 60% of their floors.
      grep -h "auto vs the best reference" "$out"/suite*.log >> "$out/summary.txt" ;;
    tunefma)
      # The FMA variants' spaces, exhaustively, on the cases they win.
      export EVOKERNEL_CACHE_DIR=/tmp/evk-tune-cache
      for c in seed-bf16-ndhwc mobilenet-s2; do LIMIT=200 step "tune-cl-$c" .gpu/evokernel tune --suite public --case "$c" --only channels_last --search exhaustive --retune --json "$out/tune-cl-$c.json"; done
      for c in seed-f32 causal-conv1d; do LIMIT=200 step "tune-st-$c" .gpu/evokernel tune --suite public --case "$c" --only smem_tile --search exhaustive --retune --json "$out/tune-st-$c.json"; done
      cat "$out"/tune-cl-*.log "$out"/tune-st-*.log | grep -E "channels_last|smem_tile" > "$out/tune-summary.log"
      export EVOKERNEL_CACHE_DIR=/tmp/evk-cache ;;
    sweep)
      # One variant's default and changed configs on some cases, through
      # scripts/config-sweep.py: SWEEP_VARIANT, SWEEP_PASS (default forward), SWEEP_CASES
      # (SUITE/CASE words) and SWEEP_CONFIGS (space-separated groups, e.g. 'dchunk=4|8').
      LIMIT=600 step sweep python3 scripts/config-sweep.py "$SWEEP_VARIANT" "${SWEEP_PASS:-forward}" "$SWEEP_CASES" $SWEEP_CONFIGS
      cp "$out/sweep.log" "$out/sweep.txt" ;;
    engine)
      # The Engine example (cargo build --release -p evokernel --example engine; copy
      # target/release/examples/engine to .gpu/engine-example before staging the run).
      LIMIT=200 step engine .gpu/engine-example ;;
    python)
      # The PyTorch package against torch on the GPU: copy target/wheels-py/*.whl (from
      # scripts/test-python.sh) into .gpu/ first; pytest runs every test on cuda too
      # (277 s in run 191: the slowest tests are listed last, to find what to trim).
      LIMIT=400 step python bash -c 'python3 -m pip install -q --no-deps --target /tmp/evk-py .gpu/evokernel-*.whl && cd python/tests && PYTHONPATH=/tmp/evk-py python3 -m pytest -q --durations=15' ;;
    backward)
      # Both backward passes on a suite (BWD_SUITE, default public; every kernel, then
      # the picks) against cuDNN's backend API and PyTorch's backward, same call.
      bs=${BWD_SUITE:-public}
      LIMIT=300 step torch_bwd python3 scripts/torch_reference.py "$out/torch-bwd.json" "suite/$bs.json" --passes dgrad,wgrad
      LIMIT=${BWD_LIMIT:-300} step dgrad .gpu/evokernel bench --suite "$bs" --pass dgrad --reference "$out/torch-bwd.json" ${BWD_ARGS:-} --json "$out/dgrad.json"
      LIMIT=${BWD_LIMIT:-300} step wgrad .gpu/evokernel bench --suite "$bs" --pass wgrad --reference "$out/torch-bwd.json" ${BWD_ARGS:-} --json "$out/wgrad.json" ;;
    bwdcheck)
      LIMIT=300 step bwd_memcheck compute-sanitizer --tool memcheck --print-limit 20 .gpu/evokernel verify --suite public --pass all --only dgrad_gather --only wgrad --only wgrad_mma --only wgrad_tile --only wgrad_tile_cl --only depth_reuse --only depth_reuse_fma_cl --only smem_tile
      LIMIT=200 step bwd_racecheck compute-sanitizer --tool racecheck --print-limit 20 .gpu/evokernel verify --input 5x20x40 --channels 40 --kernel 3x5x5 --padding 0,2,2 --pass all --only wgrad --only wgrad_mma --only wgrad_tile --only dgrad_gather --only depth_reuse
      LIMIT=200 step bwd_racecheck_cl compute-sanitizer --tool racecheck --print-limit 20 .gpu/evokernel verify --input 5x20x40 --channels 40 --kernel 3x5x5 --padding 0,2,2 --layout channels-last --pass all --only wgrad --only wgrad_tile_cl --only dgrad_gather ;;
    wgradz)
      # grad-weight past 8 tap-row groups (the groups split over blocks along z):
      # RepLKNet's 31x31 at the default and forced 1 and 2 rows a thread, a 3-D spec of 11
      # groups in both layouts, then the sanitizers on a small 17x31 spec.
      LIMIT=150 step wgradz_verify bash -c 'e=.gpu/evokernel; m="--suite models --case replknet-31x31 --pass wgrad --only wgrad";
        $e verify $m --bias && $e verify $m --config wgrad:rows=1,run=8,splits=8,warps=1 &&
        $e verify $m --config wgrad:rows=2,run=8,splits=8,warps=1 &&
        for l in channels-first channels-last; do $e verify --input 9x30x40 --channels 40 --kernel 5x7x15 --padding 2,3,7 --layout $l --pass wgrad --only wgrad --dtype f32 || exit 1; done'
      z="verify --input 20x24 --channels 8 --kernel 17x31 --padding 8,15 --pass wgrad --only wgrad --bias"
      LIMIT=150 step wgradz_memcheck compute-sanitizer --tool memcheck --print-limit 20 .gpu/evokernel $z
      LIMIT=150 step wgradz_racecheck compute-sanitizer --tool racecheck --print-limit 20 .gpu/evokernel $z
      LIMIT=150 step wgradz_tests .gpu/tests/gpu-* --include-ignored --test-threads=1 grad_weight ;;
    gemm)
      # The fp8 scaled GEMM's kernels (mma.sync and wgmma rungs) and cuBLASLt against the
      # f64 oracle (every scaling, output type and bias), then under memcheck and racecheck.
      LIMIT=300 step gemm .gpu/tests/gpu-* --include-ignored --test-threads=1 scaled_mm
      LIMIT=300 step gemm_cublaslt .gpu/tests/gpu-* --include-ignored --test-threads=1 cublaslt_scaled_mm
      LIMIT=300 step gemm_tuner .gpu/tests/gpu-* --include-ignored --test-threads=1 gemm_tuner
      LIMIT=400 step gemm_memcheck compute-sanitizer --tool memcheck --print-limit 20 .gpu/tests/gpu-* --include-ignored --test-threads=1 scaled_mm_kernels
      LIMIT=400 step gemm_racecheck compute-sanitizer --tool racecheck --print-limit 20 .gpu/tests/gpu-* --include-ignored --test-threads=1 scaled_mm_kernels ;;
    gemmbench)
      # The GEMM suite, each case's ladder against cuBLASLt in the same call
      # (GEMM_SCALING: per-tensor, rowwise or blockwise; GEMM_ARGS: e.g. --case square-8192).
      LIMIT=${GEMM_LIMIT:-500} step gemmbench .gpu/evokernel bench --op scaled-mm --suite gemm --scaling "${GEMM_SCALING:-per-tensor}" ${GEMM_ARGS:-} --json "$out/gemm-${GEMM_SCALING:-per-tensor}.json" ;;
    gemmtorch)
      # torch._scaled_mm on the GEMM suite (a cross-check of the in-process cuBLASLt).
      LIMIT=300 step gemmtorch python3 scripts/torch_scaled_mm.py "$out/torch-scaled-mm.json" ;;
    gemmprofile)
      # The GEMM's kernels under Nsight Compute (GEMM_PROFILE_ARGS: the problem flags).
      LIMIT=300 step gemmprofile .gpu/evokernel profile --op scaled-mm ${GEMM_PROFILE_ARGS:---m 8192 --n 8192 --k 8192} --json "$out/gemm-profile.json" ;;
    vulkan)
      # The Vulkan backend on the NVIDIA driver (scripts/vulkan-nvidia.sh stage before).
      source scripts/vulkan-nvidia.sh env
      step vk_devices .gpu/evokernel devices
      LIMIT=450 step vk_tests bash -c 'for t in .gpu/tests/vulkan-*; do $t --include-ignored --test-threads=1; done' ;;
    dense)
      # The dense suite on the NVIDIA Vulkan driver (scripts/vulkan-nvidia.sh stage before)
      # against PyTorch's F.convNd (cuDNN, benchmark mode) in the same call; DENSE_ARGS
      # e.g. "--case resnet50-3x3-28" or "--config dense_direct:...".
      LIMIT=300 step torch_dense python3 scripts/torch_reference.py "$out/torch-dense.json" suite/dense.json --passes forward --selections 3
      source scripts/vulkan-nvidia.sh env
      LIMIT=${DENSE_LIMIT:-500} step dense .gpu/evokernel bench --op dense-conv --backend vulkan --suite dense --reference "$out/torch-dense.json" ${DENSE_ARGS:-} --json "$out/dense.json" ;;
    vkdepthwise)
      # Depthwise on Vulkan (dense_naive, tile, depth_rotate, depth_rotate_cl) beside the
      # CUDA kernels, same call, on the public and channels-last suites (every dtype; or
      # VKDW_ARGS, e.g. "--case mobilenet-s2"): the depthwise shaders tuned first, a case
      # at a time (evolutionary, VKDW_CASES picks, VKDW_TUNE=0 skips), the bench then runs
      # the tuned configs.
      LIMIT=400 step cuda_public .gpu/evokernel bench --suite public ${VKDW_ARGS:-} --json "$out/cuda-public.json"
      LIMIT=300 step cuda_channels-last .gpu/evokernel bench --suite channels-last ${VKDW_ARGS:-} --json "$out/cuda-channels-last.json"
      source scripts/vulkan-nvidia.sh env
      export EVOKERNEL_CACHE_DIR=/tmp/evk-vkdw
      for s in public channels-last; do
        # One case a tune (each records its result in the cache as it ends), so a case that
        # runs past VKDW_TUNE_LIMIT (the NCDHW seeds' searches are long: run 163 finished
        # no whole suite in 110 s) costs only itself.
        if [ "${VKDW_TUNE:-1}" = 1 ]; then
          for c in ${VKDW_CASES:-$(python3 -c "import json,sys; print(' '.join(c['name'] for c in json.load(open(sys.argv[1]))['cases']))" "suite/$s.json")}; do
            LIMIT=${VKDW_TUNE_LIMIT:-60} step "vk_tune_$s-$c" .gpu/evokernel tune --op dense-conv --backend vulkan --suite "$s" --case "$c" --search evolutionary --retune --json "$out/vk-tune-$s-$c.json"
          done
        fi
        LIMIT=400 step "vk_$s" .gpu/evokernel bench --op dense-conv --backend vulkan --suite "$s" ${VKDW_ARGS:-} --json "$out/vk-$s.json"
        # Per case: Vulkan's best over the CUDA FMA kernels' best (the issue: <= 1.5).
        python3 scripts/vk_vs_cuda.py "$out/cuda-$s.json" "$out/vk-$s.json" > "$out/vk-vs-cuda-$s.txt" 2>&1
      done
      export EVOKERNEL_CACHE_DIR=/tmp/evk-cache
      [ -n "${OUT:-}" ] && tar czf "$OUT/logs.tgz" -C "$out" . ;;
    coopmat)
      # The cooperative-matrix shader on the ResNet-50 3x3 layers: its oracle test, the
      # evolutionary search on all five, PyTorch and the tuned picks (same call), then
      # exhaustive on two (the issue's 3% check) last: a call cut short keeps the rest.
      source scripts/vulkan-nvidia.sh env
      export EVOKERNEL_CACHE_DIR=/tmp/evk-coopmat
      LIMIT=150 step vk_coopmat_test bash -c 'for t in .gpu/tests/vulkan-*; do $t --include-ignored --test-threads=1 coopmat; done'
      ct="tune --op dense-conv --backend vulkan --suite dense --only dense_coopmat --retune"
      for c in ${COOPMAT_CASES:-resnet50-3x3-56 resnet50-3x3-14 resnet50-3x3-28 resnet50-3x3-7 resnet50-3x3-s2}; do
        LIMIT=60 step "ctune-evo-$c" .gpu/evokernel $ct --case "$c" --search evolutionary --json "$out/ctune-evo-$c.json"
      done
      LIMIT=300 step torch_dense python3 scripts/torch_reference.py "$out/torch-dense.json" suite/dense.json --passes forward --selections 3
      LIMIT=150 step dense .gpu/evokernel bench --op dense-conv --backend vulkan --suite dense --only dense_coopmat --reference "$out/torch-dense.json" --json "$out/dense.json"
      cp "$EVOKERNEL_CACHE_DIR"/*.json "$out/" 2>/dev/null
      for c in ${COOPMAT_EXH:-resnet50-3x3-56 resnet50-3x3-14}; do
        LIMIT=150 step "ctune-exh-$c" .gpu/evokernel $ct --case "$c" --search exhaustive --json "$out/ctune-exh-$c.json"
      done
      cat "$out"/ctune-*.log | grep -E "dense_coopmat" | cut -c1-230 > "$out/tune-summary.log"
      export EVOKERNEL_CACHE_DIR=/tmp/evk-cache ;;
    vkab)
      # Two builds of a dense shader on forced configs, A B A B (scripts/vk-ab.sh): stage
      # the old build as .gpu/evokernel-old and the list as .gpu/ab.txt first.
      source scripts/vulkan-nvidia.sh env
      LIMIT=${AB_LIMIT:-200} step vkab bash scripts/vk-ab.sh .gpu/evokernel-old .gpu/evokernel .gpu/ab.txt ;;
    vkshard)
      # One part of a Vulkan shader's exhaustive search (issue 19's 3% check on spaces a
      # call cannot hold: 570-832 configs of dense_coopmat2 on ResNet-50's layers, ~1.1 s
      # a config): VKSHARD=K/N of VKSHARD_CASE's space for VKSHARD_ONLY. The log keeps a
      # line per candidate (a step cut by its limit keeps what it timed); the summary,
      # the part's three fastest and how many read 2x or more above their `ahead` twin
      # (the 2.25x readings of runs 405-407).
      source scripts/vulkan-nvidia.sh env
      export EVOKERNEL_CACHE_DIR=/tmp/evk-vkshard
      c=${VKSHARD_CASE:-resnet50-3x3-28}
      LIMIT=${VKSHARD_LIMIT:-540} step "vkshard-$c" .gpu/evokernel tune --op dense-conv --backend vulkan --suite dense --case "$c" --only "${VKSHARD_ONLY:-dense_coopmat2}" --search exhaustive --shard "${VKSHARD:-1/2}" --json "$out/vkshard-$c.json"
      python3 - "$out/vkshard-$c.log" >> "$out/summary.txt" <<'PY'
import sys
t = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 6 and f[0] == "trial" and f[-1] == "ms":
        t[f[3]] = float(f[4])
best = sorted(t.items(), key=lambda kv: kv[1])[:3]
print("vkshard fastest:", "; ".join(f"{c} {ms:.4f}" for c, ms in best))
twins = [(c, ms, t[c.replace("ahead=2", "ahead=1")]) for c, ms in t.items()
         if "ahead=2" in c and c.replace("ahead=2", "ahead=1") in t]
slow = [x for x in twins if x[1] >= 2 * x[2]]
print(f"vkshard: {len(t)} timed; {len(slow)} of {len(twins)} ahead=2 configs read >= 2x their ahead=1 twin")
PY
      ;;
    densetune)
      # The direct shader's tuner on two dense layers, evolutionary then exhaustive (the
      # issue's 3% check); DENSE_TUNE_CASES overrides the layers.
      source scripts/vulkan-nvidia.sh env
      export EVOKERNEL_CACHE_DIR=/tmp/evk-dense-tune
      for c in ${DENSE_TUNE_CASES:-resnet50-3x3-28 resnet50-3x3-14}; do
        LIMIT=250 step "dtune-evo-$c" .gpu/evokernel tune --op dense-conv --backend vulkan --suite dense --case "$c" --search evolutionary --retune --json "$out/dtune-evo-$c.json"
        LIMIT=400 step "dtune-exh-$c" .gpu/evokernel tune --op dense-conv --backend vulkan --suite dense --case "$c" --search exhaustive --retune --json "$out/dtune-exh-$c.json"
      done
      cat "$out"/dtune-*.log | grep -E "dense_direct" | cut -c1-230 > "$out/tune-summary.log"
      export EVOKERNEL_CACHE_DIR=/tmp/evk-cache ;;
    blocks)
      # Training steps of the X3D and video-VAE blocks with and without convert (needs the
      # wheel in .gpu/, as the python step).
      LIMIT=300 step blocks bash -c 'python3 -m pip install -q --no-deps --target /tmp/evk-py .gpu/evokernel-*.whl && PYTHONPATH=/tmp/evk-py python3 python/examples/train_blocks.py --iters 10' ;;
    profile) LIMIT=400 step profile .gpu/evokernel profile ${PROFILE_ARGS:-} --json "$out/profile.json" --out "$out/profile-plots" ;;
    tune)
      # Evolutionary vs exhaustive on one variant's space (TUNE_VARIANT, default the
      # channels-first tensor-core pick; exhaustive only where TUNE_EXHAUSTIVE=1: the
      # depth_reuse space has up to ~1900 configs), then a second process that must
      # reuse the cache, then a run that must pick the tuned configs up.
      export EVOKERNEL_CACHE_DIR=/tmp/evk-tune-cache
      tv=${TUNE_VARIANT:-depth_reuse}
      for c in ${TUNE_CASES:-seed-bf16 x3d-3x3x3 video-vae-causal seed-f16}; do
        LIMIT=200 step "tune-evo-$c" .gpu/evokernel tune --suite public --case "$c" --only "$tv" --search evolutionary --retune --json "$out/tune-evo-$c.json"
        [ "${TUNE_EXHAUSTIVE:-0}" = 1 ] && LIMIT=200 step "tune-exh-$c" .gpu/evokernel tune --suite public --case "$c" --only "$tv" --search exhaustive --retune --json "$out/tune-exh-$c.json"
      done
      LIMIT=200 step tune-all .gpu/evokernel tune --suite public --case seed-bf16
      LIMIT=200 step tune-again .gpu/evokernel tune --suite public --case seed-bf16
      LIMIT=200 step run-tuned .gpu/evokernel run
      cat "$out"/tune-evo-*.log "$out"/tune-exh-*.log 2>/dev/null | grep -E "$tv" > "$out/tune-summary.log"
      tail -12 "$out/tune-again.log" >> "$out/tune-summary.log"; tail -14 "$out/run-tuned.log" >> "$out/tune-summary.log"
      export EVOKERNEL_CACHE_DIR=/tmp/evk-cache ;;
    racecheck) LIMIT=400 step racecheck compute-sanitizer --tool racecheck --print-limit 20 .gpu/evokernel verify --input 5x20x40 --channels 4 --kernel 3x5x5 --padding 0,2,2 --only smem_tile --only tensor_core --only streaming --only depth_reuse --only depth_reuse_fma
      LIMIT=200 step racecheck_cl compute-sanitizer --tool racecheck --print-limit 20 .gpu/evokernel verify --input 5x20x40 --channels 128 --kernel 3x5x5 --padding 0,2,2 --layout channels-last --only channels_last --only streaming_cl --only depth_reuse_fma_cl ;;
  esac
done
cat "$out/smi.txt"
grep -E "test result|FAILED|panicked|^== " "$out/tests.log" 2>/dev/null | head -30
for f in memcheck racecheck racecheck_cl bwd_memcheck bwd_racecheck bwd_racecheck_cl; do [ -f "$out/$f.log" ] && grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error|Hazard" "$out/$f.log" | head -5; done
for f in devices torch torch_ref run suite suite_cl suite_models engine python blocks torch_bwd dgrad wgrad torch_dense dense vk_public vk_channels-last; do [ -f "$out/$f.log" ] && tail -25 "$out/$f.log"; done
[ -f "$out/sweep.txt" ] && cat "$out/sweep.txt"
for f in "$out"/vk-vs-cuda-*.txt; do [ -f "$f" ] && cat "$f"; done
for f in vk_devices vk_tests; do [ -f "$out/$f.log" ] && tail -30 "$out/$f.log"; done
[ -f "$out/tune-summary.log" ] && cut -c1-230 "$out/tune-summary.log"
[ -f "$out/profile.log" ] && grep -vE "^[│┌└╞├]" "$out/profile.log" | grep -E "^seed|verdict|next|occupancy|counters" | cut -c1-260 | tail -40
scripts/gpu-monitor.sh stop "$out" >> "$out/summary.txt"
cat "$out/summary.txt"
[ -n "${OUT:-}" ] && tar czf "$OUT/logs.tgz" -C "$out" . && cp "$out/summary.txt" "$OUT/"
