#!/bin/sh
# Checks the layers at the symbol level (scripts/layers.txt): every function
# an object calls (nm -u) that another of the server's objects defines (nm,
# defined globals) must be in the caller's layer or a lower one, unless an
# allow line of layers.txt names it. Includes are checked by
# scripts/check_layers.sh; this checks what the linker sees.
# Usage: scripts/check_symbols.sh <source-dir> <objects-file>
#   objects-file: one object path a line, .../<target>.dir/<source path>.o
#   (CMakeLists.txt writes build/layer_objects.txt). Exits 1 on a violation.
root=${1:?source dir}
objs=${2:?objects file}
map="$root/scripts/layers.txt"
[ -r "$map" ] || { echo "check_symbols: no $map" >&2; exit 2; }
[ -r "$objs" ] || { echo "check_symbols: no $objs" >&2; exit 2; }
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT

# Functions the header allow lines name, as "from to name".
awk '$1 == "allow" && $4 == "header" { for (i = 5; i <= NF; i++) print $2, $3, $i }' "$map" |
    while read -r from to header; do
        [ -r "$root/$header" ] || { echo "check_symbols: no $root/$header" >&2; exit 2; }
        # A declaration starts at column 0 with its type; the first name
        # followed by "(" is the function's.
        grep -E '^[A-Za-z_]' "$root/$header" | grep -vE '^(typedef|struct|enum|union|#)' |
            sed -nE 's/^[^(]*[^A-Za-z0-9_(]([A-Za-z_][A-Za-z0-9_]*)[[:space:]]*\(.*/\1/p' |
            sed "s/^/$from $to /"
    done > "$tmp/allowed" || exit 2

# Every object's symbols: "def|use <symbol> <source path>" (one nm run).
n=0
while IFS= read -r o; do
    [ -n "$o" ] || continue
    [ -r "$o" ] || { echo "check_symbols: no object $o (build first)" >&2; exit 2; }
    printf '%s\n' "$o"
    n=$((n + 1))
done < "$objs" > "$tmp/objs" || exit 2
[ "$n" -gt 0 ] || { echo "check_symbols: no objects in $objs" >&2; exit 2; }
tr '\n' '\0' < "$tmp/objs" | xargs -0 nm -A -P -g > "$tmp/nm" || exit 2
awk '{
    src = $1; sub(/:$/, "", src); sub(/.*\.dir\//, "", src); sub(/\.o$/, "", src)
    if ($3 == "U") print "use", $2, src
    else if ($3 ~ /^[TDBRVWiu]$/) print "def", $2, src
}' "$tmp/nm" > "$tmp/syms"

awk -v objs="$n" '
    FILENAME == ARGV[1] {
        if ($1 == "layer") {
            order[$2] = ++n_layers; name[n_layers] = $2
            for (i = 3; i <= NF; i++) path[$i] = $2
        } else if ($1 == "default") {
            dflt = $2
        } else if ($1 == "allow" && $4 == "prefix") {
            for (i = 5; i <= NF; i++) prefix[++n_prefix] = $2 " " $3 " " $i
        }
        next
    }
    FILENAME == ARGV[2] { allowed[$1 " " $2 " " $3] = 1; next }
    $1 == "def" { def[$2] = $3; next }
    $1 == "use" { n_use++; use_sym[n_use] = $2; use_src[n_use] = $3 }
    function layer_of(f,    best, p) {
        if (f in cache) return cache[f]
        best = ""
        for (p in path)
            if (substr(f, 1, length(p)) == p && length(p) > length(best)) best = p
        return cache[f] = (best != "" ? path[best] : dflt)
    }
    function is_allowed(from, to, sym,    i, parts) {
        if ((from " " to " " sym) in allowed) return 1
        for (i = 1; i <= n_prefix; i++) {
            split(prefix[i], parts, " ")
            if (parts[1] == from && parts[2] == to &&
                substr(sym, 1, length(parts[3])) == parts[3]) return 1
        }
        return 0
    }
    END {
        if (dflt == "" || !(dflt in order)) { print "layers.txt: no valid default layer"; exit 2 }
        bad = 0
        for (i = 1; i <= n_use; i++) {
            s = use_sym[i]
            if (!(s in def)) continue # a library function: not ours
            from = layer_of(use_src[i]); to = layer_of(def[s])
            if (order[to] <= order[from] || is_allowed(from, to, s)) continue
            printf "%s (layer %s) calls %s, defined in %s (layer %s, above it)\n",
                use_src[i], from, s, def[s], to
            bad = 1
        }
        if (!bad) printf "symbols: ok (%d objects, %d layers)\n", objs, n_layers
        exit bad
    }' "$map" "$tmp/allowed" "$tmp/syms"
status=$?

# What is built outside the server's layers sees only public headers:
# src/tritonapi/ (libtritonserver.so; src/ is on its include path) includes
# of the project only nereid/, triton/ and its own tritonapi/ headers.
# (backends/ have only include/ on their include path.)
for f in "$root"/src/tritonapi/*.c "$root"/src/tritonapi/*.h; do
    [ -e "$f" ] || continue
    grep -n '#include "' "$f" | grep -v -e '#include "nereid/' -e '#include "triton/' \
        -e '#include "tritonapi/' | sed "s|^|$f: src/tritonapi includes only public headers: |" |
        grep . && status=1
done
exit $status
