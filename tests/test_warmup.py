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
