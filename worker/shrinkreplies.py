"""A Shrink's replies from every shard, and the error that names the shards that shrank where another failed.

Client.shrink sends every shard its Shrink at once. Where one fails and others shrank, those stay shrunk: their
rows decayed once and their ids dropped. The failure alone would leave a reader to send the Shrink again once the
failed shard is mended (a table restored, space freed) or its checkpoint has ended (a shard a checkpoint holds refuses
a Shrink: ps.engine.hold), decaying the others' rows a second time, so the error raised names them, what each
dropped, and that they take no Shrink before the next one is due (ps.errors SHARDS_STAY_SHRUNK: a Shrink has no
clock, so not PARTLY_APPLIED's words). The refusal is reworded by ps.partlyapplied, as a shard's own refusal of a
Shrink stopped part way is (ps.engine.shrinkprogress): a full disk's remedy RETRY becomes SHRINK_REMEDY there too,
and a checkpoint hold's advice to send the Shrink once that checkpoint has ended is dropped.
"""

from __future__ import annotations

from protos import ps_pb2
from ps.diskfull import SHRINK_REMEDY
from ps.errors import SHARDS_STAY_SHRUNK, CheckpointHoldError, PsError
from ps.partlyapplied import partly_applied


def shrink_replies(outcomes: list) -> list[ps_pb2.ShrinkResponse]:
    """outcomes: each shard's ShrinkResponse, or the PsError its Shrink ended with, in shard order. Returns the
    replies where no shard failed. Else raises the first failure: as it is where no shard shrank; where some did,
    reworded by ps.partlyapplied (its class and attributes kept) with "Shrink failed on shard <s>" and "Of
    the Shrink, shard(s) <those that shrank> shrank (<what each dropped and left>); <SHARDS_STAY_SHRUNK>: shard(s)
    <those> must take no Shrink before the next one is due, also once shard <s> is mended (for a
    CheckpointHoldError: once shard <s>'s checkpoint has ended): one sent again would decay their rows a second
    time" (and which other shards failed, where more did); a full disk's refusal with its remedy RETRY replaced by SHRINK_REMEDY, where its shard sent its
    fields (DiskFullError.received) or, without them, its message ends with it; a checkpoint hold's without its
    ": <CheckpointHoldError.shrink_remedy>", which the outcome says otherwise. The error keeps what the client
    noted of the refusal (refused_by)."""
    failed = [(s, o) for s, o in enumerate(outcomes) if isinstance(o, PsError)]
    if not failed:
        return outcomes
    shard, error = failed[0]
    done = [(s, o) for s, o in enumerate(outcomes) if not isinstance(o, PsError)]
    if not done:
        raise error
    shrank = "; ".join(f"shard {s} dropped {r.dropped:,} ids, {r.num_rows:,} rows and {r.pending_ids:,} pending ids "
                       "left" for s, r in done)  # fmt: skip
    more = [s for s, _ in failed[1:]]
    also = f"; shard(s) {', '.join(map(str, more))} failed too" if more else ""
    held = isinstance(error, CheckpointHoldError)  # a checkpoint holds it: nothing to mend, only to wait for
    mended = f"shard {shard}'s checkpoint has ended" if held else f"shard {shard} is mended"
    names = ", ".join(str(s) for s, _ in done)
    outcome = (f"Of the Shrink, shard(s) {names} shrank ({shrank}); {SHARDS_STAY_SHRUNK}: shard(s) {names} must take "
               f"no Shrink before the next one is due, also once {mended}: one sent again would decay their rows a "
               f"second time{also}")  # fmt: skip
    raise partly_applied(error, f"Shrink failed on shard {shard}", outcome, remedy=SHRINK_REMEDY)
