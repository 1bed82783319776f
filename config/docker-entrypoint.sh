#!/bin/sh
# The image's entrypoint (docs/images.md): preload jemalloc when the image has it, run the
# command under memray when MEMRAY_ENABLED=true, and `exec` it either way, so that the
# command (gunicorn by default) replaces this shell and receives SIGTERM itself.
#
#   MEMRAY_ENABLED  exactly `true` to profile (default false); needs memray in the image
#                   (docker build --build-arg MEMRAY_VERSION=1.20.0 .)
#   MEMRAY_OUTPUT   memray's output file (default /tmp/memray/mlpa.bin); with gunicorn's
#                   workers each forked process writes its own `<MEMRAY_OUTPUT>.<pid>`
set -e

memray_output="${MEMRAY_OUTPUT:-/tmp/memray/mlpa.bin}"
# On every start, as the reference's entrypoint does: a directory that cannot be made fails
# the start here, with the shell's message, rather than at the first profile write.
mkdir -p "$(dirname "$memray_output")"

# glibc's malloc keeps freed arenas per thread, and pods grew to their memory limit; jemalloc
# returns memory. The path ldconfig knows replaces any inherited LD_PRELOAD.
jemalloc="$(ldconfig -p 2>/dev/null | awk '$1 == "libjemalloc.so.2" { print $NF; exit }')"
if [ -n "$jemalloc" ]; then
    LD_PRELOAD="$jemalloc"
    export LD_PRELOAD
fi

if [ "${MEMRAY_ENABLED:-false}" = "true" ]; then
    if command -v memray >/dev/null 2>&1; then
        # --follow-fork: gunicorn's workers are forked from its master, and they serve.
        case "$1" in
            python | python3 | */python | */python3)
                shift  # `python -m mlpa_aiohttp ...` becomes `memray run ... -m mlpa_aiohttp ...`
                exec memray run -q -f --native --follow-fork -o "$memray_output" "$@"
                ;;
            *)
                script="$(command -v "$1")"
                shift
                exec memray run -q -f --native --follow-fork -o "$memray_output" "$script" "$@"
                ;;
        esac
    fi
    echo "docker-entrypoint: MEMRAY_ENABLED=true but memray is not installed in this image" \
        "(build it with --build-arg MEMRAY_VERSION=1.20.0); starting without profiling" >&2
fi

exec "$@"
