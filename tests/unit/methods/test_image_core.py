"""The shared loop on image rows: in-memory and lazily generated images give the same run."""

from __future__ import annotations

import numpy as np
import torch
from specs import paper_spec

from raco_cli import constraints, data, models
from raco_cli.methods.base import NullReporter, Seeds
from raco_cli.methods.sgda import raco_dp


def _fit(ds, steps=2):
    cons = constraints.build("dp", n_classes=2, n_groups=2, gamma=0.05)
    model = models.build("resnet16", input_shape=ds.input_shape, n_classes=2, options={"width": 0.125, "groups": 4, "blocks": [1, 1, 1, 1]})
    spec = paper_spec(name="raco_dp", batch_size=12, steps=steps, eval_every=steps, micro_batch=5, lr=0.2,
                      clip_norm=1.0, noise_multiplier=1.0, hist_noise_multiplier=2.0, selection="last")
    return raco_dp.fit(ds, model, cons, spec, steps=steps, seeds=Seeds.from_seed(3), device=torch.device("cpu"), reporter=NullReporter())


def test_lazy_and_in_memory_images_give_the_same_run():
    lazy = data.load("synthetic_images", data_dir=".", options={"n": 60, "size": 8, "lazy": True})
    eager = data.load("synthetic_images", data_dir=".", options={"n": 60, "size": 8, "lazy": False})
    assert isinstance(eager.X, np.ndarray) and eager.X.shape == (60, 3, 8, 8) and lazy.input_shape == (3, 8, 8)
    a, b = _fit(lazy), _fit(eager)
    for k in a.state_dict:
        torch.testing.assert_close(a.state_dict[k], b.state_dict[k])
    assert a.releases == {"laplace_histogram": 2, "gaussian_gradient": 2}
    assert a.stats["throughput_images_per_s"] > 0
    assert a.history[-1].metrics["test"]["n"] == len(lazy.splits["test"])
