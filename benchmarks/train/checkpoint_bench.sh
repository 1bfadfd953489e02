#!/usr/bin/env bash
# Checkpoint speed, measured (docs/benchmarks/train.md "Checkpoints"):
#  1. save and load of a GPT-2 124M-shaped training state (12 x 768, vocab 50257, context = --seq;
#     fp32, so the state is the weights (= masters), exp_avg and exp_avg_sq: 12 B per parameter)
#     on 4 LocalWorld ranks under ZeRO-3: `fourway-train --save-dir` (the time it prints for the
#     synchronous save) and `--resume` (the time it prints for the load), against `cp -r` + `sync`
#     and `dd conv=fsync` of the same files (the save fsyncs), and against `cp -r` without sync
#     (a copy through memory, like a load) and `cat > /dev/null` (reading alone) for the load;
#     the page cache is warm on every side; REPEATS times interleaved.
#  2. the training loop's wall time (steps and saves) with no save, synchronous saves and
#     --save-async saves every SAVE_EVERY steps, REPEATS times interleaved (order rotated).
# Prints every run, then min / median / max and the ratios of the medians.
# usage: benchmarks/train/checkpoint_bench.sh [BUILD_DIR] [REPEATS] [STEPS] [SAVE_EVERY] [WORK]
#   WORK: a scratch folder on the disk to measure (default: mktemp -d; needs ~4 GB; removed).
#   PARTS="1 2" (environment): which of the two parts to run.
set -euo pipefail
build=${1:-build/default}
repeats=${2:-3}
steps=${3:-4}
every=${4:-2}
work=${5:-$(mktemp -d)}
parts=${PARTS:-1 2}
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
train=$build/examples/train/fourway-train
model="--layers 12 --dim 768 --heads 12 --vocab 50257 --seq 16 --batch 4 --precision fp32"
mesh="--ranks 4 --zero 3"

now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }
source "$(cd "$(dirname "$0")" && pwd)/../stats.sh"  # stats, median, machine
record() { echo "$2" >> "$work/$1.txt"; }

echo "machine: $(machine); disk: $(df -h "$work" | awk 'NR==2 {print $1}')"
echo "load at start: $(uptime)"

if [[ " $parts " == *" 1 "* ]]; then
echo "== 1. save and load on 4 ranks (ZeRO-3) vs cp, dd and cat, $repeats times interleaved"
for i in $(seq "$repeats"); do
  out=$("$train" $model $mesh --steps 1 --save-dir "$work/ckpt")
  save=$(echo "$out" | grep -o "^checkpoint .* in [0-9.]* s" | grep -o "[0-9.]* s$" | cut -d' ' -f1)
  dir="$work/ckpt/step-00000001"
  bytes=$(du -bc "$dir"/* | tail -1 | cut -f1)
  out=$("$train" $model $mesh --steps 1 --resume "$work/ckpt")
  load=$(echo "$out" | grep -o "^resumed from .* in [0-9.]* s" | grep -o "[0-9.]* s$" | cut -d' ' -f1)
  t0=$(now); cp -r "$dir" "$work/cp"; sync "$work/cp"/*; cp_s=$(since "$t0")
  rm -rf "$work/cp"
  t0=$(now); cp -r "$dir" "$work/cp"; cpns_s=$(since "$t0")
  sync "$work/cp"/*
  mkdir "$work/dd"
  t0=$(now)
  for f in "$dir"/*; do dd if="$f" of="$work/dd/$(basename "$f")" bs=4M conv=fsync status=none; done
  dd_s=$(since "$t0")
  t0=$(now); cat "$dir"/* > /dev/null; cat_s=$(since "$t0")
  rm -rf "$work/ckpt" "$work/cp" "$work/dd"
  for k in save load cp_s cpns_s dd_s cat_s; do record "$k" "${!k}"; done
  echo "run $i: $bytes B; save $save s, load $load s, cp -r + sync $cp_s s, cp -r $cpns_s s," \
    "dd conv=fsync $dd_s s, cat $cat_s s; load avg $(cut -d' ' -f1 /proc/loadavg)"
done
echo "min / median / max (s): save $(stats < "$work/save.txt"), load $(stats < "$work/load.txt")," \
  "cp+sync $(stats < "$work/cp_s.txt"), cp $(stats < "$work/cpns_s.txt")," \
  "dd $(stats < "$work/dd_s.txt"), cat $(stats < "$work/cat_s.txt")"
mb() { echo "scale=1; $bytes / $(median < "$work/$1.txt") / 1000000" | bc; }
pct() { echo "scale=0; 100 * $(median < "$work/$2.txt") / $(median < "$work/$1.txt")" | bc; }
echo "medians: save $(mb save) MB/s = $(pct save cp_s)% of cp+sync, $(pct save dd_s)% of dd," \
  "$(pct save cpns_s)% of cp without sync; load $(mb load) MB/s = $(pct load cpns_s)% of cp" \
  "without sync, $(pct load cat_s)% of cat"
fi

if [[ " $parts " == *" 2 "* ]]; then
echo "== 2. training loop: $steps steps, no save / sync / --save-async every $every, $repeats times"
# The order rotates from run to run: this disk slows down after a few GB written, so a fixed
# order would always hand the same variant the slowest disk.
orders=("none sync async" "sync async none" "async none sync")
for i in $(seq "$repeats"); do
  line="run $i:"
  for variant in ${orders[$(( (i - 1) % 3 ))]}; do
    flags=""
    [ "$variant" != none ] && flags="--save-dir $work/loop --save-every $every"
    [ "$variant" = async ] && flags="$flags --save-async"
    out=$("$train" $model $mesh --steps "$steps" $flags)
    t=$(echo "$out" | grep -o "^training loop: [0-9]* steps in [0-9.]* s" | awk '{print $(NF-1)}')
    record "loop_$variant" "$t"
    line="$line $variant $t s"
    if [ "$variant" = sync ]; then  # the time each save blocked the loop
      line="$line (saves $(echo "$out" | grep -o "^checkpoint .* in [0-9.]* s" | awk '{print $(NF-1)}' | xargs | tr ' ' '+') s)"
    elif [ "$variant" = async ]; then  # the copies that blocked it, the writes that did not
      line="$line (copies $(echo "$out" | grep -o "copied to host in [0-9.]* s" | awk '{print $(NF-1)}' | xargs | tr ' ' '+') s,"
      line="$line background writes $(echo "$out" | grep -o "written in [0-9.]* s" | awk '{print $(NF-1)}' | xargs | tr ' ' '+') s)"
    fi
    line="$line,"
    rm -rf "$work/loop"
  done
  echo "$line load avg $(cut -d' ' -f1 /proc/loadavg)"
done
saves=$(( steps / every ))
[ $(( steps % every )) -ne 0 ] && saves=$(( saves + 1 ))
echo "min / median / max (s): none $(stats < "$work/loop_none.txt")," \
  "sync $(stats < "$work/loop_sync.txt"), async $(stats < "$work/loop_async.txt")"
for v in sync async; do
  echo "$v: $(echo "scale=3; ($(median < "$work/loop_$v.txt") - $(median < "$work/loop_none.txt")) / $saves" | bc) s per save" \
    "($saves saves) over the loop without saves, by the medians"
done
fi
echo "load at end: $(uptime)"
