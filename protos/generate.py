"""Regenerates the checked-in stubs from ps.proto: `python -m protos.generate` (needs the dev extra)."""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def generate(out_dir: pathlib.Path, root: pathlib.Path = ROOT) -> None:
    """Writes protos/ps_pb2.py, .pyi and _grpc.py under out_dir for root/protos/ps.proto (import path: protos)."""
    from grpc_tools import protoc  # dev extra only

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
    generate(ROOT)
    print("regenerated", *sorted(p.name for p in (ROOT / "protos").glob("ps_pb2*")), file=sys.stderr)
