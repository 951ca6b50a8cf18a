"""attnkit.pretrained_loading: any model folder loads by what its config.json says, as its
own loader (GPT.from_pretrained, BertModel.from_pretrained, the translation loader) and Hugging
Face load it."""

from __future__ import annotations

import json

import pytest
import torch

from attnkit.pretrained_loading import load_pretrained


def test_load_pretrained_dispatches_on_the_config(tmp_path):
    from attnkit.decoding import shipped_model_dir
    from attnkit.models import Transformer
    from attnkit.models.bert import BertModel, default_model_dir

    translation = load_pretrained(None)  # the shipped model
    assert translation.model_type == "translation" and translation.folder == shipped_model_dir()
    assert isinstance(translation.model, Transformer) and not translation.model.training
    bert = load_pretrained(default_model_dir())
    assert bert.model_type == "bert" and isinstance(bert.model, BertModel)
    assert bert.tokenizer is bert.model.tokenizer
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(
        ValueError,
        match=r"model_type 't5' is not one attnkit reads; expected a translation, bert, gpt2, "
        r"llama, mistral or qwen2 model folder",
    ):
        load_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("[]")
    with pytest.raises(ValueError, match=r"config.json: expected a JSON object"):
        load_pretrained(tmp_path)


def test_load_pretrained_reads_a_gpt2_folder_as_gpt_from_pretrained_does(tmp_path):
    """A GPT-2 folder written by Hugging Face loads as a GPT with its tokenizer, the same
    logits as GPT.from_pretrained gives, in eval mode."""
    from attnkit.models import GPT
    from tests.helpers.generation import byte_bpe, tiny_gpt2_config
    from tests.helpers.gpt import write_hf_gpt2_folder

    hf = write_hf_gpt2_folder(tmp_path, tiny_gpt2_config(), byte_bpe())
    loaded = load_pretrained(tmp_path)
    assert loaded.model_type == "gpt2" and loaded.folder == tmp_path
    assert isinstance(loaded.model, GPT) and not loaded.model.training
    assert loaded.tokenizer is loaded.model.tokenizer and loaded.tokenizer is not None
    ids = torch.tensor([loaded.tokenizer.encode("the cat sat")])
    with torch.no_grad():
        expected = hf(ids).logits
    torch.testing.assert_close(loaded.model(ids).logits, expected, rtol=1e-4, atol=1e-5)
    direct = GPT.from_pretrained(tmp_path)
    pairs = zip(direct.state_dict().values(), loaded.model.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_load_pretrained_reads_a_llama_folder_as_a_gpt(tmp_path):
    """A Llama folder (grouped-query attention) written by Hugging Face loads as a GPT with its
    tokenizer and Hugging Face's logits; its kind is "llama" and it counts as a GPT."""
    from attnkit import model_folder as mf
    from attnkit.models import GPT
    from tests.helpers.generation import byte_bpe, tiny_llama_config
    from tests.helpers.gpt import write_hf_llama_folder

    hf = write_hf_llama_folder(tmp_path, tiny_llama_config(), byte_bpe())
    loaded = load_pretrained(tmp_path)
    assert loaded.model_type == "llama" and loaded.is_gpt and mf.model_kind(tmp_path) == "llama"
    assert isinstance(loaded.model, GPT) and not loaded.model.training
    assert loaded.model.config.num_kv_heads == 2 and loaded.model.config.positional == "rope"
    ids = torch.tensor([loaded.tokenizer.encode("the cat sat")])
    with torch.no_grad():
        expected = hf(ids).logits
    torch.testing.assert_close(loaded.model(ids).logits, expected, rtol=1e-4, atol=1e-5)
