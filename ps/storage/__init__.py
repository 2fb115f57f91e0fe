"""Storage layer: where one table's rows live. The bounded RAM tier (arena; its lookups: arenalookups; its S3-FIFO
eviction: eviction), its id index (index) and the server-wide budget its rows are paid from (budget), the push
journal that makes pushes durable before they are acknowledged (journal; its record format: journalformat; its
replay: journalreplay; its files deleted under it: journalwatch) and its record checksum (checksum), and RocksDB,
the durable tier of every row (store; the tables' configs, numbers and counts: tablecatalog; their rows read and
written: storedrows; the shard's own records: shardmeta), with the grammar of its row keys and values (rowformat)
and of its meta values (meta), its data dir's checks and read-write open (datadir), the options it is opened and
read with (options), read-only opening and damage text (readonly), and a checkpoint's rows and counts read
(checkpointread); they take the RocksDB binding's types from rocks, the one module that imports rocksdict. The
small files that keep the shard's identity and the journal's mark beside them (sidefiles), and `ps-server
verify`'s read of a whole data dir (verifyscan, reported on by verify).
It may import the foundation (ps.errors, ps.hashing, ps.config, ...), ps.accel, ps.rows and its own modules;
never ps.engine or the process modules (tests/test_layering.py holds this).
"""
