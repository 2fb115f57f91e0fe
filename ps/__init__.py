"""sparseps server package: sharded gRPC parameter servers backed by RocksDB."""

__version__ = "0.1.0"
