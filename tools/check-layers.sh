#!/usr/bin/env bash
# The one-way layers of docs/architecture.md, checked on #include lines:
#   platform <- core/{comm, text} <- core/config <- core/model <- core/checkpoint
#            <- core/{train, serve} <- core/{plan, monitor} <- transports, devices <- cli
# (the root of core/ -- context, settings, device wrapper, l3d_core.h -- sits just above
# platform). A file may include its own folder and any folder of a lower rank; two folders of
# one rank may not include each other. core/ reaches transports and devices only through their
# vtable headers. Prints file:line for each include that breaks the order and fails.
# Usage: bash tools/check-layers.sh [repo root]
set -euo pipefail
cd "${1:-.}"

# folder rank: the same table as docs/architecture.md
RANKS='
platform 0
core 1
core/comm 2
core/text 2
core/config 3
core/model 4
core/checkpoint 5
core/train 6
core/serve 6
core/plan 7
core/monitor 7
'

files=$(find core platform devices transports include \( -name '*.[ch]' -o -name '*.cu' \) 2>/dev/null | sort)
[ -n "$files" ] || { echo "check-layers: no sources under $(pwd)" >&2; exit 2; }

# shellcheck disable=SC2086
awk -v ranks="$RANKS" '
function layer(path,   n, p) {  # the layer a path (file or include target) belongs to
    n = split(path, p, "/")
    if (p[1] == "core") {
        if (n == 2) return "core"                      # the root of core/
        if (("core/" p[2]) in rank) return "core/" p[2]
        return "core/?" p[2]                           # a folder the table does not know
    }
    if (p[1] == "llama3d") return "public"             # include/llama3d/: everyone may
    if (p[1] == "include") return "public"
    if (p[1] == "devices") return (n == 2) ? "device-vtable" : "devices"
    if (p[1] == "transports") return (n == 2) ? "transport-vtable" : "transports"
    return p[1]                                        # platform, cli, ...
}
function bad(msg) { printf "%s:%d: %s\n", FILENAME, FNR, msg; nbad++ }
BEGIN {
    n = split(ranks, l, "\n")
    for (i = 1; i <= n; i++) if (split(l[i], kv, " ") == 2) rank[kv[1]] = kv[2] + 0
}
/^[ \t]*#[ \t]*include[ \t]*"/ {
    t = $0; sub(/^[^"]*"/, "", t); sub(/".*$/, "", t)
    if (index(t, "/") == 0) next                       # a header beside the file: same folder
    from = layer(FILENAME); to = layer(t)
    if (from == to || to == "public") next
    if (from ~ /^core\/\?/ || to ~ /^core\/\?/) {
        bad("folder not in the layer table of tools/check-layers.sh: " t); next
    }
    if (from == "platform") { bad("platform/ includes " t " (platform uses nothing above it)"); next }
    if (from == "public") { bad("a public header includes " t); next }
    if (from == "core" || from ~ /^core\//) {
        if (to == "platform" || to == "device-vtable" || to == "transport-vtable") next
        if (to == "core" || to ~ /^core\//) {
            if (rank[to] < rank[from]) next
            bad(from " (rank " rank[from] ") includes " t " of " to " (rank " rank[to] \
                "): a folder uses only lower ranks (docs/architecture.md)")
            next
        }
        bad("core/ includes " t ": only the vtable headers devices/device.h and " \
            "transports/transport.h, never a backend or cli/")
        next
    }
    if (from == "devices" || from == "transports") {
        if (to == "cli") bad(from " includes " t " (cli/ is the top layer)")
        else if (to != from && (to == "devices" || to == "transports"))
            bad("a " from " backend includes " t " of another kind of backend")
        next
    }
}
END { if (nbad) { printf "check-layers: %d include(s) against the layer order\n", nbad; exit 1 } }
' $files
echo "check-layers: ok ($(echo "$files" | wc -l) files)"
