"""Rows layer: what a row is and how a push changes it, without knowing where rows are kept. The row layout and
its byte counts (layout), initial values as a pure function of seed and id (initializers), the optimizers (optim),
the one push update path (update), compiled row copies (rowcopy), the Inf/NaN check (finite), the check of a
push's values that shards and clients share (pushcheck), and the splitting of a batch's per-id loops over threads
(parallel). It may import the foundation (ps.errors, ps.hashing, ps.config, ...), ps.accel and its own modules;
never ps.storage, ps.engine or the process modules (tests/test_layering.py holds this).
"""
