"""The TCP sockets a process tree listens on beyond loopback (Linux, from ``/proc``).

``mega preprocess --ray`` without an address starts a local Ray cluster for this machine alone.
Ray binds some of its services (the GCS, the raylet, the workers' servers) to every interface
whatever node address it is given, so the cluster would accept connections from the network.
:func:`exposed_listeners` finds such sockets among the processes a driver started, so the run
can refuse the cluster (or, when the user accepts it, say which ports are open).

A socket is listed when its state is LISTEN and its local address is not a loopback one
(``127.0.0.0/8``, ``::1``); the wildcard addresses (``0.0.0.0``, ``::``) are listed. Elsewhere
than Linux nothing is found (no ``/proc``): the check is skipped, and the docs say so.
"""

from __future__ import annotations

import ipaddress
import os

#: the state column of /proc/net/tcp for a listening socket
LISTEN_STATE = "0A"


def _descendants(pid: int) -> set[int]:
    """``pid`` and every process below it, from the parent ids in ``/proc/*/stat``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stream:
                parent = int(stream.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # gone meanwhile, or unreadable
            continue
        children.setdefault(parent, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        if current not in found:
            found.add(current)
            todo.extend(children.get(current, ()))
    return found


def _socket_inodes(pids: set[int]) -> dict[int, int]:
    """socket inode -> the process holding it, for the processes ``pids``."""
    inodes = {}
    for pid in pids:
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for descriptor in descriptors:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{descriptor}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes[int(target[8:-1])] = pid
    return inodes


def _address(hex_address: str) -> str:
    """The text of an address as /proc/net/tcp{,6} writes it (hex, host byte order words)."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def _process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as stream:
            return stream.read().strip()
    except OSError:
        return "?"


def _listening_beyond_loopback() -> dict[int, str]:
    """socket inode -> ``"ADDRESS:PORT"`` of every TCP socket of this network namespace that
    listens on an address other than loopback (``/proc/net/tcp`` and ``tcp6``)."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as stream:
                rows = stream.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], int(fields[9])
            if state != LISTEN_STATE:
                continue
            host, port = local.split(":")
            address = _address(host)
            if ipaddress.ip_address(address).is_loopback:
                continue
            shown = f"[{address}]" if ":" in address else address
            found[inode] = f"{shown}:{int(port, 16)}"
    return found


def exposed_listeners(root_pid: int | None = None) -> list[str]:
    """``"ADDRESS:PORT (process name, pid)"`` of every TCP socket that ``root_pid`` (default:
    this process) or a process below it listens on, on an address other than loopback; sorted.
    Empty where there is no ``/proc``. The socket tables are read first: where nothing listens
    beyond loopback, no process is looked at."""
    if not os.path.isdir("/proc/self/fd"):
        return []
    listening = _listening_beyond_loopback()
    if not listening:
        return []
    holders = _socket_inodes(_descendants(root_pid or os.getpid()))
    return sorted(
        f"{shown} ({_process_name(pid)}, pid {pid})"
        for inode, shown in listening.items()
        if (pid := holders.get(inode)) is not None
    )
