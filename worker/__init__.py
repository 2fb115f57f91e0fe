"""sparseps worker package: the client that talks to the servers, data readers, models and the training loop.

Importing it sets how the math libraries' idle threads wait, unless the variables are set already; they are read
once, when the library loads, so import this package before numpy and torch:
- OPENBLAS_THREAD_TIMEOUT=4 (numpy's OpenBLAS): its threads otherwise spin for about 2**28 cycles after every
  matrix product, so while a numpy worker waited for its push the idle BLAS thread burnt a core that the servers
  on the same machine needed. Measured on this 2-core box, DeepFM numpy against 2 local shards: the worker used
  3.7 s of CPU during 2.5 s of push waits, and 1.2 s during 1.7 s with the variable set (the PS run went from
  15.0K to 16.8K examples/s; the in-process run did not change).
- OMP_WAIT_POLICY=PASSIVE (torch's OpenMP threads), for the same reason: the torch worker used 2.0 s of CPU during
  2.6 s of push waits, and 1.2 s during 2.4 s with it (18.4K -> 20.1K examples/s). The price: a parallel region
  that starts after its threads went to sleep wakes them first (microseconds; the MLP's products take
  milliseconds).
Processes this one starts (the local servers of worker.cluster) inherit the variables; they use neither library's
threads. A program that imported numpy before this package keeps OpenBLAS's default.
"""

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # 2**4 cycles: BLAS threads sleep as soon as they are done
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
