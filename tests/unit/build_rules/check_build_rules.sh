#!/usr/bin/env bash
# Builds the probes of tests/unit/build_rules/CMakeLists.txt in the given build tree: each
# forbidden probe must fail because its header is not found; the allowed one must build.
#   check_build_rules.sh CMAKE BUILD_DIR
set -uo pipefail
cmake=$1
build=$2
fail=0
expect_missing() {  # target header
  local out
  if out=$("$cmake" --build "$build" --target "$1" 2>&1); then
    echo "FAIL: $1 built, but its include of $2 should have been refused"
    fail=1
  elif ! grep -q "$2: No such file or directory" <<<"$out"; then
    echo "FAIL: $1 failed for another reason than a missing $2:"
    echo "$out" | tail -20
    fail=1
  else
    echo "ok: $1 cannot include $2"
  fi
}
expect_missing build_rule_model_includes_comm comm/comm.h
expect_missing build_rule_kernels_include_optim optim/adamw.h
expect_missing build_rule_plan_includes_runtime core/allocator.h
if out=$("$cmake" --build "$build" --target build_rule_model_includes_kernels 2>&1); then
  echo "ok: build_rule_model_includes_kernels builds (the model may include kernels/dispatch.h)"
else
  echo "FAIL: the allowed include of kernels/dispatch.h did not build:"
  echo "$out" | tail -20
  fail=1
fi
exit $fail
