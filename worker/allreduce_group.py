"""The allreduce dense path's process group: torch.distributed joined from the environment torchrun sets, and its
failures said as errors that name what to check.

The group: env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), gloo for a cpu device and nccl for a cuda one, whose
device is this rank's GPU ("cuda:<LOCAL_RANK>"). A rendezvous that not every rank reaches in time is a TimeoutError, a
group that cannot be set up otherwise a ConnectionError; both say where the group is and what to check. torch is
imported inside the functions, so this module imports without it.
"""

from __future__ import annotations

import datetime
import os
import re

ENV_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")


def rank_device(device: str) -> str:
    """This rank's device: worker.models.torch_backend.worker_device with a GPU of its own (nccl wants one GPU
    per worker)."""
    from worker.models.torch_backend import worker_device

    return worker_device(device, exclusive=True)


def init_process_group_from_env(device: str, timeout_s: float | None = None) -> tuple[int, int]:
    """Joins the default torch.distributed group the environment describes (env://): gloo for a cpu device,
    nccl for cuda (its GPU made the current one). Returns (rank, world_size); a default group already
    initialized is returned as it is. ValueError naming the missing variables when some of ENV_VARS are unset;
    TimeoutError when not every rank joined within timeout_s (None: torch's default), or this rank could not reach
    the rendezvous at MASTER_ADDR:MASTER_PORT in time; ConnectionError when the group could not be set up otherwise
    (MASTER_PORT in use on rank 0, say). Both are OSErrors: the CLI prints their message, torch's error chained."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    missing = [v for v in ENV_VARS if not os.environ.get(v)]
    if missing:
        raise ValueError(
            f"the allreduce dense path reads {', '.join(ENV_VARS)} from the environment (torchrun sets them); "
            f"missing: {', '.join(missing)}"
        )
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(torch.device(rank_device(device)))
        backend = "nccl"
    else:
        backend = "gloo"
    try:
        if timeout_s is None:
            dist.init_process_group(backend, init_method="env://")
        else:  # a collective waiting longer for a peer (one that died) fails instead of hanging
            dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout_s))
    except dist.DistStoreError as e:  # the rendezvous: not every rank came
        env = {v: os.environ[v] for v in ENV_VARS}
        raise TimeoutError(
            f"not every worker joined the allreduce group at {env['MASTER_ADDR']}:{env['MASTER_PORT']} (RANK "
            f"{env['RANK']} of WORLD_SIZE {env['WORLD_SIZE']}) in time: {str(e).splitlines()[0]} Every worker of "
            "the job must run with --dense allreduce and the same WORLD_SIZE (a --dense ps worker never joins); "
            "a worker that died or has not started yet leaves the group short too"
        ) from e
    except RuntimeError as e:  # DistNetworkError (the store's socket), another DistError, the backend's own
        raise _init_error(e, timeout_s) from e
    return dist.get_rank(), dist.get_world_size()


def torch_reason(e: BaseException) -> str:
    """The gist of a torch.distributed error for a message: its first line, at most 300 characters; of a line
    from gloo's transport ("[.../pair.cc:553] Connection closed by peer [addr]:port. This is typically caused
    by ..."), the first sentence without the source file."""
    lines = str(e).strip().splitlines()
    line = lines[0].strip() if lines else ""
    text = re.sub(r"^\[[^\]]*\]\s*", "", line)
    if text != line:
        text = text.split(". ", 1)[0]
    text = text.rstrip(".") or type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def timed_out(e: BaseException) -> bool:
    """Whether a torch.distributed error says that it timed out."""
    return "timed out" in str(e).lower() or "timeout" in str(e).lower()


def _init_error(e: RuntimeError, timeout_s: float | None) -> OSError:
    """The error of a failed init_process_group (other than the rendezvous timing out on the store's host): a
    TimeoutError when this rank could not reach the store in time, else a ConnectionError."""
    env = {v: os.environ[v] for v in ENV_VARS}
    where, rank, world = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}", env["RANK"], env["WORLD_SIZE"]
    within = "in time" if timeout_s is None else f"within the timeout of {timeout_s:g} s (--barrier-timeout)"
    if timed_out(e):
        return TimeoutError(
            f"RANK {rank} of WORLD_SIZE {world} could not reach the allreduce group's rendezvous at {where} "
            f"(MASTER_ADDR:MASTER_PORT, hosted by RANK 0) {within}: {torch_reason(e)}. RANK 0 must run with --dense "
            "allreduce and the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE, and this machine must reach that address; "
            "a RANK 0 that died or has not started yet leaves the group short too"
        )
    return ConnectionError(
        f"RANK {rank} of WORLD_SIZE {world} could not set up the allreduce group at {where} (MASTER_ADDR:MASTER_PORT): "
        f"{torch_reason(e)}. RANK 0 hosts the group there: MASTER_ADDR must be an address of RANK 0's machine that "
        "every worker reaches, and MASTER_PORT a port no other process holds (another job's group, say); every "
        "worker must have the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE"
    )
