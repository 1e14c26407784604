"""Where a set of processes accepts connections: their listening TCP sockets, read from /proc.

Linux only (``/proc/<pid>/net/tcp{,6}`` and ``/proc/<pid>/fd``); elsewhere, or for processes
of another user, the answer is empty. Used to show where a Ray head listens and, in the
tests, to check that the embedded default listens on loopback only.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass

LISTEN = "0A"  # TCP state in /proc/net/tcp


@dataclass(frozen=True)
class Listener:
    pid: int
    address: str  # "127.0.0.1", "::", "::ffff:192.0.2.2", ...
    port: int
    process: str  # the start of the command line

    @property
    def loopback(self) -> bool:
        ip = ipaddress.ip_address(self.address)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return ip.is_loopback

    @property
    def host(self) -> str:
        """The address in plain form: an IPv4-mapped IPv6 address as IPv4, '::' / '0.0.0.0' as 'every interface'."""
        ip = ipaddress.ip_address(self.address)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return "every interface" if ip.is_unspecified else str(ip)


def _address(hex_addr: str) -> tuple[str, int]:
    ip, port = hex_addr.split(":")
    raw = bytes.fromhex(ip)
    if len(raw) == 4:
        text = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:  # four host-order 32-bit words
        text = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
    return text, int(port, 16)


def _listening(pid: int) -> dict[int, tuple[str, int]]:
    """inode -> (address, port) of the listening TCP sockets in ``pid``'s network namespace."""
    out: dict[int, tuple[str, int]] = {}
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{name}") as f:
                next(f, None)
                for line in f:
                    p = line.split()
                    if len(p) > 9 and p[3] == LISTEN:
                        out[int(p[9])] = _address(p[1])
        except OSError:
            continue
    return out


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` has open."""
    inodes: set[int] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return ""


def listeners(pids: list[int] | set[int]) -> list[Listener]:
    """Every listening TCP socket held by one of ``pids``."""
    found: list[Listener] = []
    tables: dict[str, dict[int, tuple[str, int]]] = {}
    for pid in sorted(pids):
        inodes = socket_inodes(pid)
        if not inodes:
            continue
        try:
            netns = os.readlink(f"/proc/{pid}/ns/net")
        except OSError:
            netns = str(pid)
        table = tables.get(netns)
        if table is None:
            table = tables[netns] = _listening(pid)
        cmd = _cmdline(pid)
        for inode in sorted(inodes & set(table)):
            addr, port = table[inode]
            found.append(Listener(pid, addr, port, cmd))
    return found


def descendants(root: int) -> set[int]:
    """``root`` and every live process below it (by parent pid)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields and fields[0] not in ("Z", "X"):
            children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo += children.get(pid, [])
    return out


def summary(found: list[Listener]) -> str:
    """'127.0.0.1 (7 sockets)' / 'every interface (5 sockets), 192.0.2.2 (2 sockets)'."""
    counts: dict[str, int] = {}
    for item in found:
        counts[item.host] = counts.get(item.host, 0) + 1
    return ", ".join(f"{host} ({n} socket{'s' if n != 1 else ''})" for host, n in sorted(counts.items())) or "nothing"
