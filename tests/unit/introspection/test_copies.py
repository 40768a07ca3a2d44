"""Captured copies are NCHW, detached, equal to the tensor bit for bit, however it is laid out."""

from __future__ import annotations

import pytest
import torch

from service.introspection.copies import MIN_SAMPLE_ELEMENTS, detached_copy


@pytest.mark.parametrize(
    "shape",
    [
        (3, 64, 112, 112),  # large: transposed sample by sample
        (2, 5, 131, 97),  # odd sizes
        (4, 512, 7, 7),  # many channels, few positions
        (2, 64, 8, 8),  # just the per-sample size
        (1, 3, 300, 400),  # an input image: 3 channels
        (2, 8, 4, 4),  # small: one pass
        (1, 1, 512, 512),  # one channel: NHWC is NCHW already
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_copy_is_nchw_and_equal(shape: tuple[int, int, int, int], dtype: torch.dtype) -> None:
    t = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    for layout in (torch.channels_last, torch.contiguous_format):
        source = t.clone().contiguous(memory_format=layout).requires_grad_(True)
        copy = detached_copy(source)
        assert copy.is_contiguous()
        assert not copy.requires_grad
        assert copy.dtype == dtype
        assert torch.equal(copy, t)
        assert copy.data_ptr() != source.data_ptr()
        with torch.no_grad():
            source.add_(1.0)  # a later in-place op does not reach the copy
        assert torch.equal(copy, t)


def test_maps_in_neither_layout_are_copied_as_they_are() -> None:
    t = torch.randn(3, 64, 112, 112).contiguous(memory_format=torch.channels_last)
    assert t[0].numel() >= MIN_SAMPLE_ELEMENTS
    strided = t.permute(0, 2, 3, 1)[:, ::2]  # neither layout: the plain clone
    assert torch.equal(detached_copy(strided), strided.contiguous())
    assert torch.equal(detached_copy(t[:, :, ::2]), t[:, :, ::2].contiguous())


def test_an_empty_batch_is_an_empty_copy() -> None:
    t = torch.randn(0, 64, 16, 16).contiguous(memory_format=torch.channels_last)
    copy = detached_copy(t)
    assert copy.shape == (0, 64, 16, 16)
    assert copy.is_contiguous()
