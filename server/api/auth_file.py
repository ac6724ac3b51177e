"""The auth file: API keys as their SHA-256 (never the secret), labels and grants, in TOML.

One table per key, named by its id::

    [keys.3f9a2c1d0e4b]
    label = "team A agents"
    sha256 = "9c56…"                     # of the secret, lowercase hex
    created = 2026-05-01T12:00:00Z
    expires = 2027-01-01T00:00:00Z       # optional: refused from then on

    [keys.3f9a2c1d0e4b.grants]
    "team-a/*" = ["read", "write"]
    "shared" = ["read"]

A key is presented as ``calor_<id>_<secret>``: the id finds its entry without trying
every hash, and only the secret's digest is compared.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import tempfile
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from pathlib import Path
from typing import Any

import tomli_w

from calor.server.api.grants import Grant, Grants, permissions
from calor.server.errors import FailedPreconditionError

__all__ = [
    "TOKEN_PREFIX",
    "ApiKey",
    "KeyRing",
    "digest",
    "load",
    "new_key",
    "parse",
    "parse_expiry",
    "read",
    "save",
]

TOKEN_PREFIX = "calor_"
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")
_HEX = re.compile(r"^[0-9a-f]{64}$")
_FIELDS = frozenset({"label", "sha256", "created", "expires", "grants"})
_HEADER = (
    "# Calor API keys (`calor serve --auth-file`), managed with `calor keys`.\n"
    "# Only the SHA-256 of each secret is stored; grants: read, write, admin.\n\n"
)


def digest(secret: str) -> str:
    """The stored form of a secret: its SHA-256, hex.

    A fast hash is right here: secrets are 256 random bits made by ``new_key``, not
    passwords a person chose, so there is nothing for a slow hash to protect against.
    """
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class ApiKey:
    """One key as the file holds it: no secret, only the secret's digest."""

    id: str
    sha256: str
    grants: Grants
    label: str = ""
    created: datetime | None = None
    expires: datetime | None = None
    """From this moment on the key is refused; None: it does not expire."""

    def matches(self, secret: str) -> bool:
        """Whether ``secret`` is this key's (compared in constant time)."""
        return hmac.compare_digest(digest(secret), self.sha256)

    def expired(self, now: float) -> bool:
        """Whether the key has expired at ``now`` (seconds since the Unix epoch)."""
        return self.expires is not None and now >= self.expires.timestamp()


@dataclass(frozen=True)
class KeyRing:
    """The keys of one auth file, by id."""

    keys: Mapping[str, ApiKey] = field(default_factory=dict)

    def authenticate(self, token: str) -> ApiKey | None:
        """The key a presented ``calor_<id>_<secret>`` token is, or None."""
        if not token.startswith(TOKEN_PREFIX):
            return None
        key_id, sep, secret = token[len(TOKEN_PREFIX) :].partition("_")
        key = self.keys.get(key_id)
        if not sep or key is None:
            return None
        return key if key.matches(secret) else None

    def with_key(self, key: ApiKey) -> KeyRing:
        """These keys and one more (or one replaced)."""
        return KeyRing({**self.keys, key.id: key})

    def without(self, key_id: str) -> KeyRing:
        """These keys less one."""
        return KeyRing({k: v for k, v in self.keys.items() if k != key_id})


def new_key(
    label: str, grants: Grants, now: datetime | None = None, expires: datetime | None = None
) -> tuple[ApiKey, str]:
    """A fresh key and the token that presents it; the token is shown once, never stored.

    ``expires``, given, is when the server starts refusing it.
    """
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    created = (now or datetime.now(UTC)).replace(microsecond=0)
    key = ApiKey(key_id, digest(secret), grants, label, created, expires)
    return key, f"{TOKEN_PREFIX}{key_id}_{secret}"


def parse_expiry(text: str, now: datetime) -> datetime:
    """An expiry as ``calor keys add --expires`` takes it: an ISO 8601 date-time with its
    offset (``2027-01-01T00:00:00Z``), or a date (``2027-01-01``, midnight UTC).

    Raises:
        ValueError: It is neither, has no offset, or is not after ``now``.
    """
    try:
        moment = datetime.combine(date.fromisoformat(text), time(), UTC)
    except ValueError:
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(
                f"{text!r} is not an ISO 8601 date-time with its offset "
                "(2027-01-01T00:00:00Z) or a date (2027-01-01)"
            ) from None
        if moment.tzinfo is None:
            raise ValueError(f"{text!r} has no offset: add Z for UTC, or +HH:MM") from None
    if moment <= now:
        raise ValueError(f"{text} is not in the future (now {now.isoformat()})")
    return moment


def load(path: Path) -> KeyRing:
    """Read and check an auth file.

    Raises:
        FailedPreconditionError: The file cannot be read, is not TOML, or an entry is
            malformed (the message names the file and the entry).
    """
    return parse(read(path), f"auth file {path}")


def read(path: Path) -> bytes:
    """An auth file's content, unchecked (:func:`parse` checks it).

    Raises:
        FailedPreconditionError: The file cannot be read.
    """
    try:
        return path.read_bytes()
    except OSError as error:
        raise FailedPreconditionError(f"auth file {path}: {error.strerror or error}") from None


def parse(content: bytes, source: str) -> KeyRing:
    """Check an auth file's content; ``source`` names it in the errors.

    Raises:
        FailedPreconditionError: It is not TOML, or an entry is malformed.
    """
    try:
        data = tomllib.loads(content.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise FailedPreconditionError(f"{source}: not TOML: {error}") from None
    try:
        return _keyring(data)
    except (ValueError, TypeError) as error:
        raise FailedPreconditionError(f"{source}: {error}") from None


def _keyring(data: Mapping[str, Any]) -> KeyRing:
    unknown = set(data) - {"keys"}
    if unknown:
        raise ValueError(f"unknown top-level entries {sorted(unknown)}; only [keys.ID] tables")
    entries = data.get("keys", {})
    if not isinstance(entries, dict):
        raise ValueError("'keys' must be a table of [keys.ID] tables")
    return KeyRing({key_id: _key(key_id, entry) for key_id, entry in entries.items()})


def _key(key_id: str, entry: Any) -> ApiKey:
    where = f"[keys.{key_id}]"
    if not _ID.match(key_id):
        raise ValueError(f"{where}: an id is 1-64 letters, digits or '-'")
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be a table")
    unknown = set(entry) - _FIELDS
    if unknown:
        raise ValueError(f"{where}: unknown fields {sorted(unknown)}")
    sha = entry.get("sha256")
    if not isinstance(sha, str) or not _HEX.match(sha):
        raise ValueError(f"{where}: sha256 must be 64 lowercase hex digits")
    label = entry.get("label", "")
    created = entry.get("created")
    if not isinstance(label, str):
        raise ValueError(f"{where}: label must be a string")
    if created is not None and not (isinstance(created, datetime) and created.tzinfo):
        raise ValueError(f"{where}: created must be a date-time with its offset")
    expires = _expires(where, entry.get("expires"))
    raw = entry.get("grants")
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f'{where}: grants must be a table, e.g. "team-a/*" = ["read"]')
    grants = []
    for pattern, names in raw.items():
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"{where}: grants.{pattern!r} must be a list of permissions")
        try:
            grants.append(Grant(pattern, permissions(names)))
        except ValueError as error:
            raise ValueError(f"{where}: grants: {error}") from None
    return ApiKey(key_id, sha, Grants(tuple(grants)), label, created, expires)


def _expires(where: str, value: object) -> datetime | None:
    """An entry's ``expires``: a TOML date-time with its offset, or a date (midnight UTC)."""
    if value is None or (isinstance(value, datetime) and value.tzinfo):
        return value
    if isinstance(value, date) and not isinstance(value, datetime):
        return datetime.combine(value, time(), UTC)
    raise ValueError(
        f"{where}: expires must be an unquoted date-time with its offset "
        "(expires = 2027-01-01T00:00:00Z) or a date (expires = 2027-01-01)"
    )


def save(path: Path, keys: KeyRing) -> None:
    """Write the keys to ``path`` atomically (a temporary file renamed over it), mode 0600.

    Raises:
        OSError: The folder cannot be written.
    """
    data = {"keys": {k.id: _entry(k) for k in sorted(keys.keys.values(), key=lambda k: k.id)}}
    text = _HEADER + tomli_w.dumps(data)
    folder = path.parent
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)  # mode 0600
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _entry(key: ApiKey) -> dict[str, Any]:
    entry: dict[str, Any] = {"label": key.label, "sha256": key.sha256}
    if key.created is not None:
        entry["created"] = key.created
    if key.expires is not None:
        entry["expires"] = key.expires
    entry["grants"] = {g.pattern: sorted(p.value for p in g.permissions) for g in key.grants.grants}
    return entry
