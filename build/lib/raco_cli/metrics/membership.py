"""Membership inference on a trained model: train rows (members) vs held-out rows (non-members).

Two black-box threshold attacks, reported as the AUC of their score over a balanced set of
members and non-members (0.5 = no better than guessing; 1 = every member identified):

* ``auc_loss``: the loss-threshold attack of Yeom, Giacomelli, Fredrikson and Jha (CSF 2018,
  "Privacy risk in machine learning"): a row is called a member when its cross-entropy loss is
  low; score ``-l(x, y)``.
* ``auc_confidence``: the confidence-threshold attack of Salem et al. (NDSS 2019, "ML-Leaks",
  adversary 3): score ``max_k softmax(h(x))_k``, which needs no label (the paper's "model's output
  confidence").

Non-members are the *validation* rows: drawn from the same pool as the training rows (the
test split of an -ST dataset is rebalanced, and a population with other label proportions
would be told apart by its labels, not by membership).  Members are training rows, so the AUC
is an exact statistic of the training records: it is written under ``privacy.scope=paper``
only (``tracking/summary.py`` status ``exact``).
"""

from __future__ import annotations

import numpy as np

from raco_cli.metrics.robust import rank_auc


def _scores(logits: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return logp[np.arange(len(y)), y], np.exp(logp.max(axis=1))


def membership_inference(
    member_logits: np.ndarray, member_y: np.ndarray, nonmember_logits: np.ndarray, nonmember_y: np.ndarray, *, seed: int = 0
) -> dict[str, float]:
    """AUCs of both attacks on equally many members and non-members *with the same label counts*:
    for each label, ``min(#members, #non-members)`` rows of each side (a fixed, seeded
    subsample), so the attack's prior is 1/2 and a difference in label balance between the two
    populations (imbalanced training pool, balanced test set) cannot pass for membership.

    >>> z = np.array([[3.0, 0.0], [0.0, 3.0], [0.2, 0.0], [0.0, 0.1]])
    >>> membership_inference(z[:2], np.array([0, 1]), z[2:], np.array([0, 1]))["auc_loss"]
    1.0
    """
    rng = np.random.default_rng(seed)
    keep_in, keep_out = [], []
    for label in np.unique(np.concatenate([member_y, nonmember_y])):
        rows_in, rows_out = np.flatnonzero(member_y == label), np.flatnonzero(nonmember_y == label)
        m = min(len(rows_in), len(rows_out))
        keep_in.append(rng.choice(rows_in, size=m, replace=False))
        keep_out.append(rng.choice(rows_out, size=m, replace=False))
    i_in, i_out = np.sort(np.concatenate(keep_in)), np.sort(np.concatenate(keep_out))
    lp_in, conf_in = _scores(member_logits[i_in], member_y[i_in])
    lp_out, conf_out = _scores(nonmember_logits[i_out], nonmember_y[i_out])
    return {
        "auc_loss": rank_auc(lp_in, lp_out),  # score -loss = log p(y | x)
        "auc_confidence": rank_auc(conf_in, conf_out),
        "n_members": float(len(i_in)),
        "n_nonmembers": float(len(i_out)),
    }
