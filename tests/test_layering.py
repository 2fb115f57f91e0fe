"""The import rules of the house style: who may import RocksDB, grpc, and whom."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def modules(package: str):
    return sorted((ROOT / package).rglob("*.py"))


def test_only_the_store_imports_rocksdb():
    users = {p.relative_to(ROOT).as_posix() for pkg in ("ps", "worker") for p in modules(pkg) if any(n.startswith("rocksdict") for n in imports(p))}
    assert users == {"ps/store.py"}


def test_ps_never_imports_worker():
    for p in modules("ps"):
        assert not any(n.split(".")[0] == "worker" for n in imports(p)), p


def test_in_ps_only_service_and_server_import_grpc():
    users = {p.name for p in modules("ps") if any(n.split(".")[0] == "grpc" or n.startswith("grpc_") for n in imports(p))}
    assert users <= {"service.py", "server.py", "security.py"}  # security: TLS and token for server and client


def test_worker_uses_only_the_small_shared_pieces_of_ps():
    allowed = {"ps", "ps.wire", "ps.sharding", "ps.config", "ps.errors", "ps.security", "ps.checkpoint", "ps.settings"}  # formats both sides share
    for p in modules("worker"):
        if p.name == "inprocess.py":  # by design: the server's table code called in-process, the no-RPC reference
            continue
        used = {n for n in imports(p) if n.split(".")[0] == "ps"}
        assert used <= allowed, f"{p.relative_to(ROOT)} imports {used - allowed}"
