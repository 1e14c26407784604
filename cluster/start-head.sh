#!/usr/bin/env bash
# Start the Ray head node of a soul-runtime cluster (Ray 2.60, token auth on).
#
# Environment (all optional except SOUL_DATA_DIR):
#   SOUL_STORAGE         postgresql://USER@HOST:PORT/DB: the souls' records in PostgreSQL (the cluster's
#                        storage: docs/deploying.md); SOUL_DATA_DIR is then a node-local disk holding
#                        this node's caches (password: PGPASSWORD or ~/.pgpass, not the URL)
#   SOUL_DATA_DIR        with SOUL_STORAGE: a local disk; without it, shared durable storage mounted at
#                        the same path on EVERY node (NFS, CephFS, EFS, a RWX volume...). Required.
#   RAY_PORT             GCS port                              (default 6379)
#   RAY_CLIENT_PORT      Ray Client server port (ray://)       (default 10001)
#   NUM_CPUS             CPUs Ray may schedule on this node    (default: detected)
#   SOUL_SLOTS           dedicated hot-soul actors this node admits; exported as the
#                        custom resource {"soul_slot": N}     (default 0 = none on the head)
#   NODE_IP              address other nodes/clients use        (default: first of `hostname -I`)
#   RAY_TEMP_DIR         Ray session/log dir; keep it short (Unix sockets < 108 chars)
#   RAY_AUTH_MODE        token (default) or disabled (only on a fully trusted network)
#   RAY_AUTH_TOKEN_PATH  token file (default ~/.ray/auth_token; generated if missing)
#   RAY_AUTH_TOKEN       the token itself; takes precedence over RAY_AUTH_TOKEN_PATH
#   RAY_BLOCK=1          run in the foreground (systemd, containers)
#   SOUL_HEAD_READY_TIMEOUT_S  how long to wait, once `ray start` returned, for the Ray Client server to
#                        answer a client's first call (default 60); the script returns (or, with
#                        RAY_BLOCK=1, prints "ready") only then, so a client may connect at once
#   SOUL_PYTHON          the Python with this project installed, for that check (default python3)
#   GRPC_ENABLE_FORK_SUPPORT  0 (default here; see below why Ray Client needs it)
# Extra arguments are passed to `ray start` (e.g. --autoscaling-config=...).
set -euo pipefail

RAY_PORT="${RAY_PORT:-6379}"
RAY_CLIENT_PORT="${RAY_CLIENT_PORT:-10001}"
NUM_CPUS="${NUM_CPUS:-}"
SOUL_SLOTS="${SOUL_SLOTS:-0}"
RAY_TEMP_DIR="${RAY_TEMP_DIR:-/tmp/ray}"
NODE_IP="${NODE_IP:-$(hostname -I 2>/dev/null | awk '{print $1}')}"
NODE_IP="${NODE_IP:-127.0.0.1}"
if [[ "$NODE_IP" == "127.0.0.1" ]]; then
    export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0  # else Ray 2.60 swaps a loopback node address for the routable one
fi
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
# The Ray Client proxy forks one session server per client while its gRPC threads run; with gRPC's fork
# handlers on, the child can abort before it starts (ray-project/ray#63202) and the client fails with
# "Initialization failure from server" (1 connect in 4-10 on a busy 2-core head). The child only runs a
# new program, so it needs no fork handlers. Ray's 30 s wait for a session server
# (RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S) is kept: on a busy head one takes 8-12 s to start.
export GRPC_ENABLE_FORK_SUPPORT="${GRPC_ENABLE_FORK_SUPPORT:-0}"
: "${SOUL_DATA_DIR:?set SOUL_DATA_DIR (a local disk with SOUL_STORAGE=postgresql://..., else shared storage mounted at the same path on every node)}"

(umask 077 && mkdir -p "$SOUL_DATA_DIR")  # owner-only when created here (souls' memories)
if ! touch "$SOUL_DATA_DIR/.write-test" 2>/dev/null; then
    echo "error: SOUL_DATA_DIR=$SOUL_DATA_DIR is not writable" >&2
    exit 1
fi
rm -f "$SOUL_DATA_DIR/.write-test"
fstype="$(stat -f -c %T "$SOUL_DATA_DIR" 2>/dev/null || echo unknown)"
case "${SOUL_STORAGE:-}:$fstype" in  # without PostgreSQL, a node-local filesystem is fine for one node only
    postgres*) ;;
    *:ext2/ext3|*:ext4|*:xfs|*:btrfs|*:tmpfs|*:overlayfs|*:zfs)
        echo "warning: SOUL_DATA_DIR is on a local '$fstype' filesystem; with more than one node set SOUL_STORAGE=postgresql://... (or use shared storage)" >&2 ;;
esac
export SOUL_DATA_DIR  # inherited by the raylet and so by every actor on this node
if [[ -n "${SOUL_STORAGE:-}" ]]; then export SOUL_STORAGE; fi

if [[ "$RAY_AUTH_MODE" == "token" && -z "${RAY_AUTH_TOKEN:-}" ]]; then
    export RAY_AUTH_TOKEN_PATH="${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}"
    if [[ ! -s "$RAY_AUTH_TOKEN_PATH" ]]; then
        (umask 077 && mkdir -p "$(dirname "$RAY_AUTH_TOKEN_PATH")")
        (umask 077 && python3 -c 'import secrets; print(secrets.token_hex(32), end="")' > "$RAY_AUTH_TOKEN_PATH")
        echo "generated a new cluster token in $RAY_AUTH_TOKEN_PATH (copy it to every worker and client)" >&2
    fi
fi

args=(--head --port="$RAY_PORT" --ray-client-server-port="$RAY_CLIENT_PORT"
      --node-ip-address="$NODE_IP" --temp-dir="$RAY_TEMP_DIR"
      --include-dashboard=false --disable-usage-stats)
if [[ -n "$NUM_CPUS" ]]; then args+=(--num-cpus="$NUM_CPUS"); fi
if [[ "$SOUL_SLOTS" != "0" ]]; then args+=(--resources="{\"soul_slot\": $SOUL_SLOTS}"); fi

cat <<EOF
soul-runtime head
  GCS (workers join):   $NODE_IP:$RAY_PORT
  Ray Client (clients): ray://$NODE_IP:$RAY_CLIENT_PORT
  shared data dir:      $SOUL_DATA_DIR
  auth:                 RAY_AUTH_MODE=$RAY_AUTH_MODE${RAY_AUTH_TOKEN_PATH:+ token file $RAY_AUTH_TOKEN_PATH}
Workers:  RAY_HEAD_ADDRESS=$NODE_IP:$RAY_PORT SOUL_DATA_DIR=$SOUL_DATA_DIR cluster/start-worker.sh
Clients:  RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=<copy of the token> soul ... --address ray://$NODE_IP:$RAY_CLIENT_PORT
EOF

# `ray start` returns once the GCS and the raylet run; the Ray Client server it spawned binds its port and
# answers a few seconds later (longer on a busy machine). Wait for it: a client that connects right after
# this script returned must find it.
wait_ready() {
    local rc=0
    "${SOUL_PYTHON:-python3}" -m soul_apps.cluster.local_cluster wait-ready "ray://$NODE_IP:$RAY_CLIENT_PORT" \
        --timeout "${SOUL_HEAD_READY_TIMEOUT_S:-60}" || rc=$?
    case "$rc" in
        0) return 0 ;;
        2|3) echo "error: the head runs but its Ray Client server is not usable (see ray_client_server.err in" \
                  "$RAY_TEMP_DIR/session_latest/logs)" >&2 ;;
        *) echo "error: could not check the Ray Client server: '${SOUL_PYTHON:-python3} -m soul_apps.cluster.local_cluster'" \
                "failed (exit $rc); install this project on the head (pip install .) or set SOUL_PYTHON" >&2 ;;
    esac
    return 1
}

if [[ "${RAY_BLOCK:-0}" != "1" ]]; then
    ray start "${args[@]}" "$@"
    wait_ready
    exit $?
fi

ray start "${args[@]}" --block "$@" &
ray_pid=$!
trap 'kill -TERM "$ray_pid" 2>/dev/null' TERM INT
ready=1
if ! wait_ready; then
    ready=0
    kill -TERM "$ray_pid" 2>/dev/null || true
fi
rc=0
while kill -0 "$ray_pid" 2>/dev/null; do  # `wait` returns early when a trapped signal arrives
    rc=0
    wait "$ray_pid" || rc=$?
done
if [[ "$ready" == "0" ]]; then exit 1; fi
exit "$rc"
