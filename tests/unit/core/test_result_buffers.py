"""The memory pool behind large collective results: reused only once no tensor sees it."""

from __future__ import annotations

import torch
from strategyjob.collective.result_buffers import MIN_POOLED_BYTES, ResultBuffers

NUMEL = MIN_POOLED_BYTES // 4  # float32: the smallest pooled size


def test_a_dropped_result_gives_its_memory_to_the_next():
    pool = ResultBuffers()
    first = pool.empty(NUMEL, torch.float32)
    address = first.data_ptr()
    del first
    assert pool.empty(NUMEL, torch.float32).data_ptr() == address


def test_memory_a_tensor_still_sees_is_never_handed_out():
    pool = ResultBuffers()
    first = pool.empty(NUMEL, torch.float32)
    first.fill_(7.0)
    view = first[10:20]  # a view keeps the storage alive after the result is dropped
    address = first.data_ptr()
    del first
    second = pool.empty(NUMEL, torch.float32)
    second.fill_(1.0)
    assert second.data_ptr() != address
    assert torch.equal(view, torch.full((10,), 7.0))


def test_small_results_and_results_beyond_the_cap_are_plain_tensors():
    pool = ResultBuffers(max_bytes=2 * MIN_POOLED_BYTES)
    small = pool.empty(100, torch.float64)
    assert small.shape == (100,) and small.dtype == torch.float64
    held = [pool.empty(NUMEL, torch.float32) for _ in range(3)]  # the third exceeds the cap
    assert len(pool._buffers) == 2
    assert all(t.shape == (NUMEL,) for t in held)
    held.clear()
    big = pool.empty(2 * NUMEL, torch.float32)  # evicts the two free buffers to make room
    assert len(pool._buffers) == 1 and big.numel() == 2 * NUMEL


def test_pooled_results_behave_like_tensors():
    pool = ResultBuffers()
    result = pool.empty(NUMEL, torch.float64)
    result.copy_(torch.arange(NUMEL, dtype=torch.float64))
    assert result.dtype == torch.float64 and result.is_contiguous()
    assert float(result.sum()) == NUMEL * (NUMEL - 1) / 2
    assert torch.equal(result.view(2, -1)[1, :3], torch.arange(NUMEL // 2, NUMEL // 2 + 3.0))
