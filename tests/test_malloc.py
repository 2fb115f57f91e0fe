"""ps.accel.malloc.tune_malloc: glibc's mallopt settings where glibc is there; a False and no change elsewhere."""

from __future__ import annotations

import ctypes

import pytest

from ps.accel import malloc


class _LibcWithoutMallopt:  # musl or macOS, as far as tune_malloc can tell: no mallopt symbol
    def __getattr__(self, name: str):
        raise AttributeError(name)


class _RecordingLibc:
    def __init__(self, answer: int):
        self.calls: list[tuple[int, int]] = []
        self.answer = answer

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return self.answer


def test_without_mallopt_it_returns_false_and_changes_nothing(monkeypatch):
    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **k: _LibcWithoutMallopt())
    assert malloc.tune_malloc() is False


def test_without_a_c_library_it_returns_false(monkeypatch):
    def no_library(*a, **k):
        raise OSError("libc.so.6: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", no_library)
    assert malloc.tune_malloc() is False


@pytest.mark.parametrize("answer, ok", [(1, True), (0, False)])
def test_it_sets_the_three_thresholds_and_says_whether_they_took(monkeypatch, answer, ok):
    libc = _RecordingLibc(answer)
    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **k: libc)
    assert malloc.tune_malloc() is ok
    m_trim_threshold, m_mmap_threshold, m_arena_max = -1, -3, -8
    expected = [(m_mmap_threshold, 16 << 20), (m_arena_max, 2), (m_trim_threshold, 64 << 20)]
    assert libc.calls == (expected if ok else expected[:1])  # a refusal stops at the first setting


def test_a_memory_bound_maps_buffers_from_a_smaller_size(monkeypatch):
    libc = _RecordingLibc(1)
    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **k: libc)
    assert malloc.tune_malloc(malloc.BOUNDED_TRIM_THRESHOLD, malloc.BOUNDED_MMAP_THRESHOLD) is True
    m_trim_threshold, m_mmap_threshold, m_arena_max = -1, -3, -8
    assert libc.calls == [(m_mmap_threshold, 1 << 20), (m_arena_max, 2), (m_trim_threshold, 4 << 20)]
