"""How wide an egress allowlist of CIDRs may be.

A ``/0`` is the obvious wide net; the less obvious ones are a set of narrower entries that
add up to it (``0.0.0.0/1`` + ``128.0.0.0/1``, ``::/1`` + ``8000::/1``) and the IPv6
prefixes that embed the whole IPv4 space (``::ffff:0.0.0.0/96``, IPv4-mapped; NAT64's
``64:ff9b::/96``). So the check is on the union of the entries, with every embedded IPv4
range read as the IPv4 range it reaches: each contiguous block must be no wider than the
site's bound (``netpol.widestPrefix``, /8 and /32 by default).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from ipaddress import IPv4Network, IPv6Network

# IPv6 prefixes whose last 32 bits are an IPv4 address a packet ends up reaching
EMBEDDED_IPV4 = (
    IPv6Network("::ffff:0:0/96"),  # IPv4-mapped (RFC 4291)
    IPv6Network("64:ff9b::/96"),  # NAT64 well-known prefix (RFC 6052)
)


def embedded_ipv4(network: IPv6Network) -> list[IPv4Network]:
    """The IPv4 ranges ``network`` reaches through an IPv4-embedding prefix."""
    reached = []
    for prefix in EMBEDDED_IPV4:
        if not network.overlaps(prefix):
            continue
        if network.prefixlen <= prefix.prefixlen:  # holds the whole embedded space
            reached.append(IPv4Network("0.0.0.0/0"))
        else:
            low = int(network.network_address) & 0xFFFFFFFF
            reached.append(IPv4Network((low, network.prefixlen - prefix.prefixlen)))
    return reached


def too_wide(
    cidrs: Sequence[str], widest_ipv4: int, widest_ipv6: int
) -> tuple[int | None, str] | None:
    """Why ``cidrs`` open too much, or None: the index of the entry to blame (None when
    only the entries together do) and the reason. Entries must be valid CIDRs."""
    bound = {"IPv4": widest_ipv4, "IPv6": widest_ipv6}
    v4: list[IPv4Network] = []
    v6: list[IPv6Network] = []
    for index, cidr in enumerate(cidrs):
        network = ipaddress.ip_network(cidr, strict=False)
        if isinstance(network, IPv4Network):
            reached = [network]
        else:
            v6.append(network)
            reached = embedded_ipv4(network)
            if network.prefixlen < widest_ipv6:
                return index, _wider(f"{cidr} is", "IPv6", widest_ipv6)
        for reach in reached:
            if reach.prefixlen < widest_ipv4:
                what = f"{cidr} is" if reach == network else f"{cidr} reaches {reach},"
                return index, _wider(what, "IPv4", widest_ipv4)
        v4.extend(reached)
    blocks: list[tuple[str, IPv4Network | IPv6Network]] = [
        *(("IPv4", block) for block in ipaddress.collapse_addresses(v4)),
        *(("IPv6", block) for block in ipaddress.collapse_addresses(v6)),
    ]
    for family, block in blocks:
        if block.prefixlen == 0:
            return None, f"the entries together cover the whole {family} space ({block})"
        if block.prefixlen < bound[family]:
            return None, _wider(f"the entries together open {block},", family, bound[family])
    return None


def _wider(what: str, family: str, widest: int) -> str:
    return (
        f"{what} wider than /{widest} (netpol.widestPrefix.{family.lower()}): "
        "list narrower destinations"
    )
