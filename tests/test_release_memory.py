"""release_memory(): what a comparison or a study calls between runs in one process."""

from __future__ import annotations

import ctypes
import sys

import pytest
import torch

from agentgym.algorithms.loop.run_control import release_memory, rss_bytes


def _glibc() -> bool:
    try:
        return hasattr(ctypes.CDLL("libc.so.6"), "malloc_trim")
    except OSError:
        return False


def test_rss_is_read_on_linux_and_release_never_raises():
    before, after = release_memory()
    if sys.platform.startswith("linux"):
        assert before is not None and after is not None and after > 10 * 2**20
        assert rss_bytes() > 10 * 2**20
    else:
        assert (before, after) == (None, None)


@pytest.mark.skipif(not _glibc(), reason="malloc_trim is glibc's: nothing to give back this way without it")
def test_the_heap_a_finished_run_freed_goes_back_to_the_system():
    """Tensors freed around a few survivors (the fragmented heap a run leaves) stay resident until
    release_memory() trims the heap: ~160 MB of 64 KB buffers, every 16th kept."""
    release_memory()
    blocks = [torch.ones(16 * 1024) for _ in range(2500)]      # 64 KB each: heap, under mmap's threshold
    kept = blocks[::16]
    del blocks
    freed, trimmed = release_memory()
    assert freed - trimmed > 80 * 2**20, (freed / 2**20, trimmed / 2**20)
    assert all(float(t[0]) == 1.0 for t in kept)              # what is still in use is untouched
