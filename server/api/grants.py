"""What an API key may do: channels or channel prefixes, each with read, write or admin.

A grant's pattern is a channel name (``team-a/notes``), a prefix ending in ``*``
(``team-a/*`` covers every channel whose name starts with ``team-a/``) or ``*`` alone
(every channel). ``admin`` (settings, triggers, dreams, tuning, dropping the channel)
implies ``read`` and ``write`` on the channels it covers; ``write`` does not imply
``read``. A key's grants add up: a channel is allowed what any of its patterns allow.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "EVERYTHING",
    "EVERY_CHANNEL",
    "NOTHING",
    "Grant",
    "Grants",
    "Permission",
    "parse_grant",
    "permissions",
]


class Permission(StrEnum):
    """What a call does to a channel."""

    READ = "read"
    WRITE = "write"
    ADMIN = "admin"


EVERY_CHANNEL = "*"
"""Asks, in ``Grants.allows``, for a grant that covers every channel (``*``)."""

_IMPLIED = {
    Permission.READ: frozenset({Permission.READ}),
    Permission.WRITE: frozenset({Permission.WRITE}),
    Permission.ADMIN: frozenset(Permission),
}
# A channel name (server/api/validation.py), optionally ending in '*'; or '*' alone.
_PATTERN = re.compile(r"^(?:\*|[A-Za-z0-9][A-Za-z0-9_.:@/+-]*\*?)$")
_MAX_PATTERN = 129  # a channel name is at most 128 characters


@dataclass(frozen=True)
class Grant:
    """One pattern and what it allows.

    Raises:
        ValueError: The pattern is not a channel name, a prefix ending in ``*`` or
            ``*``; or no permission is given.
    """

    pattern: str
    permissions: frozenset[Permission]

    def __post_init__(self) -> None:
        if len(self.pattern) > _MAX_PATTERN or not _PATTERN.match(self.pattern):
            raise ValueError(
                f"{self.pattern[:40]!r} is not a channel, a prefix ending in '*', or '*'"
            )
        if not self.permissions:
            raise ValueError(f"{self.pattern}: no permission given (read, write, admin)")

    def covers(self, channel: str) -> bool:
        """Whether the pattern names this channel (``*`` names ``EVERY_CHANNEL`` too)."""
        if self.pattern.endswith("*"):
            return channel.startswith(self.pattern[:-1])
        return channel == self.pattern

    def allows(self, permission: Permission) -> bool:
        """Whether the grant gives this permission (admin gives all three)."""
        return any(permission in _IMPLIED[p] for p in self.permissions)


@dataclass(frozen=True)
class Grants:
    """Every grant of one key; ``unrestricted`` (an open server) allows everything."""

    grants: tuple[Grant, ...] = ()
    unrestricted: bool = False

    def allows(self, channel: str, permission: Permission) -> bool:
        """Whether a call may do ``permission`` to ``channel``; ``EVERY_CHANNEL`` asks
        for a grant over all channels (server-wide operations)."""
        if self.unrestricted:
            return True
        if channel == EVERY_CHANNEL:
            return any(g.pattern == EVERY_CHANNEL and g.allows(permission) for g in self.grants)
        return any(g.covers(channel) and g.allows(permission) for g in self.grants)

    def predicate(self, permission: Permission) -> Callable[[str], bool]:
        """``allows`` for one permission, as a test of a channel name."""
        return lambda channel: self.allows(channel, permission)

    def describe(self) -> list[str]:
        """Each grant as ``PATTERN=perm,perm`` (the form ``parse_grant`` reads)."""
        return [
            f"{g.pattern}={','.join(p.value for p in Permission if p in g.permissions)}"
            for g in self.grants
        ]


EVERYTHING = Grants(unrestricted=True)
"""What a call may do on a server without an auth file."""
NOTHING = Grants()
"""What a call may do before access control has looked at it."""


def parse_grant(text: str) -> Grant:
    """A grant written ``PATTERN=PERM[,PERM…]``, e.g. ``team-a/*=read,write``.

    Raises:
        ValueError: The text is not of that form, or names an unknown permission.
    """
    pattern, sep, perms = text.partition("=")
    if not sep:
        raise ValueError(f"expected PATTERN=read,write,admin, got {text!r}")
    return Grant(pattern.strip(), permissions(p.strip() for p in perms.split(",") if p.strip()))


def permissions(names: Iterable[str]) -> frozenset[Permission]:
    """Permission names as a set.

    Raises:
        ValueError: A name is not read, write or admin.
    """
    found: set[Permission] = set()
    for name in names:
        try:
            found.add(Permission(name))
        except ValueError:
            raise ValueError(f"{name!r} is not a permission (read, write, admin)") from None
    return frozenset(found)
