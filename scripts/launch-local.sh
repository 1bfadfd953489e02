#!/usr/bin/env bash
# Starts N processes of a program on this machine the way torchrun does, for a machine without
# torchrun or MPI (the device machine): process r gets RANK=r, WORLD_SIZE=N, LOCAL_RANK=r,
# MASTER_ADDR and MASTER_PORT (docs/comm.md, "Launching without MPI"). It waits for all of them,
# and the first rank that fails ends the others, as torchrun does.
#
#   scripts/launch-local.sh [--nproc N] [--port P] [--addr A] [--timeout S] [--logs DIR] \
#                           -- PROGRAM [ARGS...]
#
#   --nproc N    processes (default 2)
#   --port P     MASTER_PORT (default 20000 + this script's pid mod 10000: two launches on one
#                machine rarely meet; pass one when they might)
#   --addr A     MASTER_ADDR (default 127.0.0.1)
#   --timeout S  end every rank after S seconds (default 600)
#   --logs DIR   each rank's stdout and stderr go to DIR/rank<r>.log (default: a temporary folder,
#                removed at the end); rank 0's is printed when it ends, every failed rank's tail too
#
# Exit: 0 when every rank exits 0; 1 when one fails (the others are ended: SIGTERM, then SIGKILL
# after 5 s), naming the first that failed and its status; 124 when the timeout passes, naming
# the ranks still running; 2 for bad arguments.
set -uo pipefail
nproc=2
port=$((20000 + $$ % 10000))
addr=127.0.0.1
limit=600
logs=
die() {
  echo "launch-local: $*" >&2
  exit 2
}
number() { [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -ge "$3" ] || die "$1 needs a whole number >= $3, got '$2'"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --nproc) [ $# -gt 1 ] || die "--nproc needs a number"; number --nproc "$2" 1; nproc=$2; shift ;;
    --port) [ $# -gt 1 ] || die "--port needs a number"; number --port "$2" 1; port=$2; shift ;;
    --addr) [ $# -gt 1 ] || die "--addr needs a host"; addr=$2; shift ;;
    --timeout) [ $# -gt 1 ] || die "--timeout needs seconds"; number --timeout "$2" 1; limit=$2; shift ;;
    --logs) [ $# -gt 1 ] || die "--logs needs a folder"; logs=$2; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (the program goes after --; try --help)" ;;
  esac
  shift
done
[ "$port" -le 65535 ] || die "--port $port is not a TCP port (1..65535)"
[ $# -gt 0 ] || die "no program to start (scripts/launch-local.sh [options] -- PROGRAM [ARGS...])"
own_logs=0
if [ -z "$logs" ]; then
  logs=$(mktemp -d) || die "cannot make a temporary folder"
  own_logs=1
fi
mkdir -p "$logs" || die "cannot make $logs"

now_ms() {  # milliseconds since the epoch (EPOCHREALTIME without its decimal point)
  local t=${EPOCHREALTIME//[.,]/}
  echo $((t / 1000))
}

# Each rank in its own process group (job control), so that ending a rank ends what it started.
set -m
pids=()
for ((r = 0; r < nproc; ++r)); do
  RANK=$r WORLD_SIZE=$nproc LOCAL_RANK=$r MASTER_ADDR=$addr MASTER_PORT=$port \
    "$@" > "$logs/rank$r.log" 2>&1 &
  pids+=($!)
done
set +m  # no job reports

end_all() {  # end_all: SIGTERM to the ranks still running, SIGKILL to those left after 5 s
  local r t
  for r in "${!pids[@]}"; do [ -z "${codes[$r]:-}" ] && kill -TERM -- "-${pids[$r]}" 2>/dev/null; done
  for ((t = 0; t < 50; ++t)); do
    local alive=0
    for r in "${!pids[@]}"; do
      [ -z "${codes[$r]:-}" ] && kill -0 "${pids[$r]}" 2>/dev/null && alive=1
    done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  for r in "${!pids[@]}"; do [ -z "${codes[$r]:-}" ] && kill -KILL -- "-${pids[$r]}" 2>/dev/null; done
  wait 2>/dev/null
}
trap 'end_all; echo "launch-local: interrupted; every rank ended" >&2; exit 130' INT TERM

codes=()
start=$(now_ms)
left=$nproc
result=0
what=
while [ $left -gt 0 ]; do
  for r in "${!pids[@]}"; do
    [ -n "${codes[$r]:-}" ] && continue
    kill -0 "${pids[$r]}" 2>/dev/null && continue
    wait "${pids[$r]}"
    codes[$r]=$?
    left=$((left - 1))
    if [ "${codes[$r]}" -ne 0 ] && [ $result -eq 0 ]; then
      result=1
      what="rank $r of $nproc failed (exit ${codes[$r]}): $(tail -1 "$logs/rank$r.log")"
    fi
  done
  [ $result -ne 0 ] && break
  if [ $left -gt 0 ] && [ $(($(now_ms) - start)) -ge $((limit * 1000)) ]; then
    running=()
    for r in "${!pids[@]}"; do [ -z "${codes[$r]:-}" ] && running+=("$r"); done
    result=124
    what="TIMEOUT after ${limit} s: rank(s) ${running[*]} of $nproc still running"
    break
  fi
  [ $left -gt 0 ] && sleep 0.1
done
[ $left -gt 0 ] && end_all

cat "$logs/rank0.log"
if [ $result -ne 0 ]; then
  for r in "${!pids[@]}"; do
    if [ "$r" -ne 0 ] && [ "${codes[$r]:-0}" -ne 0 ]; then
      echo "-- rank $r (exit ${codes[$r]:-killed}), last lines of $logs/rank$r.log:"
      tail -5 "$logs/rank$r.log"
    fi
  done
  echo "launch-local: $what (MASTER_ADDR=$addr MASTER_PORT=$port)" >&2
fi
[ $own_logs -eq 1 ] && rm -rf "$logs"
exit $result
