"""Engine layer: one shard's state and its operations, without gRPC. Table (table) pulls and pushes the rows of
one table over the RAM tier, the journal and RocksDB, flushes and replays; Shard (shard) holds a data dir's
tables, the clock, exactly-once pushes (each a push.TablePush) and the flusher, opening its data dir through
opening; PushHold (hold) holds its pushes
for a checkpoint and saves one; restore reads checkpoints back and exports them. It may import every layer below
it (the foundation, ps.accel, ps.rows, ps.storage) and its own modules; never the process modules (ps.service,
ps.server, ...) (tests/test_layering.py holds this).
"""
