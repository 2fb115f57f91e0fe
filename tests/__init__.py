"""The test suite. ps is imported first, before conftest imports grpc: gRPC's fork support is then off in the test
process (ps/__init__.py), whose tests fork children (ps-worker export's) while in-process servers run."""

import ps  # noqa: F401
