#!/bin/sh
# The Calor image's entrypoint (see "Docker" in README.md).
#
#   serve [FLAGS]   (the default) `calor serve` on all interfaces, with the API keys of
#                   the mounted auth file and, when its files are mounted, TLS; FLAGS are
#                   added (e.g. --webhook-allow hooks.example.com:443)
#   health          `calor health` against this container's server, the same way: what
#                   the image's HEALTHCHECK runs
#   anything else   run as a command (`calor keys list --file …`, `sh`)
#
# Files, under /run/calor unless the environment says otherwise:
#   auth.toml            API keys (CALOR_AUTH_FILE); required: a server on 0.0.0.0 needs keys
#   tls/tls.crt, tls.key the server's certificate chain and key: TLS on (CALOR_TLS_DIR)
#   tls/client-ca.crt    also require client certificates signed by this CA (mutual TLS)
#   tls/ca.crt           the CA the health check trusts (default: the system's roots)
#   tls/client.crt, .key the health check's own certificate, under mutual TLS
set -eu

auth_file="${CALOR_AUTH_FILE:-/run/calor/auth.toml}"
tls_dir="${CALOR_TLS_DIR:-/run/calor/tls}"
port="${CALOR_PORT:-50051}"
metrics_port="${CALOR_METRICS_PORT:-9464}"

serve() {
    set -- --host 0.0.0.0 --port "$port" --metrics-port "$metrics_port" \
        --auth-file "$auth_file" "$@"
    if [ -e "$tls_dir/tls.crt" ] || [ -e "$tls_dir/tls.key" ]; then
        set -- "$@" --tls-cert "$tls_dir/tls.crt" --tls-key "$tls_dir/tls.key"
        if [ -e "$tls_dir/client-ca.crt" ]; then
            set -- "$@" --tls-client-ca "$tls_dir/client-ca.crt"
        fi
    fi
    exec calor serve "$@"
}

health() {
    set -- --target "${CALOR_HEALTH_TARGET:-localhost:$port}" "$@"
    if [ -e "$tls_dir/tls.crt" ]; then
        if [ -e "$tls_dir/ca.crt" ]; then
            set -- "$@" --tls-ca "$tls_dir/ca.crt"
        else
            set -- "$@" --tls
        fi
        if [ -e "$tls_dir/client.crt" ]; then
            set -- "$@" --tls-client-cert "$tls_dir/client.crt" \
                --tls-client-key "$tls_dir/client.key"
        fi
    fi
    exec calor health "$@"
}

case "${1:-serve}" in
    serve | -*)
        if [ "${1:-}" = serve ]; then shift; fi
        serve "$@"
        ;;
    health)
        shift
        health "$@"
        ;;
    *)
        exec "$@"
        ;;
esac
