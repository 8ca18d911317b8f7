"""The synthetic task of `qbench train-check`: next-token prediction on a fixed random
Markov chain, whose best achievable loss is known exactly.

Chain: vocab V, transition matrix P [V, V] (float64, rows sum to 1). Row i has `support` non-zero
entries: i+1 and i+2 (mod V), which make the chain irreducible and aperiodic (cycles of lengths V and
V-1 have gcd 1), plus support-2 columns drawn at random; their probabilities are a softmax of
`sharpness` x N(0, 1) logits, so rows are sparse and peaked. pi [V]: the stationary distribution
(pi P = pi), solved exactly as a linear system.
Entropy floor: sequences start from pi, so every position is stationary and the best possible
expected cross-entropy of predicting x[t+1] from x[0..t] is the conditional entropy
    H = -sum_i pi_i sum_j P_ij ln P_ij   (nats per token; 0 ln 0 = 0).
"""

from __future__ import annotations

import torch


def transition_matrix(vocab: int, support: int, seed: int, sharpness: float = 1.5) -> torch.Tensor:
    """P [V, V] float64, `support` non-zeros per row (see the module docstring)."""
    if not 2 <= support <= vocab:
        raise ValueError(f"support must be in [2, vocab = {vocab}], not {support}")
    gen = torch.Generator().manual_seed(seed)
    rows = torch.arange(vocab)
    scores = torch.rand(vocab, vocab, generator=gen, dtype=torch.float64)
    scores[rows, (rows + 1) % vocab] = 2.0  # > any draw in [0, 1): always in the support
    scores[rows, (rows + 2) % vocab] = 2.0
    columns = scores.topk(support, dim=1).indices  # [V, support], distinct per row
    logits = sharpness * torch.randn(vocab, support, generator=gen, dtype=torch.float64)
    return torch.zeros(vocab, vocab, dtype=torch.float64).scatter_(1, columns, logits.softmax(dim=1))


def stationary(P: torch.Tensor) -> torch.Tensor:
    """pi [V] with pi P = pi and sum(pi) = 1: (P^T - I) pi = 0 with one equation swapped for the sum."""
    vocab = P.shape[0]
    A = P.t() - torch.eye(vocab, dtype=P.dtype)
    A[-1] = 1.0
    b = torch.zeros(vocab, dtype=P.dtype)
    b[-1] = 1.0
    return torch.linalg.solve(A, b)


def entropy_rate(P: torch.Tensor, pi: torch.Tensor | None = None) -> float:
    """H = -sum_i pi_i sum_j P_ij ln P_ij in nats per token."""
    pi = stationary(P) if pi is None else pi
    plogp = torch.where(P > 0, P * P.clamp_min(1e-300).log(), torch.zeros_like(P))
    return float(-(pi * plogp.sum(dim=1)).sum())


def sample(P: torch.Tensor, pi: torch.Tensor, sequences: int, length: int, seed: int) -> torch.Tensor:
    """tokens [sequences, length] int64: x0 ~ pi, x[t+1] ~ P[x[t]]. Inverse CDF, one uniform u in [0, 1)
    per token: the first column whose CDF exceeds u (right=True never picks a zero-probability column)."""
    gen = torch.Generator().manual_seed(seed)
    width = int((P > 0).sum(dim=1).max())
    probs, columns = P.topk(width, dim=1)  # [V, width]: each row's support, so a draw gathers `width` values
    cdf = probs.cumsum(dim=1)
    cdf[:, -1] = 1.0  # rounding must not leave a draw of u ~ 1 past the last column
    pi_cdf = pi.cumsum(dim=0)
    pi_cdf[-1] = 1.0
    u = torch.rand(sequences, length, generator=gen, dtype=torch.float64)
    tokens = torch.empty(sequences, length, dtype=torch.int64)
    tokens[:, 0] = torch.searchsorted(pi_cdf, u[:, :1].contiguous(), right=True).squeeze(1).clamp_(max=len(pi) - 1)
    for t in range(1, length):
        prev = tokens[:, t - 1]
        pick = torch.searchsorted(cdf[prev], u[:, t : t + 1].contiguous(), right=True).clamp_(max=width - 1)
        tokens[:, t] = columns[prev].gather(1, pick).squeeze(1)
    return tokens
