"""A refusal of a request part of which was applied and stays, reworded to say so (partly_applied).

A batch push's pushes before the refused one (ps.engine.pushpath), a Shrink's chunks written before it stopped
(ps.engine.shrinkprogress) and the Shrinks of the shards that shrank where another refused (worker.shrinkreplies)
stay; the failure that stopped them says so, in ps.errors' PARTLY_APPLIED words (SHARDS_STAY_SHRUNK for the
shards' Shrinks), and a DiskFullError's remedy is kept or replaced, a CheckpointHoldError's dropped, where sending
the request again would apply its part twice.
"""

import copy

from ps.diskfull import REMEDY_AFTER, RETRY, DiskFullError
from ps.errors import NOTHING_APPLIED, CheckpointHoldError, PsError, ShardNeedsRestartError


def partly_applied(e: PsError, stopped: str, outcome: str, remedy: str = "") -> PsError:
    """e, the failure that stopped a request part of which was applied and stays, reworded to say so: a copy of e,
    its class and attributes kept, whose message is "<stopped>: <e's message less its '; nothing was applied'>.
    <outcome>"; a DiskFullError's keeps its start (DISK_FULL_PREFIX), its remedy and its own outcome, unless that
    is "nothing was applied", and ends "; <stopped>. <outcome>" (DiskFullError.instead: one whose fields are known,
    `what` not ""; a client's copy that came without them is reworded as the others); so does a
    ShardNeedsRestartError's, whose message, kept whole and first, says what a restart does. outcome: what of the
    request stays, in PARTLY_APPLIED's words (ps.engine.pushpath, ps.engine.shrinkprogress) or SHARDS_STAY_SHRUNK's
    (worker.shrinkreplies), and what sending it again does. remedy: what a DiskFullError whose remedy is RETRY says to do instead once space is freed, where
    sending the request again would apply its part twice (SHRINK_REMEDY); "": RETRY stays. Given, a
    CheckpointHoldError's message loses its ending ": <CheckpointHoldError.shrink_remedy>" (send the Shrink once
    the checkpoint has ended), outcome saying when to send it instead. A client's copy of a
    DiskFullError that came without its fields gets remedy too where its message, less "; nothing was applied",
    ends "<REMEDY_AFTER>retry" (the shard's disk-full sentence, whole); its fields stay "" (none came); a message
    cut short (clip) keeps its words, and the outcome after them says what to do."""
    if isinstance(e, DiskFullError) and e.what:
        own = "" if e.outcome in ("", NOTHING_APPLIED) else f"{e.outcome}; "
        instead = remedy if remedy and e.remedy == RETRY else None
        return e.instead(f"{own}{stopped}. {outcome}", remedy=instead)
    reworded = copy.copy(e)  # the class and the attributes (a refusal's own fields) as they are
    if isinstance(e, ShardNeedsRestartError):
        reworded.args = (f"{e}; {stopped}. {outcome}", *e.args[1:])
        return reworded
    said = str(e).removesuffix(f"; {NOTHING_APPLIED}")
    if remedy and isinstance(e, DiskFullError) and said.endswith(REMEDY_AFTER + RETRY):
        said = said.removesuffix(RETRY) + remedy
    if remedy and isinstance(e, CheckpointHoldError):  # outcome says when to send it again: said once
        said = said.removesuffix(f": {CheckpointHoldError.shrink_remedy}")
    reworded.args = (f"{stopped}: {said}. {outcome}", *e.args[1:])
    return reworded
