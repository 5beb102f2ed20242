"""Membership inference on a trained model: train rows (members) vs held-out rows (non-members).

Two black-box threshold attacks, reported as the AUC of their score over a balanced set of
members and non-members (0.5 = no better than guessing; 1 = every member identified):

* ``auc_loss``: the loss-threshold attack of Yeom, Giacomelli, Fredrikson and Jha (CSF 2018,
  "Privacy risk in machine learning"): a row is called a member when its cross-entropy loss is
  low; score ``-l(x, y)``.
* ``auc_confidence``: the confidence-threshold attack of Salem et al. (NDSS 2019, "ML-Leaks",
  adversary 3): score ``max_k softmax(h(x))_k``, which needs no label (the paper's "model's output
  confidence").

Members are training rows, so the AUC is an exact statistic of the training records: it is
written under ``privacy.scope=paper`` only (``tracking/summary.py`` status ``exact``).
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
    """AUCs of both attacks on ``m = min(#members, #non-members)`` rows of each (a fixed,
    seeded subsample of the larger side, so the attack's prior is 1/2).

    >>> z = np.array([[3.0, 0.0], [0.0, 3.0], [0.2, 0.0], [0.0, 0.1]])
    >>> membership_inference(z[:2], np.array([0, 1]), z[2:], np.array([0, 1]))["auc_loss"]
    1.0
    """
    m = min(len(member_y), len(nonmember_y))
    rng = np.random.default_rng(seed)
    keep_in = np.sort(rng.choice(len(member_y), size=m, replace=False))
    keep_out = np.sort(rng.choice(len(nonmember_y), size=m, replace=False))
    lp_in, conf_in = _scores(member_logits[keep_in], member_y[keep_in])
    lp_out, conf_out = _scores(nonmember_logits[keep_out], nonmember_y[keep_out])
    return {
        "auc_loss": rank_auc(lp_in, lp_out),  # score -loss = log p(y | x)
        "auc_confidence": rank_auc(conf_in, conf_out),
        "n_members": float(m),
        "n_nonmembers": float(m),
    }
