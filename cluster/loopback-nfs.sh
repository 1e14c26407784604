#!/usr/bin/env bash
# A network file system on this machine alone, to measure the runtime's shared storage where no NFS server or
# kernel NFS client is at hand (docs/deploying.md: measuring your storage). A measuring aid only, never a place
# for souls: an NFS server in user space (nfs-ganesha, VFS backend) exports MOUNTPOINT.export, and fuse-nfs
# (libnfs) mounts it at MOUNTPOINT through FUSE, so every read, write, fsync, open and stat of a file there is
# an NFSv3 RPC over TCP. Server, rpcbind and client run in a network namespace of their own whose only
# interface is loopback: nothing listens outside it. What it leaves out: network latency (loopback), the
# kernel's NFS client (fuse-nfs sends one call at a time, each write() as an RPC of its own, and caches only
# what FUSE does), and server-side locks (byte-range locks stay in this machine's kernel: right for one
# machine, says nothing about two).
#
#   cluster/loopback-nfs.sh up MOUNTPOINT      start the server and mount the export at MOUNTPOINT
#   cluster/loopback-nfs.sh down MOUNTPOINT    unmount it, stop the processes it started (by their recorded
#                                              pids) and remove the namespace
#
# Needs root, Linux with FUSE (/dev/fuse), and Debian or Ubuntu (nfs-ganesha, rpcbind and the libraries come
# from apt). NFSv3, not v4: the libnfs of Debian 12 (4.0) cannot write through an NFSv4 open it created.
# fuse-nfs is not packaged there: the script takes a `fuse-nfs` on PATH, else builds fuse/fuse-nfs.c of a
# checkout of github.com/sahlberg/fuse-nfs named by FUSE_NFS_SRC. State (ganesha.conf, pids, logs, the built
# client) is kept in MOUNTPOINT.state.
set -euo pipefail

usage() { echo "usage: $0 up|down MOUNTPOINT" >&2; exit 64; }
[[ $# -eq 2 ]] || usage
cmd=$1
mnt=$(realpath -m "$2")
state="$mnt.state"
export_dir="$mnt.export"
netns="soul-nfs-$(printf %s "$mnt" | md5sum | cut -c1-8)"

fail() { echo "$0: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || fail "run as root (the server, the namespace and the FUSE mount need it)"

install_packages() {
    if command -v ganesha.nfsd >/dev/null && command -v rpcbind >/dev/null && command -v cc >/dev/null \
        && [[ -n $(find /usr/lib /usr/lib64 -name libfsalvfs.so -print -quit 2>/dev/null) ]] \
        && pkg-config --exists libnfs fuse 2>/dev/null; then
        return
    fi
    command -v apt-get >/dev/null \
        || fail "needs nfs-ganesha with its VFS backend, rpcbind, libnfs and libfuse (2) headers, pkg-config and cc"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q nfs-ganesha nfs-ganesha-vfs rpcbind libnfs-dev \
        libfuse-dev pkg-config gcc >/dev/null
}

fuse_nfs_binary() {
    if command -v fuse-nfs >/dev/null; then command -v fuse-nfs; return; fi
    [[ -x $state/fuse-nfs ]] && { echo "$state/fuse-nfs"; return; }
    local src=${FUSE_NFS_SRC:-}
    [[ -n $src && -f $src/fuse/fuse-nfs.c ]] \
        || fail "no fuse-nfs on PATH: set FUSE_NFS_SRC to a checkout of github.com/sahlberg/fuse-nfs"
    mkdir -p "$state/fuse-nfs-build/fuse"
    cp "$src/fuse/fuse-nfs.c" "$state/fuse-nfs-build/fuse/"
    echo '#define HAVE_ST_ATIM 1' > "$state/fuse-nfs-build/config.h"  # all the source reads of its autoconf build
    # shellcheck disable=SC2046
    cc -O2 -o "$state/fuse-nfs" "$state/fuse-nfs-build/fuse/fuse-nfs.c" $(pkg-config --cflags --libs fuse libnfs) \
        -lpthread >&2
    echo "$state/fuse-nfs"
}

in_ns() { nsenter --net="/run/netns/$netns" "$@"; }

wait_port() {  # wait_port PORT: until something in the namespace listens on it (10 s)
    for _ in $(seq 1 100); do
        in_ns bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

up() {
    [[ -e /dev/fuse ]] || fail "no /dev/fuse on this machine"
    mountpoint -q "$mnt" && fail "$mnt is already a mount point"
    [[ -e /run/netns/$netns ]] && fail "namespace $netns exists: run '$0 down $mnt' first"
    # One rpcbind per machine: its socket and lock are files in /run, whatever the namespace.
    if [[ -e /run/rpcbind.lock ]] && ! flock -n /run/rpcbind.lock true; then
        fail "an rpcbind already runs on this machine"
    fi
    mkdir -p "$state/recovery" "$export_dir" "$mnt"
    install_packages
    local client
    client=$(fuse_nfs_binary)
    cat > "$state/ganesha.conf" <<EOF
NFS_CORE_PARAM {
    NFS_Port = 2049;
    MNT_Port = 20048;
    Protocols = 3;
    Enable_NLM = false;
    Enable_RQUOTA = false;
    Enable_UDP = false;
}
NFSV4 {
    Graceless = true;
    RecoveryBackend = fs;
    RecoveryRoot = "$state/recovery";
}
EXPORT {
    Export_Id = 1;
    Path = "$export_dir";
    Pseudo = /souls;
    Access_Type = RW;
    Squash = No_Root_Squash;
    SecType = sys;
    Protocols = 3;
    Transports = TCP;
    FSAL { Name = VFS; }
}
LOG { Default_Log_Level = WARN; }
EOF
    ip netns add "$netns"
    in_ns ip link set lo up
    # Each in the foreground of a background job, so the pid recorded is the daemon's own.
    nsenter --net="/run/netns/$netns" rpcbind -f </dev/null >"$state/rpcbind.log" 2>&1 &
    echo $! > "$state/rpcbind.pid"
    wait_port 111 || { down; fail "rpcbind did not start; see $state/rpcbind.log"; }
    nsenter --net="/run/netns/$netns" ganesha.nfsd -F -f "$state/ganesha.conf" -L "$state/ganesha.log" -p "$state/ganesha.pid" -N NIV_WARN \
        </dev/null >>"$state/ganesha.log" 2>&1 &
    echo $! > "$state/server.pid"
    wait_port 2049 || { down; fail "the NFS server did not start; see $state/ganesha.log"; }
    # fuse-nfs mounts, then goes to the background (it ends when the mount is unmounted).
    in_ns "$client" -n "nfs://127.0.0.1$export_dir?version=3" -m "$mnt" -a -p 0 || { down; fail "mount failed"; }
    for _ in $(seq 1 50); do mountpoint -q "$mnt" && break; sleep 0.1; done
    mountpoint -q "$mnt" || { down; fail "the FUSE mount did not appear at $mnt"; }
    grep " $mnt " /proc/self/mounts
}

stop_pid() {  # stop_pid FILE: TERM the process whose pid FILE holds, KILL it after 5 s
    [[ -f $1 ]] || return 0
    local pid
    pid=$(cat "$1")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    rm -f "$1"
}

down() {
    if mountpoint -q "$mnt"; then umount "$mnt" || umount -l "$mnt"; fi
    stop_pid "$state/server.pid"
    if [[ -f $state/rpcbind.pid ]]; then
        stop_pid "$state/rpcbind.pid"
        rm -f /run/rpcbind.sock   # ours: up refuses to start beside another rpcbind
    fi
    [[ -e /run/netns/$netns ]] && ip netns delete "$netns"
    return 0
}

case $cmd in
    up) up ;;
    down) down ;;
    *) usage ;;
esac
