"""Models for the decoding tests: a random one with a tiny vocabulary and one trained on the
copy task until it copies a held-out set (peaked distributions, so its outputs are meaningful)."""

from __future__ import annotations

import pytest
import torch

from attnkit.models import Transformer
from tests.helpers.decoding import tiny_config, train_copy_model


@pytest.fixture(scope="session")
def random_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_config(24)).eval()


@pytest.fixture(scope="session")
def copy_model() -> Transformer:
    return train_copy_model()
