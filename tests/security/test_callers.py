"""The callers file: what it accepts, what it refuses (without echoing a
secret), and key rotation from the command line."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from dataservice.cli import app
from dataservice.config.model import load_config
from dataservice.enums import LaneName
from dataservice.errors import ConfigError
from dataservice.proto import pb
from dataservice.security.auth import Authenticator, Rejected, sign
from dataservice.security.callers import KeyRing, write_callers_file
from tests.conftest import SHIPPED_CONFIG
from tests.harness.support import now_ms

SECRET = base64.b64encode(b"s" * 32).decode()


def _write(path: Path, document: dict[str, Any], mode: int = 0o600) -> Path:
    path.write_text(yaml.safe_dump(document))
    path.chmod(mode)
    return path


def _caller(*keys: tuple[str, str]) -> dict[str, Any]:
    return {"keys": [{"id": key_id, "secret": secret} for key_id, secret in keys]}


def test_the_first_key_signs_and_every_key_verifies(tmp_path: Path) -> None:
    other = base64.b64encode(b"o" * 32).decode()
    path = _write(
        tmp_path / "c.yml", {"callers": {"a": _caller(("a-new", SECRET), ("a-old", other))}}
    )
    keyring = KeyRing.load(path)
    assert keyring.signing_key("a").key_id == "a-new"
    assert {keyring.verifying_key(k).caller for k in ("a-new", "a-old")} == {"a"}  # type: ignore[union-attr]
    assert keyring.verifying_key("b-1") is None


@pytest.mark.parametrize(
    ("document", "complaint"),
    [
        ({"callers": {"a": _caller(("a-1", "not base64!"))}}, "not base64"),
        ({"callers": {"a": _caller(("a-1", base64.b64encode(b"short").decode()))}}, "shorter"),
        ({"callers": {"a": _caller(("k", SECRET)), "b": _caller(("k", SECRET))}}, "used twice"),
        ({"callers": {"a": _caller(("1", SECRET), ("2", SECRET), ("3", SECRET))}}, "keys"),
        ({"callers": {"a": {**_caller(("a-1", SECRET)), "extra": 1}}}, "extra"),
        ({"callers": {"Not A Name": _caller(("a-1", SECRET))}}, "callers"),
    ],
)
def test_bad_files_are_refused_without_echoing_secrets(
    tmp_path: Path, document: dict[str, Any], complaint: str
) -> None:
    path = _write(tmp_path / "c.yml", document)
    with pytest.raises(ConfigError, match=complaint) as caught:
        KeyRing.load(path)
    assert SECRET not in str(caught.value)
    assert "not base64!" not in str(caught.value)


def test_a_file_others_may_read_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.yml", {"callers": {"a": _caller(("a-1", SECRET))}}, mode=0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        KeyRing.load(path)


def test_secrets_show_only_their_length(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.yml", {"callers": {"a": _caller(("a-1", SECRET))}})
    keyring = KeyRing.load(path)
    shown = repr(keyring) + repr(keyring.signing_key("a")) + str(keyring.signing_key("a").secret)
    assert SECRET not in shown
    assert "sss" not in shown
    assert "32 bytes" in shown


def _verify(keyring: KeyRing, signer: KeyRing) -> str:
    """Whether a request signed with ``signer``'s key for "demo" passes ``keyring``."""
    envelope = pb.RequestEnvelope(
        caller="demo", request_id="r1", deadline_unix_ms=now_ms() + 1000,
        issued_at_unix_ms=now_ms(),
        read=pb.ReadRecordRequest(scope="demo", object_id="a", mode=pb.READ_MODE_PRIMARY),
    )  # fmt: skip
    body = sign(envelope.SerializeToString(), signer.signing_key("demo"))
    authenticator = Authenticator(keyring, load_config(SHIPPED_CONFIG), LaneName.INTERACTIVE)
    try:
        authenticator.open("r1", body, now_ms())
    except Rejected as rejected:
        return rejected.reason.value
    return "ok"


def test_rotation_keeps_both_keys_valid_until_the_next(tmp_path: Path) -> None:
    path = tmp_path / "callers.yml"
    runner = CliRunner()
    env = {"DATASERVICE_CALLERS_FILE": str(path), "DATASERVICE_CONFIG": str(SHIPPED_CONFIG)}
    assert runner.invoke(app, ["keys", "init"], env=env).exit_code == 0
    assert path.stat().st_mode & 0o777 == 0o600
    before = KeyRing.load(path)
    assert before.callers == {"demo", "loadtest"}

    rotated = runner.invoke(app, ["keys", "rotate", "demo", "--key-id", "demo-2"], env=env)
    assert rotated.exit_code == 0, rotated.output
    after = KeyRing.load(path)
    assert after.signing_key("demo").key_id == "demo-2"
    # Callers still signing with the old key are served while they move over.
    assert _verify(after, before) == "ok"
    assert _verify(after, after) == "ok"
    assert _verify(before, after) == "unknown_key"

    again = runner.invoke(app, ["keys", "rotate", "demo", "--key-id", "demo-3"], env=env)
    assert again.exit_code == 0
    assert _verify(KeyRing.load(path), before) == "unknown_key"
    # Nothing secret on the terminal.
    assert not any(
        form in (rotated.output + again.output)
        for form in yaml.safe_load(path.read_text())["callers"]["demo"]["keys"][0].values()
        if len(form) > 20
    )
    reused = runner.invoke(app, ["keys", "rotate", "loadtest", "--key-id", "demo-3"], env=env)
    assert reused.exit_code == 1
    assert "already in use" in reused.output


def test_a_new_callers_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "callers.yml"
    write_callers_file(path, {"a": "a-1"})
    assert path.stat().st_mode & 0o777 == 0o600
    assert KeyRing.load(path).signing_key("a").key_id == "a-1"
