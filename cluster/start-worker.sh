#!/usr/bin/env bash
# Join this machine to a soul-runtime Ray cluster as a worker node (Ray 2.60).
#
# Environment:
#   RAY_HEAD_ADDRESS     head GCS address HOST:PORT. Required (or RAY_HEAD_IP + RAY_PORT).
#   SOUL_DATA_DIR        with SOUL_STORAGE=postgresql://... (as on the head): this node's local disk for
#                        its caches; without it, the SAME shared storage path as on the head. Required.
#   NUM_CPUS             CPUs Ray may schedule here             (default: detected)
#   SOUL_SLOTS           dedicated hot-soul actors this node admits: resource {"soul_slot": N}
#                        (default 40 per CPU; measured: ~100-150 idle actors saturate a 2-core node)
#   NODE_IP              this node's address                    (default: first of `hostname -I`)
#   RAY_TEMP_DIR         Ray session/log dir (short path)       (default /tmp/ray)
#   RAY_AUTH_MODE        must match the head: token (default) or disabled
#   RAY_AUTH_TOKEN_PATH  copy of the head's token               (default ~/.ray/auth_token)
#   RAY_AUTH_TOKEN       or the token itself
#   RAY_BLOCK=1          run in the foreground
# Extra arguments are passed to `ray start`.
set -euo pipefail

if [[ -z "${RAY_HEAD_ADDRESS:-}" && -n "${RAY_HEAD_IP:-}" ]]; then
    RAY_HEAD_ADDRESS="$RAY_HEAD_IP:${RAY_PORT:-6379}"
fi
: "${RAY_HEAD_ADDRESS:?set RAY_HEAD_ADDRESS=HEAD_HOST:6379}"
: "${SOUL_DATA_DIR:?set SOUL_DATA_DIR to the shared storage path used by the head}"
NUM_CPUS="${NUM_CPUS:-}"
SOUL_SLOTS="${SOUL_SLOTS:-$((40 * ${NUM_CPUS:-$(nproc)}))}"
RAY_TEMP_DIR="${RAY_TEMP_DIR:-/tmp/ray}"
NODE_IP="${NODE_IP:-$(hostname -I 2>/dev/null | awk '{print $1}')}"
NODE_IP="${NODE_IP:-127.0.0.1}"
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"

if [[ ! -d "$SOUL_DATA_DIR" ]] || ! touch "$SOUL_DATA_DIR/.write-test" 2>/dev/null; then
    echo "error: SOUL_DATA_DIR=$SOUL_DATA_DIR is not a writable directory (mount the shared storage first)" >&2
    exit 1
fi
rm -f "$SOUL_DATA_DIR/.write-test"
export SOUL_DATA_DIR
if [[ -n "${SOUL_STORAGE:-}" ]]; then export SOUL_STORAGE; fi

if [[ "$RAY_AUTH_MODE" == "token" && -z "${RAY_AUTH_TOKEN:-}" ]]; then
    export RAY_AUTH_TOKEN_PATH="${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}"
    if [[ ! -s "$RAY_AUTH_TOKEN_PATH" ]]; then
        echo "error: token auth is on but $RAY_AUTH_TOKEN_PATH is missing: copy the head's token here" >&2
        exit 1
    fi
fi

args=(--address="$RAY_HEAD_ADDRESS" --node-ip-address="$NODE_IP" --temp-dir="$RAY_TEMP_DIR"
      --disable-usage-stats)
if [[ -n "$NUM_CPUS" ]]; then args+=(--num-cpus="$NUM_CPUS"); fi
if [[ "$SOUL_SLOTS" != "0" ]]; then args+=(--resources="{\"soul_slot\": $SOUL_SLOTS}"); fi
if [[ "${RAY_BLOCK:-0}" == "1" ]]; then args+=(--block); fi

head_host="${RAY_HEAD_ADDRESS%:*}"
echo "soul-runtime worker $NODE_IP joining $RAY_HEAD_ADDRESS (soul_slot=$SOUL_SLOTS, data $SOUL_DATA_DIR)"
echo "clients connect to the head: ray://$head_host:${RAY_CLIENT_PORT:-10001}"
exec ray start "${args[@]}" "$@"
