"""TLS to Redis: the certificate options of a ``rediss://`` or
``sentinels://`` URL, checked once.

The scheme turns TLS on; the query tunes it. Every Redis client of the
service reads the same query, so the broker (kombu) and the redis-py clients
(answers, limits, the supervisor) agree:

| query key | values | default |
|---|---|---|
| ``ssl_cert_reqs`` | ``required``, ``optional``, ``none`` | ``required`` |
| ``ssl_ca_certs`` | CA certificates (PEM), trusted besides the system's | system CAs only |
| ``ssl_certfile`` | a client certificate (PEM), for servers that verify clients | none |
| ``ssl_keyfile`` | its private key, when not in ``ssl_certfile`` | none |
| ``ssl_check_hostname`` | ``true``, ``false`` | ``true`` (off with ``none``) |

The default verifies the server against the system CAs, as redis-py does;
kombu alone would fall back to no verification at all. A value outside the
table, an unknown ``ssl_*`` key, a file that does not exist, or a TLS option
on a plain ``redis://`` URL is a :class:`~dataservice.errors.ConfigError`.
On ``sentinels://`` the options hold for the Sentinels and for the servers
they name alike (:mod:`dataservice.redis.endpoints`).
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from dataservice.errors import ConfigError

_CERT_REQS = {
    "required": ssl.CERT_REQUIRED,
    "optional": ssl.CERT_OPTIONAL,
    "none": ssl.CERT_NONE,
}
_BOOLEANS = {"true": True, "false": False}
_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
_KEYS = frozenset({"ssl_cert_reqs", "ssl_check_hostname", *_FILES})
TLS_SCHEMES = ("rediss://", "sentinels://")


@dataclass(frozen=True, slots=True)
class RedisTLS:
    cert_reqs: ssl.VerifyMode = ssl.CERT_REQUIRED
    check_hostname: bool = True
    ca_certs: str | None = None
    certfile: str | None = None
    keyfile: str | None = None

    def connection_options(self) -> dict[str, Any]:
        """redis-py's connection arguments: kombu's ``ssl`` (Celery's
        ``broker_use_ssl``) too."""
        options: dict[str, Any] = {
            "ssl_cert_reqs": self.cert_reqs,
            "ssl_check_hostname": self.check_hostname,
        }
        for name, value in (
            ("ssl_ca_certs", self.ca_certs),
            ("ssl_certfile", self.certfile),
            ("ssl_keyfile", self.keyfile),
        ):
            if value is not None:
                options[name] = value
        return options


def uses_tls(url: str) -> bool:
    return url.startswith(TLS_SCHEMES)


def redis_tls(url: str, name: str = "the Redis URL") -> RedisTLS | None:
    """The TLS options of a ``rediss://`` URL (None for a URL without TLS);
    ``name`` is what a :class:`ConfigError` calls the URL."""
    parts = urlsplit(url)
    return query_tls(parts.query, name, on=parts.scheme == "rediss")


def query_tls(query: str, name: str, *, on: bool) -> RedisTLS | None:
    """The TLS options in a URL's ``query``; ``on``: its scheme turns TLS on
    (else a TLS option is refused). Keys other than ``ssl_*`` are left to
    the caller."""
    options: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if not key.startswith("ssl_"):
            continue
        if key not in _KEYS:
            known = ", ".join(sorted(_KEYS))
            raise ConfigError(f"{name}: unknown TLS option {key!r} (known: {known})")
        if key in options:
            raise ConfigError(f"{name}: {key} is given twice")
        options[key] = value
    if not on:
        if options:
            raise ConfigError(f"{name}: TLS options ({', '.join(options)}) need a rediss:// URL")
        return None
    cert_reqs = options.get("ssl_cert_reqs", "required")
    if cert_reqs not in _CERT_REQS:
        raise ConfigError(
            f"{name}: ssl_cert_reqs must be required, optional or none, not {cert_reqs!r}"
        )
    check_hostname = options.get("ssl_check_hostname", "true").lower()
    if check_hostname not in _BOOLEANS:
        raise ConfigError(f"{name}: ssl_check_hostname must be true or false")
    for key in _FILES:
        # A missing file would otherwise surface only at connect time, where
        # the broker's connection retries hide it.
        if key in options and not _readable(options[key]):
            raise ConfigError(f"{name}: {key} {options[key]!r} is not a readable file")
    if "ssl_keyfile" in options and "ssl_certfile" not in options:
        raise ConfigError(f"{name}: ssl_keyfile needs ssl_certfile")
    return RedisTLS(
        cert_reqs=_CERT_REQS[cert_reqs],
        # Hostname checking needs a verified certificate; redis-py turns it
        # off with "none" too, so the broker does the same.
        check_hostname=_BOOLEANS[check_hostname] and cert_reqs != "none",
        ca_certs=options.get("ssl_ca_certs"),
        certfile=options.get("ssl_certfile"),
        keyfile=options.get("ssl_keyfile"),
    )


def _readable(path: str) -> bool:
    return Path(path).is_file() and os.access(path, os.R_OK)


def without_tls_options(url: str) -> str:
    """``url`` without its ``ssl_*`` query keys: kombu is given them as
    ``broker_use_ssl`` instead, since its own parsing of the query would
    replace those options and map values differently."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(k, v) for k, v in query if k not in _KEYS]
    if len(kept) == len(query):
        return url
    return urlunsplit(parts._replace(query=urlencode(kept)))
