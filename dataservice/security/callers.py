"""Caller keys: the secrets behind request signatures, loaded from their own file.

``DATASERVICE_CALLERS_FILE`` names a YAML file, readable by the service and
by nobody else (it is refused when other users may read it)::

    callers:
      orders:
        keys:                          # the first signs; every listed key verifies
          - id: orders-2026-12         # unique across all callers
            secret: <base64, at least 32 bytes>
          - id: orders-2026-06         # the previous key, until every caller has moved
            secret: <...>
        redis_password: <...>          # optional: the caller's Redis user (security/acl.py)
    workers:
      redis_password: <...>            # optional: the workers' Redis user

Rotation (:func:`rotate_key`, ``dataservice keys rotate``): the workers' file
is the source of every key. Rotating puts a fresh key first and keeps the
current one second; workers verify both, callers sign with the first. Restart
the workers (the file is read at start), copy the caller's entry to the
caller's own file and restart the caller; the next rotation drops the old key.
At most two keys per caller are valid at once. A :class:`Secret` never shows
its value in a repr, a log line or an error.
"""

from __future__ import annotations

import base64
import binascii
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dataservice.config.model import CallerName, Config
from dataservice.config.settings import Settings
from dataservice.errors import ConfigError
from dataservice.identifiers import KEY_ID, anchored

MIN_SECRET_BYTES = 32
MAX_KEYS_PER_CALLER = 2


@dataclass(frozen=True, slots=True)
class Secret:
    """Bytes that must not be shown: repr and str say only how long they are."""

    value: bytes = field(repr=False)

    def __repr__(self) -> str:
        return f"Secret(<{len(self.value)} bytes>)"

    __str__ = __repr__


@dataclass(frozen=True, slots=True)
class CallerKey:
    caller: str
    key_id: str
    secret: Secret


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class _KeyEntry(_Model):
    id: Annotated[str, Field(pattern=anchored(KEY_ID))]
    secret: str


class _CallerEntry(_Model):
    keys: Annotated[list[_KeyEntry], Field(min_length=1, max_length=MAX_KEYS_PER_CALLER)]
    redis_password: Annotated[str, Field(min_length=16)] | None = None


class _WorkersEntry(_Model):
    redis_password: Annotated[str, Field(min_length=16)] | None = None


class _CallersFile(_Model):
    callers: dict[CallerName, _CallerEntry]
    workers: _WorkersEntry = _WorkersEntry()


def _decode_secret(text: str, where: str) -> Secret:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{where}: secret is not base64") from None
    if len(raw) < MIN_SECRET_BYTES:
        raise ConfigError(f"{where}: secret is shorter than {MIN_SECRET_BYTES} bytes")
    return Secret(raw)


class KeyRing:
    """Every caller's keys, by key id, and each caller's signing key."""

    def __init__(
        self,
        keys: Mapping[str, CallerKey],
        signing: Mapping[str, CallerKey],
        redis_passwords: Mapping[str, Secret],
        workers_redis_password: Secret | None = None,
    ) -> None:
        self._keys = dict(keys)
        self._signing = dict(signing)
        self.redis_passwords = dict(redis_passwords)
        self.workers_redis_password = workers_redis_password

    def __repr__(self) -> str:
        return f"KeyRing(<{len(self._keys)} keys of {len(self._signing)} callers>)"

    @property
    def callers(self) -> frozenset[str]:
        return frozenset(self._signing)

    def verifying_key(self, key_id: str) -> CallerKey | None:
        return self._keys.get(key_id)

    def signing_key(self, caller: str) -> CallerKey:
        key = self._signing.get(caller)
        if key is None:
            raise ConfigError(f"the callers file holds no key for caller {caller!r}")
        return key

    @classmethod
    def parse(cls, data: Any, *, source: str) -> KeyRing:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source}: expected a mapping at the top level")
        try:
            parsed = _CallersFile.model_validate(data)
        except ValidationError as exc:
            # Never echo input: a misplaced secret would end up in the message.
            places = sorted({".".join(str(p) for p in e["loc"]) for e in exc.errors()})
            raise ConfigError(f"{source}: invalid entries: {', '.join(places)}") from None
        keys: dict[str, CallerKey] = {}
        signing: dict[str, CallerKey] = {}
        passwords: dict[str, Secret] = {}
        for caller, entry in parsed.callers.items():
            for index, item in enumerate(entry.keys):
                where = f"{source}: callers.{caller}.keys.{index}"
                if item.id in keys:
                    raise ConfigError(f"{where}: key id {item.id!r} is used twice")
                key = CallerKey(caller, item.id, _decode_secret(item.secret, where))
                keys[item.id] = key
                signing.setdefault(caller, key)
            if entry.redis_password is not None:
                passwords[caller] = Secret(entry.redis_password.encode())
        workers = parsed.workers.redis_password
        return cls(keys, signing, passwords, None if workers is None else Secret(workers.encode()))

    @classmethod
    def load(cls, path: Path) -> KeyRing:
        try:
            mode = path.stat().st_mode
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(f"{path}: other users may read it; chmod 600 it")
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            raise ConfigError(f"{path}: not valid YAML") from None
        return cls.parse(data, source=str(path))


def load_keyring(path: Path | None) -> KeyRing:
    if path is None:
        raise ConfigError("DATASERVICE_CALLERS_FILE is not set: no caller keys to sign or verify")
    return KeyRing.load(path)


def new_secret() -> str:
    """A fresh random secret, base64-encoded as the callers file holds it."""
    return base64.b64encode(secrets.token_bytes(MIN_SECRET_BYTES)).decode("ascii")


def write_callers_file(
    path: Path, callers: Mapping[str, str], *, redis_passwords: bool = True
) -> None:
    """Write a new callers file with one fresh key per caller (``caller -> key id``),
    readable only by its owner."""
    _write(path, _with_callers({"callers": {}}, callers, redis_passwords))


def add_callers(path: Path, callers: Mapping[str, str], *, redis_passwords: bool = True) -> None:
    """Add callers (``caller -> key id``, each with a fresh key) to a callers file,
    creating it if needed; entries already there are left as they are."""
    document: dict[str, Any] = {"callers": {}}
    if path.exists():
        KeyRing.load(path)  # refuses a file that is invalid or readable by others
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    _write(path, _with_callers(document, callers, redis_passwords))


def rotate_key(path: Path, caller: str, key_id: str) -> str | None:
    """Give ``caller`` a fresh signing key, first in its list, keeping the key
    it signed with until now as the second; an older one is dropped. Returns
    the id of the key dropped, if any.

    Apply it to the workers' file only, and copy the caller's entry from
    there: each call makes a new secret (see the module docstring)."""
    keyring = KeyRing.load(path)
    if keyring.verifying_key(key_id) is not None:
        raise ConfigError(f"{path}: key id {key_id!r} is already in use")
    document: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    entry = document["callers"].get(caller)
    if entry is None:
        raise ConfigError(f"{path}: no caller {caller!r}; add it first")
    kept = entry["keys"][: MAX_KEYS_PER_CALLER - 1]
    dropped = entry["keys"][MAX_KEYS_PER_CALLER - 1 :]
    entry["keys"] = [{"id": key_id, "secret": new_secret()}, *kept]
    _write(path, document)
    return dropped[0]["id"] if dropped else None


def _with_callers(
    document: dict[str, Any], callers: Mapping[str, str], redis_passwords: bool
) -> dict[str, Any]:
    for caller, key_id in callers.items():
        entry: dict[str, Any] = {"keys": [{"id": key_id, "secret": new_secret()}]}
        if redis_passwords:
            entry["redis_password"] = secrets.token_urlsafe(24)
        document["callers"].setdefault(caller, entry)
    if redis_passwords and not document.get("workers", {}).get("redis_password"):
        document["workers"] = {"redis_password": secrets.token_urlsafe(24)}
    return document


def _write(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Created private, before a secret is written into it.
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")


def ensure_callers_file(settings: Settings, config: Config) -> list[str]:
    """Give every configured caller a signing key (and Redis password) in the
    callers file, creating the file if needed; returns the callers added.
    Existing keys are kept: rotating them is an operator's decision."""
    path = settings.callers_file
    if path is None:
        return []
    existing: set[str] = set()
    if path.exists():
        existing = set(KeyRing.load(path).callers)
    missing = [caller for caller in config.callers if caller not in existing]
    if missing or not path.exists():
        add_callers(path, {caller: f"{caller}-{date.today():%Y%m%d}" for caller in missing})
    return missing
