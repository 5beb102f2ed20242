"""Checkpoints stay loadable: the ``state_dict`` of both ResNets, every key with its shape, is
the one main's code built before ResNet16 and ResNet20 became one :class:`ResNet` with a stem
argument.  Recorded from that code as a count, a SHA-256 of the ``"<key> <shape>"`` lines in
order, and a readable sample of keys (seeded initial weights were checked equal then too)."""

from __future__ import annotations

import hashlib

import pytest

from raco_cli import models

# model name: (input shape, classes, number of keys, SHA-256 of the "<key> <shape>" lines), with
# conf/model/<name>.yaml's settings
EXPECTED = {
    "resnet16": ((3, 64, 64), 2, 56, "93f74e4ac277a32c7049c5dac64a69f750d81d7cee344583c57194dc829f869e"),
    "resnet20": ((3, 32, 32), 10, 65, "09392b13cb5e89ab3761638818a90df5e9a9c7931e849a10f6d422ad591ecbc5"),
}
# a readable sample of what the digests pin: stem, a block, a shortcut, the head
SAMPLE = {
    "resnet16": {"stem.0.weight": (64, 3, 7, 7), "stem.1.bias": (64,), "stages.0.1.conv2.weight": (64, 64, 3, 3),
                 "stages.1.0.shortcut.0.weight": (128, 64, 1, 1), "stages.3.0.norm2.weight": (512,), "head.weight": (2, 512)},
    "resnet20": {"stem.0.weight": (16, 3, 3, 3), "stem.1.bias": (16,), "stages.0.2.conv2.weight": (16, 16, 3, 3),
                 "stages.2.0.shortcut.1.weight": (64,), "stages.2.2.norm2.bias": (64,), "head.weight": (10, 64)},
}


def shapes(model) -> dict[str, tuple[int, ...]]:  # noqa: ANN001
    return {key: tuple(value.shape) for key, value in model.state_dict().items()}


def digest(layout: dict[str, tuple[int, ...]]) -> str:
    return hashlib.sha256("\n".join(f"{key} {shape}" for key, shape in layout.items()).encode()).hexdigest()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_state_dict_keys_and_shapes_are_main_s(name: str) -> None:
    input_shape, n_classes, count, sha256 = EXPECTED[name]
    got = shapes(models.build(name, input_shape=input_shape, n_classes=n_classes))
    assert {key: got.get(key) for key in SAMPLE[name]} == SAMPLE[name]
    assert len(got) == count
    assert digest(got) == sha256, "keys, their order or shapes changed:\n" + "\n".join(f"{k} {s}" for k, s in got.items())


def test_options_change_shapes_not_keys():
    """Width, groups and the stem's max-pool change no key (a max-pool has no parameters)."""
    default16 = shapes(models.build("resnet16", input_shape=(3, 64, 64), n_classes=2))
    narrow16 = shapes(models.build("resnet16", input_shape=(3, 32, 32), n_classes=2, options={"width": 0.25, "groups": 4, "stem_pool": False}))
    assert list(narrow16) == list(default16)
    assert narrow16["stem.0.weight"] == (16, 3, 7, 7)
    default20 = shapes(models.build("resnet20", input_shape=(3, 32, 32), n_classes=10))
    narrow20 = shapes(models.build("resnet20", input_shape=(1, 8, 8), n_classes=2, options={"width": 0.5, "groups": 4}))
    assert list(narrow20) == list(default20)
    assert narrow20["stem.0.weight"] == (8, 1, 3, 3)
