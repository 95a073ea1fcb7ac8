#!/usr/bin/env bash
# Installs what dataservice needs on a fresh Debian machine: the system packages
# that are missing (Redis, MariaDB, RabbitMQ, the MariaDB client headers,
# Chromium for the Flower browser test, driven by Playwright from the dev group,
# iproute2 for the partition faults, Node.js and npm for the Node caller), a virtualenv
# in .venv, the service with its examples extra and its dev and bench
# dependency groups, and beside it the tooling package (tools/: the load
# harness, the demo, the private-service starter) with its chart extra, and
# the Node caller's packages, as its lockfile pins them.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
command -v rabbitmq-server >/dev/null 2>&1 || [ -x /usr/sbin/rabbitmq-server ] || missing+=(rabbitmq-server)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
pkg-config --exists mariadb 2>/dev/null || pkg-config --exists mysqlclient 2>/dev/null || missing+=(libmariadb-dev)
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
[ -x /usr/bin/chromium ] || missing+=(chromium)
# The partition faults' network namespace and veth pairs.
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || missing+=(iproute2)
# The Node caller in examples/node, which the conformance tests run.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

if ((${#missing[@]})); then
  echo "installing system packages: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
# uv installs the same requirements as pip in a fraction of the time (about
# 15 s against 70 s here); pip does it where uv cannot be had. Dependency
# groups need pip 25.1 or newer. Both compile the installed modules: where
# PYTHONDONTWRITEBYTECODE is set nothing else would, and every worker process
# and command would compile celery, redis and SQLAlchemy from source again
# (2-3 s of CPU each).
if .venv/bin/python -m pip install -q --disable-pip-version-check uv >/dev/null 2>&1; then
  .venv/bin/python -m uv pip install -q --compile-bytecode --python .venv/bin/python \
    "pip>=25.1" -e '.[examples]' -e './tools[chart]' --group dev --group bench
else
  .venv/bin/python -m pip install -q --upgrade "pip>=25.1"
  .venv/bin/python -m pip install -q -e '.[examples]' -e './tools[chart]' --group dev --group bench
fi

# Exactly the lockfile's versions (npm ci), without the registry's notices.
(cd examples/node && npm ci --no-audit --no-fund --loglevel=error)
