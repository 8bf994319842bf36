#!/usr/bin/env bash
# The test command (README quick start). On a fresh machine it installs what the
# tests need (package + extras, the Kafka broker's jars via Maven, Debian's
# prometheus), then runs lint, types and the whole suite. The integration tests
# start their own real Kafka broker (KRaft, 127.0.0.1) and Prometheus, and with
# STREAMLEARN_REQUIRE_KAFKA=1 they fail rather than skip when those cannot start.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"

deploy/install-deps.sh
echo "== ruff"; "$PY" -m ruff check streamlearn simulators tests
echo "== mypy"; "$PY" -m mypy --strict streamlearn && "$PY" -m mypy simulators
echo "== pytest"
export STREAMLEARN_REQUIRE_KAFKA="${STREAMLEARN_REQUIRE_KAFKA:-1}"
exec "$PY" -m pytest "$@"
