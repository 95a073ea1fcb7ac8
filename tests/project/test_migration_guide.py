"""``docs/migration.md`` runs as written.

Its blocks run in order on Redis db 7 and the test database: the ``yaml``
block is added to a copy of the shipped ``queues.yml``; each ``sh`` block runs
in ``bash -e`` as the service's owner (``DATASERVICE_*`` naming that copy, a
new callers file, the Redis as its administrator); the ``text`` block's
variables, with the password ``dataservice keys init`` gave the caller and the
test Redis for ``redis:6379/0``, are the caller's environment, in which each
``python`` block runs as a script. A worker per lane, as the workers' Redis
user, serves from the first ``python`` block on.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
import yaml
from dataservice_tools.localservices import redis_reachable
from sqlalchemy import Engine

from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.security.acl import WORKER_USER
from dataservice.security.callers import load_keyring
from tests.conftest import SHIPPED_CONFIG, TEST_DATABASE_URL, require
from tests.harness.support import worker_process

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "migration.md"
OWN_REDIS = "redis://127.0.0.1:6379/7"
# Where the guide's caller URLs point; the test's Redis stands in for it.
DOCUMENTED_REDIS = "@redis:6379/0"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def _blocks() -> list[tuple[str, str]]:
    return BLOCK.findall(GUIDE.read_text(encoding="utf-8"))


def _config(tmp_path: Path, blocks: list[tuple[str, str]]) -> Path:
    """The shipped queues.yml with the guide's caller."""
    (policy,) = [yaml.safe_load(body) for kind, body in blocks if kind == "yaml"]
    data = yaml.safe_load(SHIPPED_CONFIG.read_text(encoding="utf-8"))
    data["callers"].update(policy["callers"])
    path = tmp_path / "queues.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _as_user(user: str, password: bytes) -> str:
    return f"redis://{user}:{quote(password.decode(), safe='')}@127.0.0.1:6379/7"


def _caller_environ(body: str, password: bytes) -> dict[str, str]:
    """The ``text`` block's variables, for the test's Redis and the caller's password."""
    found = {}
    for line in body.splitlines():
        name, _, value = line.partition("=")
        assert DOCUMENTED_REDIS in value, line
        assert "PASSWORD" in value, line
        value = value.replace("PASSWORD", quote(password.decode(), safe=""))
        found[name] = value.replace(DOCUMENTED_REDIS, "@127.0.0.1:6379/7")
    return found


def _run(argv: list[str], environ: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(
        argv, env=environ, cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"{argv[-1]!r} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_every_block_of_the_migration_guide_runs_as_written(
    database: Engine, tmp_path: Path
) -> None:
    del database  # migrated, with the workers' database user
    require(redis_reachable(OWN_REDIS), "Redis at 127.0.0.1:6379")
    blocks = _blocks()
    assert [kind for kind, _ in blocks].count("python") >= 1, "the guide has no client code"
    owner = Settings(
        config_path=_config(tmp_path, blocks),
        broker_url=OWN_REDIS,
        result_backend_url=OWN_REDIS,
        redis_url=OWN_REDIS,
        database_url=TEST_DATABASE_URL,
        callers_file=tmp_path / "callers.yml",
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("DATASERVICE_")}
    # As where the package is installed: its commands on the PATH.
    base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"
    environ = {**base, **owner.to_env()}
    admin = redis.Redis.from_url(OWN_REDIS)
    admin.flushdb()
    users: list[str] = []
    caller: dict[str, str] = {}
    serving = False
    with ExitStack() as workers:
        try:
            for kind, body in blocks:
                if kind == "sh":
                    out = _run(["bash", "-e", "-c", body], environ, tmp_path)
                    users += out.split() if "acl apply" in body else []
                elif kind == "text":
                    keyring = load_keyring(owner.callers_file)
                    caller = _caller_environ(body, keyring.redis_passwords["orders"].value)
                elif kind == "python":
                    if not serving:
                        _start_workers(workers, owner, tmp_path)
                        serving = True
                    script = tmp_path / "client.py"
                    script.write_text(body, encoding="utf-8")
                    out = _run([sys.executable, str(script)], {**environ, **caller}, tmp_path)
                    assert "200 archived" in out, out
        finally:
            workers.close()
            if users:
                admin.acl_deluser(*users)
            admin.flushdb()
            admin.close()
    assert WORKER_USER in users
    assert caller, "the guide names no caller environment"


def _start_workers(stack: ExitStack, owner: Settings, tmp_path: Path) -> None:
    """A worker per lane, connected as the workers' Redis user."""
    password = load_keyring(owner.callers_file).workers_redis_password
    assert password is not None
    url = _as_user(WORKER_USER, password.value)
    own = Settings(
        config_path=owner.config_path,
        broker_url=url,
        result_backend_url=url,
        redis_url=url,
        database_url=owner.database_url,
        callers_file=owner.callers_file,
    )
    config = own.load()
    for lane in LaneName:
        stack.enter_context(worker_process(own, config, lane, tmp_path / f"{lane.value}.log"))
