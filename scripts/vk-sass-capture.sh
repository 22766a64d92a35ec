#!/usr/bin/env bash
# On the GPU machine (Vulkan env set): the NVIDIA driver's compiled code of forced Vulkan
# configs, captured from its shader disk cache (one fresh cache a config, so each entry
# holds that one pipeline) into $OUT/NAME.glcache.bin; read here with scripts/vk_sass.py.
# NVIDIA's Vulkan driver reports no internal representations (perf.md, run 395), but it
# keeps every pipeline's SASS, zstd-compressed, in this cache.
# Usage: [SUITE=dense] [OP=dense-conv] scripts/vk-sass-capture.sh FILE
# FILE lines: "NAME CASE CONFIG" (CONFIG the full --config text).
suite=${SUITE:-dense} op=${OP:-dense-conv}
while read -r name c cfg; do
  [ -z "$name" ] && continue
  dir=$(mktemp -d)
  __GL_SHADER_DISK_CACHE=1 __GL_SHADER_DISK_CACHE_PATH="$dir" __GL_SHADER_DISK_CACHE_SKIP_CLEANUP=1 \
    timeout 120 .gpu/evokernel bench --op "$op" --backend vulkan --suite "$suite" --case "$c" \
    --config "$cfg" --only "${cfg%%:*}" 2>&1 | grep -E "┆ *${cfg%%:*}:|Register Count" | sed "s/^/$name: /"
  f=$(find "$dir" -name '*.bin' | head -1)
  [ -n "$f" ] && cp "$f" "$OUT/$name.glcache.bin" || echo "$name: no cache entry written"
  rm -rf "$dir"
done < "$1"
