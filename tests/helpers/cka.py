"""Linear CKA as the textbook writes it, on the full Gram matrices: the reference the similarity job must equal."""

from __future__ import annotations

import torch


def textbook_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA on the full n x n Gram matrices: HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)), HSIC = tr(K H L H)."""
    x, y = x.double().reshape(x.shape[0], -1), y.double().reshape(y.shape[0], -1)
    n = x.shape[0]
    h = torch.eye(n, dtype=torch.float64) - 1.0 / n
    k, l_ = h @ (x @ x.T) @ h, h @ (y @ y.T) @ h

    def hsic(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a * b).sum())

    return hsic(k, l_) / float((hsic(k, k) * hsic(l_, l_)) ** 0.5)
