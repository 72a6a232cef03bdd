"""Statistics the tests judge sampled text by."""

from __future__ import annotations

from collections import Counter

import torch


def chi_square_p(a: Counter[int], b: Counter[int]) -> float:
    """Two samples from one distribution? Pearson's test of homogeneity over the tokens
    both saw at least 5 times in all (the rest pooled), its p-value."""
    total = a + b
    kept = [t for t, n in total.items() if n >= 10]
    rows = [[a[t] for t in kept], [b[t] for t in kept]]
    rows[0].append(sum(a.values()) - sum(rows[0]))
    rows[1].append(sum(b.values()) - sum(rows[1]))
    table = torch.tensor(rows, dtype=torch.float64)
    table = table[:, table.sum(0) > 0]
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    chi2 = float(((table - expected) ** 2 / expected).sum())
    df = table.shape[1] - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2), torch.tensor(chi2 / 2)))
