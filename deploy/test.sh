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
export STREAMLEARN_REQUIRE_KAFKA="${STREAMLEARN_REQUIRE_KAFKA:-1}"
if [[ $# -gt 0 ]]; then
    echo "== ruff"; "$PY" -m ruff check streamlearn simulators tests
    echo "== mypy"; "$PY" -m mypy --strict streamlearn && "$PY" -m mypy simulators
    echo "== pytest"
    exec "$PY" -m pytest "$@"
fi
# Lint and types (about 1.5 min of one core on a clean clone) run beside the tests, in the
# time the integration tests spend waiting on streams; their report comes first at the end.
LINT_LOG="$(mktemp -t streamlearn-lint.XXXXXX)"
( set +e; echo "== ruff"; "$PY" -m ruff check streamlearn simulators tests; RUFF=$?
  echo "== mypy"; "$PY" -m mypy --strict streamlearn && "$PY" -m mypy simulators; MYPY=$?
  exit $(( RUFF != 0 || MYPY != 0 )) ) >"$LINT_LOG" 2>&1 &
LINT_PID=$!
echo "== pytest"
# The whole suite as two pytest processes side by side: most integration tests (a real
# broker, Prometheus and daemons; they spend most of their time waiting on streams, about
# half of two cores busy) and everything else (CPU-bound, one core) with the integration
# tests listed in tests/integration/conftest.py's BESIDE_FILES, which evens out
# the two processes' times. Each process starts its own broker. Together they take about
# the longer one's time instead of the sum. The integration tests' output is printed when
# both are done; each process's exit status counts.
INTEGRATION_LOG="$(mktemp -t streamlearn-integration.XXXXXX)"
# the integration tests that measure a CPU share (marked cpu_share) run last and wait for this
export STREAMLEARN_OTHER_TESTS_DONE="$INTEGRATION_LOG.others-done"
STREAMLEARN_INTEGRATION_SHARE=main "$PY" -m pytest tests/integration --durations=15 >"$INTEGRATION_LOG" 2>&1 &
INTEGRATION_PID=$!
trap 'kill "$INTEGRATION_PID" "$LINT_PID" 2>/dev/null || true' INT TERM
echo "(integration tests running alongside; their report follows this one: $INTEGRATION_LOG)"
set +e
STREAMLEARN_INTEGRATION_SHARE=beside "$PY" -m pytest --durations=10
OTHERS=$?
touch "$STREAMLEARN_OTHER_TESTS_DONE"
wait "$INTEGRATION_PID"
INTEGRATION=$?
wait "$LINT_PID"
LINT=$?
set -e
echo "== pytest tests/integration (all but BESIDE_FILES)"
cat "$INTEGRATION_LOG"
cat "$LINT_LOG"
echo "== lint and types exit $LINT; pytest: others exit $OTHERS, integration exit $INTEGRATION"
[[ $LINT -eq 0 && $OTHERS -eq 0 && $INTEGRATION -eq 0 ]]
