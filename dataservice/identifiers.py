"""Every identifier's pattern, written once.

The wire codec, the configuration schema and the callers file all check
names against these; ``docs/protocol.md`` ("Identifier rules") states them in
words, and a test keeps the two in step.
"""

from __future__ import annotations

import re

CALLER = r"[a-z0-9][a-z0-9_.-]{0,63}"
# A scope never contains ':', which separates it from the id in cache keys.
SCOPE = CALLER
# A grant in a caller's allowlist: a scope, a prefix followed by '*', or '*' alone.
SCOPE_GRANT = rf"\*|{SCOPE}\*?"
REQUEST_ID = r"[A-Za-z0-9_-]{1,64}"
# ':' is allowed: the scope, which comes first in cache keys, cannot hold one.
OBJECT_ID = r"[A-Za-z0-9._~:@/+=-]{1,128}"
IDEMPOTENCY_KEY = r"[\x21-\x7e]{1,128}"
KEY_ID = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
QUEUE = r"[a-z][a-z0-9_.-]{0,63}"
# A table of the service's own database, named in configuration (never quoted by hand).
TABLE = r"[a-z_][a-z0-9_]{0,63}"

CALLER_RE = re.compile(CALLER)
SCOPE_RE = re.compile(SCOPE)
REQUEST_ID_RE = re.compile(REQUEST_ID)
OBJECT_ID_RE = re.compile(OBJECT_ID)
IDEMPOTENCY_KEY_RE = re.compile(IDEMPOTENCY_KEY)


def anchored(pattern: str) -> str:
    """``pattern`` as a whole-string match, for schema validators that search."""
    return f"^(?:{pattern})$"
