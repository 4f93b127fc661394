#!/usr/bin/env bash
# README command 1: serve the webhook on its embedded defaults (self-generated certificate in
# .state/, simulated GPU nodes from config/sim/) on https://127.0.0.1:8443. Extra arguments go to
# `hami_webhook.py serve` (e.g. --listen 0.0.0.0:8443 --config my.yaml).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt
exec .venv/bin/python hami_webhook.py serve "$@"
