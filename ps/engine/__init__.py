"""Engine layer: one shard's state and its operations, without gRPC. Table (table) pulls and pushes the rows of one
table over the RAM tier, the journal and RocksDB, flushes and replays; Shard (shard) holds a data dir's tables, the
clock and exactly-once pushes (each a push.TablePush), refusing writes once its data dir is lost or it broke
(writeguard) and serving its pulls through PullPath (pullpath); opening opens its data dir, closing closes it,
Flusher (flusher) writes its dirty rows in the background, TableMaker (tablemaker) makes its tables; JobClocks
(jobs: followedjob's FollowedJob with its waits) follows its training job, whose workers' PushBatches StampedPushes
(stampedpush) routes, over JobTenancy (tenancy: which job holds the shard), stampcheck and syncsum; PushHold (hold)
holds its pushes for a checkpoint and saves one; restore reads checkpoints back and exports them. It may import
every layer below it (the foundation, ps.accel, ps.rows, ps.storage) and its own modules; never the process modules
(ps.service, ps.server, ...) (tests/test_layering.py holds this).
"""
