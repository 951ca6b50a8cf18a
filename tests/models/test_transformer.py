"""The encoder-decoder Transformer: config, shared embeddings, incremental decoding, padding,
dtypes and dropout, at toy sizes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnkit.models import Transformer, TransformerConfig

TOL = dict(atol=1e-5, rtol=0)
V = 20  # vocabulary; id 0 is padding


def small_config(**overrides) -> TransformerConfig:
    kw = dict(
        src_vocab_size=V,
        tgt_vocab_size=V,
        d_model=16,
        num_heads=2,
        num_encoder_layers=2,
        num_decoder_layers=2,
        d_ff=32,
        dropout=0.0,
        attn_dropout=0.0,
        max_len=16,
    )
    kw.update(overrides)
    return TransformerConfig(**kw)


def make_model(seed=0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(small_config(**overrides)).eval()


def padded_batch():
    """Sources and targets of different lengths, right-padded with 0."""
    src_lengths, tgt_lengths = [6, 3, 1], [5, 2, 4]
    g = torch.Generator().manual_seed(1)
    src = torch.randint(1, V, (3, 6), generator=g)
    tgt = torch.randint(1, V, (3, 5), generator=g)
    for i, (s, t) in enumerate(zip(src_lengths, tgt_lengths, strict=True)):
        src[i, s:] = 0
        tgt[i, t:] = 0
    return src, tgt, src_lengths, tgt_lengths


# --------------------------------------------------------------------------- config


def test_config_validation():
    with pytest.raises(
        ValueError, match=r"positional: expected one of \['sinusoidal', 'learned'\], got 'rope'"
    ):
        small_config(positional="rope")
    with pytest.raises(ValueError, match=r"src_vocab_size=20 and tgt_vocab_size=30"):
        small_config(tgt_vocab_size=30)
    small_config(tgt_vocab_size=30, share_embeddings=False)  # fine without sharing
    with pytest.raises(ValueError, match=r"unknown keys \['heads'\]"):
        TransformerConfig.from_dict({"d_model": 16, "heads": 2})
    with pytest.raises(ValueError, match=r"d_model=16, num_heads=3"):
        Transformer(small_config(num_heads=3))


def test_config_round_trip():
    config = small_config(positional="learned", norm_first=False, activation="gelu")
    d = config.to_dict()
    assert d["positional"] == "learned" and d["d_model"] == 16
    assert TransformerConfig.from_dict(d) == config
    assert set(d) == {f.name for f in dataclasses.fields(TransformerConfig)}


# --------------------------------------------------------------------------- embeddings


def test_shared_and_tied_embeddings_share_storage():
    model = make_model()
    src, tgt, out = model.src_embed.weight, model.tgt_embed.weight, model.output.weight
    assert src is tgt is out
    assert src.data_ptr() == tgt.data_ptr() == out.data_ptr()
    assert sum(p is src for p in model.parameters()) == 1  # counted once
    # A training step moves all three together.
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    ids = torch.tensor([[3, 4, 5]])
    model(ids, ids).sum().backward()
    opt.step()
    assert torch.equal(model.src_embed.weight, model.output.weight)
    assert torch.equal(model.tgt_embed.weight, model.output.weight)


def test_tied_output_without_shared_embeddings():
    model = make_model(share_embeddings=False, tgt_vocab_size=25)
    assert model.output.weight is model.tgt_embed.weight
    assert model.output.weight.data_ptr() == model.tgt_embed.weight.data_ptr()
    assert model.src_embed.weight.data_ptr() != model.tgt_embed.weight.data_ptr()
    assert model.src_embed.weight.shape == (V, 16) and model.output.weight.shape == (25, 16)


def test_untied_output_has_its_own_storage():
    model = make_model(share_embeddings=False, tie_output=False)
    ptrs = {model.src_embed.weight.data_ptr(), model.tgt_embed.weight.data_ptr()}
    assert model.output.weight.data_ptr() not in ptrs and len(ptrs) == 2


def test_pad_embedding_is_zero():
    model = make_model()
    assert (model.src_embed.weight[0] == 0).all()


# --------------------------------------------------------------------------- decoding


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
@pytest.mark.parametrize("norm_first", [True, False])
def test_incremental_decoding_equals_teacher_forcing(norm_first, positional):
    model = make_model(norm_first=norm_first, positional=positional)
    src, tgt, _, _ = padded_batch()
    tgt = tgt.clamp(min=1)  # every position real
    with torch.no_grad():
        memory, src_mask, _ = model.encode(src)
        full = model.decode(tgt, memory, src_mask).output  # (B, T, V)
        caches = model.init_cache(3, tgt.shape[1], memory)
        steps = [
            model.decode(tgt[:, t : t + 1], memory, src_mask, caches=caches, offset=t).output
            for t in range(tgt.shape[1])
        ]
    assert full.shape == (3, 5, V)
    torch.testing.assert_close(torch.cat(steps, 1), full, **TOL)
    torch.testing.assert_close(full, model(src, tgt), **TOL)


def test_reordered_caches_follow_the_selected_rows():
    model = make_model()
    src, tgt, _, _ = padded_batch()
    tgt = tgt.clamp(min=1)
    index = torch.tensor([2, 0, 0])  # what beam search does between steps
    with torch.no_grad():
        memory, src_mask, _ = model.encode(src)
        caches = model.init_cache(3, 5, memory)
        for t in range(2):
            model.decode(tgt[:, t : t + 1], memory, src_mask, caches=caches, offset=t)
        for self_cache, cross_cache in caches:
            self_cache.reorder(index)
            cross_cache.reorder(index)
        tgt_r, memory_r, src_mask_r = tgt[index], memory[index], src_mask[index]
        steps = [
            model.decode(tgt_r[:, t : t + 1], memory_r, src_mask_r, caches=caches, offset=t).output
            for t in range(2, 5)
        ]
        full = model.decode(tgt_r, memory_r, src_mask_r).output
    torch.testing.assert_close(torch.cat(steps, 1), full[:, 2:], **TOL)


def test_a_cached_step_at_the_wrong_offset_is_refused():
    """Before: an empty cache with offset=3 gave position 3's encoding to what the cache takes
    as position 0 (or, offset=-1, torch's broadcast error)."""
    model = make_model()
    src, tgt, _, _ = padded_batch()
    with torch.no_grad():
        memory, src_mask, _ = model.encode(src)
        caches = model.init_cache(3, 5, memory)
        for offset in (3, -1):
            with pytest.raises(ValueError, match=rf"offset={offset}: the cache holds 0 target"):
                model.decode(tgt[:, :1], memory, src_mask, caches=caches, offset=offset)
        assert caches[0][0].length == 0  # refused before anything was written
        model.decode(tgt[:, :1], memory, src_mask, caches=caches, offset=0)
        with pytest.raises(ValueError, match=r"new ones start at offset=1"):
            model.decode(tgt[:, 1:2], memory, src_mask, caches=caches, offset=0)


def test_padded_batch_equals_each_sentence_alone():
    model = make_model()
    src, tgt, src_lengths, tgt_lengths = padded_batch()
    with torch.no_grad():
        batch = model(src, tgt)
        memory, src_mask, _ = model.encode(src)
        for i, (s, t) in enumerate(zip(src_lengths, tgt_lengths, strict=True)):
            alone = model(src[i : i + 1, :s], tgt[i : i + 1, :t])
            torch.testing.assert_close(batch[i : i + 1, :t], alone, **TOL)
            memory_alone = model.encode(src[i : i + 1, :s]).memory
            torch.testing.assert_close(memory[i : i + 1, :s], memory_alone, **TOL)
    assert torch.equal(src_mask[:, 0], src != 0) and src_mask.shape == (3, 1, 6)


def test_weights_are_returned_per_layer():
    model = make_model()
    src, tgt, _, _ = padded_batch()
    memory, src_mask, enc_ws = model.encode(src, return_weights=True)
    logits, self_ws, cross_ws = model.decode(tgt, memory, src_mask, return_weights=True)
    assert [w.shape for w in enc_ws] == [(3, 2, 6, 6)] * 2
    assert [w.shape for w in self_ws] == [(3, 2, 5, 5)] * 2
    assert [w.shape for w in cross_ws] == [(3, 2, 5, 6)] * 2
    assert (cross_ws[0][2, ..., 1:] == 0).all()  # source 2 has one real token
    plain = model.decode(tgt, memory, src_mask)
    assert plain.self_weights is None and plain.cross_weights is None
    assert model.encode(src).weights is None
    torch.testing.assert_close(logits, plain.output, **TOL)


def test_batch_size_one_length_one():
    model = make_model()
    src, tgt = torch.tensor([[7]]), torch.tensor([[3]])
    out = model(src, tgt)
    assert out.shape == (1, 1, V) and torch.isfinite(out).all()
    memory, src_mask, _ = model.encode(src)
    caches = model.init_cache(1, 1, memory)
    step = model.decode(tgt, memory, src_mask, caches=caches, offset=0).output
    torch.testing.assert_close(step, out, **TOL)


def test_bad_input_raises():
    model = make_model()
    with pytest.raises(
        ValueError, match=r"src: expected integer token ids of shape \(B, S\), got shape \(4,\)"
    ):
        model.encode(torch.ones(4, dtype=torch.long))
    memory, src_mask, _ = model.encode(torch.ones(1, 4, dtype=torch.long))
    with pytest.raises(
        ValueError,
        match=r"tgt: expected integer token ids of shape \(B, T\), got shape \(1, 2, 3\)",
    ):
        model.decode(torch.ones(1, 2, 3, dtype=torch.long), memory, src_mask)
    with pytest.raises(ValueError, match=r"src: 17 positions exceed the model.s max_len=16"):
        model.encode(torch.ones(1, 17, dtype=torch.long))
    # empty batches: named by the argument given (before: an error about "context")
    src, tgt = torch.ones(2, 4, dtype=torch.long), torch.ones(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"tgt: expected at least one row .* got shape \(0, 3\)"):
        model(src[:0], tgt[:0])
    with pytest.raises(
        ValueError, match=r"src: expected at least one sentence .* got shape \(0, 4\)"
    ):
        model.encode(src[:0])
    with pytest.raises(
        ValueError, match=r"src: expected at least one sentence .* got shape \(2, 0\)"
    ):
        model.encode(src[:, :0])
    with pytest.raises(ValueError, match=r"tgt: expected at least one row .* got shape \(2, 0\)"):
        model(src, tgt[:, :0])


def test_forward_requires_one_target_row_per_source_row():
    """Teacher forcing pairs row i of tgt with row i of src; only decode() shares a memory row
    among several target rows (the beams of one sentence)."""
    model = make_model()
    src, tgt = torch.randint(1, V, (2, 6)), torch.randint(1, V, (4, 5))
    for rows in (4, 3, 1):  # 2 divides 4: it used to pair targets with the wrong sources
        with pytest.raises(
            ValueError,
            match=rf"src, tgt: expected the same batch size, got src \(2, 6\) and tgt \({rows}, 5\)",
        ):
            model(src, tgt[:rows])
    memory, src_mask, _ = model.encode(src)
    shared = model.decode(tgt, memory, src_mask).output  # (4, 5, V): rows 0-1 read source 0
    alone = model(src[:1].expand(2, -1), tgt[:2])
    torch.testing.assert_close(shared[:2], alone, **TOL)


@pytest.mark.parametrize("bad", [V, 5000, -1])
@pytest.mark.parametrize("side", ["src", "tgt"])
def test_ids_outside_the_vocabulary_are_refused(side, bad):
    model = make_model()
    ids = {"src": torch.randint(1, V, (2, 6)), "tgt": torch.randint(1, V, (2, 5))}
    ids[side][1, 2] = bad
    message = rf"{side}: token id {bad} is outside the vocabulary \[0, {V}\)"
    with pytest.raises(ValueError, match=message):
        model(ids["src"], ids["tgt"])
    if side == "src":
        with pytest.raises(ValueError, match=message):
            model.encode(ids["src"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.uint8, torch.int16])
@pytest.mark.parametrize("side", ["src", "tgt"])
def test_ids_must_be_integers(side, dtype):
    """uint8 and int16 ids passed the check, then failed in torch's embedding ("Expected tensor
    for argument #1 'indices' to have one of the following scalar types: Long, Int")."""
    model = make_model()
    ids = {"src": torch.randint(1, V, (2, 6)), "tgt": torch.randint(1, V, (2, 5))}
    ids[side] = ids[side].to(dtype)
    with pytest.raises(
        ValueError, match=rf"{side}: expected integer token ids of shape .* dtype {dtype}"
    ):
        model(ids["src"], ids["tgt"])
    with pytest.raises(TypeError, match=r"src: expected a torch.Tensor of token ids, got list"):
        model.encode([[1, 2]])


# --------------------------------------------------------------------------- dtypes


def test_bfloat16_model_gives_finite_bfloat16_output():
    model = make_model().to(torch.bfloat16)
    src, tgt, _, _ = padded_batch()
    with torch.no_grad():
        out = model(src, tgt)
        memory, src_mask, _ = model.encode(src)
        caches = model.init_cache(3, 2, memory)
        step = model.decode(tgt[:, :1], memory, src_mask, caches=caches, offset=0).output
    assert out.dtype == step.dtype == torch.bfloat16
    assert torch.isfinite(out).all() and torch.isfinite(step).all()
    assert caches[0][0].k.dtype == torch.bfloat16
    # Close to the float32 model it came from, at bfloat16 precision.
    ref = make_model()(src, tgt)
    torch.testing.assert_close(out.float(), ref, atol=0.08, rtol=0)


def test_float64_model_matches_float32():
    model = make_model()
    src, tgt, _, _ = padded_batch()
    with torch.no_grad():
        out32 = model(src, tgt)
        out64 = model.double()(src, tgt)
    assert out64.dtype == torch.float64
    torch.testing.assert_close(out64.float(), out32, atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------- dropout


def test_dropout_train_vs_eval():
    model = make_model(dropout=0.2, attn_dropout=0.2)
    src, tgt, _, _ = padded_batch()
    model.train()
    assert not torch.equal(model(src, tgt), model(src, tgt))
    torch.manual_seed(11)
    a = model(src, tgt)
    torch.manual_seed(11)
    torch.testing.assert_close(model(src, tgt), a, rtol=0, atol=0)
    model.eval()
    no_dropout = make_model()
    no_dropout.load_state_dict(model.state_dict())
    torch.testing.assert_close(model(src, tgt), model(src, tgt), rtol=0, atol=0)
    torch.testing.assert_close(model(src, tgt), no_dropout(src, tgt), **TOL)


@pytest.mark.parametrize("ffn_dropout, want", [(None, 0.3), (0.0, 0.0), (0.2, 0.2)])
def test_ffn_dropout_defaults_to_dropout(ffn_dropout, want):
    model = Transformer(
        TransformerConfig(
            src_vocab_size=20,
            tgt_vocab_size=20,
            d_model=8,
            num_heads=2,
            d_ff=16,
            dropout=0.3,
            ffn_dropout=ffn_dropout,
        )
    )
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        assert layer.ffn.dropout.p == want


def test_over_long_ids_are_named():
    """Before: 'sequence length 12 (offset 0 + length 12) exceeds max_len=10 of the positional
    encoding', naming neither src nor tgt."""
    model = make_model()
    limit = model.config.max_len
    ok = torch.randint(1, V, (2, 4))
    long = torch.randint(1, V, (2, limit + 1))
    with pytest.raises(
        ValueError, match=rf"^src: {limit + 1} positions exceed the model's max_len={limit}$"
    ):
        model(long, ok)
    with pytest.raises(
        ValueError, match=rf"^tgt: {limit + 1} positions exceed the model's max_len={limit}$"
    ):
        model(ok, long)
    memory, src_mask, _ = model.encode(ok)
    with pytest.raises(
        ValueError, match=rf"^tgt: {limit + 1} positions \(offset {limit - 3} \+ 4\) exceed"
    ):
        model.decode(ok, memory, src_mask, offset=limit - 3)


def test_init_cache_names_a_memory_that_is_not_one():
    model = make_model()
    with pytest.raises(TypeError, match=r"^memory: expected the encoder output .*, got NoneType$"):
        model.init_cache(2, 10, None)
    with pytest.raises(TypeError, match=r"got \(2, 5\)$"):
        model.init_cache(2, 10, torch.zeros(2, 5))
