#!/usr/bin/env bash
# The README's test command. On a fresh Debian machine (as root, or with sudo)
# it installs what the tests need, then runs every check and test of the
# workspace, printing how long each stage took. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

stage() {
  local name=$1 start rc=0
  shift
  start=$(date +%s)
  echo "==> stage: $name"
  "$@" || rc=$?
  echo "==> stage: $name: $([ $rc -eq 0 ] && echo ok || echo "FAILED ($rc)") in $(( $(date +%s) - start ))s"
  return $rc
}

install_system_packages() {
  # binary -> Debian package
  # redis-sentinel: Redis failovers (e2e/tests/failover.rs);
  # chromium + node/npm: the web page's browser tests (gateway/tests/web.rs);
  # kubectl: rendering deploy/ (e2e/tests/deploy.rs); unshare and ip: a
  # network namespace of a test's own (gateway/tests/tracing.rs), and the
  # mount namespace of each Job container the fake API server runs; curl:
  # a container's in-cluster call (crates/testkit/tests/job_runner.rs).
  local -A wanted=([redis-server]=redis-server [redis-sentinel]=redis-sentinel [docker-registry]=docker-registry [chromium]=chromium [node]=nodejs [npm]=npm [kubectl]=kubernetes-client [unshare]=util-linux [ip]=iproute2 [curl]=curl)
  local missing=()
  for binary in "${!wanted[@]}"; do
    command -v "$binary" >/dev/null 2>&1 || missing+=("${wanted[$binary]}")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "redis-server, redis-sentinel, docker-registry, chromium and node already installed"
    return 0
  fi
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  echo "installing: ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Any call to a system protoc fails: the build must use protox.
export PROTOC=/bin/false
export CARGO_TERM_COLOR=never
# A clean build gains nothing from incremental state; it costs gigabytes of
# disk (a linker that runs out of space dies with a bus error, not a message).
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}

check_disk_space() {
  # A full build and test run writes about 12 GiB under target/.
  local need_gib=15 free_gib
  free_gib=$(( $(df -Pk . | awk 'NR==2 {print $4}') / 1024 / 1024 ))
  echo "free disk space under $(pwd): ${free_gib} GiB (a full run needs about ${need_gib} GiB)"
  if [ "$free_gib" -lt "$need_gib" ]; then
    echo "not enough disk space: free some (e.g. 'cargo clean' in other checkouts) and run again" >&2
    return 1
  fi
}

install_web_test_packages() {
  # playwright-core, pinned by gateway/tests/web/package-lock.json.
  if [ -d gateway/tests/web/node_modules/playwright-core ] \
    && [ gateway/tests/web/node_modules/.package-lock.json -nt gateway/tests/web/package-lock.json ]; then
    echo "playwright-core already installed"
    return 0
  fi
  npm ci --prefix gateway/tests/web --no-audit --no-fund
}

install_python_test_packages() {
  # schemathesis and openapi-spec-validator, pinned by scripts/requirements-test.txt.
  if schemathesis --version 2>/dev/null | grep -q "$(sed -n 's/^schemathesis==//p' scripts/requirements-test.txt)" \
    && python3 -c 'import openapi_spec_validator' 2>/dev/null; then
    echo "schemathesis and openapi-spec-validator already installed"
    return 0
  fi
  # Debian's own python3 is "externally managed" (PEP 668): pip refuses
  # unless told; a pyenv or venv python takes the plain install.
  python3 -m pip install -q --disable-pip-version-check -r scripts/requirements-test.txt \
    || python3 -m pip install -q --disable-pip-version-check --break-system-packages -r scripts/requirements-test.txt
}

stage "disk space" check_disk_space
stage "install system packages" install_system_packages
stage "install python test packages" install_python_test_packages
stage "install web test packages" install_web_test_packages
stage "format" cargo fmt --all --check
stage "build (no protoc)" cargo build --workspace --all-targets --locked
stage "lint" cargo clippy --workspace --all-targets --locked -- -D warnings
stage "test" cargo test --workspace --locked --no-fail-fast
