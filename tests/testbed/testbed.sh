#!/usr/bin/env bash
# The test bed: a real Kubernetes control plane (etcd, kube-apiserver,
# kube-controller-manager) on 127.0.0.1, for one pinned release.
#
#   testbed.sh build              build and cache the binaries (once per version)
#   testbed.sh start DIR [PID]    start a control plane with its data in DIR (new or empty);
#                                 when PID is given, everything is stopped and DIR removed
#                                 as soon as that process is gone
#   testbed.sh stop DIR           stop what DIR's control plane started, remove DIR
#   testbed.sh token DIR NS SA    print a ServiceAccount token (TokenRequest API)
#   testbed.sh bin                print the folder holding the cached binaries
#
# The binaries come from the official Go modules through the Go module proxy:
# k8s.io/kubernetes (its staging modules replaced by their published versions)
# and go.etcd.io/etcd/server/v3. They are cached, keyed by version, in
# $NEXO_TESTBED_CACHE (default: ${XDG_CACHE_HOME:-$HOME/.cache}/nexo-testbed).
#
# After `start`, DIR holds: admin.kubeconfig, ca.crt, admin.crt/admin.key,
# env (APISERVER_URL, ETCD_PORT, ... and the process ids), logs/*.log.
set -euo pipefail

K8S_VERSION=v1.37.2
STAGING_VERSION=v0.37.2
ETCD_VERSION=v3.6.16
CACHE_ROOT=${NEXO_TESTBED_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nexo-testbed}
BIN_DIR=$CACHE_ROOT/k8s-$K8S_VERSION-etcd-$ETCD_VERSION/bin

die() { echo "testbed: $*" >&2; exit 1; }
log() { echo "testbed: $*" >&2; }

need() {
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' is required but not installed"
  done
}

# ---------------------------------------------------------------- build --

build_kubernetes() {
  local mod=$CACHE_ROOT/build-k8s-$K8S_VERSION
  mkdir -p "$mod"
  local upstream_mod
  upstream_mod=$(cd "$mod" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$K8S_VERSION" \
    | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  [ -f "$upstream_mod" ] || die "could not download k8s.io/kubernetes@$K8S_VERSION's go.mod"
  # Every staging module the upstream go.mod requires at v0.0.0 is replaced
  # by its published release.
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
  cat >"$mod/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  log "resolving k8s.io/kubernetes $K8S_VERSION dependencies"
  (cd "$mod" && go mod tidy -e >/dev/null 2>"$mod/tidy.log") || { cat "$mod/tidy.log" >&2; die "go mod tidy failed"; }
  local v=$K8S_VERSION minor
  minor=${v#v1.}; minor=${minor%%.*}
  local ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags="$ldflags -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  log "building kube-apiserver, kube-controller-manager, kubectl $K8S_VERSION (slow the first time)"
  (cd "$mod" && go build -trimpath -tags tools -ldflags "$ldflags" -o "$BIN_DIR.tmp/" \
      k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kubectl)
}

build_etcd() {
  local mod=$CACHE_ROOT/build-etcd-$ETCD_VERSION
  mkdir -p "$mod"
  cat >"$mod/go.mod" <<GOMOD
module nexo.io/testbed-etcd

go 1.26.0

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
GOMOD
  cat >"$mod/tools.go" <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
  log "resolving etcd $ETCD_VERSION dependencies"
  (cd "$mod" && go mod tidy -e >/dev/null 2>"$mod/tidy.log") || { cat "$mod/tidy.log" >&2; die "go mod tidy failed"; }
  log "building etcd $ETCD_VERSION"
  (cd "$mod" && go build -trimpath -tags tools -ldflags "-s -w" -o "$BIN_DIR.tmp/etcd" go.etcd.io/etcd/server/v3)
}

cmd_build() {
  if [ -x "$BIN_DIR/kube-apiserver" ] && [ -x "$BIN_DIR/kube-controller-manager" ] \
     && [ -x "$BIN_DIR/kubectl" ] && [ -x "$BIN_DIR/etcd" ]; then
    return 0
  fi
  need go
  local started=$SECONDS
  rm -rf "$BIN_DIR.tmp"
  mkdir -p "$BIN_DIR.tmp"
  build_etcd
  build_kubernetes
  rm -rf "$BIN_DIR"
  mv "$BIN_DIR.tmp" "$BIN_DIR"
  log "built into $BIN_DIR in $((SECONDS - started)) s"
}

# ---------------------------------------------------------------- start --

free_port() {
  # Ask the kernel for a free loopback port.
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

gen_certs() {
  local d=$1
  local o="openssl"
  $o req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=nexo-testbed-ca" \
    -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
  sign() { # name subject [san]
    local name=$1 subj=$2 san=${3:-}
    $o req -newkey rsa:2048 -nodes -subj "$subj" -keyout "$d/$name.key" -out "$d/$name.csr" 2>/dev/null
    if [ -n "$san" ]; then
      printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" >"$d/$name.ext"
    else
      printf 'extendedKeyUsage=clientAuth\n' >"$d/$name.ext"
    fi
    $o x509 -req -in "$d/$name.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
      -days 2 -extfile "$d/$name.ext" -out "$d/$name.crt" 2>/dev/null
    rm -f "$d/$name.csr" "$d/$name.ext"
  }
  sign server "/CN=kube-apiserver" "IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc"
  sign admin "/O=system:masters/CN=nexo-testbed-admin"
  sign etcd "/CN=etcd" "IP:127.0.0.1,DNS:localhost"
  $o genrsa -out "$d/sa.key" 2048 2>/dev/null
  $o rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
}

write_kubeconfig() { # file url
  # JSON is valid YAML: kubectl reads it, and so does the Manager (which has
  # no YAML parser).
  cat >"$1" <<KC
{
  "apiVersion": "v1",
  "kind": "Config",
  "clusters": [{"name": "testbed", "cluster": {"server": "$2", "certificate-authority": "$DIR/ca.crt"}}],
  "users": [{"name": "admin", "user": {"client-certificate": "$DIR/admin.crt", "client-key": "$DIR/admin.key"}}],
  "contexts": [{"name": "testbed", "context": {"cluster": "testbed", "user": "admin"}}],
  "current-context": "testbed"
}
KC
}

wait_ready() { # url what pid timeout_s
  local url=$1 what=$2 pid=$3 deadline=$((SECONDS + $4))
  while [ $SECONDS -lt $deadline ]; do
    kill -0 "$pid" 2>/dev/null || { tail -n 30 "$DIR/logs/$what.log" >&2; die "$what exited before it was ready (log: $DIR/logs/$what.log)"; }
    if curl -fsS --max-time 2 --cacert "$DIR/ca.crt" --cert "$DIR/admin.crt" --key "$DIR/admin.key" \
         "$url" >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.2
  done
  tail -n 30 "$DIR/logs/$what.log" >&2
  die "$what not ready after $4 s (log: $DIR/logs/$what.log)"
}

cmd_start() {
  DIR=${1:?usage: testbed.sh start DIR [PID]}
  local watch_pid=${2:-}
  need curl openssl python3
  cmd_build
  mkdir -p "$DIR"
  DIR=$(cd "$DIR" && pwd)
  [ -z "$(ls -A "$DIR")" ] || die "$DIR is not empty"
  mkdir -p "$DIR/logs" "$DIR/etcd-data"
  local started=$SECONDS
  gen_certs "$DIR"
  local etcd_port etcd_peer api_port kcm_port
  etcd_port=$(free_port); etcd_peer=$(free_port); api_port=$(free_port); kcm_port=$(free_port)
  : >"$DIR/pids"

  "$BIN_DIR/etcd" --name testbed --data-dir "$DIR/etcd-data" \
    --listen-client-urls "https://127.0.0.1:$etcd_port" --advertise-client-urls "https://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "testbed=http://127.0.0.1:$etcd_peer" \
    --cert-file "$DIR/etcd.crt" --key-file "$DIR/etcd.key" --trusted-ca-file "$DIR/ca.crt" --client-cert-auth \
    --listen-metrics-urls "" --log-level warn --unsafe-no-fsync \
    >"$DIR/logs/etcd.log" 2>&1 &
  local etcd_pid=$!
  echo "$etcd_pid" >>"$DIR/pids"
  # From here on, a failure stops what was started.
  trap 'cmd_stop "$DIR" >/dev/null 2>&1 || true' EXIT
  wait_ready "https://127.0.0.1:$etcd_port/health" etcd "$etcd_pid" 30

  "$BIN_DIR/kube-apiserver" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
    --etcd-servers "https://127.0.0.1:$etcd_port" --etcd-cafile "$DIR/ca.crt" \
    --etcd-certfile "$DIR/admin.crt" --etcd-keyfile "$DIR/admin.key" \
    --tls-cert-file "$DIR/server.crt" --tls-private-key-file "$DIR/server.key" \
    --client-ca-file "$DIR/ca.crt" \
    --authorization-mode Node,RBAC \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$DIR/sa.pub" --service-account-signing-key-file "$DIR/sa.key" \
    --api-audiences https://kubernetes.default.svc \
    --service-cluster-ip-range 10.96.0.0/16 \
    --endpoint-reconciler-type none \
    --enable-priority-and-fairness=false \
    --profiling=false \
    >"$DIR/logs/kube-apiserver.log" 2>&1 &
  local api_pid=$!
  echo "$api_pid" >>"$DIR/pids"
  local url="https://127.0.0.1:$api_port"
  write_kubeconfig "$DIR/admin.kubeconfig" "$url"

  wait_ready "$url/readyz" kube-apiserver "$api_pid" 90

  # The controller manager starts once the API server is ready.
  "$BIN_DIR/kube-controller-manager" \
    --kubeconfig "$DIR/admin.kubeconfig" --authentication-kubeconfig "$DIR/admin.kubeconfig" \
    --authorization-kubeconfig "$DIR/admin.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$kcm_port" \
    --tls-cert-file "$DIR/server.crt" --tls-private-key-file "$DIR/server.key" \
    --controllers garbage-collector-controller,namespace-controller,serviceaccount-controller,serviceaccount-token-controller,deployment-controller,replicaset-controller \
    --service-account-private-key-file "$DIR/sa.key" --root-ca-file "$DIR/ca.crt" \
    --leader-elect=false --use-service-account-credentials=false \
    --profiling=false \
    >"$DIR/logs/kube-controller-manager.log" 2>&1 &
  local kcm_pid=$!
  echo "$kcm_pid" >>"$DIR/pids"

  wait_ready "https://127.0.0.1:$kcm_port/healthz" kube-controller-manager "$kcm_pid" 60
  trap - EXIT

  cat >"$DIR/env" <<ENV
APISERVER_URL=$url
KUBECONFIG=$DIR/admin.kubeconfig
ETCD_PORT=$etcd_port
ETCD_PID=$etcd_pid
APISERVER_PID=$api_pid
CONTROLLER_MANAGER_PID=$kcm_pid
KUBECTL=$BIN_DIR/kubectl
K8S_VERSION=$K8S_VERSION
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
  log "kube-apiserver $K8S_VERSION ready at $url in $((SECONDS - started)) s (data: $DIR)"
}

# ----------------------------------------------------------------- stop --

cmd_stop() {
  local dir=${1:?usage: testbed.sh stop DIR}
  [ -d "$dir" ] || return 0
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
  rm -rf "$dir"
}

# ---------------------------------------------------------------- token --

cmd_token() {
  local dir=${1:?usage: testbed.sh token DIR NAMESPACE SERVICEACCOUNT} ns=${2:?} sa=${3:?}
  # shellcheck disable=SC1091
  . "$dir/env"
  "$KUBECTL" --kubeconfig "$KUBECONFIG" -n "$ns" create token "$sa" --duration 1h
}

case "${1:-}" in
  build) cmd_build ;;
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  token) shift; cmd_token "$@" ;;
  bin) echo "$BIN_DIR" ;;
  *) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
