#!/usr/bin/env bash
# The test bed: a real Kubernetes control plane (etcd, kube-apiserver,
# kube-controller-manager) on 127.0.0.1, for one pinned release.
#
#   testbed.sh build [--node] [--peer] [--kine]
#                                 build and cache the binaries (once per version): the
#                                 control plane, helm 4 and 3, the OCI registry,
#                                 helm-docs, the monitoring CRDs, promtool, cosign; with --node
#                                 the node; with --peer the benchmarks' peer, OCM's work
#                                 agent; with --kine kine
#   testbed.sh start DIR [--node] [--audit] [--kine] [PID]
#                                 start a control plane with its data in DIR (new or empty);
#                                 when PID is given, everything is stopped and DIR removed
#                                 as soon as that process is gone. --node: inside a network
#                                 namespace of its own, with a node (see below). --audit:
#                                 the API server writes an audit log (Metadata level, JSON
#                                 lines) to DIR/logs/audit.log. --kine: the datastore is
#                                 kine over SQLite (what k3s runs), not etcd
#
# NEXO_K8S_VERSION picks the Kubernetes release of `build` and `start`
# among SUPPORTED_K8S_VERSIONS (default: the newest); `bin --versions`
# prints them.
#   testbed.sh stop DIR           stop what DIR's test bed started, remove DIR; refuses a
#                                 DIR that `start` did not create (no DIR/.nexo-testbed)
#                                 and does nothing when DIR does not exist
#   testbed.sh restart-apiserver DIR [SECONDS]
#                                 stop the API server, wait SECONDS (default 0), start it
#                                 again with the same flags on the same port
#   testbed.sh token DIR NS SA    print a ServiceAccount token (TokenRequest API)
#   testbed.sh user DIR NAME      write DIR/NAME.kubeconfig: a client certificate for the
#                                 user NAME in system:masters (so the audit log tells one
#                                 client from another), print its path
#   testbed.sh import DIR ARCHIVE import an OCI image archive into the node's containerd
#   testbed.sh bin [--node|--helm|--helm3|--registry|--helm-docs|--monitoring-crds|--promtool|--cosign|--peer|--kine|--versions]
#                                 print the folder holding the cached binaries (or CRDs)
#   testbed.sh leftovers RECORD   list the processes and network namespaces still left of
#                                 the test beds listed in RECORD; exit 1 if there are any
#
# When NEXO_TESTBED_RECORD names a file, `start` appends a line to it for the
# test bed it starts (`NETNS DIR`, NETNS `-` without --node) before starting
# anything: tests/run.sh records that way every test bed of its run, its
# tests' included, and checks with `leftovers` that nothing of them is left.
#
# The node (--node): kubelet, kube-scheduler and kube-proxy of the same
# release, Debian's containerd, runc and CNI plugins (bridge, host-local).
# Everything, the control plane included, runs in the network namespace
# nexo-tb-<id> with no route out: the API server listens on NODE_IP
# (10.77.0.1, an address of the namespace's loopback), pods get addresses
# of 10.88.0.0/24 on the bridge cni0 and reach the API server through the
# `kubernetes` Service (10.96.0.1, kube-proxy's iptables rules). Tests that
# use it run in the namespace too (`ip netns exec`). containerd, the kubelet
# and kube-proxy run in a PID and mount namespace of their own, so stopping
# ends every shim and container and takes every mount with it.
#
# The binaries come from the official Go modules through the Go module proxy:
# k8s.io/kubernetes (its staging modules replaced by their published versions)
# and go.etcd.io/etcd/server/v3, helm from helm.sh/helm/v4 and v3, and the
# chart's other tools from theirs (HELM3_VERSION and below). They are cached, keyed by version, in
# $NEXO_TESTBED_CACHE (default: ${XDG_CACHE_HOME:-$HOME/.cache}/nexo-testbed).
#
# After `start`, DIR holds: admin.kubeconfig, ca.crt, admin.crt/admin.key,
# env (APISERVER_URL, KUBECTL, HELM, ETCD_PORT, ... and the process ids; NETNS, NODE_NAME,
# NODE_IP with --node), logs/*.log, and .nexo-testbed, the marker that
# `stop` looks for before it deletes DIR (who started it, when, which pid
# it watches).
set -euo pipefail

# The supported Kubernetes releases (README.md, "Supported Kubernetes
# releases"): the newest patch of each minor that the Go module proxy
# serves. The last is the default; NEXO_K8S_VERSION picks another of them
# for `build` and `start` (tests/run.sh runs the end-to-end tests against
# each). Each is built and cached on its own, keyed by version.
SUPPORTED_K8S_VERSIONS="v1.34.4 v1.35.4 v1.36.3 v1.37.2"
K8S_VERSION=${NEXO_K8S_VERSION:-${SUPPORTED_K8S_VERSIONS##* }}
case " $SUPPORTED_K8S_VERSIONS " in
  *" $K8S_VERSION "*) ;;
  *) echo "testbed: NEXO_K8S_VERSION=$K8S_VERSION is not a supported release (supported: $SUPPORTED_K8S_VERSIONS)" >&2; exit 2 ;;
esac
# The staging modules (k8s.io/api, ...) of release v1.X.Y are published as v0.X.Y.
STAGING_VERSION=v0.${K8S_VERSION#v1.}
ETCD_VERSION=v3.6.16
HELM_VERSION=v4.3.2
# The chart's tools (tests/chart.rs, tests/chart_registry.rs): Helm 3, which
# most clusters are still driven by, beside Helm 4; the CNCF distribution
# registry, the OCI registry the chart is pushed to and installed from;
# helm-docs, which writes the chart's README; the prometheus-operator CRDs
# (ServiceMonitor, PodMonitor, PrometheusRule) the monitoring templates are
# applied against; promtool, which checks the alert rules, the dashboard's
# queries and a scrape (the Go module of Prometheus 3.16); cosign, which
# signs and verifies the image, its SBOM and provenance offline with a key
# (v2: its key-based flow needs no transparency log or TUF root).
HELM3_VERSION=v3.21.4
REGISTRY_VERSION=v3.1.2
HELM_DOCS_VERSION=v1.14.2
PROMETHEUS_OPERATOR_VERSION=v0.85.0
PROMETHEUS_VERSION=v0.316.0
COSIGN_VERSION=v2.6.5
# The k3s datastore (start --kine): kine over SQLite, in place of etcd.
KINE_VERSION=v0.17.5
# The benchmarks' peer (tests/bench/peer.rs): Open Cluster Management's work agent.
OCM_VERSION=v1.2.1
CACHE_ROOT=${NEXO_TESTBED_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nexo-testbed}
BIN_DIR=$CACHE_ROOT/k8s-$K8S_VERSION-etcd-$ETCD_VERSION/bin
NODE_BIN_DIR=$CACHE_ROOT/k8s-$K8S_VERSION-node/bin
HELM_BIN_DIR=$CACHE_ROOT/helm-$HELM_VERSION/bin
HELM3_BIN_DIR=$CACHE_ROOT/helm-$HELM3_VERSION/bin
REGISTRY_BIN_DIR=$CACHE_ROOT/distribution-$REGISTRY_VERSION/bin
HELM_DOCS_BIN_DIR=$CACHE_ROOT/helm-docs-$HELM_DOCS_VERSION/bin
MONITORING_CRDS_DIR=$CACHE_ROOT/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION/crds
PROMTOOL_BIN_DIR=$CACHE_ROOT/promtool-$PROMETHEUS_VERSION/bin
COSIGN_BIN_DIR=$CACHE_ROOT/cosign-$COSIGN_VERSION/bin
PEER_DIR=$CACHE_ROOT/ocm-work-$OCM_VERSION
KINE_BIN_DIR=$CACHE_ROOT/kine-$KINE_VERSION/bin
CNI_BIN_DIR=/usr/lib/cni
NODE_NAME=nexo-node
NODE_IP=10.77.0.1
POD_SUBNET=10.88.0.0/24
SERVICE_RANGE=10.96.0.0/16
KUBERNETES_SERVICE_IP=10.96.0.1
PAUSE_IMAGE=nexo.test/pause:testbed
# Written by `start` into the DIR it created; `stop` removes no DIR without it.
MARKER=.nexo-testbed
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The command prefix of every process of the test bed: empty, or
# `ip netns exec NS` in node mode.
IN=()

die() { echo "testbed: $*" >&2; exit 1; }
log() { echo "testbed: $*" >&2; }

need() {
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' is required but not installed"
  done
}

# ---------------------------------------------------------------- build --

# Prints one field (Dir, GoMod) of `go mod download -json MODULE@VERSION`,
# run in MODDIR. That command reports a failure only inside its JSON, on
# stdout (.Error; nothing on stderr): the JSON is shown and the script
# stops, rather than a filter dropping the error and `set -e` ending the
# script without a word.
go_download() { # moddir module@version field
  local json value
  json=$(cd "$1" && GOFLAGS=-mod=mod go mod download -json "$2") || {
    printf '%s\n' "$json" >&2
    die "cannot download $2 through the Go module proxy"
  }
  value=$(printf '%s\n' "$json" | sed -n "s/^[[:space:]]*\"$3\": \"\(.*\)\",\{0,1\}\$/\1/p")
  [ -n "$value" ] || { printf '%s\n' "$json" >&2; die "go mod download -json $2 gave no $3"; }
  printf '%s\n' "$value"
}

# Resolves the build module's requirements. No -e: with it, tidy reports a
# package it cannot resolve and still exits 0, and as its output goes to
# tidy.log, shown only on failure, the error went unseen (surfacing later,
# if at all, as a go build error further from its cause). Neither module
# needs it: for the pinned versions, tidy without -e exits 0 and writes the
# same go.mod and go.sum as with it.
tidy_module() { # moddir what
  log "resolving $2 dependencies"
  (cd "$1" && go mod tidy >/dev/null 2>"$1/tidy.log") || {
    cat "$1/tidy.log" >&2
    die "go mod tidy failed: cannot resolve $2's dependencies (log: $1/tidy.log)"
  }
}

# The build module of one Go program: MODDIR/go.mod requiring MODULE at
# VERSION and MODDIR/tools.go importing PKG, the command to build; with
# --replace, the upstream module's replace lines too, which apply to a
# build of it. Its requirements are then resolved (tidy_module).
tool_module() { # moddir name module version pkg [--replace]
  local mod=$1 name=$2 module=$3 version=$4 pkg=$5
  mkdir -p "$mod"
  printf 'module nexo.io/testbed-%s\n\ngo 1.26.0\n\nrequire %s %s\n' "$name" "$module" "$version" >"$mod/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$pkg" >"$mod/tools.go"
  if [ "${6:-}" = --replace ]; then
    local upstream_mod
    upstream_mod=$(go_download "$mod" "$module@$version" GoMod)
    if grep -q '^replace' "$upstream_mod"; then
      sed -n '/^replace/,$p' "$upstream_mod" >>"$mod/go.mod"
    fi
  fi
  tidy_module "$mod" "$name $version"
}

# The build module: k8s.io/kubernetes at K8S_VERSION, every staging module
# that its go.mod requires at v0.0.0 replaced by its published release.
# Args: module dir, then the commands (k8s.io/kubernetes/cmd/...) to build
# into OUT.
build_k8s_commands() { # moddir outdir cmd...
  local mod=$1 out=$2
  shift 2
  mkdir -p "$mod"
  local upstream_mod
  upstream_mod=$(go_download "$mod" "k8s.io/kubernetes@$K8S_VERSION" GoMod)
  [ -f "$upstream_mod" ] || die "could not download k8s.io/kubernetes@$K8S_VERSION's go.mod"
  local staging
  staging=$(sed -n 's/^[[:space:]]*\(k8s\.io\/[a-z0-9-]*\) v0\.0\.0$/\1/p' "$upstream_mod" | sort -u)
  [ -n "$staging" ] || die "no staging modules found in $upstream_mod"
  {
    echo "module nexo.io/testbed-build"
    echo
    echo "go 1.26.0"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    for m in $staging; do echo "	$m => $m $STAGING_VERSION"; done
    echo ")"
  } >"$mod/go.mod"
  {
    echo "//go:build tools"
    echo
    echo "package tools"
    echo
    echo "import ("
    for c in "$@"; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done
    echo ")"
  } >"$mod/tools.go"
  tidy_module "$mod" "k8s.io/kubernetes $K8S_VERSION"
  local v=$K8S_VERSION minor
  minor=${v#v1.}; minor=${minor%%.*}
  # The version ldflags, so every binary reports K8S_VERSION (a node
  # registers with the kubelet's version).
  local ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags="$ldflags -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  local pkgs=()
  for c in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  log "building $* $K8S_VERSION (slow the first time)"
  (cd "$mod" && go build -trimpath -tags tools -ldflags "$ldflags" -o "$out/" "${pkgs[@]}")
}

build_kubernetes() {
  build_k8s_commands "$CACHE_ROOT/build-k8s-$K8S_VERSION" "$BIN_DIR.tmp" \
    kube-apiserver kube-controller-manager kubectl
}

build_etcd() {
  local mod=$CACHE_ROOT/build-etcd-$ETCD_VERSION
  mkdir -p "$mod"
  tool_module "$mod" etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" go.etcd.io/etcd/server/v3
  log "building etcd $ETCD_VERSION"
  (cd "$mod" && go build -trimpath -tags tools -ldflags "-s -w" -o "$BIN_DIR.tmp/etcd" go.etcd.io/etcd/server/v3)
}

# The node: kubelet, kube-scheduler and kube-proxy of the same release, and
# the pause program (the pod sandbox's init) compiled statically with
# musl-gcc from the module's build/pause/linux/pause.c. containerd, runc and
# the CNI plugins are Debian's packages (need_node_packages).
build_node() {
  rm -rf "$NODE_BIN_DIR.tmp"
  mkdir -p "$NODE_BIN_DIR.tmp"
  build_k8s_commands "$CACHE_ROOT/build-k8s-node-$K8S_VERSION" "$NODE_BIN_DIR.tmp" \
    kubelet kube-scheduler kube-proxy
  local src
  src=$(go_download "$CACHE_ROOT/build-k8s-node-$K8S_VERSION" "k8s.io/kubernetes@$K8S_VERSION" Dir)
  [ -f "$src/build/pause/linux/pause.c" ] || die "no build/pause/linux/pause.c in k8s.io/kubernetes@$K8S_VERSION"
  need musl-gcc
  musl-gcc -static -Os -Wall -Werror -DVERSION="$K8S_VERSION-nexo-testbed" \
    -o "$NODE_BIN_DIR.tmp/pause" "$src/build/pause/linux/pause.c"
  strip "$NODE_BIN_DIR.tmp/pause" 2>/dev/null || true
  rm -rf "$NODE_BIN_DIR"
  mv "$NODE_BIN_DIR.tmp" "$NODE_BIN_DIR"
}

# One command of a Go module, built into OUTDIR/BINARY (what was there
# replaced once it built), with "-s -w" and LDFLAGS; --replace as in
# tool_module.
build_go_command() { # name module version pkg outdir binary ldflags [--replace]
  local name=$1 module=$2 version=$3 pkg=$4 out=$5 binary=$6 ldflags=$7
  local mod=$CACHE_ROOT/build-$name-$version
  rm -rf "$out.tmp"
  mkdir -p "$mod" "$out.tmp"
  tool_module "$mod" "$name" "$module" "$version" "$pkg" ${8:-}
  log "building $name $version"
  (cd "$mod" && go build -trimpath -tags tools -ldflags "-s -w $ldflags" -o "$out.tmp/$binary" "$pkg")
  rm -rf "$out"
  mv "$out.tmp" "$out"
}

# Helm, for the chart's tests (tests/chart*.rs): the helm command of the
# helm.sh/helm/v4 module, its version stamped in as its Makefile does; and
# Helm 3's, of helm.sh/helm/v3, beside it.
build_helm() {
  build_go_command helm helm.sh/helm/v4 "$HELM_VERSION" helm.sh/helm/v4/cmd/helm "$HELM_BIN_DIR" helm \
    "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
}

build_helm3() {
  build_go_command helm helm.sh/helm/v3 "$HELM3_VERSION" helm.sh/helm/v3/cmd/helm "$HELM3_BIN_DIR" helm \
    "-X helm.sh/helm/v3/internal/version.version=$HELM3_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
}

# The CNCF distribution registry (its `registry` command), a local OCI
# registry for `helm push` and `helm install oci://`.
build_registry() {
  build_go_command distribution github.com/distribution/distribution/v3 "$REGISTRY_VERSION" \
    github.com/distribution/distribution/v3/cmd/registry "$REGISTRY_BIN_DIR" registry \
    "-X github.com/distribution/distribution/v3/version.version=$REGISTRY_VERSION" --replace
}

# helm-docs, which writes a chart's README.md from its values.yaml's comments.
build_helm_docs() {
  build_go_command helm-docs github.com/norwoodj/helm-docs "$HELM_DOCS_VERSION" \
    github.com/norwoodj/helm-docs/cmd/helm-docs "$HELM_DOCS_BIN_DIR" helm-docs \
    "-X main.version=${HELM_DOCS_VERSION#v}" --replace
}

# promtool, Prometheus' checker of rules and metrics (its cmd/promtool),
# its version stamped in as Prometheus' promu does (module v0.316.0 is
# Prometheus 3.16.0).
build_promtool() {
  local m=${PROMETHEUS_VERSION#v0.}
  build_go_command promtool github.com/prometheus/prometheus "$PROMETHEUS_VERSION" \
    github.com/prometheus/prometheus/cmd/promtool "$PROMTOOL_BIN_DIR" promtool \
    "-X github.com/prometheus/common/version.Version=${m:0:1}.${m:1}"
}

# cosign, the signer of OCI images (its cmd/cosign), its version stamped in
# as its Makefile does.
build_cosign() {
  build_go_command cosign github.com/sigstore/cosign/v2 "$COSIGN_VERSION" \
    github.com/sigstore/cosign/v2/cmd/cosign "$COSIGN_BIN_DIR" cosign \
    "-X sigs.k8s.io/release-utils/version.gitVersion=$COSIGN_VERSION"
}

# The ServiceMonitor, PodMonitor and PrometheusRule CRDs, as the prometheus-operator
# module of that release ships them (example/prometheus-operator-crd);
# nothing is built.
fetch_monitoring_crds() {
  local mod=$CACHE_ROOT/build-prometheus-operator-$PROMETHEUS_OPERATOR_VERSION
  rm -rf "$MONITORING_CRDS_DIR.tmp"
  mkdir -p "$mod" "$MONITORING_CRDS_DIR.tmp"
  printf 'module nexo.io/testbed-prometheus-operator\n\ngo 1.26.0\n' >"$mod/go.mod"
  local src
  src=$(go_download "$mod" "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" Dir)
  for kind in servicemonitors podmonitors prometheusrules; do
    local f=$src/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml
    [ -f "$f" ] || die "no $f in prometheus-operator $PROMETHEUS_OPERATOR_VERSION"
    cp "$f" "$MONITORING_CRDS_DIR.tmp/"
  done
  rm -rf "$MONITORING_CRDS_DIR"
  mv "$MONITORING_CRDS_DIR.tmp" "$MONITORING_CRDS_DIR"
}

# The peer of the benchmarks, built only by `build --peer` (tests/bench.sh):
# the work agent of open-cluster-management.io/ocm (its `work` command, whose
# `agent` subcommand applies ManifestWorks), and the ManifestWork and
# AppliedManifestWork CRDs of the open-cluster-management.io/api release its
# go.mod requires. Into PEER_DIR: bin/work, crds/*.yaml, VERSIONS.
build_peer() {
  local mod=$CACHE_ROOT/build-ocm-$OCM_VERSION
  rm -rf "$PEER_DIR.tmp"
  mkdir -p "$mod" "$PEER_DIR.tmp/bin" "$PEER_DIR.tmp/crds"
  tool_module "$mod" ocm open-cluster-management.io/ocm "$OCM_VERSION" \
    open-cluster-management.io/ocm/cmd/work --replace
  local api_version
  api_version=$(cd "$mod" && go list -m -f '{{.Version}}' open-cluster-management.io/api)
  local api
  api=$(go_download "$mod" "open-cluster-management.io/api@$api_version" Dir)
  cp "$api/work/v1/0000_00_work.open-cluster-management.io_manifestworks.crd.yaml" \
     "$api/work/v1/0000_01_work.open-cluster-management.io_appliedmanifestworks.crd.yaml" \
     "$PEER_DIR.tmp/crds/"
  log "building the OCM work agent $OCM_VERSION (slow the first time)"
  local v=${OCM_VERSION#v}
  (cd "$mod" && go build -trimpath -tags tools \
    -ldflags "-s -w -X open-cluster-management.io/ocm/pkg/version.versionFromGit=$OCM_VERSION -X open-cluster-management.io/ocm/pkg/version.majorFromGit=${v%%.*} -X open-cluster-management.io/ocm/pkg/version.minorFromGit=$(echo "$v" | cut -d. -f2)" \
    -o "$PEER_DIR.tmp/bin/work" open-cluster-management.io/ocm/cmd/work)
  printf 'open-cluster-management.io/ocm %s\nopen-cluster-management.io/api %s\n%s\n' \
    "$OCM_VERSION" "$api_version" "$(go version)" >"$PEER_DIR.tmp/VERSIONS"
  rm -rf "$PEER_DIR"
  mv "$PEER_DIR.tmp" "$PEER_DIR"
}

# kine, the etcd shim k3s runs its API server on, here over SQLite: the
# main package of github.com/k3s-io/kine, built with cgo (SQLite is C).
build_kine() {
  local mod=$CACHE_ROOT/build-kine-$KINE_VERSION
  rm -rf "$KINE_BIN_DIR.tmp"
  mkdir -p "$mod" "$KINE_BIN_DIR.tmp"
  tool_module "$mod" kine github.com/k3s-io/kine "$KINE_VERSION" github.com/k3s-io/kine --replace
  need gcc
  log "building kine $KINE_VERSION"
  (cd "$mod" && CGO_ENABLED=1 go build -trimpath -tags tools -ldflags "-s -w" \
    -o "$KINE_BIN_DIR.tmp/kine" github.com/k3s-io/kine)
  rm -rf "$KINE_BIN_DIR"
  mv "$KINE_BIN_DIR.tmp" "$KINE_BIN_DIR"
}

need_node_packages() {
  local missing=()
  command -v containerd >/dev/null 2>&1 || missing+=(containerd)
  command -v runc >/dev/null 2>&1 || missing+=(runc)
  [ -x "$CNI_BIN_DIR/bridge" ] || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null 2>&1 || missing+=(iptables)
  command -v conntrack >/dev/null 2>&1 || missing+=(conntrack)
  command -v ip >/dev/null 2>&1 || missing+=(iproute2)
  command -v musl-gcc >/dev/null 2>&1 || missing+=(musl-tools)
  [ ${#missing[@]} -eq 0 ] || die "the node needs Debian's ${missing[*]} (apt-get install ${missing[*]}; tests/install.sh installs them)"
  [ "$(id -u)" = 0 ] || die "the node needs root (network namespace, mounts, containerd)"
}

cmd_build() { # [--node] [--peer] [--kine]
  local node= peer= kine=
  for arg in "$@"; do
    case $arg in
      --node) node=1 ;;
      --peer) peer=1 ;;
      --kine) kine=1 ;;
      *) die "build: unknown argument $arg" ;;
    esac
  done
  if ! { [ -x "$BIN_DIR/kube-apiserver" ] && [ -x "$BIN_DIR/kube-controller-manager" ] \
     && [ -x "$BIN_DIR/kubectl" ] && [ -x "$BIN_DIR/etcd" ]; }; then
    need go
    local started=$SECONDS
    rm -rf "$BIN_DIR.tmp"
    mkdir -p "$BIN_DIR.tmp"
    build_etcd
    build_kubernetes
    rm -rf "$BIN_DIR"
    mv "$BIN_DIR.tmp" "$BIN_DIR"
    log "built the control plane into $BIN_DIR in $((SECONDS - started)) s"
  fi
  if [ -n "$node" ] && ! { [ -x "$NODE_BIN_DIR/kubelet" ] && [ -x "$NODE_BIN_DIR/kube-scheduler" ] \
     && [ -x "$NODE_BIN_DIR/kube-proxy" ] && [ -x "$NODE_BIN_DIR/pause" ]; }; then
    need go
    local started=$SECONDS
    build_node
    log "built the node into $NODE_BIN_DIR in $((SECONDS - started)) s"
  fi
  if [ ! -x "$HELM_BIN_DIR/helm" ]; then
    need go
    local started=$SECONDS
    build_helm
    log "built helm into $HELM_BIN_DIR in $((SECONDS - started)) s"
  fi
  if [ ! -x "$HELM3_BIN_DIR/helm" ]; then
    need go
    local started=$SECONDS
    build_helm3
    log "built helm $HELM3_VERSION into $HELM3_BIN_DIR in $((SECONDS - started)) s"
  fi
  if [ ! -x "$REGISTRY_BIN_DIR/registry" ]; then
    need go
    local started=$SECONDS
    build_registry
    log "built the distribution registry into $REGISTRY_BIN_DIR in $((SECONDS - started)) s"
  fi
  if [ ! -x "$HELM_DOCS_BIN_DIR/helm-docs" ]; then
    need go
    local started=$SECONDS
    build_helm_docs
    log "built helm-docs into $HELM_DOCS_BIN_DIR in $((SECONDS - started)) s"
  fi
  if [ ! -x "$PROMTOOL_BIN_DIR/promtool" ]; then
    need go
    local started=$SECONDS
    build_promtool
    log "built promtool into $PROMTOOL_BIN_DIR in $((SECONDS - started)) s"
  fi
  if [ ! -x "$COSIGN_BIN_DIR/cosign" ]; then
    need go
    local started=$SECONDS
    build_cosign
    log "built cosign into $COSIGN_BIN_DIR in $((SECONDS - started)) s"
  fi
  if [ ! -f "$MONITORING_CRDS_DIR/monitoring.coreos.com_prometheusrules.yaml" ]; then
    need go
    fetch_monitoring_crds
    log "fetched the prometheus-operator $PROMETHEUS_OPERATOR_VERSION CRDs into $MONITORING_CRDS_DIR"
  fi
  if [ -n "$kine" ] && [ ! -x "$KINE_BIN_DIR/kine" ]; then
    need go
    local started=$SECONDS
    build_kine
    log "built kine into $KINE_BIN_DIR in $((SECONDS - started)) s"
  fi
  if [ -n "$peer" ] && ! { [ -x "$PEER_DIR/bin/work" ] && [ -f "$PEER_DIR/VERSIONS" ]; }; then
    need go
    local started=$SECONDS
    build_peer
    log "built the OCM work agent into $PEER_DIR in $((SECONDS - started)) s"
  fi
  return 0
}

# ---------------------------------------------------------------- start --

free_port() {
  # Ask the kernel for a free loopback port.
  "${IN[@]}" python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# Writes DIR/NAME.crt and DIR/NAME.key: a key and a certificate for SUBJECT
# signed by DIR's CA; with SAN a serving and client certificate, without a
# client certificate only.
sign_cert() { # dir name subject [san]
  local d=$1 name=$2 subj=$3 san=${4:-}
  openssl req -newkey rsa:2048 -nodes -subj "$subj" -keyout "$d/$name.key" -out "$d/$name.csr" 2>/dev/null
  if [ -n "$san" ]; then
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" >"$d/$name.ext"
  else
    printf 'extendedKeyUsage=clientAuth\n' >"$d/$name.ext"
  fi
  openssl x509 -req -in "$d/$name.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
    -days 2 -extfile "$d/$name.ext" -out "$d/$name.crt" 2>/dev/null
  rm -f "$d/$name.csr" "$d/$name.ext"
}

gen_certs() {
  local d=$1
  local o="openssl"
  $o req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=nexo-testbed-ca" \
    -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
  sign() { sign_cert "$d" "$@"; }
  sign server "/CN=kube-apiserver" "IP:127.0.0.1,IP:$NODE_IP,IP:$KUBERNETES_SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
  sign admin "/O=system:masters/CN=nexo-testbed-admin"
  sign kubelet-client "/O=system:nodes/CN=system:node:$NODE_NAME"
  sign kubelet-server "/CN=$NODE_NAME" "IP:$NODE_IP,DNS:$NODE_NAME"
  sign etcd "/CN=etcd" "IP:127.0.0.1,DNS:localhost"
  $o genrsa -out "$d/sa.key" 2048 2>/dev/null
  $o rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
}

write_kubeconfig() { # file url [user-cert-name]
  # JSON is valid YAML: kubectl reads it, and so does the Manager (which has
  # no YAML parser).
  local user=${3:-admin}
  cat >"$1" <<KC
{
  "apiVersion": "v1",
  "kind": "Config",
  "clusters": [{"name": "testbed", "cluster": {"server": "$2", "certificate-authority": "$DIR/ca.crt"}}],
  "users": [{"name": "admin", "user": {"client-certificate": "$DIR/$user.crt", "client-key": "$DIR/$user.key"}}],
  "contexts": [{"name": "testbed", "context": {"cluster": "testbed", "user": "admin"}}],
  "current-context": "testbed"
}
KC
}

wait_ready() { # url what pid timeout_s
  local url=$1 what=$2 pid=$3 deadline=$((SECONDS + $4))
  while [ $SECONDS -lt $deadline ]; do
    kill -0 "$pid" 2>/dev/null || { tail -n 30 "$DIR/logs/$what.log" >&2; die "$what exited before it was ready (log: $DIR/logs/$what.log)"; }
    if "${IN[@]}" curl -fsS --max-time 2 --cacert "$DIR/ca.crt" --cert "$DIR/admin.crt" --key "$DIR/admin.key" \
         "$url" >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.2
  done
  tail -n 30 "$DIR/logs/$what.log" >&2
  die "$what not ready after $4 s (log: $DIR/logs/$what.log)"
}

node_config() { # writes the node's configuration into DIR
  local api_url=$1
  mkdir -p "$DIR/containerd" "$DIR/cni/net.d" "$DIR/cni/ipam" "$DIR/kubelet/root" "$DIR/kubelet/pki" "$DIR/pod-logs"
  cat >"$DIR/containerd/config.toml" <<TOML
version = 2
root = "$DIR/containerd/root"
state = "$DIR/containerd/state"
[grpc]
  address = "$DIR/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # Root here lacks CAP_SYS_RESOURCE: the kubelet's negative oom_score_adj
  # for the sandbox would make runc fail.
  restrict_oom_score_adj = true
  enable_selinux = false
  # The pods' network namespaces are mounted under DIR, not /run/netns:
  # the mounts live in the node's mount namespace, so files in the host's
  # /run/netns would outlive them.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$DIR/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
TOML
  cat >"$DIR/cni/net.d/10-nexo-testbed.conflist" <<JSON
{
  "cniVersion": "0.4.0",
  "name": "nexo-testbed",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$DIR/cni/ipam",
              "ranges": [[{"subnet": "$POD_SUBNET"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
  # What worked on a cgroup v1 hybrid machine without systemd, where root
  # lacks some capabilities: no QoS cgroups, nothing reserved, no eviction.
  cat >"$DIR/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $DIR/kubelet-server.crt
tlsPrivateKeyFile: $DIR/kubelet-server.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $DIR/ca.crt}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://$DIR/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
resolvConf: ""
clusterDomain: cluster.local
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {"memory.available": "0%", "nodefs.available": "0%", "imagefs.available": "0%", "nodefs.inodesFree": "0%"}
localStorageCapacityIsolation: false
podLogsDir: $DIR/pod-logs
syncFrequency: 10s
fileCheckFrequency: 10s
nodeStatusUpdateFrequency: 5s
rotateCertificates: false
serverTLSBootstrap: false
YAML
  write_kubeconfig "$DIR/kubelet.kubeconfig" "$api_url" kubelet-client
  cat >"$DIR/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $DIR/admin.kubeconfig}
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $POD_SUBNET
bindAddress: $NODE_IP
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack: {maxPerCore: 0, min: 0}
YAML
  cat >"$DIR/node.env" <<ENV
NODE_BIN_DIR=$NODE_BIN_DIR
NODE_NAME=$NODE_NAME
NODE_IP=$NODE_IP
PAUSE_ARCHIVE=$DIR/pause.oci.tar
ENV
  # The pause image (the pod sandbox), written as an OCI archive from the
  # cached static pause binary.
  python3 "$HERE/../image/oci-image.py" --out "$DIR/pause.oci.tar" --name "$PAUSE_IMAGE" \
    --file "$NODE_BIN_DIR/pause:/pause:0755" --entrypoint /pause --user 65535:65535 >/dev/null
}

# The network namespace: loopback up with NODE_IP on it, forwarding on,
# no other interface (the bridge comes with the first pod), no route out.
make_netns() {
  "${IN[@]}" ip link set lo up
  "${IN[@]}" ip addr add "$NODE_IP/32" dev lo
  "${IN[@]}" sysctl -qw net.ipv4.ip_forward=1
  "${IN[@]}" sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
}

wait_node_ready() { # pid timeout_s
  local pid=$1 deadline=$((SECONDS + $2))
  while [ $SECONDS -lt $deadline ]; do
    kill -0 "$pid" 2>/dev/null || { tail -n 30 "$DIR"/logs/kubelet.log "$DIR"/logs/containerd.log >&2 2>/dev/null; die "the node exited before it was Ready"; }
    # Ready, and the not-ready taint taken off by the node lifecycle
    # controller: pods can be scheduled.
    if [ "$("${IN[@]}" "$BIN_DIR/kubectl" --kubeconfig "$DIR/admin.kubeconfig" get node "$NODE_NAME" \
          -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}/{.spec.taints}' 2>/dev/null)" = True/ ]; then
      return 0
    fi
    sleep 0.5
  done
  tail -n 30 "$DIR/logs/kubelet.log" >&2 2>/dev/null || true
  die "node $NODE_NAME not Ready after $2 s (logs: $DIR/logs)"
}

# After a failed start, before DIR goes: its logs, copied to DIR.failed-logs.
# A copy that an earlier failure left there (it holds the marker
# .nexo-testbed-logs) is replaced; anything else of that name is left
# alone, and the copy gets a name of its own.
keep_logs() {
  local keep=$DIR.failed-logs
  if [ -e "$keep" ] || [ -L "$keep" ]; then
    if [ -f "$keep/$MARKER-logs" ] && ! [ -L "$keep" ]; then
      rm -rf "$keep"
    else
      keep=$(mktemp -d "$keep.XXXXXX") && rmdir "$keep"
    fi
  fi
  cp -r "$DIR/logs" "$keep" 2>/dev/null || return 0
  : >"$keep/$MARKER-logs"
  log "logs kept in $keep"
}

cmd_start() {
  local node= watch_pid= audit= kine=
  DIR=
  for arg in "$@"; do
    case $arg in
      --node) node=1 ;;
      --audit) audit=1 ;;
      --kine) kine=1 ;;
      *) if [ -z "$DIR" ]; then DIR=$arg; else watch_pid=$arg; fi ;;
    esac
  done
  [ -n "$DIR" ] || die "usage: testbed.sh start DIR [--node] [--audit] [--kine] [PID]"
  need curl openssl python3
  if [ -n "$node" ]; then
    need_node_packages
    cmd_build --node ${kine:+--kine}
  else
    cmd_build ${kine:+--kine}
  fi
  mkdir -p "$DIR"
  DIR=$(cd "$DIR" && pwd)
  [ -z "$(ls -A "$DIR")" ] || die "$DIR is not empty"
  local started=$SECONDS
  local host=127.0.0.1 netns=
  # One name per DIR, so that several test beds can run side by side.
  [ -z "$node" ] || netns=nexo-tb-$(printf '%s' "$DIR" | sha256sum | cut -c1-10)
  # The marker, first of all: `stop` (the failure trap below included)
  # deletes only a DIR that holds it, so a mistyped `stop` cannot take
  # someone's data with it.
  {
    echo "# Created by tests/testbed/testbed.sh start; testbed.sh stop removes this directory."
    echo "dir=$DIR"
    echo "started_by_pid=$$"
    echo "uid=$(id -u)"
    echo "watch_pid=$watch_pid"
    echo "netns=$netns"
    echo "started_at=$(date -u +%FT%TZ)"
  } >"$DIR/$MARKER"
  # Recorded before anything starts, so that nothing of it escapes the check.
  [ -z "${NEXO_TESTBED_RECORD:-}" ] || printf '%s %s\n' "${netns:--}" "$DIR" >>"$NEXO_TESTBED_RECORD"
  mkdir -p "$DIR/logs" "$DIR/etcd-data"
  : >"$DIR/pids"
  if [ -n "$node" ]; then
    ip netns add "$netns" || die "cannot create the network namespace $netns"
    echo "$netns" >"$DIR/netns"
    IN=(ip netns exec "$netns")
    host=$NODE_IP
  fi
  # From here on, a failure stops what was started and keeps the logs.
  trap 'keep_logs || true; cmd_stop "$DIR" >/dev/null 2>&1 || true' EXIT
  [ -z "$node" ] || make_netns
  gen_certs "$DIR"
  local etcd_port etcd_peer api_port kcm_port sched_port
  etcd_port=$(free_port); etcd_peer=$(free_port); api_port=$(free_port); kcm_port=$(free_port)
  sched_port=$(free_port)

  local datastore_name=etcd-$ETCD_VERSION
  local datastore=(--etcd-servers "https://127.0.0.1:$etcd_port" --etcd-cafile "$DIR/ca.crt"
    --etcd-certfile "$DIR/admin.crt" --etcd-keyfile "$DIR/admin.key")
  if [ -n "$kine" ]; then
    # kine over SQLite, as k3s runs it: the API server speaks etcd's v3
    # API to it (plain, on loopback); ETCD_PORT and ETCD_PID are kine's.
    "${IN[@]}" "$KINE_BIN_DIR/kine" --endpoint "sqlite://$DIR/etcd-data/state.db?_journal=WAL&cache=shared&_busy_timeout=30000" \
      --listen-address "127.0.0.1:$etcd_port" --metrics-bind-address "" \
      >"$DIR/logs/kine.log" 2>&1 &
    local etcd_pid=$!
    echo "$etcd_pid" >>"$DIR/pids"
    local deadline=$((SECONDS + 30))
    # Ready once it accepts connections (the API server retries what follows).
    until "${IN[@]}" python3 -c "import socket; socket.create_connection(('127.0.0.1', $etcd_port), 1)" 2>/dev/null; do
      kill -0 "$etcd_pid" 2>/dev/null || { tail -n 30 "$DIR/logs/kine.log" >&2; die "kine exited before it was ready (log: $DIR/logs/kine.log)"; }
      [ $SECONDS -lt $deadline ] || { tail -n 30 "$DIR/logs/kine.log" >&2; die "kine not listening after 30 s"; }
      sleep 0.2
    done
    datastore=(--etcd-servers "http://127.0.0.1:$etcd_port")
    datastore_name=kine-$KINE_VERSION-sqlite
  else
  "${IN[@]}" "$BIN_DIR/etcd" --name testbed --data-dir "$DIR/etcd-data" \
    --listen-client-urls "https://127.0.0.1:$etcd_port" --advertise-client-urls "https://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "testbed=http://127.0.0.1:$etcd_peer" \
    --cert-file "$DIR/etcd.crt" --key-file "$DIR/etcd.key" --trusted-ca-file "$DIR/ca.crt" --client-cert-auth \
    --listen-metrics-urls "" --log-level warn --unsafe-no-fsync \
    >"$DIR/logs/etcd.log" 2>&1 &
  local etcd_pid=$!
  echo "$etcd_pid" >>"$DIR/pids"
  wait_ready "https://127.0.0.1:$etcd_port/health" etcd "$etcd_pid" 30
  fi

  # Control-plane mode: loopback only, and no `kubernetes` endpoints (127.0.0.1
  # is not a valid endpoint). Node mode: the API server is reached at NODE_IP,
  # by pods through the `kubernetes` Service, whose endpoints it maintains.
  local api_net=(--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --endpoint-reconciler-type none)
  # (The kubelet is reached at its InternalIP: no name resolves here.)
  [ -z "$node" ] || api_net=(--bind-address 0.0.0.0 --advertise-address "$NODE_IP" --endpoint-reconciler-type lease
    --kubelet-preferred-address-types InternalIP)
  # Every request, its user, verb and resource, once answered (the
  # benchmarks' account of what each client costs the API server).
  local audit_args=()
  if [ -n "$audit" ]; then
    printf '%s\n' "apiVersion: audit.k8s.io/v1" "kind: Policy" \
      "omitStages: [RequestReceived, ResponseStarted]" "rules:" "  - level: Metadata" \
      >"$DIR/audit-policy.yaml"
    audit_args=(--audit-policy-file "$DIR/audit-policy.yaml" --audit-log-path "$DIR/logs/audit.log"
      --audit-log-format json --audit-log-mode blocking)
  fi
  # The command line is kept, so that `restart-apiserver` can run the same
  # server again (the tests of watches broken by a restart).
  local api_cmd=("$BIN_DIR/kube-apiserver" \
    "${api_net[@]}" "${audit_args[@]}" --secure-port "$api_port" \
    "${datastore[@]}" \
    --tls-cert-file "$DIR/server.crt" --tls-private-key-file "$DIR/server.key" \
    --client-ca-file "$DIR/ca.crt" \
    --kubelet-client-certificate "$DIR/admin.crt" --kubelet-client-key "$DIR/admin.key" \
    --kubelet-certificate-authority "$DIR/ca.crt" \
    --authorization-mode Node,RBAC \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$DIR/sa.pub" --service-account-signing-key-file "$DIR/sa.key" \
    --api-audiences https://kubernetes.default.svc \
    --service-cluster-ip-range "$SERVICE_RANGE" \
    --enable-priority-and-fairness=false \
    --profiling=false)
  printf '%q ' "${api_cmd[@]}" >"$DIR/apiserver.cmd"
  "${IN[@]}" "${api_cmd[@]}" >"$DIR/logs/kube-apiserver.log" 2>&1 &
  local api_pid=$!
  echo "$api_pid" >>"$DIR/pids"
  echo "$api_pid" >"$DIR/apiserver.pid"
  local url="https://$host:$api_port"
  write_kubeconfig "$DIR/admin.kubeconfig" "$url"

  wait_ready "$url/readyz" kube-apiserver "$api_pid" 90

  # The controller manager starts once the API server is ready; with the
  # HorizontalPodAutoscaler's controller (tests/crds.rs scales a NexoProxy)
  # and the disruption controller (tests/chart_disruption.rs evicts a pod
  # under the chart's PodDisruptionBudget).
  local controllers=garbage-collector-controller,namespace-controller,serviceaccount-controller,serviceaccount-token-controller,deployment-controller,replicaset-controller,horizontal-pod-autoscaler-controller,disruption-controller
  [ -z "$node" ] || controllers=$controllers,endpointslice-controller,endpointslice-mirroring-controller,endpoints-controller,pod-garbage-collector-controller,node-lifecycle-controller,root-ca-certificate-publisher-controller
  "${IN[@]}" "$BIN_DIR/kube-controller-manager" \
    --kubeconfig "$DIR/admin.kubeconfig" --authentication-kubeconfig "$DIR/admin.kubeconfig" \
    --authorization-kubeconfig "$DIR/admin.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$kcm_port" \
    --tls-cert-file "$DIR/server.crt" --tls-private-key-file "$DIR/server.key" \
    --controllers "$controllers" \
    --service-account-private-key-file "$DIR/sa.key" --root-ca-file "$DIR/ca.crt" \
    --leader-elect=false --use-service-account-credentials=false \
    --profiling=false \
    >"$DIR/logs/kube-controller-manager.log" 2>&1 &
  local kcm_pid=$!
  echo "$kcm_pid" >>"$DIR/pids"

  wait_ready "https://127.0.0.1:$kcm_port/healthz" kube-controller-manager "$kcm_pid" 60

  local node_env=
  if [ -n "$node" ]; then
    "${IN[@]}" "$NODE_BIN_DIR/kube-scheduler" \
      --kubeconfig "$DIR/admin.kubeconfig" --authentication-kubeconfig "$DIR/admin.kubeconfig" \
      --authorization-kubeconfig "$DIR/admin.kubeconfig" \
      --bind-address 127.0.0.1 --secure-port "$sched_port" --leader-elect=false --profiling=false \
      >"$DIR/logs/kube-scheduler.log" 2>&1 &
    local sched_pid=$!
    echo "$sched_pid" >>"$DIR/pids"
    node_config "$url"
    # nsenter, not `ip netns exec`: that one mounts a new /sys, without the
    # cgroup hierarchies the kubelet and runc need.
    nsenter --net="/run/netns/$netns" unshare --pid --fork --kill-child --mount --propagation private --mount-proc \
      bash "$HERE/node.sh" "$DIR" >"$DIR/logs/node.log" 2>&1 &
    local node_pid=$!
    echo "$node_pid" >>"$DIR/pids"
    wait_node_ready "$node_pid" 120
    node_env="NETNS=$netns
NODE_NAME=$NODE_NAME
NODE_IP=$NODE_IP
NODE_PID=$node_pid
SCHEDULER_PID=$sched_pid
CONTAINERD_ADDRESS=$DIR/containerd/containerd.sock"
  fi
  trap - EXIT

  cat >"$DIR/env" <<ENV
APISERVER_URL=$url
KUBECONFIG=$DIR/admin.kubeconfig
ETCD_PORT=$etcd_port
ETCD_PID=$etcd_pid
APISERVER_PID=$api_pid
CONTROLLER_MANAGER_PID=$kcm_pid
KUBECTL=$BIN_DIR/kubectl
HELM=$HELM_BIN_DIR/helm
HELM3=$HELM3_BIN_DIR/helm
REGISTRY=$REGISTRY_BIN_DIR/registry
HELM_DOCS=$HELM_DOCS_BIN_DIR/helm-docs
MONITORING_CRDS=$MONITORING_CRDS_DIR
PROMTOOL=$PROMTOOL_BIN_DIR/promtool
COSIGN=$COSIGN_BIN_DIR/cosign
K8S_VERSION=$K8S_VERSION
DATASTORE=$datastore_name
$node_env
ENV

  if [ -n "$watch_pid" ]; then
    # The reaper: stops everything once the process that asked for the test bed
    # is gone, however it ended (failure, panic, Ctrl-C, kill).
    (
      trap '' INT HUP
      exec </dev/null >/dev/null 2>&1
      while kill -0 "$watch_pid" 2>/dev/null && [ -f "$DIR/pids" ]; do sleep 1; done
      cmd_stop "$DIR"
    ) &
    echo "$!" >"$DIR/reaper.pid"
    disown || true
  fi
  if [ -n "$node" ]; then
    log "kube-apiserver $K8S_VERSION and node $NODE_NAME ready at $url in network namespace $netns in $((SECONDS - started)) s (data: $DIR)"
  else
    log "kube-apiserver $K8S_VERSION${kine:+ on kine $KINE_VERSION (SQLite)} ready at $url in $((SECONDS - started)) s (data: $DIR)"
  fi
}

# ----------------------------------------------------------------- stop --

cmd_stop() {
  local dir=${1:?usage: testbed.sh stop DIR}
  # Nothing there: nothing to do (tests/run.sh's trap may stop twice).
  [ -d "$dir" ] || return 0
  # Only a directory that `start` created, nothing killed or deleted otherwise.
  if ! [ -f "$dir/$MARKER" ] || [ -L "$dir/$MARKER" ]; then
    if [ -f "$dir/pids" ] || [ -f "$dir/env" ]; then
      log "$dir looks like a test bed that an older testbed.sh started, without the marker:"
      log "stop the processes listed in $dir/pids and remove $dir by hand"
    fi
    die "refusing to stop $dir: it has no $MARKER, so testbed.sh start did not create it (nothing stopped, nothing deleted)"
  fi
  # The node's containers, while containerd still answers: their cgroups
  # (containerd's /k8s.io/<id>) are removed once everything has stopped.
  local containers=
  if [ -S "$dir/containerd/containerd.sock" ]; then
    containers=$(timeout 5 ctr --address "$dir/containerd/containerd.sock" -n k8s.io containers ls -q 2>/dev/null || true)
  fi
  if [ -f "$dir/pids" ]; then
    local pids
    pids=$(tac "$dir/pids")
    rm -f "$dir/pids"
    for pid in $pids; do kill -TERM "$pid" 2>/dev/null || true; done
    for _ in $(seq 1 50); do
      local alive=
      for pid in $pids; do kill -0 "$pid" 2>/dev/null && alive=1; done
      [ -z "$alive" ] && break
      sleep 0.1
    done
    for pid in $pids; do kill -KILL "$pid" 2>/dev/null || true; done
  fi
  if [ -f "$dir/netns" ]; then
    local netns
    netns=$(cat "$dir/netns")
    # Whatever still runs in the namespace (a test's own processes).
    local left
    left=$(ip netns pids "$netns" 2>/dev/null || true)
    [ -z "$left" ] || kill -KILL $left 2>/dev/null || true
    ip netns del "$netns" 2>/dev/null || true
  fi
  local id cg
  for id in $containers; do
    for cg in /sys/fs/cgroup/*/k8s.io/"$id"; do
      [ -d "$cg" ] || continue
      # The kernel takes a moment to release a cgroup whose last process died.
      for _ in 1 2 3 4 5; do rmdir "$cg" 2>/dev/null && break; sleep 0.2; done
    done
  done
  [ -z "$containers" ] || rmdir /sys/fs/cgroup/*/k8s.io 2>/dev/null || true
  # Any mount left under DIR (none is expected: the node's live in its own
  # mount namespace) is taken off before DIR goes.
  local m
  for m in $(awk -v d="$dir/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  # The marker goes last: a removal cut short (a mount still busy) leaves a
  # DIR that the next `stop` still recognises and can finish. A concurrent
  # stop (the reaper's) is harmless: rm -f takes what is already gone.
  local entry
  for entry in "$dir"/* "$dir"/.[!.]* "$dir"/..?*; do
    [ "$entry" = "$dir/$MARKER" ] || rm -rf -- "$entry"
  done
  rm -f -- "$dir/$MARKER"
  rmdir -- "$dir" 2>/dev/null || [ ! -e "$dir" ] || die "cannot remove $dir"
}

# ---------------------------------------------------------- restart --

# Stops the API server (SIGTERM, as a rolling restart of a control plane
# does) and starts it again on the same port with the same flags: what a
# watch sees when its API server restarts. Control-plane test beds only.
cmd_restart_apiserver() {
  local dir=${1:?usage: testbed.sh restart-apiserver DIR [DOWN_SECONDS]} down=${2:-0}
  [ -f "$dir/$MARKER" ] && [ -f "$dir/apiserver.cmd" ] || die "$dir is not a test bed started by this testbed.sh"
  DIR=$(cd "$dir" && pwd)
  [ ! -s "$DIR/netns" ] || die "restart-apiserver is for control-plane test beds (no --node)"
  IN=()
  local old url pid
  old=$(cat "$DIR/apiserver.pid")
  kill -TERM "$old" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$old" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$old" 2>/dev/null || true
  sleep "$down"
  # exec: the recorded pid is the server itself, not a subshell around it.
  eval "exec $(cat "$DIR/apiserver.cmd")" >>"$DIR/logs/kube-apiserver.log" 2>&1 &
  pid=$!
  echo "$pid" >>"$DIR/pids"
  echo "$pid" >"$DIR/apiserver.pid"
  url=$(sed -n 's/^APISERVER_URL=//p' "$DIR/env")
  wait_ready "$url/readyz" kube-apiserver "$pid" 90
  log "kube-apiserver restarted at $url"
}

# ---------------------------------------------------------------- token --

cmd_user() {
  local dir=${1:?usage: testbed.sh user DIR NAME} name=${2:?usage: testbed.sh user DIR NAME}
  [ -f "$dir/$MARKER" ] || die "$dir is not a test bed"
  DIR=$(cd "$dir" && pwd)
  sign_cert "$DIR" "user-$name" "/O=system:masters/CN=$name"
  local url
  url=$(sed -n 's/^APISERVER_URL=//p' "$DIR/env")
  write_kubeconfig "$DIR/$name.kubeconfig" "$url" "user-$name"
  echo "$DIR/$name.kubeconfig"
}

cmd_token() {
  local dir=${1:?usage: testbed.sh token DIR NAMESPACE SERVICEACCOUNT} ns=${2:?} sa=${3:?}
  # shellcheck disable=SC1091
  . "$dir/env"
  "$KUBECTL" --kubeconfig "$KUBECONFIG" -n "$ns" create token "$sa" --duration 1h
}

cmd_import() {
  local dir=${1:?usage: testbed.sh import DIR ARCHIVE} archive=${2:?usage: testbed.sh import DIR ARCHIVE}
  [ -S "$dir/containerd/containerd.sock" ] || die "$dir has no node (start it with --node)"
  local ctr=(ctr --address "$dir/containerd/containerd.sock" -n k8s.io) out name digest
  out=$("${ctr[@]}" images import "$archive") || die "cannot import $archive: $out"
  # `unpacking NAME:TAG (sha256:...)...done`. The CRI finds `REPO@DIGEST`
  # references by an image record of that name, which a pull would create
  # and an import does not: it is added here.
  while read -r _ name digest _; do
    digest=${digest#(}; digest=${digest%%)*}
    [[ $digest == sha256:* ]] || continue
    "${ctr[@]}" images tag --force "$name" "${name%:*}@$digest" >/dev/null
    log "imported $name as ${name%:*}@$digest"
  done < <(printf '%s\n' "$out" | grep '^unpacking ')
}

# ------------------------------------------------------------ leftovers --

# The processes whose command line names one of the DIRs (DIR itself or a
# path under it), as `PID COMMAND LINE`. Every process of a test bed does:
# etcd (--data-dir DIR/etcd-data), the API server (its certificates), the
# controller manager and the scheduler (--kubeconfig DIR/admin.kubeconfig),
# the node's unshare and node.sh (DIR), containerd, the kubelet and
# kube-proxy (--config DIR/...), the reaper (start DIR PID); and no process
# of a test bed in another DIR does, however it was started.
processes_of() { # dir...
  [ $# -gt 0 ] || return 0
  local p args arg d line
  for p in /proc/[0-9]*; do
    # Gone since the glob, a kernel thread (empty), or not ours to read.
    mapfile -d '' -t args 2>/dev/null <"$p/cmdline" || continue
    for arg in ${args[@]+"${args[@]}"}; do
      for d in "$@"; do
        case $arg in
          "$d" | "$d"/* | *="$d" | *="$d"/*)
            line="${args[*]}"
            echo "${p#/proc/} ${line:0:240}"
            continue 3 ;;
        esac
      done
    done
  done
}

# Those of the network namespaces NAME... that exist.
netns_left() { # name...
  [ $# -gt 0 ] || return 0
  local have n
  have=$(ip netns list 2>/dev/null | awk '{print $1}' || true)
  for n in "$@"; do
    if printf '%s\n' "$have" | grep -qxF -- "$n"; then echo "$n"; fi
  done
}

# What is left of the test beds listed in RECORD (see NEXO_TESTBED_RECORD):
# processes and network namespaces of those test beds only, not of one that
# someone started by hand, or that another run started, in another DIR.
cmd_leftovers() {
  local record=${1:?usage: testbed.sh leftovers RECORD}
  [ -f "$record" ] || die "no record $record"
  local dirs=() names=() ns d
  while read -r ns d; do
    [ -n "$d" ] || continue
    dirs+=("$d")
    [ "$ns" = - ] || names+=("$ns")
  done <"$record"
  # A test bed's reaper notices its stop within a second and then ends: a
  # short grace, so that what is reported is what stays.
  local procs netns line deadline=$((SECONDS + 10))
  while :; do
    procs=$(processes_of ${dirs[@]+"${dirs[@]}"})
    netns=$(netns_left ${names[@]+"${names[@]}"})
    if [ -z "$procs$netns" ] || [ $SECONDS -ge $deadline ]; then break; fi
    sleep 0.5
  done
  if [ -n "$procs" ]; then
    log "processes of the test beds in $record still running:"
    while IFS= read -r line; do echo "  $line"; done <<<"$procs" >&2
  fi
  [ -z "$netns" ] || log "network namespaces of the test beds in $record left: ${netns//$'\n'/ }"
  [ -z "$procs$netns" ] || exit 1
  log "no process or network namespace left of the ${#dirs[@]} test bed(s) in $record"
}

case "${1:-}" in
  build) shift; cmd_build "$@" ;;
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  restart-apiserver) shift; cmd_restart_apiserver "$@" ;;
  token) shift; cmd_token "$@" ;;
  user) shift; cmd_user "$@" ;;
  import) shift; cmd_import "$@" ;;
  bin) case ${2:-} in
         --node) echo "$NODE_BIN_DIR" ;;
         --helm) echo "$HELM_BIN_DIR" ;;
         --helm3) echo "$HELM3_BIN_DIR" ;;
         --registry) echo "$REGISTRY_BIN_DIR" ;;
         --helm-docs) echo "$HELM_DOCS_BIN_DIR" ;;
         --monitoring-crds) echo "$MONITORING_CRDS_DIR" ;;
         --promtool) echo "$PROMTOOL_BIN_DIR" ;;
         --cosign) echo "$COSIGN_BIN_DIR" ;;
         --peer) echo "$PEER_DIR" ;;
         --kine) echo "$KINE_BIN_DIR" ;;
         --versions) echo "$SUPPORTED_K8S_VERSIONS" ;;
         *) echo "$BIN_DIR" ;;
       esac ;;
  leftovers) shift; cmd_leftovers "$@" ;;
  # The usage: the comment at the top of this file.
  *) sed -n '2,/^set -euo pipefail$/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
