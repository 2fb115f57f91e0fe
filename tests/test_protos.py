"""The checked-in stubs are exactly what protoc (the pinned grpcio-tools) generates from ps.proto."""

import pathlib
import shutil

from protos.generate import generate

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_regenerating_the_stubs_gives_the_same_bytes(tmp_path):
    (tmp_path / "protos").mkdir()
    shutil.copy(ROOT / "protos" / "ps.proto", tmp_path / "protos" / "ps.proto")
    generate(tmp_path, root=tmp_path)
    for name in ("ps_pb2.py", "ps_pb2.pyi", "ps_pb2_grpc.py"):
        fresh = (tmp_path / "protos" / name).read_bytes()
        assert fresh == (ROOT / "protos" / name).read_bytes(), f"protos/{name} is stale: run python -m protos.generate"
