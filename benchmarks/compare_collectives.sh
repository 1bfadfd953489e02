#!/usr/bin/env bash
# Prints, from one run: LocalWorld all_reduce busbw vs Open MPI's MPI_Allreduce busbw (same rank
# count, same sizes, under mpirun) vs single-core memcpy bandwidth, with the ratios. The two
# sides run alternately, `rounds` times each (LocalWorld, MPI, LocalWorld, MPI, ...), and every
# cell is min / median / max over the rounds; the ratio column divides the medians.
#
#   benchmarks/compare_collectives.sh [build-dir] [ranks] [max-bytes] [seconds-per-size] [rounds]
#   defaults:                          build/default  2      268435456   0.3                3
#
# busbw is the nccl-tests definition: algbw * 2(n-1)/n for all_reduce; memcpy is bytes copied / s.
set -euo pipefail
build=${1:-build/default}
ranks=${2:-2}
max_bytes=${3:-268435456}
budget=${4:-0.3}
rounds=${5:-3}
lw="$build/benchmarks/comm/bench_local_world"
mpi="$build/benchmarks/comm/bench_mpi_allreduce"
for exe in "$lw" "$mpi"; do
  [[ -x "$exe" ]] || { echo "missing $exe: cmake --build $build --target $(basename "$exe")" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# command: $0 $build $ranks $max_bytes $budget $rounds"
for r in $(seq 1 "$rounds"); do
  FOURWAY_BENCH_MAX_BYTES=$max_bytes "$lw" --benchmark_filter="^(memcpy|all_reduce/ranks:$ranks)/" \
    --benchmark_min_time="$budget" --benchmark_format=json > "$tmp/lw.$r.json" 2> "$tmp/lw.err"
  mpirun -np "$ranks" --oversubscribe --allow-run-as-root --bind-to none \
    -x OMPI_MCA_btl=self,vader,tcp "$mpi" "$max_bytes" "$budget" > "$tmp/mpi.$r.txt"
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$tmp" "$ranks" "$rounds" <<'PY'
import json, statistics, sys
tmp, ranks, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
local, memcpy, mpi = {}, {}, {}
for r in range(1, rounds + 1):
    for b in json.load(open("%s/lw.%d.json" % (tmp, r)))["benchmarks"]:
        size = int(b["bytes"])
        if b["name"].startswith("memcpy/"):
            memcpy.setdefault(size, []).append(b["busbw_GBps"])
        elif b["name"].startswith("all_reduce/ranks:%s/" % ranks):
            local.setdefault(size, []).append(b["busbw_GBps"])
    for line in open("%s/mpi.%d.txt" % (tmp, r)):
        parts = line.split()
        if len(parts) == 3:
            mpi.setdefault(int(parts[0]), []).append(float(parts[2]))
def human(n):
    for unit in ["B", "KiB", "MiB", "GiB"]:
        if n < 1024:
            return "%d %s" % (n, unit)
        n //= 1024
def cell(v):
    return "%.2f / %.2f / %.2f" % (min(v), statistics.median(v), max(v)) if v else "n/a"
def med(v):
    return statistics.median(v) if v else float("nan")
print("| size | LocalWorld busbw GB/s (min / median / max) | Open MPI busbw GB/s | memcpy GB/s | LocalWorld / MPI (medians) | LocalWorld / memcpy |")
print("| ---: | ---: | ---: | ---: | ---: | ---: |")
for size in sorted(local):
    l, m, c = local[size], mpi.get(size, []), memcpy.get(size, [])
    print("| %s | %s | %s | %s | %.2fx | %.0f%% |" % (human(size), cell(l), cell(m), cell(c),
          med(l) / med(m), 100 * med(l) / med(c)))
PY
