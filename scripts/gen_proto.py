"""Generate the Python protobuf modules and their type stubs.

Usage: python scripts/gen_proto.py [--out DIR]

Writes ``*_pb2.py`` and ``*_pb2.pyi`` beside each ``.proto`` file under
``dataservice/proto`` (or under DIR, mirroring the tree, for the drift test).
The code generator versions are pinned in pyproject.toml's ``dev`` group, so
two runs on any machine produce identical bytes.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "dataservice" / "proto"


def proto_files() -> list[Path]:
    return sorted(PROTO_ROOT.rglob("*.proto"))


def generate(out: Path) -> list[Path]:
    from grpc_tools import protoc

    plugin = shutil.which("protoc-gen-mypy", path=str(Path(sys.executable).parent)) or shutil.which(
        "protoc-gen-mypy"
    )
    if plugin is None:
        raise SystemExit("protoc-gen-mypy not found: install the dev dependency group")
    out.mkdir(parents=True, exist_ok=True)
    protos = [str(p.relative_to(PROTO_ROOT)) for p in proto_files()]
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"--plugin=protoc-gen-mypy={plugin}",
        f"--python_out={out}",
        f"--mypy_out={out}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted(p for p in out.rglob("*_pb2.py*"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROTO_ROOT)
    args = parser.parse_args()
    for path in generate(args.out):
        print(path.relative_to(args.out))


if __name__ == "__main__":
    sys.exit(main())
