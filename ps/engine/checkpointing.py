"""ShardCheckpoints: a shard's checkpoints: the push gate every push passes through and the hold that closes it
(ps.engine.hold.PushHold), and saving the shard's RocksDB checkpoint under that hold.

A save flushes the shard, then writes a RocksDB checkpoint of it into <directory>/shard-<id> (ps.engine.hold's
save_into creates and, on failure, removes what it made) and returns what the checkpoint's manifest records of it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from ps.checkpoint import file_checksums
from ps.engine.hold import PushHold, check_caller, save_into
from ps.engine.table import rows_text
from ps.errors import CallerGoneError, InvalidArgumentError
from ps.server_config import ServerConfig
from ps.storage import leftovers
from ps.storage.store import Store

log = logging.getLogger("ps.engine.shard")  # the shard's: its checkpoints are a part of it


class ShardCheckpoints:
    """One shard's checkpoint hold and saves. flush: the shard's (every dirty row written to RocksDB); clock: the
    shard's clock now."""

    def __init__(self, config: ServerConfig, store: Store, flush: Callable[[], int], clock: Callable[[], int]):
        self.config = config
        self.shard_id = config.shard_id
        self.store = store
        self._flush = flush
        self._clock = clock
        self.gate = PushHold(self.shard_id)  # every push passes its push_gate; a hold closes it

    def hold(self, timeout_s: float, caller_gone: Callable[[], bool] | None = None) -> tuple[int, str]:
        """PushHold.hold at the shard's clock: (clock, token)."""
        return self.gate.hold(timeout_s, self._clock, caller_gone)

    def save(self, directory: str, token: str, caller_gone: Callable[[], bool] | None = None) -> dict:
        """Flushes, then writes a RocksDB checkpoint of this shard to <directory>/shard-<id>, under the hold that
        returned token (which cannot expire while this runs); returns what the manifest records of it. A directory
        inside the data dir, or one that holds it (deleting the checkpoint would delete the data dir), is refused
        (InvalidArgumentError). Refusals and failures leave nothing behind
        (PushHold.saving, save_into); caller_gone: as save_into's (a save whose caller left writes nothing more)."""
        data_dir, target = os.path.realpath(self.config.data_dir), os.path.realpath(directory)
        common = os.path.commonpath([target, data_dir])
        if common == data_dir:
            raise InvalidArgumentError(f"checkpoint dir {directory} lies inside shard {self.shard_id}'s data dir "
                                       f"{self.config.data_dir}; give a directory outside it; nothing saved")  # fmt: skip
        if common == target:  # deleting the checkpoint would delete the live data dir with it
            raise InvalidArgumentError(f"checkpoint dir {directory} holds shard {self.shard_id}'s data dir "
                                       f"{self.config.data_dir}; give a directory beside it, not above it; nothing "
                                       "saved")  # fmt: skip
        with self.gate.saving(token):
            started = time.monotonic()
            name = f"shard-{self.shard_id}"
            written = save_into(directory, name, self.config.checkpoint_root,
                                lambda path: self.write(path, caller_gone), caller_gone)  # fmt: skip
            clock = self._clock()
            saved = {"shard_id": self.shard_id, "dir": name, "clock": clock, **written}
            log.info("checkpoint saved to %s in %.1f s: %s, clock %s", os.path.join(directory, name),
                     time.monotonic() - started, rows_text(sum(saved["rows"].values())), f"{clock:,}")  # fmt: skip
            return saved

    def write(self, path: str, caller_gone: Callable[[], bool] | None = None) -> dict:
        """Flushes, writes a RocksDB checkpoint of this shard to path and returns what the manifest records of its
        files and rows. A failure once RocksDB wrote it (reading it back) removes it: a failed save leaves
        nothing behind. caller_gone: as save_into's, asked again once the flush is done (CallerGoneError, nothing
        written) and once the checkpoint is written and read back (CallerGoneError, and the checkpoint removed): a
        caller that leaves meanwhile removes the directory it gave, which cannot take away a folder RocksDB writes
        into, and a save_into that made that directory again after the caller's removal would leave the whole
        checkpoint there."""
        directory = os.path.dirname(path)
        self._flush()
        check_caller(caller_gone, directory)  # a flush takes long: the caller may have left during it
        self.store.checkpoint(path)
        try:
            written = {
                "files": file_checksums(path),
                "rows": self.store.saved_counts(path),  # read back from the checkpoint just written: what it holds
            }
            check_caller(caller_gone, directory)  # nobody reads it, nor removes it after this
            return written
        except BaseException as e:
            whose = ("whose caller left while RocksDB wrote it" if isinstance(e, CallerGoneError)
                     else "which failed once RocksDB wrote it")  # fmt: skip
            leftovers.remove([path], f"shard {self.shard_id}'s checkpoint save, {whose}")
            raise
