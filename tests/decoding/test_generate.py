"""Greedy and beam search: exhaustive-search reference, cache vs recompute, batch-size
invariance, length limits, scores against teacher forcing."""

from __future__ import annotations

import itertools

import pytest
import torch

from attnkit import attention
from attnkit.decoding import DecodingConfig, generate
from attnkit.decoding.generate import beam_search, greedy_search
from attnkit.decoding.search import LengthPenalty
from attnkit.models import Transformer
from tests.helpers.decoding import (
    BOS,
    EOS,
    copy_held_out,
    copy_nll,
    pad_batch,
    random_sources,
    tiny_config,
)


def teacher_forced_log_prob(model, src_ids: list[int], out_ids: list[int]) -> float:
    """log p(out_ids + [eos] | src) from one teacher-forced forward pass (no decoding code)."""
    src = torch.tensor([[*src_ids, EOS]])
    tgt_in = torch.tensor([[BOS, *out_ids]])
    with torch.no_grad():
        lprobs = model(src, tgt_in).double().log_softmax(-1)[0]  # (T, V)
    target = torch.tensor([*out_ids, EOS])
    return float(lprobs.gather(1, target[:, None]).sum())


# --------------------------------------------------------------------------- exhaustive search


@pytest.mark.parametrize(
    "style,alpha,min_len", [("fairseq", 1.0, 1), ("gnmt", 0.6, 1), ("fairseq", 0.0, 2)]
)
def test_beam_search_equals_exhaustive_search(style, alpha, min_len):
    """Vocabulary pad/bos/eos/unk + 2 tokens, outputs of at most 3 tokens. The beam (40)
    holds every candidate at every step, so beam search must find every sequence, with the
    score an enumeration gives it, in the same order."""
    torch.manual_seed(1)
    model = Transformer(tiny_config(6)).eval()
    src = [4, 5, 5]
    longest, penalty = 3, LengthPenalty(style, alpha)
    expected = []
    for n in range(min_len, longest + 1):
        for seq in itertools.product([3, 4, 5], repeat=n):  # unk is an ordinary token here
            lp = teacher_forced_log_prob(model, src, list(seq))
            expected.append((list(seq), penalty.normalize(lp, n + 1)))
    expected.sort(key=lambda e: -e[1])

    config = DecodingConfig(
        beam_size=40, n_best=40, max_len_a=0, max_len_b=longest, min_len=min_len,
        lenpen=alpha, lenpen_style=style,
    )  # fmt: skip
    (hyps,) = generate(model, pad_batch([src]), config)
    assert [h.tokens for h in hyps] == [tokens for tokens, _ in expected]
    assert [h.score for h in hyps] == pytest.approx([s for _, s in expected], abs=1e-5)


def test_beam_of_one_equals_greedy(random_model):
    src = pad_batch(random_sources(6, 24, 1, 12, seed=3))
    for lenpen in (0.0, 1.0):
        config = DecodingConfig(beam_size=1, lenpen=lenpen)
        greedy = greedy_search(random_model, src, config)
        beam = beam_search(random_model, src, config)
        assert [g[0].tokens for g in greedy] == [b[0].tokens for b in beam]
        for g, b in zip(greedy, beam, strict=True):
            assert g[0].score == pytest.approx(b[0].score, abs=1e-5)
            assert g[0].log_prob == pytest.approx(b[0].log_prob, abs=1e-5)


# --------------------------------------------------------------------------- scores and limits


def test_scores_match_teacher_forcing(copy_model):
    sources = random_sources(5, 20, 2, 10, seed=11)
    config = DecodingConfig(beam_size=4, n_best=4, lenpen=1.0)
    results = generate(copy_model, pad_batch(sources), config)
    for src, hyps in zip(sources, results, strict=True):
        assert len(hyps) == 4
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        for h in hyps:
            lp = teacher_forced_log_prob(copy_model, src, h.tokens)
            assert h.log_prob == pytest.approx(lp, abs=1e-4)
            assert h.score == pytest.approx(lp / (len(h.tokens) + 1), abs=1e-4)


@pytest.mark.parametrize("beam", [1, 5])
def test_trained_copy_model_copies(copy_model, beam):
    """The fixture trained until every held-out sequence has NLL <= COPY_MAX_NLL: each of its
    tokens wins by more than 2 nats, so search must return each copy, on every processor."""
    sources = copy_held_out()
    nll = copy_nll(copy_model, sources)  # each <= COPY_MAX_NLL: the fixture trained until so
    results = generate(copy_model, pad_batch(sources), DecodingConfig(beam_size=beam))
    wrong = [
        (src, hyps[0].tokens)
        for src, hyps in zip(sources, results, strict=True)
        if hyps[0].tokens != src
    ]
    assert not wrong, f"{len(wrong)}/{len(sources)} not copied: (source, output) {wrong[:5]}"
    log_probs = [hyps[0].log_prob for hyps in results]
    assert log_probs == pytest.approx((-nll).tolist(), abs=1e-4)


@pytest.mark.parametrize("beam", [1, 3])
def test_length_limits(random_model, beam):
    sources = random_sources(8, 24, 1, 15, seed=7)
    config = DecodingConfig(beam_size=beam, max_len_a=0.5, max_len_b=2, min_len=3, n_best=beam)
    results = generate(random_model, pad_batch(sources), config)
    for src, hyps in zip(sources, results, strict=True):
        limit = max(int(0.5 * len(src) + 2), 3)
        for h in hyps:
            assert 3 <= len(h.tokens) <= limit
            assert EOS not in h.tokens and BOS not in h.tokens and 0 not in h.tokens


@pytest.mark.parametrize("beam", [1, 3])
def test_zero_length_limit_gives_empty_outputs(random_model, beam):
    config = DecodingConfig(beam_size=beam, max_len_a=0, max_len_b=0, min_len=0)
    results = generate(random_model, pad_batch([[5, 6, 7], [8]]), config)
    assert [hyps[0].tokens for hyps in results] == [[], []]
    assert all(hyps[0].log_prob < 0 for hyps in results)


def test_model_limit_caps_the_output(random_model):
    # max_len=40 positions: bos + at most 39 tokens, whatever a and b say.
    config = DecodingConfig(beam_size=2, max_len_a=10, max_len_b=100, min_len=100)
    (hyps,) = generate(random_model, pad_batch([[5, 6, 7]]), config)
    assert len(hyps[0].tokens) == 39


# --------------------------------------------------------------------------- cache and batching


def path_sources(model_name: str, n: int, vocab: int, max_len: int, seed: int) -> list[list[int]]:
    """Sources for comparing two decoding paths token for token. The random model's weights are
    the same on every processor; the copy model's depend on where it was trained, so it gets the
    held-out sources its training criterion covers (no near-ties that rounding could flip)."""
    if model_name == "copy_model":
        return copy_held_out(n)
    return random_sources(n, vocab, 1, max_len, seed=seed)


@pytest.mark.parametrize("beam", [1, 5])
@pytest.mark.parametrize("model_name", ["random_model", "copy_model"])
def test_cached_equals_recomputed(request, model_name, beam):
    model = request.getfixturevalue(model_name)
    vocab = model.config.tgt_vocab_size
    src = pad_batch(path_sources(model_name, 8, vocab, 12, seed=13))
    cached = generate(model, src, DecodingConfig(beam_size=beam, n_best=beam))
    recomputed = generate(model, src, DecodingConfig(beam_size=beam, n_best=beam, use_cache=False))
    for a, b in zip(cached, recomputed, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


@pytest.mark.parametrize("intel_mkl", [True, False], ids=["fused kernel", "step kernel"])
@pytest.mark.parametrize("beam", [1, 5])
@pytest.mark.parametrize("model_name", ["random_model", "copy_model"])
def test_output_does_not_depend_on_batch_size(request, monkeypatch, model_name, beam, intel_mkl):
    """32 sentences one at a time and all 32 in one padded batch, with either attention
    kernel of a float32 decoding step (torch's fused one on Intel CPUs, attnkit's step
    kernel elsewhere: the rule reads the cache's layout, never the batch size)."""
    monkeypatch.setattr(attention, "mkl_gemv_is_generic", lambda: not intel_mkl)
    steps = []
    kernel = attention.one_query_attention
    monkeypatch.setattr(attention, "one_query_attention", lambda *a: steps.append(1) or kernel(*a))
    model = request.getfixturevalue(model_name)
    sources = path_sources(model_name, 32, model.config.tgt_vocab_size, 20, seed=17)
    config = DecodingConfig(beam_size=beam, n_best=beam)
    batched = generate(model, pad_batch(sources), config)
    for src, hyps in zip(sources, batched, strict=True):
        (alone,) = generate(model, pad_batch([src]), config)
        assert [h.tokens for h in alone] == [h.tokens for h in hyps]
        assert [h.score for h in alone] == pytest.approx([h.score for h in hyps], abs=1e-5)
    assert bool(steps) != intel_mkl  # the kernel the case names did run


# --------------------------------------------------------------------------- odds and ends


def test_generate_restores_training_mode_and_rejects_bad_input(random_model):
    random_model.train()
    try:
        generate(random_model, pad_batch([[5]]), DecodingConfig(beam_size=2))
        assert random_model.training
    finally:
        random_model.eval()
    with pytest.raises(ValueError, match=r"src: expected a non-empty \(B, S\) int64 tensor"):
        generate(random_model, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"src: 41 positions exceed the model's max_len=40"):
        generate(random_model, torch.full((1, 41), 5))


@pytest.mark.parametrize("beam", [1, 2])
@pytest.mark.parametrize("broken", ["all", "one sentence"])
def test_nan_log_probabilities_are_refused_naming_the_sentences(beam, broken):
    """A model whose output is NaN: beam search raised an IndexError (or returned no
    hypothesis) and greedy search a NaN-scored output, without saying why."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(8)).eval()
    src = pad_batch([[4, 5, 6], [7, 6], [5, 5, 5, 5]])
    if broken == "all":
        with torch.no_grad():
            model.output.weight.fill_(float("nan"))  # (tied or not: every logit is NaN)
        rows = r"\[0, 1, 2\]"
    else:  # the second sentence's encoder output (the embeddings are tied to the output)
        encode = model.encode

        def broken_encode(src_ids, *args, **kwargs):
            memory, *rest = encode(src_ids, *args, **kwargs)
            return (memory.index_fill(0, torch.tensor([1]), float("nan")), *rest)

        model.encode = broken_encode
        rows = r"\[1\]"
    with pytest.raises(ValueError, match=rf"log-probabilities: NaN for sentence\(s\) {rows} "):
        generate(model, src, DecodingConfig(beam_size=beam))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(beam_size=0), r"beam_size: expected an integer >= 1, got 0"),
        (dict(n_best=3, beam_size=2), r"n_best: expected 1 <= n_best <= beam_size=2, got 3"),
        (dict(lenpen_style="x"), r"lenpen_style: expected one of"),
        (dict(max_len_a=-1), r"max_len_a, max_len_b: expected >= 0"),
    ],
)
def test_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DecodingConfig(**kwargs)


def test_bfloat16_runs(random_model):
    model = Transformer(random_model.config)
    model.load_state_dict(random_model.state_dict())
    model = model.to(torch.bfloat16).eval()
    (hyps,) = generate(model, pad_batch([[5, 6, 7]]), DecodingConfig(beam_size=2))
    assert isinstance(hyps[0].score, float) and len(hyps[0].tokens) >= 1


@pytest.mark.parametrize("beam", [1, 5])
def test_cached_decoding_under_bf16_autocast(copy_model, beam):
    """Evaluation inside a bf16 training run: float32 weights under autocast. The cache takes
    the dtype the projections produce (bf16), and on the held-out sources (every token ahead
    by more than 2 nats, see COPY_MAX_NLL) bf16 rounding must give the tokens of float32."""
    src = pad_batch(copy_held_out(16))
    config = DecodingConfig(beam_size=beam)
    reference = generate(copy_model, src, config)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        memory, _, _ = copy_model.encode(src)
        caches = copy_model.init_cache(src.shape[0], 4, memory)
        autocast = generate(copy_model, src, config)
    assert caches[0][0].k.dtype == torch.bfloat16 and memory.dtype == torch.float32
    for a, b in zip(reference, autocast, strict=True):
        assert a[0].tokens == b[0].tokens
