"""attnkit.training.bleu: the val_bleu hook decodes with its tokenizer's special ids and scores
as sacreBLEU does."""

from __future__ import annotations

import sacrebleu
import torch

from attnkit.data import ParallelCorpus
from attnkit.decoding import DecodingConfig, generate
from attnkit.models import Transformer
from attnkit.training.bleu import bleu_eval_hook
from tests.helpers.decoding import tiny_config


class _Tokenizer:
    """Special ids that are not attnkit's 0/1/2 (pad 0, bos 22, eos 23); a word per id."""

    pad_id, bos_id, eos_id = 0, 22, 23

    def encode_batch(self, lines):
        return [[4 + (ord(c) - ord("a")) % 18 for c in line.replace(" ", "")] for line in lines]

    def decode_batch(self, batch):
        return [" ".join(f"w{i}" for i in ids) for ids in batch]


def test_hook_decodes_with_the_tokenizers_ids_and_scores_like_sacrebleu():
    torch.manual_seed(0)
    model = Transformer(tiny_config(24)).eval()
    tokenizer = _Tokenizer()
    sources = ["abc", "hello world", "xyz", "attention"]
    # Reference translations: greedy search given the ids by hand.
    explicit = DecodingConfig(beam_size=1, bos_id=22, eos_id=23)
    hypotheses = []
    for line in sources:
        src = torch.tensor([[*tokenizer.encode_batch([line])[0], 23]])
        (hyps,) = generate(model, src, explicit)
        hypotheses.append(tokenizer.decode_batch([hyps[0].tokens])[0])
    assert not any({"w22", "w23"} & set(h.split()) for h in hypotheses)
    # Half the references are the outputs themselves, so the score is neither 0 nor 100.
    references = [hypotheses[0], "w5 w6 w7 w8", hypotheses[2], "w9 w9 w9"]
    corpus = ParallelCorpus(src=sources, tgt=references)
    got = bleu_eval_hook(tokenizer, corpus)(model)
    want = sacrebleu.corpus_bleu(hypotheses, [references]).score
    assert 0 < want < 100
    assert got == {"val_bleu": want}
