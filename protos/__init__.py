"""Wire protocol: ps.proto and the stubs generated from it (never hand-edited; see tests/test_protos.py)."""
