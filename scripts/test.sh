#!/usr/bin/env bash
# README command 2: run the whole test suite on a fresh machine.
# Installs what the tests need (a venv from requirements*.txt; redis-server and prometheus from
# Debian's packages when missing), then runs ruff and pytest. The tests start every server they
# use themselves (webhook, agents, redis-server, prometheus) on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
if ((${#missing[@]})); then
  echo "installing ${missing[*]} from Debian's packages" >&2
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt

.venv/bin/ruff check .
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
