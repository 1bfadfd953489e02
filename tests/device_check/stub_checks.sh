# shellcheck shell=bash
# Sourced by the *_stubbed.sh tests: `out` holds what the script under test printed; `fail WHY`
# counts a failed check and shows that output; `expect_in_out CONTEXT STRING...` fails for each
# STRING missing from it; `finish NAME` ends the test (exit 1 after any failure).
out=
fails=0
fail() {
  echo "FAIL: $1; the script printed:" >&2
  printf '  | %s\n' "${out//$'\n'/$'\n'  | }" >&2
  fails=$((fails + 1))
}
expect_in_out() {
  local context=$1 want
  shift
  for want in "$@"; do
    grep -qF -- "$want" <<< "$out" || fail "missing '$want'$context"
  done
}
finish() {
  if [ "$fails" -gt 0 ]; then
    echo "$1: $fails check(s) failed" >&2
    exit 1
  fi
  echo "$1: every check passed"
}
