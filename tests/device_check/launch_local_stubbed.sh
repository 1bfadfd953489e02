#!/usr/bin/env bash
# scripts/launch-local.sh with a stand-in program that records the variables it was started with:
# N processes with RANK 0..N-1, WORLD_SIZE N, LOCAL_RANK = RANK, one MASTER_ADDR and MASTER_PORT,
# the program's arguments passed through; rank 0's output printed; a rank that fails ends the
# others at once (exit 1, naming it); a rank that outlives --timeout ends them all (exit 124,
# naming the ranks still running); bad arguments are exit 2.
#   launch_local_stubbed.sh LAUNCHER WORKDIR
set -uo pipefail
# shellcheck source=tests/device_check/stub_checks.sh
source "$(dirname "$0")/stub_checks.sh"
launcher=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
cat > "$work/program" <<'STUB'
#!/usr/bin/env bash
echo "RANK=${RANK:-unset} WORLD_SIZE=${WORLD_SIZE:-unset} LOCAL_RANK=${LOCAL_RANK:-unset}" \
     "MASTER_ADDR=${MASTER_ADDR:-unset} MASTER_PORT=${MASTER_PORT:-unset} args: $*" >> "$STUB_RECORD"
echo "program rank $RANK says hello"
echo $$ > "$STUB_PIDS/rank$RANK.pid"
if [ "${STUB_FAIL_RANK:-x}" = "$RANK" ]; then
  echo "rank $RANK: boom"
  exit 3
fi
[ "${STUB_SLEEP_RANK:-x}" = "$RANK" ] || [ "${STUB_SLEEP_RANK:-x}" = all ] && sleep 30
exit 0
STUB
chmod +x "$work/program"
export STUB_RECORD=$work/record.txt STUB_PIDS=$work/pids
mkdir -p "$STUB_PIDS"
still_running() {  # the ranks whose process is alive
  local f
  for f in "$STUB_PIDS"/*.pid; do kill -0 "$(cat "$f")" 2>/dev/null && basename "$f" .pid; done
}

out=$(bash "$launcher" --nproc 4 --port 23456 --logs "$work/logs" -- "$work/program" --a "b c" 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "exit $rc with 4 ranks that succeed"
expect_in_out " with 4 ranks" "program rank 0 says hello"
grep -q "program rank 1" <<< "$out" && fail "rank 1's output printed (only rank 0's should be)"
[ "$(wc -l < "$STUB_RECORD")" -eq 4 ] || fail "not 4 processes started"
for r in 0 1 2 3; do
  grep -qxF "RANK=$r WORLD_SIZE=4 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=23456 args: --a b c" \
    "$STUB_RECORD" || fail "rank $r was not started with RANK=$r WORLD_SIZE=4 LOCAL_RANK=$r, the port and the arguments"
  [ -f "$work/logs/rank$r.log" ] || fail "no log of rank $r in --logs"
done

# rank 2 fails while the others would run 30 s: they are ended, the launch fails naming rank 2
: > "$STUB_RECORD"
rm -f "$STUB_PIDS"/*.pid
start=$(date +%s)
out=$(STUB_FAIL_RANK=2 STUB_SLEEP_RANK=all bash "$launcher" --nproc 3 -- "$work/program" 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "exit $rc when rank 2 fails, want 1"
[ $(($(date +%s) - start)) -lt 10 ] || fail "the other ranks were not ended when rank 2 failed"
[ -z "$(still_running)" ] || fail "still running after rank 2 failed: $(still_running)"
expect_in_out " when rank 2 fails" "launch-local: rank 2 of 3 failed (exit 3): rank 2: boom" \
  "-- rank 2 (exit 3)"

# a rank that outlives --timeout 1: every rank is ended, exit 124 naming the one still running
rm -f "$STUB_PIDS"/*.pid
start=$(date +%s)
out=$(STUB_SLEEP_RANK=1 bash "$launcher" --nproc 2 --timeout 1 -- "$work/program" 2>&1)
rc=$?
[ $rc -eq 124 ] || fail "exit $rc past the timeout, want 124"
[ $(($(date +%s) - start)) -lt 10 ] || fail "the timeout did not end the launch"
[ -z "$(still_running)" ] || fail "still running after the timeout: $(still_running)"
expect_in_out " past the timeout" "launch-local: TIMEOUT after 1 s: rank(s) 1 of 2 still running"

out=$(bash "$launcher" --nproc 0 -- "$work/program" 2>&1)
[ $? -eq 2 ] || fail "--nproc 0 accepted"
expect_in_out " for --nproc 0" "--nproc needs a whole number >= 1, got '0'"
out=$(bash "$launcher" --nproc 2 2>&1)
[ $? -eq 2 ] || fail "a launch without a program accepted"
expect_in_out " without a program" "no program to start"

finish launch_local_stubbed
