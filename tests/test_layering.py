"""The import rules of the house, read from every import statement in ps/ and worker/ (absolute, `from ps import
x`, relative, inside functions too), with no exemptions:

- ps/ is layered; a module imports only modules of its own layer or below, and ps's imports have no cycle:
      foundation  ps.errors, ps.errornames, ps.replacedstate, ps.emptyflags, ps.diskfull, ps.partlyapplied,
                  ps.hashing, ps.bytesize, ps.config, ps.newtable, ps.server_config, ps.table_toml, ps.sharding,
                  ps.checkpoint, ps.wire, ps.codec, ps.utctime, ps.progress, ps.stamp, ps.terminate, ps.signalsafe,
                  ps.metricshttp, ps.storage.atomicfile (stdlib only: ps.checkpoint writes the manifest with it)
      accel       ps.accel.*    optional OS-level accelerations
      rows        ps.rows.*     row layout, initial values, the optimizer and update kernels
      storage     ps.storage.*  RAM tier, id index, journal, RocksDB
      engine      ps.engine.*   Table and Shard: one shard's state without gRPC; restore and export
      process     ps.service, ps.service_calls, ps.server_run, ps.listen_address, ps.refusals, ps.replies,
                  ps.unreadreplies, ps.server, ps.health, ps.security, ps.secretfiles, ps.tlsprobe, ps.metrics,
                  ps.settings, ps.settings_names, ps.flagtypes, ps.sizing, ps.__main__, ps.cli_server_flags,
                  ps.cli_server, ps.cli_commands
- one module imports rocksdict, the RocksDB binding (ROCKSDB_MODULE, ps.storage.rocks); the other storage modules
  take its types from there;
- in ps/, only the process modules that speak gRPC (service, service_calls, server, health, security) import grpc, and only they and
  the codec import the generated stubs (protos);
- ps/ never imports worker/, tests/ or benchmarks/; worker/ never imports tests/ or benchmarks/;
- worker/ imports only the pieces of ps/ that both sides share (WORKER_MAY_IMPORT).
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

LAYERS = ("foundation", "accel", "rows", "storage", "engine", "process")
FOUNDATION = {
    "ps",
    "ps.errors",
    "ps.errornames",
    "ps.replacedstate",
    "ps.diskfull",
    "ps.partlyapplied",
    "ps.emptyflags",
    "ps.hashing",
    "ps.bytesize",
    "ps.config",
    "ps.newtable",
    "ps.server_config",
    "ps.table_toml",
    "ps.sharding",
    "ps.checkpoint",
    "ps.wire",
    "ps.codec",
    "ps.utctime",
    "ps.progress",
    "ps.stamp",
    "ps.terminate",
    "ps.signalsafe",
    "ps.storage.atomicfile",
    "ps.metricshttp",
}
PROCESS = {"ps.service", "ps.service_calls", "ps.server_run", "ps.listen_address", "ps.refusals", "ps.replies", "ps.unreadreplies", "ps.server", "ps.health", "ps.security", "ps.secretfiles", "ps.tlsprobe", "ps.metrics", "ps.settings", "ps.flagtypes", "ps.settings_names",
           "ps.sizing", "ps.__main__", "ps.cli_server_flags", "ps.cli_server", "ps.cli_commands"}  # fmt: skip
ROCKSDB_MODULE = "ps.storage.rocks"  # benchmarks and tests may import rocksdict too: the raw binding is their reference
GRPC_USERS = {"ps.service", "ps.service_calls", "ps.server", "ps.health", "ps.security"}
STUB_USERS = GRPC_USERS | {"ps.codec"}
WORKER_MAY_IMPORT = {
    "ps", "ps.errors", "ps.errornames", "ps.hashing", "ps.config", "ps.table_toml", "ps.sharding", "ps.checkpoint", "ps.wire", "ps.codec",
    "ps.replacedstate",  # a ModelStateReplacedError's words, the shard's and the client's own
    "ps.diskfull",  # DiskFullError, which the client raises by name and does not retry; DISK_FULL_ERRNOS (predict)
    "ps.partlyapplied",  # a Shrink that failed on some shards, reworded as a shard rewords a request part of which stays
    "ps.emptyflags",  # flags given empty (a path, a host), refused as ps-server refuses its own (stdlib only)
    "ps.security",  # TLS and token settings of a client channel
    "ps.secretfiles",  # the token and TLS files, read and checked as the server reads its own
    "ps.tlsprobe",  # what a client that cannot connect is told of the server's TLS
    "ps.settings",  # flags from PS_* variables and TOML, as the server reads them
    "ps.flagtypes",  # the flags' argparse types and help formatter, both programs'
    "ps.settings_names",  # the PS_* names of both programs, for the warning of one that sets nothing
    "ps.bytesize",  # human_bytes: byte counts shown as the server shows them (stdlib only)
    "ps.stamp",  # WorkerStamp: the worker builds it, the shard reads it back
    "ps.accel.malloc",  # glibc malloc settings for multi-MB messages
    "ps.rows.optim",  # the tables' optimizers, run on a worker's local rows in geo mode
    "ps.rows.finite",  # the Inf/NaN check of a push's grads, ...
    "ps.rows.pushcheck",  # ... and of all its values, as a shard makes them: a bad push reaches no shard
    "ps.progress",  # the bar or plain lines of a long count (export, eval, predict)
    "ps.terminate",  # SIGTERM as an exception, child processes that die with their parent, waits signals end
    "ps.storage.diskspace",  # low_bytes: ps-worker stats marks a low disk as the server reckons it (stdlib only)
    "ps.storage.leftovers",  # an export's leftovers in its OUT, which ps-server export removes too (stdlib only)
    "ps.storage.atomicfile",  # a JSON file replaced whole: --resume-file's record (stdlib only)
    "ps.metricshttp",  # the metrics endpoints' HTTP server, bounded in connections (stdlib and prometheus-client)
    "ps.listen_address",  # host_port: an IPv6 address in brackets, as the worker's metrics endpoint says it (stdlib only)
}  # fmt: skip


def layer_of(module: str) -> str:
    if module in FOUNDATION:
        return "foundation"
    if module in PROCESS:
        return "process"
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in LAYERS:
        return parts[1]
    raise AssertionError(f"{module} has no layer: add it to tests/test_layering.py's LAYERS")


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module that `module` (whose source this is) imports, by absolute dotted name, relative imports
    resolved; `from a import b` counts as an import of a.b when a.b is a module, else of a."""
    names = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                parent = ".".join(base + ([node.module] if node.module else []))
            else:
                parent = node.module or ""
            for a in node.names:
                child = f"{parent}.{a.name}"
                names.add(child if is_module(child) else parent)
    return names


def sources(package: str) -> list[tuple[str, str, bool]]:
    return [(module_name(p), p.read_text(), p.name == "__init__.py") for p in sorted((ROOT / package).rglob("*.py"))]


def violations(module: str, imported: set[str]) -> list[str]:
    """What is wrong with `module` importing `imported` (modules of ps/ or worker/)."""
    out = []
    top = lambda n: n.split(".")[0]
    if any(top(n) == "rocksdict" for n in imported) and module != ROCKSDB_MODULE:
        out.append(f"{module} imports rocksdict; only {ROCKSDB_MODULE} may")
    if top(module) == "ps":
        if any(top(n) in ("worker", "tests", "benchmarks") for n in imported):
            out.append(f"{module} imports {sorted(n for n in imported if top(n) in ('worker', 'tests', 'benchmarks'))}")
        if any(top(n) == "grpc" or top(n).startswith("grpc_") for n in imported) and module not in GRPC_USERS:
            out.append(f"{module} imports grpc; only {sorted(GRPC_USERS)} may")
        if any(top(n) == "protos" for n in imported) and module not in STUB_USERS:
            out.append(f"{module} imports the generated stubs; only {sorted(STUB_USERS)} may")
        mine = LAYERS.index(layer_of(module))
        for n in sorted(x for x in imported if top(x) == "ps"):
            if LAYERS.index(layer_of(n)) > mine:
                out.append(f"{module} ({layer_of(module)}) imports {n} ({layer_of(n)}), a higher layer")
    if top(module) == "worker":
        if any(top(n) in ("tests", "benchmarks") for n in imported):
            out.append(f"{module} imports tests or benchmarks")
        extra = sorted(n for n in imported if top(n) == "ps" and n not in WORKER_MAY_IMPORT)
        if extra:
            out.append(f"{module} imports {extra}, which worker/ may not")
    return out


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph (a list of nodes, the first repeated at the end), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state and (found := visit(m)):
                return found
        state[n] = 2
        stack.pop()
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_every_import_follows_the_rules():
    problems = []
    for package in ("ps", "worker"):
        for module, source, is_package in sources(package):
            problems += violations(module, imports(source, module, is_package))
    assert problems == []


def test_exactly_one_module_imports_rocksdict():
    importers = [module for package in ("ps", "worker") for module, source, is_package in sources(package)
                 if any(n.split(".")[0] == "rocksdict" for n in imports(source, module, is_package))]  # fmt: skip
    assert importers == [ROCKSDB_MODULE]


def test_ps_has_no_import_cycle():
    graph = {}
    for module, source, is_package in sources("ps"):
        graph[module] = {n for n in imports(source, module, is_package) if n.split(".")[0] == "ps" and n != module}
    assert cycle(graph) is None


@pytest.mark.parametrize(
    "module, source, is_package",
    [
        ("ps.wire", "from ps.engine.shard import Shard\n", False),  # absolute, up two layers
        ("ps.wire", "from ps.engine import shard\n", False),  # `from package import module`
        ("ps.wire", "import ps.engine.shard\n", False),
        ("ps.rows.optim", "from ..storage import arena\n", False),  # relative
        ("ps.rows.optim", "from ..storage.journal import Journal\n", False),
        ("ps.storage", "from ..engine import table\n", True),  # relative, from a package's __init__
        ("ps.storage.arena", "def f():\n    from ps.engine.table import Table\n", False),  # inside a function
        ("ps.storage.arena", "import rocksdict\n", False),
        ("ps.storage.store", "from rocksdict import Rdict\n", False),  # a RocksDB module, not the binding's one
        ("ps.rows.optim", "import grpc\n", False),
        ("ps.config", "from protos import ps_pb2\n", False),
        ("ps.config", "from worker.client import Client\n", False),
        ("worker.client", "from ps.storage import store\n", False),
        ("worker.client", "from ps.engine.shard import Shard\n", False),
        ("worker.train", "from tests.inprocess import InProcessTables\n", False),
    ],
)
def test_the_rules_bite_on_a_wrong_import(module, source, is_package):
    assert violations(module, imports(source, module, is_package)), f"{module}: {source!r} was allowed"


def test_the_rules_allow_a_right_import():
    assert violations("ps.storage.arena", imports("from ..rows import rowcopy\nfrom ps.accel import hugepages\n", "ps.storage.arena")) == []  # fmt: skip
    assert violations("worker.client", imports("from ps import wire\nfrom ps.sharding import SlotMap\n", "worker.client")) == []  # fmt: skip


def test_cycles_are_found():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def layer_paragraph(doc: str, layer: str) -> str:
    """The text of one layer's paragraph in a docstring laid out as this file's: its name indented 6 spaces, its
    continuation lines indented deeper, and the next layer or the next `- ` rule ending it."""
    lines = doc.splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(rf" {{6}}{layer}\s", line)]
    assert len(starts) == 1, f"{len(starts)} paragraphs for the {layer} layer, expected 1"
    paragraph = [lines[starts[0]][6 + len(layer) :]]
    for line in lines[starts[0] + 1 :]:
        if not line.startswith(" " * 7):
            break
        paragraph.append(line)
    return " ".join(paragraph)


def modules_named(paragraph: str) -> list[str]:
    """The `ps.x` names in a layer's paragraph, outside parentheses (which give reasons, naming other modules)."""
    return re.findall(r"ps(?:\.\w+)+", re.sub(r"\([^)]*\)", "", paragraph))


def misnamed_layers(doc: str) -> list[str]:
    """The layers among foundation and process whose line in `doc` does not name exactly their modules, once each."""
    expected = {"foundation": FOUNDATION - {"ps"}, "process": PROCESS}
    return [layer for layer, modules in expected.items()
            if sorted(modules_named(layer_paragraph(doc, layer))) != sorted(modules)]  # fmt: skip


def test_the_docstring_names_every_module_of_the_foundation_and_process_layers():
    """The foundation and process lines at the top of this file name FOUNDATION's and PROCESS's modules, each
    once, no other and none in the other layer's line."""
    assert misnamed_layers(__doc__) == []


def test_the_docstring_check_bites_on_a_module_in_the_wrong_line_or_unknown():
    moved = __doc__.replace(" ps.terminate,", "").replace("ps.cli_commands", "ps.cli_commands, ps.terminate")
    assert misnamed_layers(moved) == ["foundation", "process"]
    assert misnamed_layers(__doc__.replace("ps.cli_commands", "ps.cli_commands, ps.nosuchmodule")) == ["process"]
    assert misnamed_layers(__doc__.replace("ps.wire,", "ps.wire, ps.wire,")) == ["foundation"]


def test_every_module_is_named_in_docs_architecture_md():
    """The map of the code names every module of ps/ and worker/ (by path, or by file name in its list)."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    unnamed = [str(p.relative_to(ROOT)) for pkg in ("ps", "worker") for p in sorted((ROOT / pkg).rglob("*.py"))
               if p.name != "__init__.py" and not re.search(rf"(?<![\w/]){re.escape(p.name)}\b", doc)
               and str(p.relative_to(ROOT)) not in doc]  # fmt: skip
    assert unnamed == [], f"docs/architecture.md does not name {unnamed}"
