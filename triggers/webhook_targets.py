"""Where a webhook may go: strict URL parsing, one canonical form for every way of writing
an address, the allow-list, and which addresses a delivery may connect to.

Pure logic, standard library only: the CLI checks ``--webhook-allow`` entries with it, the
trigger service checks a webhook's URL at creation, and delivery checks both the URL and
every address its host resolves to.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = [
    "Address",
    "AllowList",
    "Target",
    "address_refusal",
    "canonical_address",
    "parse_allow_entry",
    "parse_host",
    "parse_url",
]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
"""An IP address, IPv4 or IPv6."""

_SCHEME_PORTS = {"http": 80, "https": 443}
_ENTRY_DEFAULT_PORTS = (80, 443)  # what a bare host on the allow-list opens
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_MAX_HOSTNAME = 253

# Instance metadata and other cloud control-plane endpoints: named apart, since one of
# them (Azure's wire server) sits in public address space.
_METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, Oracle, DigitalOcean, OpenStack
        "169.254.170.2",  # AWS ECS task credentials
        "169.254.170.23",  # AWS EKS pod identity
        "fd00:ec2::254",  # AWS instance metadata over IPv6
        "fd00:ec2::23",  # AWS EKS pod identity over IPv6
        "100.100.100.200",  # Alibaba Cloud
        "168.63.129.16",  # Azure wire server
        "192.0.0.192",  # Oracle Cloud (classic)
    )
)
_PRIVATE_V4 = tuple(
    ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
)
_SHARED_V4 = ipaddress.IPv4Network("100.64.0.0/10")
_THIS_NETWORK_V4 = ipaddress.IPv4Network("0.0.0.0/8")
_UNIQUE_LOCAL_V6 = ipaddress.IPv6Network("fc00::/7")
_NAT64_V6 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))


@dataclass(frozen=True)
class Target:
    """A webhook URL, parsed and canonical.

    Attributes:
        scheme: ``http`` or ``https``.
        host: The canonical host: a lower-case name without a trailing dot, or the
            address's standard text (``127.0.0.1``, ``::1``) however the URL wrote it.
        port: The port to connect to (the scheme's default when the URL gives none).
        address: The address when the host is an IP literal in any form; None for a name.
        path: The request target: the path (``/`` when empty) and the query.
        written_host: The host as the URL wrote it (lower case).
    """

    scheme: str
    host: str
    port: int
    address: Address | None
    path: str
    written_host: str

    @property
    def hostport(self) -> str:
        """``host:port``, an IPv6 host in brackets: how the allow-list names it."""
        return f"{_bracketed(self.host)}:{self.port}"

    @property
    def authority(self) -> str:
        """The ``Host`` header: the host, and the port unless it is the scheme's default."""
        if self.port == _SCHEME_PORTS[self.scheme]:
            return _bracketed(self.host)
        return self.hostport


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def canonical_address(address: Address) -> Address:
    """``address``, with an IPv4-mapped IPv6 address (``::ffff:127.0.0.1``) as plain IPv4."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


# --- hosts ----------------------------------------------------------------------------------


def _ipv4_number(part: str) -> int | None:
    """One part of a numeric IPv4 host, by the inet_aton rules: ``0x`` hex, a leading ``0``
    octal, else decimal; None when it is not a number."""
    if part[:2] in ("0x", "0X"):
        digits, base, allowed = part[2:], 16, "0123456789abcdefABCDEF"
    elif len(part) > 1 and part[0] == "0":
        digits, base, allowed = part[1:], 8, "01234567"
    else:
        digits, base, allowed = part, 10, "0123456789"
    if not digits:
        return 0 if base == 16 else None  # "0x" alone is zero, as in the URL standard
    if any(ch not in allowed for ch in digits):
        return None
    return int(digits, base)


def _numeric_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address a host written as numbers means (``2130706433``, ``0x7f.1``,
    ``0177.0.0.1``, ``127.1``), or None when the host is a name.

    Follows the WHATWG URL standard's IPv4 parser, which matches inet_aton: one to four
    parts, the last filling the bytes the others leave. A host whose last label is a
    number but which is not a valid address is refused rather than taken as a name.

    Raises:
        ValueError: The host ends in a number but is no IPv4 address.
    """
    parts = host.split(".")
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()  # a trailing dot
    last = parts[-1]
    if not last or (not last.isdigit() and _ipv4_number(last) is None):
        return None  # a name (a last label of letters)
    numbers = [_ipv4_number(part) if part else None for part in parts]
    if len(parts) > 4 or any(n is None for n in numbers):
        raise ValueError(f"host {host!r} ends in a number but is not an IPv4 address")
    values = [n for n in numbers if n is not None]
    if any(n > 255 for n in values[:-1]) or values[-1] >= 256 ** (5 - len(values)):
        raise ValueError(f"host {host!r}: a part of the IPv4 address is out of range")
    value = values[-1]
    for i, n in enumerate(values[:-1]):
        value += n << (8 * (3 - i))
    return ipaddress.IPv4Address(value)


def parse_host(host: str, *, bracketed: bool = False) -> tuple[str, Address | None]:
    """The canonical text of a host and, when it is an IP literal, its address.

    Numeric IPv4 in any form inet_aton accepts becomes dotted decimal; IPv6 becomes its
    compressed form, an IPv4-mapped one plain IPv4; a name becomes lower case without a
    trailing dot, and must be letters, digits, ``-`` and ``_`` in dot-separated labels.

    Args:
        host: The host, without brackets.
        bracketed: The host was written in brackets, so it must be IPv6.

    Raises:
        ValueError: The host is empty, malformed, or an IPv6 address with a zone.
    """
    text = host.lower()
    if not text:
        raise ValueError("no host")
    if "%" in text:
        raise ValueError(f"host {host!r}: an address with a zone (%) is not accepted")
    if bracketed or ":" in text:
        try:
            address = canonical_address(ipaddress.IPv6Address(text))
        except ValueError:
            raise ValueError(f"host {host!r} is not an IPv6 address") from None
        return str(address), address
    ipv4 = _numeric_ipv4(text)
    if ipv4 is not None:
        return str(ipv4), ipv4
    name = text.removesuffix(".")
    labels = name.split(".")
    if len(name) > _MAX_HOSTNAME or not all(_LABEL.fullmatch(label) for label in labels):
        raise ValueError(f"host {host!r} is not a valid host name")
    return name, None


def _split_authority(authority: str) -> tuple[str, str | None, bool]:
    """``host[:port]`` or ``[v6]:port`` → (host, port text or None, bracketed)."""
    if authority.startswith("["):
        inside, bracket, rest = authority[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError("write an IPv6 host as [address] or [address]:port")
        return inside, (rest[1:] if rest else None), True
    if authority.count(":") > 1:
        raise ValueError("write an IPv6 host as [address] or [address]:port")
    host, colon, port = authority.partition(":")
    return host, (port if colon else None), False


def _port(text: str) -> int:
    if not text:
        raise ValueError("the port is missing after ':'")
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"the port must be a number from 1 to 65535, not {text[:12]!r}")
    return int(text)


def parse_url(url: str) -> Target:
    """A webhook URL, parsed strictly.

    http or https only; a host and nothing else in the authority (no user name or
    password); a port from 1 to 65535 if one is given; ASCII with no spaces, control
    characters or backslashes. The host is canonical (:func:`parse_host`), so
    ``http://2130706433/`` and ``http://0x7f.1/`` are both ``127.0.0.1``.

    Raises:
        ValueError: Why the URL is not acceptable.
    """
    if not url.isascii() or any(ch <= " " or ch == "\x7f" for ch in url):
        raise ValueError("must be ASCII with no spaces or control characters")
    if "\\" in url:
        raise ValueError("must not contain a backslash")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ValueError(f"not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in _SCHEME_PORTS:
        raise ValueError("the scheme must be http or https")
    if not parts.netloc:
        raise ValueError("the URL has no host")
    if "@" in parts.netloc:
        # Credentials in a URL leak into logs; use config.secret to authenticate instead.
        raise ValueError("must not carry user credentials")
    written, port_text, bracketed = _split_authority(parts.netloc)
    host, address = parse_host(written, bracketed=bracketed)
    port = _SCHEME_PORTS[scheme] if port_text is None else _port(port_text)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Target(scheme, host, port, address, path, written.lower())


# --- the allow-list -------------------------------------------------------------------------


def parse_allow_entry(entry: str) -> tuple[str, tuple[int, ...]]:
    """The canonical host and the ports one allow-list entry opens.

    ``host:port`` and ``[v6 address]:port`` open exactly that port; a bare host (or a
    bare IPv6 address, bracketed or not) opens only the default ports 80 and 443. A
    numeric host in any form is its canonical address (``0x7f.1:8080`` is
    ``127.0.0.1:8080``).

    Raises:
        ValueError: The entry is empty, its host is malformed, or its port is not a
            number from 1 to 65535.
    """
    text = entry.strip()
    try:
        if text.count(":") > 1 and not text.startswith("["):
            host, port_text, bracketed = text, None, True  # a bare IPv6 address
        else:
            host, port_text, bracketed = _split_authority(text)
        canonical, _ = parse_host(host, bracketed=bracketed)
        ports = _ENTRY_DEFAULT_PORTS if port_text is None else (_port(port_text),)
    except ValueError as exc:
        raise ValueError(f"allow-list entry {entry!r}: {exc}") from None
    return canonical, ports


@dataclass(frozen=True)
class AllowList:
    """The hosts and ports webhooks may reach, from ``--webhook-allow`` entries.

    An entry that is an IP literal also allows that exact address at delivery, even when
    it is loopback, private or link-local: the operator named it. Names match exactly
    (no wildcards); a name's resolved addresses must be public unless allowed so.
    """

    pairs: frozenset[tuple[str, int]]

    @classmethod
    def of(cls, entries: Iterable[str]) -> AllowList:
        """The allow-list of these entries.

        Raises:
            ValueError: An entry is malformed (see :func:`parse_allow_entry`).
        """
        pairs: set[tuple[str, int]] = set()
        for entry in entries:
            host, ports = parse_allow_entry(entry)
            pairs.update((host, port) for port in ports)
        return cls(frozenset(pairs))

    def allows(self, host: str, port: int) -> bool:
        """Whether ``host`` (any spelling: case, numeric forms, brackets) and ``port`` are
        on the list."""
        text = host.strip()
        bracketed = text.startswith("[") and text.endswith("]")
        try:
            canonical, _ = parse_host(text[1:-1] if bracketed else text, bracketed=bracketed)
        except ValueError:
            return False
        return (canonical, port) in self.pairs

    def allows_address(self, address: Address, port: int) -> bool:
        """Whether an entry names exactly this address and port."""
        return (str(canonical_address(address)), port) in self.pairs


# --- addresses ------------------------------------------------------------------------------


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a 6to4, NAT64 or Teredo address carries, if any."""
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]  # the client's address
    if any(address in net for net in _NAT64_V6):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


_KINDS: tuple[tuple[Callable[[Address], bool], str], ...] = (
    (lambda a: a in _METADATA, "a cloud metadata address"),
    (lambda a: a.is_unspecified or a in _THIS_NETWORK_V4, "an unspecified address"),
    (lambda a: a.is_loopback, "a loopback address"),
    (lambda a: a.is_link_local, "a link-local address"),
    (lambda a: a.is_multicast, "a multicast address"),
    (lambda a: any(a in net for net in _PRIVATE_V4), "a private address"),
    (lambda a: a in _SHARED_V4, "a shared (carrier-grade NAT) address"),
    (lambda a: a in _UNIQUE_LOCAL_V6, "a unique-local address"),
    (lambda a: isinstance(a, ipaddress.IPv6Address) and a.is_site_local, "a site-local address"),
)
"""Named kinds of address a webhook may not reach, most telling first."""


def address_refusal(address: Address) -> str | None:
    """What makes an address one a webhook must not reach unless allowed by address
    ("a loopback address", "a cloud metadata address", …), or None for a public one.

    Refused: cloud metadata endpoints, unspecified, loopback, link-local, private
    (RFC 1918), shared (RFC 6598), unique-local, site-local, multicast, and every other
    special-purpose or reserved range; an IPv6 address that carries an IPv4 one
    (mapped, 6to4, NAT64, Teredo) is judged by the IPv4 one too.
    """
    address = canonical_address(address)
    for is_kind, kind in _KINDS:
        if is_kind(address):
            return kind
    if isinstance(address, ipaddress.IPv6Address):
        inner = _embedded_ipv4(address)
        if inner is not None and (inner_kind := address_refusal(inner)) is not None:
            return f"an address carrying {inner}, {inner_kind}"
    if address.is_reserved or address.is_private or not address.is_global:
        return "a special-purpose address"
    return None
