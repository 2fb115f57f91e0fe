"""The words of a ModelStateReplacedError: how its shard was replaced, and what each kind of call it refused loses;
and those of a call to a table that another of its name and another dim replaced (table_replaced).

StateReplacedWords: what of the model state is gone, what of the call stands, who stops and what to do; a push's
(PUSH_REFUSED), a read's (READ_REFUSED), and those of ps.service's Checkpoint, CreateTable and Shrink. The message is
built in one place (model_state_replaced), for the shard's refusal (ps.engine.shard check_state_id) and the
client's own (worker.shard_calls, worker.checkpoint) alike.
"""

from typing import NamedTuple

from ps.errors import MODEL_STATE_REPLACED, NOTHING_READ_OR_APPLIED


class StateReplacedWords(NamedTuple):
    """What a ModelStateReplacedError says of the call it refused (model_state_replaced), after how its shard was
    replaced: the caller picks them by what the call does (PUSH_REFUSED, READ_REFUSED, or its own)."""

    gone: str  # what of the model state the client worked with is not on the shard, from ", so ..."
    outcome: str  # what of the call stands; "": the words before these say it (a client's note of a refusal)
    stops: str  # a sentence: who stops, and what to do


PUSH_REFUSED = StateReplacedWords(
    "so what the client pushed before is not here",
    "the push was not applied",
    "A training run stops: start it again on what the shards hold now (from the checkpoint's position, with "
    "--skip-examples)",
)  # a push's (PushBatch), or a call that changes rows and carries no state id (the client's note)
READ_REFUSED = StateReplacedWords(
    "so its rows are not those of the model state the client read before",
    NOTHING_READ_OR_APPLIED,
    "A training run, an eval or a predict stops: start it again on what the shards hold now",
)  # a pull's (PullBatch), or a call of ps.security.READ_ONLY_METHODS that carries no state id (the client's note)


def how_replaced(restored_from: str) -> str:
    """How a shard that holds another model state than its client read was replaced, in model_state_replaced's
    `how`: "restored from checkpoint C" where restored_from names the checkpoint C, else (""), "started on a new,
    empty data dir". The shard's words (ps.engine.shard check_state_id) and the client's from its Stats alike."""
    return f"restored from checkpoint {restored_from}" if restored_from else "started on a new, empty data dir"


def model_state_replaced(shard: int, state_id: int, seen: int, how: str, words: StateReplacedWords) -> str:
    """A ModelStateReplacedError's message, the shard's (ps.engine.shard check_state_id) and the client's for a call
    that carries no state id (worker.shard_calls): shard `shard` holds state_id, not seen (the one its client read
    from Stats), since it was `how` ("restored from checkpoint C", "started on a new, empty data dir", ...); then
    words: what is gone, what of the call stands, and who stops, with what to do."""
    outcome = f"; {words.outcome}" if words.outcome else ""
    return (f"shard {shard} {MODEL_STATE_REPLACED} (state id {state_id:#x}, the client's {seen:#x}): since the client "
            f"connected, the shard was {how}, {words.gone}{outcome}. {words.stops}")  # fmt: skip


# what a refusal for a state id the shard does not hold (ps.engine.shard check_state_id) says of ps.service's Checkpoint
# hold or save, CreateTable and Shrink: what is gone, what of the call stands, what its caller does
CHECKPOINT_STOPS = ("A checkpoint save stops there, writing no manifest: save again once the shards hold one model "
                    "(ps-worker stats names each shard's restore)")  # fmt: skip
CHECKPOINT_REFUSED = {  # by each of ps.codec STATE_ID_PHASES
    "hold": READ_REFUSED._replace(outcome="the shard was not held", stops=CHECKPOINT_STOPS),
    "save": READ_REFUSED._replace(outcome="the shard saved nothing", stops=CHECKPOINT_STOPS),
}
CREATE_REFUSED = StateReplacedWords(  # a run's CreateTable comes after its wait_ready, before its pushes
    "so the tables it held before may be lost there",
    "the table was not created there",
    "A training run stops there: start it again on what the shards hold now; its start refuses shards that lost a "
    "trained table or were restored from different checkpoints, and names them, as ps-worker stats does",
)
SHRINK_REFUSED = READ_REFUSED._replace(
    outcome="nothing was shrunk",
    stops="The Shrink stops there: send it again, if still wanted, to the model the shards hold now",
)


def table_replaced(table: str, dim: int, now: int, outcome: str = "") -> str:
    """The words for a call sized by dim, the dim its client read of `table`, which has dim `now`: another client
    replaced it (CreateTable replace_untrained) since. The client's TableReplacedError for a pull's rows
    (worker.tabledims) and a shard's refusal of a push of the dim of a table it replaced (ps.service) alike;
    outcome: what of the call stands ("" none said)."""
    outcome = f"; {outcome}" if outcome else ""
    return (f"table {table!r} has dim {now}, not the dim {dim} this client read when it opened the table: another "
            f"client replaced it since (CreateTable replace_untrained) with a table of dim {now}{outcome}. A model "
            f"built for dim {dim} cannot use it: start again on the table as it is now (a new client, or "
            f"describe_table({table!r}) to read its dim anew)")  # fmt: skip
