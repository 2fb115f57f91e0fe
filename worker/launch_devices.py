"""Each `ps-worker launch` worker's backend and device: --backends read, each worker's config checked on them, and
the devices checked against this machine's GPUs before anything starts.

A worker's entry: "numpy", "torch" (on the CPU) or "torch:cuda" (on a GPU), as the launch plan, its summary and
--metrics-out name it.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ps.terminate import how_it_ended

BACKENDS = ("numpy", "torch")
DEVICES = ("cpu", "cuda")


def expand_backends(text: str, workers: int) -> tuple[str, ...]:
    """One entry per worker from --backends, each "backend" or "backend:device" (torch:cuda; spaces around either
    part dropped): as many as workers, or one for all. ValueError otherwise (the pairing of backend and device is
    TrainConfig's to check)."""
    entries = []
    for raw in text.split(","):
        backend, device = split_backend(raw)
        if backend not in BACKENDS:
            raise ValueError(f"--backends {text!r}: {raw.strip()!r} is not a backend; expected "
                             f"{' or '.join(BACKENDS)}, each optionally with its device (torch:cuda)")  # fmt: skip
        if device is not None and device not in DEVICES:
            named = f"names the device {device!r}" if device else "names no device after ':'"
            raise ValueError(f"--backends {text!r}: {raw.strip()!r} {named}; expected {' or '.join(DEVICES)}")
        entries.append(backend if device is None else f"{backend}:{device}")
    if len(entries) == 1:
        return tuple(entries) * workers
    if len(entries) != workers:
        raise ValueError(f"--backends {text!r} names {len(entries)} backends for --workers {workers}: give one per "
                         "worker, or one for all")  # fmt: skip
    return tuple(entries)


def split_backend(entry: str) -> tuple[str, str | None]:
    """("torch", "cuda") of "torch:cuda"; ("numpy", None) of "numpy" (the worker keeps the train flags' --device);
    each part stripped."""
    backend, colon, device = entry.partition(":")
    return backend.strip(), (device.strip() if colon else None)


def cuda_device_count() -> tuple[int, str]:
    """(the GPUs torch sees here, torch's version), asked of a child Python: CUDA started in launch itself could
    start driver threads before launch forks its workers (worker.launch_workers WorkerGroup.start)."""
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0, torch.__version__)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise ValueError(f"could not ask torch how many GPUs it sees (the child Python that asks "
                         f"{how_it_ended(done.returncode)}): {last}")  # fmt: skip
    count, version = done.stdout.split()
    return int(count), version


def check_devices(workers: Sequence[str], dense: str, gpus: Callable[[], tuple[int, str]] | None = None) -> None:
    """ValueError, before anything starts, for workers' devices that cannot run: --dense allreduce over more than
    one kind of device (gloo and nccl do not mix in one group); cuda workers where torch sees no GPU; --dense
    allreduce with more cuda workers than GPUs (nccl wants a GPU per worker). workers: resolve_workers's; gpus:
    what cuda_device_count gives (the default)."""
    devices = sorted({split_backend(w)[1] or "cpu" for w in workers})
    if dense == "allreduce" and len(devices) > 1:
        raise ValueError(f"--dense allreduce joins the workers in one torch.distributed group, gloo on the CPU and "
                         f"nccl on CUDA: its workers must all run on one kind of device, not {' and '.join(devices)} "
                         "(--dense ps trains the MLP on the servers and mixes devices)")  # fmt: skip
    on_cuda = [i for i, w in enumerate(workers) if split_backend(w)[1] == "cuda"]
    if not on_cuda:
        return
    count, version = (gpus or cuda_device_count)()
    which = f"worker{'s' * (len(on_cuda) > 1)} {', '.join(map(str, on_cuda))}"
    if count == 0:
        raise ValueError(f"{which} would run on cuda (--backends torch:cuda, or --device cuda), but torch {version} "
                         "sees no CUDA device here: run them on cpu, or on a machine with an NVIDIA GPU and a CUDA "
                         "build of torch")  # fmt: skip
    if dense == "allreduce" and len(on_cuda) > count:
        raise ValueError(f"--dense allreduce with {len(on_cuda)} cuda workers, but torch sees {count} "
                         f"GPU{'s' * (count != 1)} here: nccl wants a GPU of its own for each worker (worker i runs "
                         "on cuda:i); start fewer cuda workers, or use --dense ps, whose workers may share a GPU")  # fmt: skip


def resolve_workers(entries: Sequence[str], cfg: Any) -> tuple[str, ...]:
    """Each worker's backend and device as the launch plan, its summary and --metrics-out name them: "numpy",
    "torch" on the CPU, "torch:cuda" on a GPU. The device is the --backends entry's, else the train flags'
    (cfg.device); the pair, and the rest of the worker's config (as worker i: its --max-examples share), is
    checked by TrainConfig.validate (ValueError naming the entry and the worker)."""
    workers = []
    for i, entry in enumerate(entries):
        backend, device = split_backend(entry)
        worker_cfg = dataclasses.replace(cfg, backend=backend, device=device or cfg.device,  # its own share of
                                         worker_id=min(i, cfg.num_workers - 1))  # --max-examples, too  # fmt: skip
        try:
            worker_cfg.validate()
        except ValueError as e:
            if _not_the_entrys(worker_cfg, e):  # a flag of every worker's, not this backend or device
                raise ValueError(f"{e} (worker {i})" if cfg.num_workers > 1 and i else str(e)) from None
            hint = ""
            if device is None and cfg.device != "cpu":  # --device for every worker: give it to the torch ones
                torch_ones = any(split_backend(b)[0] == "torch" for b in entries)
                hint = (f"; to put only the torch workers on {cfg.device}, name it in --backends (torch:{cfg.device})"
                        " and leave --device out" if torch_ones else f"; {cfg.device} runs torch workers only: give "
                        f"--backends torch:{cfg.device}")  # fmt: skip
            raise ValueError(f"--backends {entry} (worker {i}): {e}{hint}") from None
        workers.append(backend if worker_cfg.device == "cpu" else f"{backend}:{worker_cfg.device}")
    return tuple(workers)


def _not_the_entrys(worker_cfg: Any, error: ValueError) -> bool:
    """Whether worker_cfg's validation error comes from the train flags, not from its --backends entry: the same
    config on numpy and the cpu fails the same way."""
    try:
        dataclasses.replace(worker_cfg, backend="numpy", device="cpu").validate()
    except ValueError as neutral:
        return str(neutral) == str(error)
    return False
