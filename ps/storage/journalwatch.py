"""What was deleted under a running journal: its data dir gone or replaced, its active segment unlinked, and the
text that says so (DataDirWatch, asked by ps.storage.journal.Journal.check_intact about once a second).

A deleted segment is one whose open file has no link left (os.fstat: st_nlink 0), which appends would go on
filling with nothing on disk to replay; a deleted data dir is one whose path is gone or names another inode (a dir
removed and made again) than when the watch started (os.stat). A permission or I/O error on the stat is no sign
of a deletion: the writes say what is wrong.
"""

from __future__ import annotations

import os
import time

from ps.errors import NOTHING_APPLIED


class DataDirWatch:
    """The data dir a journal started in (data_dir: the mark's directory; "": none), watched from start() on.
    intact_at: time.time() of the last check that found everything in place (the journal sets it)."""

    def __init__(self, data_dir: str):
        self.data_dir = data_dir
        self._dir_id: tuple[int, int] | None = None  # the dir's (st_dev, st_ino) when start() ran
        self.intact_at = 0.0

    def start(self) -> None:
        """Notes the data dir's identity as it is now (no dir to watch: only the segment is checked)."""
        try:
            st = os.stat(self.data_dir)
            self._dir_id = (st.st_dev, st.st_ino)
        except OSError:
            self._dir_id = None
        self.intact_at = time.time()

    def dir_gone(self) -> bool:
        """Whether the data dir the journal started in is gone or replaced (one os.stat; False before start())."""
        if self._dir_id is None:
            return False
        try:
            st = os.stat(self.data_dir)
        except (FileNotFoundError, NotADirectoryError):
            return True
        except OSError:  # a permission, an I/O error: no sign of a deletion; the writes say what is wrong
            return False
        return (st.st_dev, st.st_ino) != self._dir_id

    @staticmethod
    def segment_gone(fd: int) -> bool:
        """Whether the segment open as fd (-1: none) was deleted (one os.fstat; a closed fd reads as intact)."""
        try:
            return fd >= 0 and os.fstat(fd).st_nlink == 0
        except OSError:
            return False

    def dir_lost(self, now: float) -> tuple[str, str]:
        """(the refusal of later appends, the ERROR line to log) once the data dir is found gone at `now`."""
        when, since = _clock(now), _clock(self.intact_at)
        lost = (f"its data dir {self.data_dir} was deleted or replaced under the running server "
                f"(between {since} and {when}): pushes since {since} could not be kept. Restart the "
                f"server on an intact data dir (a backup, or --restore of a checkpoint); {NOTHING_APPLIED}")  # fmt: skip
        told = (f"the data dir {self.data_dir} was deleted or replaced under the running server (found at "
                f"{when}; it was in place at {since}): RocksDB's files, the journal and its mark are no "
                "longer in it, so nothing this server acknowledged since its last flush can be kept, and a "
                "restart on that path would find them missing (or start a new, empty shard where the dir "
                "is gone). This server takes no more writes (FAILED_PRECONDITION) and reports NOT_SERVING; "
                "restart it on an intact data dir (a backup, or --restore of a checkpoint)")  # fmt: skip
        return lost, told

    def segment_lost(self, now: float, path: str, next_seq: int, opened_at: float) -> tuple[str, str]:
        """(the refusal of later appends, the ERROR line to log) once the active segment `path` (opened at
        opened_at; next_seq: the seq the next append would take) is found deleted at `now`."""
        when, since = _clock(now), _clock(self.intact_at)
        first = int(os.path.basename(path)[:-4])
        held = (f"records {first:,} to {next_seq - 1:,}, acknowledged since {_clock(opened_at)}"
                if next_seq > first else "no record yet")  # fmt: skip
        lost = (f"its journal segment {path} was deleted under the running server (between "
                f"{since} and {when}): pushes since {_clock(opened_at)} could not be kept in the "
                "journal. Restart the server (SIGTERM: its stop writes every acknowledged push to "
                f"RocksDB; then start it again) on its data dir, intact otherwise; {NOTHING_APPLIED}")  # fmt: skip
        told = (f"the journal segment {path} was deleted under the running server (found at {when}; "
                f"it was there at {since}): the pushes it held ({held}) are in no file, only in this "
                "server's memory until a flush writes their rows to RocksDB (one is started now). This "
                "server takes no more writes (FAILED_PRECONDITION) and reports NOT_SERVING; stop it with "
                "SIGTERM (its stop writes every row to RocksDB; a kill -9 before a flush loses those "
                "pushes) and start it again")  # fmt: skip
        return lost, told


def _clock(t: float) -> str:
    """A wall-clock time for a message: '2026-12-04 12:41:20 UTC' (local time, with its zone)."""
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t))
