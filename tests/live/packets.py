"""Listeners and probes for the air-gap's packet tests, in the standard library alone: the
same file runs on the host (the outside world's listeners) and in a pod of the Python
image (the in-cluster stand-ins and every probe), passed as ``python3 -c``.

``serve NAME READY [tcp|udp:[ADDRESS:]PORT]...`` answers every TCP connection and every
UDP datagram on each port (of every address, or of ADDRESS) with one line, ``NAME PORT``;
it writes READY (a file, or ``-``) once it listens.

``probe [tcp|udp:HOST:PORT]...`` tries each target at once, and prints one line per target
in the order given: ``TARGET open NAME PORT`` when the listener answered, else what was
observed: ``timeout`` (nothing came back: a packet dropped), ``refused`` (a reset, or an
ICMP port unreachable), ``unreachable`` (an ICMP host or network unreachable) or
``error <why>``."""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path

# how long a probe waits for an answer: a dropped SYN is retransmitted after 1 s, so a
# connection that will open has opened by then
PROBE_TIMEOUT = 3.0


def _tcp(name: str, address: str, port: int) -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((address, port))
    server.listen(64)

    def answer() -> None:
        while True:
            conn, _ = server.accept()
            try:
                conn.sendall(f"{name} {port}\n".encode())
            except OSError:
                pass
            finally:
                conn.close()

    threading.Thread(target=answer, daemon=True).start()


def _udp(name: str, address: str, port: int) -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind((address, port))

    def answer() -> None:
        while True:
            _, peer = server.recvfrom(512)
            server.sendto(f"{name} {port}\n".encode(), peer)

    threading.Thread(target=answer, daemon=True).start()


def serve(name: str, ready: str, targets: list[str]) -> None:
    for target in targets:
        proto, *address, port = target.split(":")
        (_tcp if proto == "tcp" else _udp)(name, address[0] if address else "0.0.0.0", int(port))
    if ready != "-":
        Path(ready).write_text("ready\n")
    print(f"{name}: serving {' '.join(targets)}", flush=True)
    threading.Event().wait()


# a DNS query (id 0xfab0, recursion desired) for the A record of a name every cluster
# resolves: what a resolver answers, where a listener of ``serve`` answers anything
DNS_QUERY = (
    b"\xfa\xb0\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    + b"".join(
        bytes([len(label)]) + label.encode()
        for label in "kubernetes.default.svc.cluster.local".split(".")
    )
    + b"\x00\x00\x01\x00\x01"
)


def _probe(target: str) -> str:
    """``tcp``: open once the connection is (a banner, if one comes at once, said after);
    ``udp``: open once a datagram answers one sent (a DNS query on port 53)."""
    proto, host, port = target.split(":")
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    sock = socket.socket(socket.AF_INET, kind)
    sock.settimeout(PROBE_TIMEOUT)
    try:
        sock.connect((host, int(port)))
        if proto == "tcp":
            sock.settimeout(0.5)
            try:
                said = sock.recv(512).decode(errors="replace").strip()
            except (TimeoutError, OSError):
                said = ""
            return f"open {said}".strip()
        sock.send(DNS_QUERY if port == "53" else b"?\n")
        said = sock.recv(512)
        return (
            "open dns"
            if said[:2] == DNS_QUERY[:2]
            else f"open {said.decode(errors='replace').strip()}"
        )
    except TimeoutError:
        return "timeout"
    except (ConnectionRefusedError, ConnectionResetError):
        return "refused"
    except OSError as failed:
        if failed.errno in (101, 113):  # ENETUNREACH, EHOSTUNREACH
            return "unreachable"
        return f"error {failed.strerror}"
    finally:
        sock.close()


def probe(targets: list[str]) -> None:
    found: dict[str, str] = {}

    def run(target: str) -> None:
        found[target] = _probe(target)

    threads = [threading.Thread(target=run, args=(target,)) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for target in targets:
        print(f"{target} {found[target]}", flush=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"] and len(argv) >= 4:
        serve(argv[1], argv[2], argv[3:])
        return 0
    if argv[:1] == ["probe"] and len(argv) >= 2:
        probe(argv[1:])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
