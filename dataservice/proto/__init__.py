"""Generated protobuf modules of the record API (package ``access.v2``).

The ``.proto`` sources live beside the generated code; regenerate with
``python scripts/gen_proto.py`` (a test fails when the two drift apart).
"""

from dataservice.proto.access.v2 import access_pb2 as pb

__all__ = ["pb"]
