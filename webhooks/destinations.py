"""Where webhooks may be sent. Any API key registers endpoints, so a URL that names
an address inside the network (the database, the broker, a cloud's metadata
service) would be server-side request forgery. By default only `https` URLs whose
every address is public are allowed; BATCHGEN_WEBHOOK_ALLOWED_HOSTS names the hosts
and networks an operator trusts, which may then be any address and plain `http`.

The policy is checked when an endpoint is registered (a clear 400) and again on
every connection the sender opens (webhooks.sender), on the very address it
connects to: a name that resolves to a public address at registration and to
127.0.0.1 later (DNS rebinding) is refused at the send."""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from functools import lru_cache

import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SETTING = "BATCHGEN_WEBHOOK_ALLOWED_HOSTS"


class DestinationRefused(Exception):
    """A webhook URL or address the policy refuses; the message says why, for the
    registering client or the delivery log."""


class LookupFailed(DestinationRefused):
    """The host's name did not resolve, now: refused at registration (the client
    hears it at once), but a send tries again later, as after a refused connection:
    a resolver that is down for a minute must not fail the deliveries due then."""


# A lookup waits this long at most. getaddrinfo cannot be interrupted, so it runs on
# this small pool and the caller stops waiting: a name whose DNS never answers
# holds a pool thread until the system resolver gives up (its own timeout and
# attempts, /etc/resolv.conf), never a web thread or a sender.
LOOKUP_SECONDS = 5.0
_lookups = ThreadPoolExecutor(max_workers=4, thread_name_prefix="webhook-dns")


def _networks(reason: str, *cidrs: str) -> list[tuple[IPNetwork, str]]:
    return [(ipaddress.ip_network(cidr), reason) for cidr in cidrs]


# Named explicitly rather than left to `is_global` alone: the reason goes into the
# error, and `ipaddress`'s tables change between Python releases. The metadata
# services come first for the most telling reason; some of them are public
# addresses reachable only from inside a cloud (Azure's WireServer).
_NOT_PUBLIC: list[tuple[IPNetwork, str]] = [
    *_networks("a cloud metadata address", "169.254.169.254/32", "169.254.170.2/32",
               "fd00:ec2::254/128", "168.63.129.16/32", "100.100.100.200/32"),
    *_networks("a loopback address", "127.0.0.0/8", "::1/128"),
    *_networks("an unspecified address", "0.0.0.0/8", "::/128"),
    *_networks("a private address", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"),
    *_networks("a carrier-grade NAT address", "100.64.0.0/10"),
    *_networks("a link-local address", "169.254.0.0/16", "fe80::/10"),
    *_networks("a unique-local address", "fc00::/7", "fec0::/10"),
    *_networks("a multicast address", "224.0.0.0/4", "ff00::/8"),
    *_networks("a reserved address", "240.0.0.0/4", "192.0.0.0/24", "198.18.0.0/15",
               "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32",
               "100::/64", "2001::/23", "64:ff9b:1::/48"),
]
# IPv6 forms that carry an IPv4 address a router or NAT64 gateway may deliver to:
# IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible (::a.b.c.d), NAT64's well-known
# prefix (64:ff9b::a.b.c.d) and 6to4 (2002:aabb:ccdd::). Checked as that IPv4.
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for, if it is one of those forms."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64 or (address in _IPV4_COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def why_not_public(address: IPAddress) -> str | None:
    """Why `address` is not a public one (its range, in words), or None if it is."""
    inner = embedded_ipv4(address)
    if inner is not None:
        reason = why_not_public(inner)
        return f"{reason} ({inner}) in IPv6 form" if reason else None
    for network, reason in _NOT_PUBLIC:
        if address.version == network.version and address in network:
            return reason
    if not address.is_global:
        return "not a public address"
    return None


_HOST_NAME = re.compile(r"^(\*\.)?([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?\.)*"
                        r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")


@dataclass(frozen=True)
class AllowList:
    """The operator's trusted destinations: host names (exact, or `*.example.com`
    for its subdomains) and networks (CIDR, or one address)."""

    names: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowList:
        """From the setting's comma-separated entries; ValueError names a bad one."""
        names, suffixes, networks = set(), [], []
        for entry in (e.strip().lower().rstrip(".") for e in entries):
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
                continue
            except ValueError:
                if "/" in entry or ":" in entry or not _HOST_NAME.match(entry):
                    raise ValueError(f"{SETTING}: {entry!r} is neither a host name nor an "
                                     "address or network (e.g. 10.0.0.0/8)") from None
            if entry.startswith("*."):
                suffixes.append(entry[1:])
            else:
                names.add(entry)
        return cls(frozenset(names), tuple(suffixes), tuple(networks))

    def names_host(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        return host in self.names or any(host.endswith(s) for s in self.suffixes)

    def holds(self, address: IPAddress) -> bool:
        # An IPv4-mapped address counts as its IPv4 form: 127.0.0.1 allows ::ffff:127.0.0.1.
        forms = [address, *filter(None, [embedded_ipv4(address)])]
        return any(form.version == network.version and form in network
                   for form in forms for network in self.networks)


@lru_cache(maxsize=8)
def _parsed(entries: tuple[str, ...]) -> AllowList:
    return AllowList.parse(entries)


def allowed_destinations() -> AllowList:
    """The allow-list of the settings (parsed once per value)."""
    from django.conf import settings

    return _parsed(tuple(settings.BATCHGEN_WEBHOOK_ALLOWED_HOSTS))


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address `host` resolves to (an address literal: itself), in the
    resolver's order, within LOOKUP_SECONDS. The one place names are looked up."""
    lookup = _lookups.submit(lambda: socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
    try:
        infos = lookup.result(timeout=LOOKUP_SECONDS)
    except FutureTimeout:
        lookup.cancel()
        raise LookupFailed(f"{host} did not resolve within {LOOKUP_SECONDS:g} s") from None
    except (OSError, UnicodeError) as exc:
        raise LookupFailed(f"{host} does not resolve ({exc})") from None
    addresses = [ipaddress.ip_address(info[4][0]) for info in infos
                 if info[0] in (socket.AF_INET, socket.AF_INET6)]
    if not addresses:
        raise LookupFailed(f"{host} resolves to no IP address")
    return list(dict.fromkeys(addresses))


def check_addresses(addresses: Iterable[IPAddress], *, host: str, scheme: str,
                    allowed: AllowList) -> None:
    """Refuse unless every address may be sent to for `scheme://host`: a host the
    allow-list names, or an address in its networks, is trusted over http and
    https; anything else must be https to a public address."""
    if allowed.names_host(host):
        return
    for address in addresses:
        if allowed.holds(address):
            continue
        if scheme != "https":
            raise DestinationRefused(
                f"plain {scheme} is allowed only to the hosts and networks {SETTING} "
                f"names ({host} is {address}); use https")
        reason = why_not_public(address)
        if reason:
            named = f"{host} is" if host == str(address) else f"{host} resolves to {address},"
            raise DestinationRefused(f"{named} {reason}; webhooks go to public addresses "
                                     f"only unless {SETTING} allows it")


def check_url(url: str, *, allowed: AllowList | None = None) -> None:
    """Refuse a URL the sender would refuse: parsed as the sender parses it
    (httpx: IDNA, address literals), its host resolved and every address checked."""
    allowed = allowed_destinations() if allowed is None else allowed
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise DestinationRefused(f"not a valid URL ({exc})") from None
    host = parsed.raw_host.decode("ascii")
    if parsed.scheme not in ("http", "https") or not host:
        raise DestinationRefused("not an absolute http(s) URL")
    if parsed.scheme != "https" and not allowed.names_host(host) and not allowed.networks:
        # Said without a lookup: no network could make plain http allowed.
        raise DestinationRefused(f"plain http is allowed only to the hosts and networks "
                                 f"{SETTING} names; use https")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    addresses = [] if allowed.names_host(host) else resolve(host, port)
    check_addresses(addresses, host=host, scheme=parsed.scheme, allowed=allowed)
