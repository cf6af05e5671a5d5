#!/bin/sh
# Checks that no source file under src/ or backends/ grows past what one
# reader can hold (issue 38): 1,500 lines, 1,000 under backends/python/;
# and that no C/C++ function is over 150 lines (a body is what lies between
# a '{' and a '}' in column 0: clang-format puts a function's braces there).
# A file allowed over the limit goes in `allowed` (one path a line), with
# the reason beside it; none is today.
# Usage: scripts/check_sizes.sh [source-dir]; exits 1 on a violation.
root=${1:-$(dirname "$0")/..}
allowed='
'
cd "$root" || exit 1
# "<path> <lines> <limit>" for each file over its limit (one wc for all)
over=$(find src backends -type f \( -name '*.c' -o -name '*.cc' -o -name '*.cpp' \
    -o -name '*.h' -o -name '*.py' \) -exec wc -l {} + | awk '
    $2 == "total" { next }
    { limit = ($2 ~ /^backends\/python\//) ? 1000 : 1500 }
    $1 > limit { print $2, $1, limit }')
status=0
while read -r f lines limit; do
    [ -n "$f" ] || continue
    printf '%s\n' "$allowed" | grep -qx "$f" && continue
    echo "$f: $lines lines, over the limit of $limit: split it by job (docs/architecture.md)"
    status=1
done <<END
$over
END
long=$(find src backends -type f \( -name '*.c' -o -name '*.cc' -o -name '*.cpp' \) \
    -exec awk 'FNR == 1 { start = 0 }
    /^\{/ { start = FNR; sig = prev }
    /^\}/ { if (start && FNR - start - 1 > 150)
               print FILENAME ":" start ": " FNR - start - 1 " lines: " sig
           start = 0 }
    { prev = $0 }' {} +)
if [ -n "$long" ]; then
    printf '%s\n' "$long" | sed 's/$/ (over 150 lines: split it by job)/'
    status=1
fi
[ $status -eq 0 ] && echo "sizes: ok"
exit $status
