"""The Markov chain of `qbench switchback --train-check`: sparse peaked rows, an exact stationary
distribution, the conditional entropy against a brute-force enumeration of sequences, and a sampler
whose transitions follow the matrix."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from qbench.benches.train_check import markov


@pytest.mark.parametrize("vocab,support", [(3, 2), (7, 3), (64, 8)])
def test_rows_are_sparse_distributions_with_the_cycle_in_their_support(vocab, support):
    P = markov.transition_matrix(vocab, support, seed=vocab)
    assert torch.allclose(P.sum(dim=1), torch.ones(vocab, dtype=torch.float64), atol=1e-12)
    assert ((P > 0).sum(dim=1) == support).all()
    rows = torch.arange(vocab)
    assert (P[rows, (rows + 1) % vocab] > 0).all() and (P[rows, (rows + 2) % vocab] > 0).all()
    again = markov.transition_matrix(vocab, support, seed=vocab)
    assert torch.equal(P, again)  # seeded: the same chain every run


def test_stationary_distribution_is_a_fixed_point():
    P = markov.transition_matrix(50, 5, seed=3)
    pi = markov.stationary(P)
    assert (pi > 0).all() and math.isclose(float(pi.sum()), 1.0, rel_tol=1e-12)
    assert torch.allclose(pi @ P, pi, atol=1e-14)


def _sequence_entropy(P, pi, n: int) -> float:
    """H(X_1 .. X_n) in nats by enumerating all V^n sequences, X_1 ~ pi."""
    vocab, total = P.shape[0], 0.0
    for seq in itertools.product(range(vocab), repeat=n):
        p = float(pi[seq[0]])
        for a, b in zip(seq, seq[1:]):
            p *= float(P[a, b])
        total -= p * math.log(p) if p > 0 else 0.0
    return total


@pytest.mark.parametrize("vocab,support,n", [(3, 2, 6), (4, 3, 5), (5, 4, 4)])
def test_entropy_rate_equals_brute_force_conditional_entropy(vocab, support, n):
    """H(X_n | X_1 .. X_n-1) = H(X_1..X_n) - H(X_1..X_n-1), enumerated, equals the closed form."""
    P = markov.transition_matrix(vocab, support, seed=11 * vocab)
    pi = markov.stationary(P)
    brute = _sequence_entropy(P, pi, n) - _sequence_entropy(P, pi, n - 1)
    assert math.isclose(markov.entropy_rate(P, pi), brute, rel_tol=1e-9)
    assert 0 < brute < math.log(support)  # peaked rows: below the entropy of a uniform row


def test_sampler_follows_the_chain():
    P = markov.transition_matrix(12, 4, seed=5)
    pi = markov.stationary(P)
    tokens = markov.sample(P, pi, sequences=4000, length=9, seed=1)
    assert tokens.shape == (4000, 9) and tokens.dtype == torch.int64
    prev, nxt = tokens[:, :-1].flatten(), tokens[:, 1:].flatten()
    assert (P[prev, nxt] > 0).all()  # never a zero-probability transition
    ones = torch.ones(len(prev), dtype=torch.float64)
    counts = torch.zeros(12, 12, dtype=torch.float64).index_put_((prev, nxt), ones, accumulate=True)
    empirical = counts / counts.sum(dim=1, keepdim=True)
    assert (empirical - P).abs().max() < 0.05  # ~2900 draws per row: 4 standard errors of a 0.5 probability
    start = torch.bincount(tokens[:, 0], minlength=12).double() / 4000
    assert (start - pi).abs().max() < 0.04
    cross_entropy = float(-P[prev, nxt].log().mean())
    assert abs(cross_entropy - markov.entropy_rate(P, pi)) < 0.03  # the floor is what the true model scores
    assert torch.equal(tokens, markov.sample(P, pi, 4000, 9, seed=1))
