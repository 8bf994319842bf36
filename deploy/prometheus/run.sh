#!/usr/bin/env bash
# Run a throw-away Prometheus on 127.0.0.1 that scrapes one target every second.
#
#   run.sh start --target HOST:PORT [--port N] [--dir DIR] [--metrics-path /metrics]
#       writes DIR/prometheus.yml, keeps the TSDB in DIR/data, waits for /-/ready
#       and prints the base URL (http://127.0.0.1:N). DIR defaults to a new temp dir.
#   run.sh stop --dir DIR
#       SIGTERM, wait, then SIGKILL.
#
# Query it through the HTTP API, e.g.
#   curl -s 'http://127.0.0.1:N/api/v1/query?query=up'
set -euo pipefail

die() { echo "run.sh: $*" >&2; exit 1; }

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

cmd_start() {
    local target="" port="" dir="" path="/metrics"
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --target) target="$2"; shift 2 ;;
            --port) port="$2"; shift 2 ;;
            --dir) dir="$2"; shift 2 ;;
            --metrics-path) path="$2"; shift 2 ;;
            *) die "start: unknown option $1 (expected --target, --port, --dir, --metrics-path)" ;;
        esac
    done
    [[ -n "$target" ]] || die "start: --target HOST:PORT is required"
    command -v prometheus >/dev/null || die "prometheus not on PATH: run deploy/prometheus/install.sh"
    [[ -n "$dir" ]] || dir="$(mktemp -d -t streamlearn-prometheus.XXXXXX)"
    mkdir -p "$dir/data"
    dir="$(cd "$dir" && pwd)"
    [[ -n "$port" ]] || port="$(free_port)"
    cat > "$dir/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: streamlearn
    metrics_path: $path
    static_configs:
      - targets: ["$target"]
YML
    setsid prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
        --web.listen-address="127.0.0.1:$port" --storage.tsdb.retention.time=1d \
        </dev/null >"$dir/prometheus.log" 2>&1 &
    echo $! > "$dir/prometheus.pid"
    local i
    for i in $(seq 1 120); do
        if python3 -c 'import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' \
            "http://127.0.0.1:$port/-/ready" 2>/dev/null; then
            echo "run.sh: prometheus ready (pid $(cat "$dir/prometheus.pid"), dir $dir)" >&2
            echo "http://127.0.0.1:$port"
            return 0
        fi
        if ! kill -0 "$(cat "$dir/prometheus.pid")" 2>/dev/null; then
            tail -n 30 "$dir/prometheus.log" >&2
            die "prometheus exited during startup"
        fi
        sleep 0.25
    done
    tail -n 30 "$dir/prometheus.log" >&2
    cmd_stop --dir "$dir"
    die "prometheus not ready within 30 s"
}

cmd_stop() {
    local dir=""
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --dir) dir="$2"; shift 2 ;;
            *) die "stop: unknown option $1 (expected --dir DIR)" ;;
        esac
    done
    [[ -n "$dir" && -f "$dir/prometheus.pid" ]] || { echo "run.sh: nothing running in '$dir'" >&2; return 0; }
    local pid i
    pid="$(cat "$dir/prometheus.pid")"
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 80); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$dir/prometheus.pid"
    echo "run.sh: prometheus $pid stopped" >&2
}

case "${1:-}" in
    start) shift; cmd_start "$@" ;;
    stop) shift; cmd_stop "$@" ;;
    *) echo "usage: $0 {start --target HOST:PORT [--port N] [--dir DIR] [--metrics-path P]|stop --dir DIR}" >&2; exit 2 ;;
esac
