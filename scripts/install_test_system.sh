#!/usr/bin/env bash
# System packages the test suite uses (Debian): chromium for the dashboard's browser test,
# PostgreSQL for the distributed-study test and docker-compose to validate exported compose files
# (`docker-compose config` reads a file without a Docker daemon). Browsers are never downloaded by a tool: Playwright
# is pointed at /usr/bin/chromium. Idempotent; skips (with a note) where apt is not usable.
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
{ command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; } || need+=(postgresql)
{ command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1; } || need+=(docker-compose)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "note: cannot install ${need[*]} (needs root + apt); the tests that use them will be skipped" >&2
  exit 0
fi
echo "installing system packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null 2>&1 ||
  { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null; }
