"""`ServerConfig`: one shard process's settings (ps-server's flags), checked by its validate before a shard opens."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ps.config import (
    DEFAULT_REPLY_READ_TIMEOUT_S,
    MAX_CLUSTER_CHARS,
    MAX_INTERVAL_S,
    MAX_MEMORY_BYTES,
    MAX_MEMORY_TEXT,
    MAX_MESSAGE_BYTES,
    MIN_REPLY_READ_TIMEOUT_S,
)
from ps.emptyflags import refuse_empty_host, refuse_empty_path


@dataclass(frozen=True)
class ServerConfig:
    """One shard process. `port` 0 takes a free port."""

    data_dir: str
    shard_id: int = 0
    num_shards: int = 1
    host: str = "127.0.0.1"
    port: int = 0
    threads: int = 8
    max_queued_calls: int = 256  # calls waiting for one of the threads; past them RESOURCE_EXHAUSTED (ps.server)
    sync: bool = False  # fsync each acknowledged push (survives power loss, not only a process crash)
    max_message_bytes: int = MAX_MESSAGE_BYTES  # largest request and reply (gRPC's limits and the servicer's)
    reply_bytes: int | None = None  # room for replies of rows built and not sent yet, each counted twice
    # (ps.replies.REPLY_COPIES); 0: no bound; None: 1 GiB, or the request room under memory_bytes (reply_room_bytes)
    reply_read_timeout_s: float = DEFAULT_REPLY_READ_TIMEOUT_S  # a reply of rows its caller has not read this long
    # after it was handed to gRPC ends its call, its room given back (ps.unreadreplies); 0: no limit, else at least
    # MIN_REPLY_READ_TIMEOUT_S
    cache_bytes: int | None = None  # RAM tier budget shared by all tables; None: 2 GiB, or what memory_bytes leaves
    memory_bytes: int | None = None  # one bound for the data: RAM tier, RocksDB, write-behind (ps.storage.memory)
    read_threads: int = 2  # threads reading a request's missed rows from RocksDB
    flush_interval_s: float = 30.0  # the background flusher writes dirty rows to RocksDB this often
    journal_flush_bytes: int = 1 << 30  # ... or as soon as the journal has grown by this much
    tls_cert: str | None = None  # PEM certificate and key: serve TLS (ps/security.py)
    tls_key: str | None = None
    tls_ca: str | None = None  # with cert and key: mutual TLS, clients must present a certificate it signed
    auth_token_file: str | None = None  # every call but health checks must carry this token
    read_token_file: str | None = None  # ... or this one, for the calls that change nothing (ps/security.py)
    restore_dir: str | None = None  # a checkpoint to fill a new data dir from (ps/checkpoint.py)
    metrics_port: int | None = None  # serve Prometheus metrics on this port (0: a free one; None: off)
    direct_reads: bool = False  # RocksDB reads SST files with O_DIRECT, past the page cache (benchmarks, small hosts)
    mmap_reads: bool = False  # RocksDB reads SST files through memory maps (ps.storage.options.rocksdb_options)
    accept_journal_loss: bool = False  # start even if journal records are missing or damaged (ps.storage.journalreplay)
    checkpoint_root: str | None = None  # Checkpoint saves write only inside this directory; None: saves refused
    cluster: str = ""  # the name of the cluster this shard belongs to, in Stats (clients compare their shards')
    verify_on_start: bool = False  # read every block of a data dir with data first; refuse it if damaged (ps.server)

    def validate(self) -> None:
        if self.direct_reads and self.mmap_reads:
            raise ValueError("--direct-reads and --mmap-reads exclude each other: give one of them")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("give both --tls-cert and --tls-key, or neither")
        if self.tls_ca and not self.tls_cert:
            raise ValueError("--tls-ca (mutual TLS) needs --tls-cert and --tls-key")
        if self.read_token_file and not self.auth_token_file:
            raise ValueError("--read-token-file admits read-only callers beside those of --auth-token-file, whose "
                             "token may do everything: give --auth-token-file too")  # fmt: skip
        if not self.num_shards >= 1:
            raise ValueError(f"--num-shards must be >= 1, got {self.num_shards}")
        if not 0 <= self.shard_id < self.num_shards:
            raise ValueError(f"--shard-id {self.shard_id} must be in 0..{self.num_shards - 1} (--num-shards "
                             f"{self.num_shards})")  # fmt: skip
        refuse_empty_host("--host", self.host)
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must be in 0..65535, got {self.port}")
        for flag, size in (("--cache-bytes", self.cache_bytes), ("--memory-bytes", self.memory_bytes)):
            if size is not None and not 1 <= size <= MAX_MEMORY_BYTES:
                raise ValueError(f"{flag} must be at least 1 byte and at most {MAX_MEMORY_TEXT}, got {size:,}")
        if self.read_threads < 1:
            raise ValueError(f"read_threads must be >= 1, got {self.read_threads}")
        if self.max_queued_calls < 1:
            raise ValueError(f"--max-queued-calls must be >= 1, got {self.max_queued_calls}")
        if self.reply_bytes is not None and self.reply_bytes < 0:
            raise ValueError(f"--reply-bytes must be >= 0 (0: no bound), got {self.reply_bytes:,}")
        if self.reply_read_timeout_s and not MIN_REPLY_READ_TIMEOUT_S <= self.reply_read_timeout_s <= MAX_INTERVAL_S:
            raise ValueError(f"--reply-read-timeout-s must be 0 (no limit) or from {MIN_REPLY_READ_TIMEOUT_S:g} to "
                             f"{MAX_INTERVAL_S:g} s (a shorter limit cancels the calls of large replies their callers "
                             f"are still reading), got {self.reply_read_timeout_s:g}")  # fmt: skip
        if not 0 < self.flush_interval_s <= MAX_INTERVAL_S:
            raise ValueError(f"--flush-interval-s must be > 0 and <= {MAX_INTERVAL_S:g} s, got {self.flush_interval_s}")
        if len(self.cluster) > MAX_CLUSTER_CHARS or not all(
            c.isascii() and (c.isalnum() or c in "._-") for c in self.cluster
        ):
            raise ValueError(f"--cluster {self.cluster[:MAX_CLUSTER_CHARS + 1]!r}: expected at most "
                             f"{MAX_CLUSTER_CHARS} letters, digits, '.', '_' or '-'")  # fmt: skip
        if self.checkpoint_root is not None and not self.checkpoint_root.strip():
            raise ValueError(
                "--checkpoint-root is empty; give a directory, or leave the flag out to refuse checkpoints"
            )
        if self.checkpoint_root and os.path.exists(self.checkpoint_root) and not os.path.isdir(self.checkpoint_root):
            raise ValueError(f"--checkpoint-root {self.checkpoint_root} is not a directory; give a directory, or "
                             "leave the flag out to refuse checkpoints")  # fmt: skip
        if not self.data_dir.strip():
            raise ValueError("--data-dir is empty; give the shard's data directory")
        refuse_empty_path("--restore", self.restore_dir, "the checkpoint to fill the data dir from",
                          "start the shard with no tables")  # fmt: skip
        for flag, path in (("--data-dir", self.data_dir), ("--restore", self.restore_dir),
                           ("--checkpoint-root", self.checkpoint_root)):  # fmt: skip
            try:
                (path or "").encode("utf-8")
            except UnicodeEncodeError:  # a name of bytes not in the locale's encoding (os.fsdecode's surrogates)
                raise ValueError(f"{flag} {path!r} is no UTF-8 path name: RocksDB takes UTF-8 paths only; give a "
                                 "path of UTF-8 characters") from None  # fmt: skip
        if self.checkpoint_root and _within(self.checkpoint_root, self.data_dir):
            raise ValueError(f"--checkpoint-root {self.checkpoint_root} lies inside --data-dir {self.data_dir}: a "
                             "checkpoint there would be written into the shard's own files; give a directory "
                             "outside it (a checkpoint's files are hard links on the same file system)")  # fmt: skip
        if self.metrics_port and self.metrics_port == self.port:
            raise ValueError(f"--metrics-port {self.metrics_port} is --port too: give the metrics their own port")


def _within(path: str, directory: str) -> bool:
    """path is directory or lies inside it (symbolic links resolved)."""
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return os.path.commonpath([path, directory]) == directory
