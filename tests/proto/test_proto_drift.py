"""The committed generated protobuf code matches a fresh generation.

``dataservice/proto/**/*_pb2.py`` and ``*_pb2.pyi`` are generated from the
``.proto`` files beside them by ``scripts/gen_proto.py`` with pinned code
generator versions (pyproject.toml, ``dev`` group), so a fresh generation must
be byte-identical to what is committed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GEN_PROTO = ROOT / "scripts" / "gen_proto.py"
PROTO_ROOT = ROOT / "dataservice" / "proto"
HOW_TO_FIX = (
    "the committed generated protobuf code is out of date with its .proto sources; "
    "run `python scripts/gen_proto.py` and commit the result"
)


def _generated_files(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*_pb2.py*"))
        if path.suffix in {".py", ".pyi"}
    }


def _generate_into(out: Path) -> dict[str, bytes]:
    result = subprocess.run(
        [sys.executable, str(GEN_PROTO), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"scripts/gen_proto.py failed:\n{result.stderr}"
    return _generated_files(out)


def test_every_proto_file_has_committed_generated_code() -> None:
    protos = sorted(PROTO_ROOT.rglob("*.proto"))
    assert protos, "no .proto files under dataservice/proto"
    missing = [
        f"{proto.relative_to(PROTO_ROOT).with_suffix('')}_pb2{suffix}"
        for proto in protos
        for suffix in (".py", ".pyi")
        if not proto.with_name(f"{proto.stem}_pb2{suffix}").is_file()
    ]
    assert not missing, f"missing generated files {missing}: {HOW_TO_FIX}"


def test_committed_generated_code_matches_a_fresh_generation(tmp_path: Path) -> None:
    fresh = _generate_into(tmp_path)
    committed = _generated_files(PROTO_ROOT)

    assert fresh, "scripts/gen_proto.py generated nothing"
    only_fresh = sorted(fresh.keys() - committed.keys())
    only_committed = sorted(committed.keys() - fresh.keys())
    assert not only_fresh, f"not committed: {only_fresh}: {HOW_TO_FIX}"
    assert not only_committed, f"committed but no longer generated: {only_committed}: {HOW_TO_FIX}"
    differing = sorted(name for name in fresh if fresh[name] != committed[name])
    assert not differing, f"differ from a fresh generation: {differing}: {HOW_TO_FIX}"
