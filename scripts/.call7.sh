#!/usr/bin/env bash
W=/tmp/w; mkdir -p $W
export EVOKERNEL_CACHE_DIR=/tmp/evk-cache
timeout 260 python3 scripts/config-sweep.py wgrad_tile_cl wgrad 'channels-last/mobilenet-s1-nhwc' 'th=7|8,tw=8|14|16' 'th=7,tw=8,cb=48|72' 'th=7,tw=8,splits=128|512' 'th=7,tw=8,workers=1|4' 'th=7,tw=8,rows=1|9' > $W/sweep-mb.txt 2>&1
tar czf $OUT/w.tgz -C $W .
timeout 200 python3 scripts/config-sweep.py wgrad_tile_cl wgrad 'channels-last/x3d-ndhwc channels-last/video-vae-ndhwc' 'th=7|8,tw=7|8|14' > $W/sweep-3d.txt 2>&1
tar czf $OUT/w.tgz -C $W .
timeout 60 .gpu/evokernel bench --suite channels-last --case mobilenet-s1-nhwc --pass wgrad --only cudnn --only wgrad_tile_cl > $W/mb-cudnn.log 2>&1
tar czf $OUT/w.tgz -C $W .
cat $W/sweep-mb.txt $W/sweep-3d.txt; grep -E "cudnn|wgrad_tile_cl:" $W/mb-cudnn.log | awk -F'┆' '{print $2, $7}'
