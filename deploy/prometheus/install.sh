#!/usr/bin/env bash
# Install Debian's prometheus package unless a prometheus binary is already on
# PATH. The package starts a system service on 0.0.0.0:9090; streamlearn never
# uses it (tests run their own instance via run.sh), so it is stopped and
# disabled right away.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1; then
    echo "install.sh: $(prometheus --version 2>&1 | head -n 1)"
    exit 0
fi
SUDO=""
if [[ "$(id -u)" != 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d exit 101 stops the package's postinst from starting the service.
POLICY=/usr/sbin/policy-rc.d
ADDED_POLICY=0
if [[ ! -e "$POLICY" ]]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod +x "$POLICY"
    ADDED_POLICY=1
fi
cleanup() { if [[ "$ADDED_POLICY" == 1 ]]; then $SUDO rm -f "$POLICY"; fi; }
trap cleanup EXIT
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
# Belt and braces: whatever started, stop it and keep it from starting at boot.
if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
    $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
else
    $SUDO service prometheus stop >/dev/null 2>&1 || true
    $SUDO update-rc.d prometheus disable >/dev/null 2>&1 || true
fi
service_pidfile=/run/prometheus/prometheus.pid
if [[ -f "$service_pidfile" ]]; then $SUDO kill "$(cat "$service_pidfile")" 2>/dev/null || true; fi
echo "install.sh: $(prometheus --version 2>&1 | head -n 1)"
