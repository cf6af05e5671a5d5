#!/bin/sh
# Checks that no source file under src/ or backends/ grows past what one
# reader can hold (issue 38): 1,500 lines, 1,000 under backends/python/.
# The files below are still over the limit and are being split on other
# branches (issue 38); remove an entry when its file is split.
# Usage: scripts/check_sizes.sh [source-dir]; exits 1 on a violation.
root=${1:-$(dirname "$0")/..}
allowed='
src/core/repository.c
src/http/http_server.c
src/config/normalize.c
'
status=0
cd "$root" || exit 1
for f in $(find src backends -type f \( -name '*.c' -o -name '*.cc' -o -name '*.cpp' \
    -o -name '*.h' -o -name '*.py' \) | sort); do
    case $f in
    backends/python/*) limit=1000 ;;
    *) limit=1500 ;;
    esac
    lines=$(wc -l <"$f")
    [ "$lines" -le "$limit" ] && continue
    printf '%s\n' "$allowed" | grep -qx "$f" && continue
    echo "$f: $lines lines, over the limit of $limit: split it by job (docs/architecture.md)"
    status=1
done
[ $status -eq 0 ] && echo "sizes: ok"
exit $status
