"""The release of a model's certificate (``constraint.confidence`` under ``privacy.scope=model``).

After training, the released model's hard predictions on the validation split are counted per
(cell of the constraint's partition, predicted class) and released once as exact integers

    c~_{q,k} = c_{q,k} + Z_{q,k},   Z i.i.d. N_Z(0, sigma_Z^2),   sigma_Z = ceil(sqrt(sigma^2 + 4)),

the discrete Gaussian of :mod:`raco_cli.privacy.discrete` (no floating-point channel).  The
model is a post-processing of the training releases, so given it each validation record falls
in exactly one (cell, class) count: adding or removing a record changes one count by 1 (a
training record changes none), L2 sensitivity 1, and the release composes adaptively with
training as ``GaussianDpEvent(sigma)`` in the run's DpEvent tree (the convolution lemma of
:mod:`raco_cli.privacy.discrete`: as for the size count, :mod:`raco_cli.privacy.size`).
``sigma = privacy.certificate_noise_multiplier``.  What the counts certify:
:mod:`raco_cli.constraints.certificate`.
"""

from __future__ import annotations

import dp_accounting as dpa
import numpy as np

from raco_cli.privacy import releases
from raco_cli.privacy.discrete import noisy_integer_counts
from raco_cli.privacy.mechanisms import NoiseSource


def certificate_event(noise_multiplier: float) -> dpa.DpEvent:
    """The DpEvent of :func:`noisy_counts` (L2 sensitivity 1 under add/remove of one record)."""
    return dpa.GaussianDpEvent(noise_multiplier)


def noisy_counts(counts: np.ndarray, *, noise_multiplier: float, source: NoiseSource) -> np.ndarray:
    """``counts + Z`` (module docstring, :func:`raco_cli.privacy.discrete.noisy_integer_counts`),
    int64 of the same shape, through the replay tape.

    >>> import torch
    >>> noisy_counts(np.array([[10, 20]]), noise_multiplier=1e-9, source=torch.Generator().manual_seed(0)).shape
    (1, 2)
    """
    return np.asarray(releases.release("certificate", lambda: noisy_integer_counts(counts, noise_multiplier, source)), dtype=np.int64)
