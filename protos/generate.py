"""Regenerates the checked-in stubs from ps.proto: `python -m protos.generate` (needs the dev extra)."""

from __future__ import annotations

import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent


def generate(out_dir: pathlib.Path) -> None:
    """Writes ps_pb2.py, ps_pb2.pyi and ps_pb2_grpc.py for protos/ps.proto into out_dir."""
    from grpc_tools import protoc  # dev extra only

    root = HERE.parent
    args = [
        "protoc",
        f"-I{root}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(root / "protos" / "ps.proto"),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")


if __name__ == "__main__":
    generate(HERE.parent)
    print("regenerated", *sorted(p.name for p in HERE.glob("ps_pb2*")), file=sys.stderr)
