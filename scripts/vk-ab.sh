#!/usr/bin/env bash
# On the GPU machine (Vulkan env set): two builds of a Vulkan shader (or one build on two
# configs) on forced configs, interleaved A B A B (clocks drift between runs). Usage:
#   [SUITE=dense|public|channels-last] scripts/vk-ab.sh OLD_BINARY NEW_BINARY FILE
# FILE lines: "CASE OLD_CONFIG NEW_CONFIG" (full --config texts of SUITE's CASE; "-" skips
# that side). Prints "CASE NEW_CONFIG old_ms new_ms" per round.
old=$1 new=$2 suite=${SUITE:-dense}
ms() { # binary case config -> the median ms of the forced config (or the failure)
  timeout 60 "$1" bench --op dense-conv --backend vulkan --suite "$suite" --case "$2" --config "$3" \
    --only "${3%%:*}" 2>&1 | grep -E "┆ *${3%%:*}:" | head -1 | awk -F'┆' '{gsub(/ /,"",$5); gsub(/ /,"",$4); print ($4 ~ /^pass/ ? $5 : "FAIL:" $4)}'
}
mon=$(mktemp -d); scripts/gpu-monitor.sh start "$mon"  # a throttled round is no A/B
while read -r c a b; do
  [ -z "$c" ] && continue
  for round in 1 2; do
    ta=-; tb=-
    [ "$a" != - ] && ta=$(ms "$old" "$c" "$a")
    [ "$b" != - ] && tb=$(ms "$new" "$c" "$b")
    echo "$c $b $ta $tb"
  done
done < "$3"
scripts/gpu-monitor.sh stop "$mon"; rm -rf "$mon"
