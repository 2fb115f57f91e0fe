"""sparseps worker package: the client that talks to the servers, data readers, models and the training loop.

Importing it sets how the math libraries' idle threads wait, unless the variables are set already; they are read
once, when the library loads, so import this package before numpy and torch:
- OPENBLAS_THREAD_TIMEOUT=4 (numpy's OpenBLAS): its threads otherwise spin for about 2**28 cycles after every
  matrix product, so while a numpy worker waits for its push an idle BLAS thread burns a core that servers on
  the same machine need.
- OMP_WAIT_POLICY=PASSIVE (torch's OpenMP threads), for the same reason. The price: a parallel region that starts
  after its threads went to sleep wakes them first (microseconds, against the milliseconds of the MLP's products).
Processes this one starts (the local servers of worker.cluster) inherit the variables; they use neither library's
threads. A program that imported numpy before this package keeps OpenBLAS's default.
"""

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # 2**4 cycles: BLAS threads sleep as soon as they are done
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import ps  # noqa: F401  (before numba is imported: a cache dir it can write, see ps/__init__.py)
