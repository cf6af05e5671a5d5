#!/bin/sh
# Checks the one-way layering between the core and the schedulers
# (docs/architecture.md): a file in src/core includes no scheduler header
# but sched/scheduler.h, and a scheduler includes from src/core only the
# request and model headers (plus the generic core/util.h). The server's
# state (core/server_internal.h) stays inside src/core, and the repository's
# private header (core/repository_internal.h) inside the repository's files.
# src/storage includes from src/core only util.h and libcurl.h.
# Usage: scripts/check_layers.sh [source-dir]; exits 1 on a violation.
root=${1:-$(dirname "$0")/..}
status=0
for f in "$root"/src/core/*.c "$root"/src/core/*.h; do
    grep -n '#include "sched/' "$f" | grep -v '#include "sched/scheduler.h"' |
        sed "s|^|$f: the core may include only sched/scheduler.h: |" | grep . && status=1
done
for f in "$root"/src/sched/*.c "$root"/src/sched/*.h; do
    grep -n '#include "core/' "$f" |
        grep -v -e '#include "core/request.h"' -e '#include "core/model.h"' -e '#include "core/util.h"' |
        sed "s|^|$f: a scheduler may include only core/request.h, core/model.h, core/util.h: |" |
        grep . && status=1
done
# Object storage (src/storage) sits below the core: it includes from
# src/core only the generic util.h and libcurl.h, and nothing above.
for f in "$root"/src/storage/*.c "$root"/src/storage/*.h; do
    [ -e "$f" ] || continue
    grep -n '#include "\(core\|sched\|http\|grpc\|backend\|frontend\|metrics\|config\)/' "$f" |
        grep -v -e '#include "core/util.h"' -e '#include "core/libcurl.h"' |
        sed "s|^|$f: object storage may include only core/util.h, core/libcurl.h: |" |
        grep . && status=1
done
# The request and model headers themselves stay below the core's.
for f in "$root"/src/core/request.h "$root"/src/core/model.h; do
    grep -n '#include "\(core/core.h\|core/repository.h\|core/stats.h\|core/[a-z_]*_internal.h\|sched/\)' "$f" |
        sed "s|^|$f: includes a header above it: |" | grep . && status=1
done
for f in $(find "$root/src" "$root/backends" "$root/tools" -name '*.[ch]' -o -name '*.cc' 2>/dev/null); do
    case "$f" in "$root"/src/core/*) continue ;; esac
    grep -n '#include "core/[a-z_]*_internal.h"' "$f" |
        sed "s|^|$f: only src/core may include a core/*_internal.h header: |" | grep . && status=1
done
for f in "$root"/src/core/*.c "$root"/src/core/*.h; do
    case "$f" in "$root"/src/core/repository_*) continue ;; esac
    grep -n '#include "core/repository_internal.h"' "$f" |
        sed "s|^|$f: only the repository's files may include core/repository_internal.h: |" |
        grep . && status=1
done
[ $status -eq 0 ] && echo "layers: ok"
exit $status
