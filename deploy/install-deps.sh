#!/usr/bin/env bash
# Everything streamlearn's tests need on a fresh machine; safe to run again
# (each step skips what is already there). Called by .ci/run.
#   1. the package in editable mode with its test, bench and plot extras
#   2. the Kafka broker's jars (deploy/kafka/lib, from Maven Central via mvn)
#   3. Debian's prometheus (service left stopped)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PY="${PYTHON:-python3}"
"$PY" -m pip install -q -e '.[test,bench,plot,confluent]'

if ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
    SUDO=""; [[ "$(id -u)" == 0 ]] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        openjdk-17-jre-headless maven >/dev/null
fi
deploy/kafka/kafka.sh fetch
deploy/prometheus/install.sh
