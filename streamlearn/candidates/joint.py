"""Joint features φ(context, candidate) of candidate rows.

φ(x, c) = [c, vec(x ⊗ c), 1]: the candidate's own features, every shared-context ×
candidate-feature interaction (what Vowpal Wabbit's ``-q sc`` builds, here exact
rather than hashed) and a bias, so one shared weight vector scores any candidate of
any request. With no shared context (``d_x = 0``) φ is the candidate's features
and the bias.

>>> from streamlearn.candidates.sets import CandidateSets
>>> sets = CandidateSets(np.array([[2.0]]), np.array([[1.0, 3.0], [0.0, 1.0]]), np.array([0, 2]))
>>> joint_features(sets).tolist()
[[1.0, 3.0, 2.0, 6.0, 1.0], [0.0, 1.0, 0.0, 2.0, 1.0]]
"""

from __future__ import annotations

import numpy as np

from streamlearn.candidates.sets import CandidateSets
from streamlearn.errors import DataError

__all__ = ["MAX_JOINT_DIM", "joint_dim", "joint_features", "stored_joint_features"]

MAX_JOINT_DIM = 1 << 16


def joint_dim(d_x: int, d_c: int) -> int:
    """The dimension of φ for contexts of d_x and candidates of d_c features."""
    return d_c + d_x * d_c + 1


def joint_features(sets: CandidateSets) -> np.ndarray:
    """(N, joint_dim) φ of every candidate row, vectorised over the whole batch."""
    d_x, d_c = sets.context.shape[1], sets.items.shape[1]
    if joint_dim(d_x, d_c) > MAX_JOINT_DIM:
        raise DataError(f"Expected d_c + d_x·d_c + 1 <= {MAX_JOINT_DIM} joint features. Got "
                        f"d_x = {d_x}, d_c = {d_c}: {joint_dim(d_x, d_c)}.")
    N = len(sets.items)
    phi = np.empty((N, joint_dim(d_x, d_c)))  # filled in place: no stacked temporaries
    phi[:, :d_c] = sets.items
    if d_x:
        context = sets.context[sets.request_of]
        phi[:, d_c:-1] = (context[:, :, None] * sets.items[:, None, :]).reshape(N, d_x * d_c)
    phi[:, -1] = 1.0
    return phi


def stored_joint_features(rows: np.ndarray, d_x: int, d_c: int, column: int = 0) -> np.ndarray:
    """φ of stored candidate rows ``[context (d_x), candidate (d_c), exploit candidate (d_c)]``
    (pending joins, experience-log rows): ``column`` 0 for the candidate, 1 for the exploit
    candidate."""
    start = d_x + column * d_c
    return joint_features(CandidateSets(rows[:, :d_x], rows[:, start:start + d_c],
                                        np.arange(len(rows) + 1)))
