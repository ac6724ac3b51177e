"""Debian's ``nats-server`` for cluster mode, unpacked into the virtualenv
(``make nats-server``; nothing is installed system-wide).

The package comes from Debian 13 (trixie), nats-server 2.10: Debian 12's 2.9.10 lets
two concurrent writes that name the same last sequence of a subject both through in a
clustered stream (nats-io/nats-server#4320, fixed in 2.9.21), and the leases and the
write log's fence rest on that check refusing all but one.

    python -m calor.server.cluster.nats_install .venv/bin/nats-server
"""

from __future__ import annotations

import hashlib
import io
import lzma
import platform
import sys
import tarfile
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["FIXED_VERSION", "install"]

DEBIAN = "https://deb.debian.org/debian"
SUITE = "trixie"
PACKAGE = "nats-server"
FIXED_VERSION = (2, 9, 21)
"""The first nats-server whose clustered streams check a write's expected last
sequence of its subject against the writes still being replicated too."""
_ARCHITECTURES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
_TIMEOUT = 120.0


def install(target: Path) -> str:
    """Download Debian's package, check it against the archive's index, and write its
    ``nats-server`` to ``target``; the package's version."""
    architecture = _ARCHITECTURES.get(platform.machine().lower())
    if architecture is None:
        raise RuntimeError(f"no Debian nats-server for this machine ({platform.machine()})")
    index = _fetch(f"{DEBIAN}/dists/{SUITE}/main/binary-{architecture}/Packages.xz")
    fields = _paragraph(lzma.decompress(index).decode(), PACKAGE)
    package = _fetch(f"{DEBIAN}/{fields['Filename']}")
    if hashlib.sha256(package).hexdigest() != fields["SHA256"]:
        raise RuntimeError(f"{fields['Filename']} does not match the archive's index")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(_member(package, "./usr/sbin/nats-server"))
    partial.chmod(0o755)
    partial.replace(target)
    return fields["Version"]


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=_TIMEOUT) as answer:
        return bytes(answer.read())


def _paragraph(index: str, package: str) -> dict[str, str]:
    """The fields of ``package``'s entry in a Debian ``Packages`` index."""
    for paragraph in index.split("\n\n"):
        fields = dict(_fields(paragraph))
        if fields.get("Package") == package:
            return fields
    raise RuntimeError(f"{package} is not in Debian {SUITE}'s index")


def _fields(paragraph: str) -> Iterator[tuple[str, str]]:
    for line in paragraph.splitlines():
        if line and not line[0].isspace() and ":" in line:
            name, _, value = line.partition(":")
            yield name, value.strip()


def _member(package: bytes, path: str) -> bytes:
    """The file at ``path`` in a ``.deb`` (an ``ar`` archive holding ``data.tar.*``)."""
    if not package.startswith(b"!<arch>\n"):
        raise RuntimeError("not a Debian package")
    offset = 8
    while offset + 60 <= len(package):
        header = package[offset : offset + 60]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
        body = package[offset + 60 : offset + 60 + size]
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(body)) as data:
                member = data.extractfile(path)
                if member is None:
                    break
                return member.read()
        offset += 60 + size + size % 2
    raise RuntimeError(f"{path} is not in the package")


def main(argv: Sequence[str] | None = None) -> int:
    """Install nats-server at the path given."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    version = install(Path(args[0]))
    print(f"nats-server {version} (Debian {SUITE}) at {args[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
