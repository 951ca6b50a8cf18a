"""attnkit.models.gpt_tokenizer: decoding refuses ids that are not integers of the vocabulary
(a negative id was an OverflowError from the tokenizers library, a float id was rounded)."""

from __future__ import annotations

import pytest
import torch

from attnkit.models.gpt_tokenizer import GPTTokenizer
from tests.helpers.gpt import train_byte_bpe


@pytest.fixture(scope="module")
def tokenizer() -> GPTTokenizer:
    return GPTTokenizer(train_byte_bpe(["the cat sat on the mat", "a dog ran"] * 20), eos_id=0)


def test_decode_round_trips(tokenizer):
    ids = tokenizer.encode("the cat")
    assert tokenizer.decode(ids) == "the cat"
    assert tokenizer.decode(torch.tensor(ids)) == "the cat"


@pytest.mark.parametrize(
    "ids, message",
    [
        ([-1], r"ids\[0\]: id -1 is outside the vocabulary \[0, "),
        ([10**9], r"ids\[0\]: id 1000000000 is outside the vocabulary \[0, "),
        ([1.5], r"ids\[0\]: expected an integer id, got 1.5"),
        (torch.tensor([1.0]), r"ids: expected a 1-D tensor of integer ids"),
    ],
)
def test_decode_refuses_what_is_not_an_id_of_the_vocabulary(tokenizer, ids, message):
    with pytest.raises(ValueError, match=message):
        tokenizer.decode(ids)
