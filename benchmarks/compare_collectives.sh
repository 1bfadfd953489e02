#!/usr/bin/env bash
# Prints, from one run: LocalWorld all_reduce busbw vs Open MPI's MPI_Allreduce busbw (same rank
# count, same sizes, under mpirun) vs single-core memcpy bandwidth, with the ratios.
#
#   benchmarks/compare_collectives.sh [build-dir] [ranks] [max-bytes] [seconds-per-size]
#   defaults:                          build/default  2      268435456   0.3
#
# busbw is the nccl-tests definition: algbw * 2(n-1)/n for all_reduce; memcpy is bytes copied / s.
set -euo pipefail
build=${1:-build/default}
ranks=${2:-2}
max_bytes=${3:-268435456}
budget=${4:-0.3}
lw="$build/benchmarks/comm/bench_local_world"
mpi="$build/benchmarks/comm/bench_mpi_allreduce"
for exe in "$lw" "$mpi"; do
  [[ -x "$exe" ]] || { echo "missing $exe: cmake --build $build --target $(basename "$exe")" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# command: $0 $build $ranks $max_bytes $budget"
FOURWAY_BENCH_MAX_BYTES=$max_bytes "$lw" --benchmark_filter="^(memcpy|all_reduce/ranks:$ranks)/" \
  --benchmark_min_time="$budget" --benchmark_format=json > "$tmp/lw.json" 2> "$tmp/lw.err"
mpirun -np "$ranks" --oversubscribe --allow-run-as-root --bind-to none \
  -x OMPI_MCA_btl=self,vader,tcp "$mpi" "$max_bytes" "$budget" > "$tmp/mpi.txt"

python3 - "$tmp/lw.json" "$tmp/mpi.txt" "$ranks" <<'PY'
import json, sys
lw = json.load(open(sys.argv[1]))["benchmarks"]
ranks = sys.argv[3]
local, memcpy = {}, {}
for b in lw:
    size = int(b["bytes"])
    if b["name"].startswith("memcpy/"):
        memcpy[size] = b["busbw_GBps"]
    elif b["name"].startswith("all_reduce/ranks:%s/" % ranks):
        local[size] = b["busbw_GBps"]
mpi = {}
for line in open(sys.argv[2]):
    parts = line.split()
    if len(parts) == 3:
        mpi[int(parts[0])] = float(parts[2])
def human(n):
    for unit in ["B", "KiB", "MiB", "GiB"]:
        if n < 1024:
            return "%d %s" % (n, unit)
        n //= 1024
print("| size | LocalWorld busbw GB/s | Open MPI busbw GB/s | memcpy GB/s | LocalWorld / MPI | LocalWorld / memcpy |")
print("| ---: | ---: | ---: | ---: | ---: | ---: |")
for size in sorted(local):
    l, m, c = local[size], mpi.get(size, float("nan")), memcpy.get(size, float("nan"))
    print("| %s | %.3f | %.3f | %.3f | %.2fx | %.0f%% |" % (human(size), l, m, c, l / m if m else float("nan"), 100 * l / c))
PY
