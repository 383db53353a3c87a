#!/usr/bin/env bash
# Lists every C++ function definition (free functions, member functions, lambdas as
# "__anon...") under the given files or folders with its length in lines, longest first,
# from Universal Ctags' start and end lines. With --over N, lists only functions longer
# than N lines and exits 1 when there is one (a check for "no function over ~80 lines").
#
# Usage: scripts/function-lengths.sh [--over N] PATH...
# Not a parser of its own: what ctags calls a function is what this counts.
set -euo pipefail

over=0
if [[ "${1:-}" == "--over" ]]; then
  over="${2:?--over needs a line count}"
  shift 2
fi
if [[ $# -eq 0 ]]; then
  echo "usage: $0 [--over N] PATH..." >&2
  exit 2
fi
command -v ctags >/dev/null || { echo "$0: needs ctags (apt-get install universal-ctags)" >&2; exit 2; }

listing=$(ctags -R -x --languages=C++ --c++-kinds=f --fields=+ne \
            --_xformat='%{end} %n %N %F' "$@" |
          awk '{ printf "%5d  %s:%d  %s\n", $1 - $2 + 1, $4, $2, $3 }' | sort -k1,1nr -k2)
if (( over > 0 )); then
  long=$(awk -v n="$over" '$1 > n' <<<"$listing")
  if [[ -n "$long" ]]; then
    echo "$long"
    exit 1
  fi
  echo "no function over $over lines"
else
  echo "$listing"
fi
