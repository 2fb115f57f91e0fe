"""ps.engine.warmup.warm_up: a scratch table pulled and pushed in a temporary directory, removed afterwards; a
failure is reported, not raised."""

from __future__ import annotations

import logging
import tempfile

from ps.engine import warmup


def test_it_runs_in_a_directory_it_removes(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert warmup.warm_up() is True
    assert list(tmp_path.iterdir()) == []


def test_a_failure_is_logged_and_returns_false(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def broken_store(*args, **kwargs):
        raise OSError("no space left on device")

    monkeypatch.setattr(warmup, "Store", broken_store)
    with caplog.at_level(logging.WARNING, logger="ps.engine.warmup"):
        assert warmup.warm_up() is False
    assert "no space left on device" in caplog.text and "first request loads them" in caplog.text
    assert list(tmp_path.iterdir()) == []


def test_it_loads_the_kernels_of_large_requests_and_of_eviction(tmp_path):
    """What the first requests of a larger-than-RAM table take: the split over kernel threads, the parallel hash of a
    large journal record, the choice of victims and the index's deletes. In a process of its own, where nothing
    loaded them before (numba compiles, or loads from its cache, on a kernel's first call)."""
    import subprocess
    import sys

    script = (
        "from ps.engine.warmup import warm_up\n"
        "from ps.rows import parallel\n"
        "from ps.storage import arena, checksum, index\n"
        "assert warm_up()\n"
        "kernels = {'victims': arena._probation_victims, 'hash': checksum._hash_chunks, 'fold': checksum._fold,\n"
        "           'delete': index._delete}\n"
        "if parallel.THREADS > 1:\n"
        "    kernels['group'] = arena._group_by_home\n"
        "print(sorted(name for name, k in kernels.items() if not k.signatures))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout  # none left for a request to load
