"""Fixtures for the generation tests (helpers in tests/helpers/generation.py)."""

import pytest

from tests.helpers.generation import ByteTokenizer
from tests.helpers.generation import byte_bpe as _byte_bpe


@pytest.fixture(scope="session")
def byte_bpe():
    return _byte_bpe()


@pytest.fixture
def byte_tokenizer() -> ByteTokenizer:
    return ByteTokenizer()
