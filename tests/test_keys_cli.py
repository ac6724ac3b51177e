"""``calor keys add|list|revoke``: the auth file they write and what they print."""

from __future__ import annotations

import json
import stat
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from calor.client.cli import main
from calor.server.api import auth_file
from calor.server.api.grants import Permission
from calor.server.errors import FailedPreconditionError


def keys(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["keys", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_add_prints_the_key_once_and_stores_only_its_hash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "keys.toml"
    status, out, err = keys(
        capsys, "add", "--file", str(path), "--label", "team A bots",
        "--grant", "team-a/*=read,write", "--grant", "shared=read",
    )  # fmt: skip
    assert status == 0
    token = out.strip()
    assert token.startswith("calor_") and len(token.splitlines()) == 1  # stdout: the key alone
    assert "only time" in err
    secret = token.split("_", 2)[2]
    text = path.read_text()
    assert secret not in text and token not in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    [key] = auth_file.load(path).keys.values()
    assert auth_file.load(path).authenticate(token) == key
    assert key.sha256 == auth_file.digest(secret) and key.label == "team A bots"
    assert key.created is not None and key.created.tzinfo is not None
    assert key.grants.allows("team-a/notes", Permission.WRITE)
    assert key.grants.allows("shared", Permission.READ)
    assert not key.grants.allows("shared", Permission.WRITE)
    assert not key.grants.allows("team-b/notes", Permission.READ)
    assert [p.name for p in tmp_path.iterdir()] == ["keys.toml"]  # no temporary file left


def test_list_shows_ids_labels_grants_and_created_never_secrets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "keys.toml"
    _, first, _ = keys(capsys, "add", "--file", str(path), "--label", "ops", "--grant", "*=admin")
    _, second, _ = keys(capsys, "add", "--file", str(path), "--grant", "team-b/*=read")
    status, out, _ = keys(capsys, "list", "--file", str(path))
    assert status == 0
    ids = [token.strip().split("_")[1] for token in (first, second)]
    assert all(key_id in out for key_id in ids)
    assert "ops" in out and "*=admin" in out and "team-b/*=read" in out
    for token in (first, second):
        assert token.strip().split("_", 2)[2] not in out
    status, out, _ = keys(capsys, "list", "--file", str(path), "--json")
    listed = json.loads(out)
    assert sorted(entry["id"] for entry in listed) == sorted(ids)
    assert {tuple(entry["grants"]) for entry in listed} == {("*=admin",), ("team-b/*=read",)}
    fields = {"id", "label", "created", "expires", "expired", "grants"}
    assert all(set(entry) == fields for entry in listed)
    assert all(entry["expires"] is None and not entry["expired"] for entry in listed)


def test_revoke_removes_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "keys.toml"
    _, kept, _ = keys(capsys, "add", "--file", str(path), "--grant", "a=read")
    _, gone, _ = keys(capsys, "add", "--file", str(path), "--grant", "b=read")
    gone_id = gone.strip().split("_")[1]
    status, out, _ = keys(capsys, "revoke", "--file", str(path), gone_id)
    assert status == 0 and f"revoked key {gone_id}" in out and "SIGHUP" in out
    ring = auth_file.load(path)
    assert ring.authenticate(gone.strip()) is None
    assert ring.authenticate(kept.strip()) is not None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    status, _, err = keys(capsys, "revoke", "--file", str(path), gone_id)
    assert status == 1 and "no key" in err


def test_the_file_may_come_from_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALOR_AUTH_FILE", str(tmp_path / "env.toml"))
    assert keys(capsys, "add", "--grant", "x=read")[0] == 0
    assert (tmp_path / "env.toml").exists()
    monkeypatch.delenv("CALOR_AUTH_FILE")
    status, _, err = keys(capsys, "list")
    assert status == 2 and "--file" in err


@pytest.mark.parametrize(
    "grant",
    ["team-a/*", "team-a/*=", "team-a/*=fly", "team-*-a=read", "bad name=read", "=read"],
)
def test_a_malformed_grant_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], grant: str
) -> None:
    path = tmp_path / "keys.toml"
    status, _, err = keys(capsys, "add", "--file", str(path), "--grant", grant)
    assert status == 2 and "--grant" in err
    assert not path.exists()


@pytest.mark.parametrize(
    "text",
    [
        "not toml [",
        "[keys.k1]\nsha256 = 'short'\ngrants = { x = ['read'] }\n",
        "[keys.k1]\nsha256 = '" + "a" * 64 + "'\n",  # no grants
        "[keys.k1]\nsha256 = '" + "a" * 64 + "'\ngrants = { x = ['fly'] }\n",
        "[keys.k1]\nsha256 = '" + "a" * 64 + "'\ngrant = { x = ['read'] }\n",  # a typo
        "[keys.k_1]\nsha256 = '" + "a" * 64 + "'\ngrants = { x = ['read'] }\n",
        "[other]\n",
    ],
)
def test_a_malformed_file_is_refused_with_its_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(text)
    with pytest.raises(FailedPreconditionError, match="keys.toml"):
        auth_file.load(path)
    status, _, err = keys(capsys, "list", "--file", str(path))
    assert status == 1 and "keys.toml" in err


def test_a_hand_written_file_without_label_or_created_loads(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    digest = auth_file.digest("s3cret")
    path.write_text(f'[keys.ops-1]\nsha256 = "{digest}"\n[keys.ops-1.grants]\n"*" = ["read"]\n')
    ring = auth_file.load(path)
    assert ring.authenticate("calor_ops-1_s3cret") is ring.keys["ops-1"]
    assert ring.authenticate("calor_ops-1_wrong") is None
    assert ring.authenticate("calor_ops-2_s3cret") is None


# --- expiry -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("2999-01-01T00:00:00Z", datetime(2999, 1, 1, tzinfo=UTC)),
        (
            "2999-01-01T09:30:00+02:00",
            datetime(2999, 1, 1, 9, 30, tzinfo=timezone(timedelta(hours=2))),
        ),
        ("2999-06-30", datetime(2999, 6, 30, tzinfo=UTC)),  # a date: midnight UTC
    ],
)
def test_add_with_expires_writes_it_and_list_shows_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], given: str, stored: datetime
) -> None:
    path = tmp_path / "keys.toml"
    status, token, err = keys(
        capsys, "add", "--file", str(path), "--grant", "a=read", "--expires", given
    )
    assert status == 0 and f"expires {stored.isoformat()}" in err
    [key] = auth_file.load(path).keys.values()
    assert key.expires == stored and key.expires.utcoffset() == stored.utcoffset()
    assert "expires = " in path.read_text()
    assert auth_file.load(path).authenticate(token.strip()) == key

    status, out, _ = keys(capsys, "list", "--file", str(path))
    header, row = out.splitlines()
    assert header.split() == ["ID", "LABEL", "CREATED", "EXPIRES", "GRANTS"]
    assert stored.isoformat() in row and "expired" not in row
    _, out, _ = keys(capsys, "list", "--file", str(path), "--json")
    [entry] = json.loads(out)
    assert (entry["expires"], entry["expired"]) == (stored.isoformat(), False)


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ("2020-01-01T00:00:00Z", "is not in the future"),
        ("2020-01-01", "is not in the future"),
        ("2999-01-01T00:00:00", "has no offset"),
        ("next tuesday", "not an ISO 8601 date-time"),
        ("2999-13-01T00:00:00Z", "not an ISO 8601 date-time"),
    ],
)
def test_a_past_or_malformed_expiry_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], given: str, reason: str
) -> None:
    path = tmp_path / "keys.toml"
    status, _, err = keys(
        capsys, "add", "--file", str(path), "--grant", "a=read", "--expires", given
    )
    assert status == 2 and "--expires" in err and reason in err
    assert not path.exists()


def test_a_hand_written_expiry_loads_and_a_past_one_is_listed_as_expired(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "keys.toml"
    digest = auth_file.digest("s3cret")
    entries = {
        "old": "2020-01-01T00:00:00Z",
        "dated": "2999-01-01",
        "later": "2999-01-01T12:00:00Z",
    }
    path.write_text(
        "".join(
            f'[keys.{key_id}]\nsha256 = "{digest}"\nexpires = {when}\n'
            f'[keys.{key_id}.grants]\n"*" = ["read"]\n'
            for key_id, when in entries.items()
        )
    )
    ring = auth_file.load(path)
    assert ring.keys["old"].expires == datetime(2020, 1, 1, tzinfo=UTC)
    assert ring.keys["dated"].expires == datetime(2999, 1, 1, tzinfo=UTC)
    assert ring.keys["later"].expires == datetime(2999, 1, 1, 12, tzinfo=UTC)

    status, out, _ = keys(capsys, "list", "--file", str(path))
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert status == 0 and "2020-01-01T00:00:00+00:00 (expired)" in rows["old"]
    assert "expired" not in rows["dated"] and "expired" not in rows["later"]
    _, out, _ = keys(capsys, "list", "--file", str(path), "--json")
    assert {e["id"]: e["expired"] for e in json.loads(out)} == {
        "dated": False,
        "later": False,
        "old": True,
    }

    # `calor keys` writes the expiry back when it rewrites the file.
    assert keys(capsys, "revoke", "--file", str(path), "later")[0] == 0
    assert auth_file.load(path).keys["old"].expires == datetime(2020, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    "expires",
    ['"2999-01-01T00:00:00Z"', "2999-01-01T00:00:00", "12:00:00", "1"],  # quoted, no offset, …
)
def test_a_malformed_expiry_in_the_file_is_refused_naming_the_entry(
    tmp_path: Path, expires: str
) -> None:
    path = tmp_path / "keys.toml"
    digest = auth_file.digest("s3cret")
    path.write_text(
        f'[keys.k1]\nsha256 = "{digest}"\nexpires = {expires}\ngrants = {{ x = ["read"] }}\n'
    )
    with pytest.raises(FailedPreconditionError, match=r"keys.toml: \[keys.k1\]: expires must be"):
        auth_file.load(path)
