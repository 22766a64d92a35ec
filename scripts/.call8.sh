#!/usr/bin/env bash
W=/tmp/w; mkdir -p $W
export EVOKERNEL_CACHE_DIR=/tmp/evk-cache
timeout 200 python3 scripts/config-sweep.py wgrad_tile_cl wgrad 'channels-last/mobilenet-s1-nhwc' 'th=4|2,tw=8|14|7' 'th=7|8,tw=4|7' 'th=7,tw=8,minblocks=2|3' > $W/sweep-mb2.txt 2>&1
tar czf $OUT/w.tgz -C $W .
timeout 100 python3 scripts/config-sweep.py wgrad_tile_cl wgrad 'models/convnext-t-nhwc channels-last/convnext-nhwc' 'th=4|7,tw=14' > $W/sweep-cn.txt 2>&1
tar czf $OUT/w.tgz -C $W .
for i in 1 2; do timeout 60 .gpu/evokernel bench --suite channels-last --case mobilenet-s1-nhwc --pass wgrad --only cudnn --only wgrad_tile_cl --config wgrad_tile_cl:cb=144,minblocks=1,rows=3,splits=256,th=7,tma=1,tw=8,vec=4,workers=2 > $W/mb-cudnn-$i.log 2>&1; grep -E "cudnn|wgrad_tile_cl:" $W/mb-cudnn-$i.log | awk -F'┆' '{print $2, $7}'; done
tar czf $OUT/w.tgz -C $W .
cat $W/sweep-mb2.txt $W/sweep-cn.txt
