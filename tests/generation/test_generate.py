"""Token generation with attnkit's GPT against Hugging Face's GPT2LMHeadModel.generate on the
same random weights, the cache against recomputing the prefix, batches against single prompts."""

import dataclasses

import pytest
import torch

from attnkit.generation import GenerationConfig, generate, generate_steps
from tests.helpers.generation import load_pair, tiny_llama_gpt

PROMPTS = [[1, 2, 3], [50, 60, 70, 80, 90, 100, 7], [42], [10, 20, 30, 40]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return load_pair(tmp_path_factory.mktemp("gpt2"))


def _hf_generate(hf, prompt, n, **kwargs):
    with torch.inference_mode():
        out = hf.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=n, min_new_tokens=n, pad_token_id=0, **kwargs,
        )  # fmt: skip
    return out


def test_greedy_equals_hugging_face(pair):
    hf, gpt = pair
    ours = generate(gpt, PROMPTS, GenerationConfig(max_new_tokens=24, eos_ids=()))
    for prompt, tokens in zip(PROMPTS, ours.tokens, strict=True):
        theirs = _hf_generate(hf, prompt, 24, do_sample=False)[0, len(prompt) :].tolist()
        assert tokens == theirs
    assert ours.finish_reasons == ["length"] * len(PROMPTS)


def test_repetition_penalty_greedy_equals_hugging_face(pair):
    hf, gpt = pair
    for prompt in PROMPTS[:2]:
        ours = generate(
            gpt, [prompt], GenerationConfig(max_new_tokens=20, eos_ids=(), repetition_penalty=1.5)
        )
        theirs = _hf_generate(hf, prompt, 20, do_sample=False, repetition_penalty=1.5)
        assert ours.tokens[0] == theirs[0, len(prompt) :].tolist()


def test_logprobs_are_the_models(pair):
    """Each log-probability is log_softmax of Hugging Face's raw logits at the chosen id."""
    hf, gpt = pair
    prompt = PROMPTS[1]
    ours = generate(gpt, [prompt], GenerationConfig(max_new_tokens=10, eos_ids=(), logprobs=True))
    with torch.inference_mode():
        out = hf.generate(
            torch.tensor([prompt]), max_new_tokens=10, min_new_tokens=10, do_sample=False,
            pad_token_id=0, output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
    theirs = [
        torch.log_softmax(step.float(), dim=-1)[0, tok].item()
        for step, tok in zip(out.logits, ours.tokens[0], strict=True)
    ]
    assert ours.logprobs[0] == pytest.approx(theirs, abs=1e-5)


def test_logprobs_only_when_asked(pair):
    """Off by default (no log-softmax a step); asking changes no token."""
    _, gpt = pair
    plain = generate(gpt, PROMPTS, GenerationConfig(max_new_tokens=6, eos_ids=()))
    asked = generate(gpt, PROMPTS, GenerationConfig(max_new_tokens=6, eos_ids=(), logprobs=True))
    assert plain.logprobs is None
    assert asked.tokens == plain.tokens
    assert [len(lp) for lp in asked.logprobs] == [6] * len(PROMPTS)
    assert all(lp <= 0 for row in asked.logprobs for lp in row)
    steps = list(generate_steps(gpt, PROMPTS, GenerationConfig(max_new_tokens=2, eos_ids=())))
    assert [step.logprobs for step in steps] == [None, None]
    with pytest.raises(TypeError, match="logprobs: expected True or False"):
        GenerationConfig(logprobs="yes")
    with pytest.raises(TypeError, match="use_cache: expected True or False, got 'no'"):
        GenerationConfig(use_cache="no")  # was accepted, and taken as True


def test_logprobs_follow_rows_that_finish_early(pair):
    """Rows that end at eos at different steps leave the batch; each keeps one log-probability
    per token, the same as when it is generated alone."""
    _, gpt = pair
    free = generate(gpt, PROMPTS, GenerationConfig(max_new_tokens=12, eos_ids=()))
    eos = (free.tokens[0][2], free.tokens[2][5])  # rows 0 and 2 end early (or earlier)
    config = GenerationConfig(max_new_tokens=12, eos_ids=eos, logprobs=True)
    out = generate(gpt, PROMPTS, config)
    assert [len(t) for t in out.tokens] == [len(lp) for lp in out.logprobs]
    assert len(out.tokens[0]) <= 3 and len(out.tokens[2]) <= 6
    for row, prompt in enumerate(PROMPTS):
        alone = generate(gpt, [prompt], config)
        assert alone.tokens[0] == out.tokens[row]
        assert alone.logprobs[0] == pytest.approx(out.logprobs[row], abs=1e-4)


@pytest.mark.parametrize(
    "settings",
    [
        dict(),
        dict(repetition_penalty=1.3),
        dict(temperature=0.9, top_k=20, seed=3),
        dict(temperature=1.2, top_p=0.8, repetition_penalty=1.2, seed=4),
    ],
)
def test_cached_equals_recomputed(pair, settings):
    _, gpt = pair
    config = GenerationConfig(max_new_tokens=30, eos_ids=(), logprobs=True, **settings)
    cached = generate(gpt, PROMPTS, config)
    recomputed = generate(gpt, PROMPTS, dataclasses.replace(config, use_cache=False))
    assert cached.tokens == recomputed.tokens
    for a, b in zip(cached.logprobs, recomputed.logprobs, strict=True):
        assert a == pytest.approx(b, abs=1e-4)


def test_batched_equals_one_at_a_time(pair):
    _, gpt = pair
    config = GenerationConfig(max_new_tokens=20, eos_ids=(), repetition_penalty=1.2)
    batched = generate(gpt, PROMPTS, config).tokens
    assert batched == [generate(gpt, [p], config).tokens[0] for p in PROMPTS]


def test_eos_ends_a_row_and_the_others_go_on(pair):
    _, gpt = pair
    free = generate(gpt, PROMPTS, GenerationConfig(max_new_tokens=20, eos_ids=())).tokens
    eos = free[0][5]  # row 0 writes this id at step 5
    out = generate(gpt, PROMPTS, GenerationConfig(max_new_tokens=20, eos_ids=(eos,)))
    for row, tokens in enumerate(free):
        cut = tokens.index(eos) + 1 if eos in tokens else len(tokens)
        assert out.tokens[row] == tokens[:cut]
        assert out.finish_reasons[row] == ("eos" if eos in tokens else "length")
    assert out.tokens[0][-1] == eos and len(out.tokens[0]) <= 6


def test_default_eos_is_the_models(pair, monkeypatch):
    _, gpt = pair
    free = generate(gpt, PROMPTS, GenerationConfig(max_new_tokens=20, eos_ids=())).tokens
    monkeypatch.setattr(gpt.config, "eos_token_id", free[1][3])  # row 1 writes it at step 3
    out = generate(gpt, PROMPTS, GenerationConfig(max_new_tokens=20))
    assert out.finish_reasons[1] == "eos" and out.tokens[1] == free[1][:4]
    assert (
        out.tokens
        == generate(gpt, PROMPTS, GenerationConfig(max_new_tokens=20, eos_ids=(free[1][3],))).tokens
    )


def test_seed_makes_sampling_reproducible(pair):
    _, gpt = pair
    config = GenerationConfig(max_new_tokens=25, eos_ids=(), temperature=1.0, seed=11)
    a = generate(gpt, PROMPTS, config).tokens
    assert a == generate(gpt, PROMPTS, config).tokens
    other = GenerationConfig(max_new_tokens=25, eos_ids=(), temperature=1.0, seed=12)
    assert a != generate(gpt, PROMPTS, other).tokens


def test_top_k_1_sampling_is_greedy(pair):
    _, gpt = pair
    greedy = generate(gpt, PROMPTS, GenerationConfig(max_new_tokens=15, eos_ids=())).tokens
    sampled = GenerationConfig(max_new_tokens=15, eos_ids=(), temperature=1.0, top_k=1, seed=0)
    assert generate(gpt, PROMPTS, sampled).tokens == greedy


@pytest.mark.parametrize(
    "settings",
    [
        dict(temperature=1e-45),
        dict(temperature=1e-300, top_p=0.9),
        dict(temperature=1e-46, top_k=5),
    ],
    ids=str,
)
def test_a_tiny_temperature_samples_the_greedy_tokens(pair, settings):
    """Greedy decoding is the limit of sampling as the temperature goes to 0, also where
    ``logits / temperature`` overflows (softmax would be NaN, the draw an id past the end)."""
    _, gpt = pair
    greedy = generate(gpt, PROMPTS, GenerationConfig(max_new_tokens=15, eos_ids=())).tokens
    sampled = GenerationConfig(max_new_tokens=15, eos_ids=(), seed=0, **settings)
    assert generate(gpt, PROMPTS, sampled).tokens == greedy


@pytest.mark.parametrize("temperature", [0.0, 1.0, 1e-45])
def test_a_tiny_repetition_penalty_chooses_ids_of_the_vocabulary(pair, temperature):
    """A seen id's positive logit / 1e-40 overflows to +inf: the next id is one of those."""
    _, gpt = pair
    config = GenerationConfig(
        max_new_tokens=12, eos_ids=(), temperature=temperature, repetition_penalty=1e-40, seed=0
    )
    for tokens in generate(gpt, PROMPTS, config).tokens:
        assert len(tokens) == 12 and all(0 <= t < gpt.config.vocab_size for t in tokens)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_nan_logits_are_an_error_not_a_token(temperature):
    model = tiny_llama_gpt()
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    config = GenerationConfig(max_new_tokens=3, temperature=temperature, seed=0)
    with pytest.raises(ValueError, match=r"logits: NaN in row\(s\) \[0, 1\]"):
        generate(model, [[1, 2], [3]], config)


def test_tensor_prompts(pair):
    _, gpt = pair
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    config = GenerationConfig(max_new_tokens=5, eos_ids=())
    assert generate(gpt, ids, config).tokens == generate(gpt, ids.tolist(), config).tokens


def test_max_new_tokens_must_fit_the_context(pair):
    _, gpt = pair  # the longest of PROMPTS has 7 tokens: 7 + 91 - 1 positions > 96
    with pytest.raises(ValueError, match="max_new_tokens.*context_length=96"):
        generate(gpt, PROMPTS, GenerationConfig(max_new_tokens=91))
    assert (
        len(generate(gpt, [[1]], GenerationConfig(max_new_tokens=96, eos_ids=())).tokens[0]) == 96
    )


def test_a_prompt_too_long_for_the_context_is_named(pair):
    _, gpt = pair  # context_length=96
    message = (
        r"prompts\[1\]: prompt too long: 97 tokens; at most 96 fit the model's "
        "context_length=96"
    )
    with pytest.raises(ValueError, match=message):
        generate(gpt, [[1, 2], [3] * 97], GenerationConfig(max_new_tokens=1))
    with pytest.raises(ValueError, match="max_new_tokens: the longest prompt has 95 tokens"):
        generate(gpt, [[1, 2], [3] * 95], GenerationConfig(max_new_tokens=3))


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "recompute"])
def test_the_last_new_token_needs_no_position(pair, use_cache):
    """A prompt of 5 tokens and 92 new tokens read positions 0 .. 95 (the last new token is
    returned, never fed back): the whole context of 96, which refused 92 before. The tokens are
    Hugging Face's for the same weights, and a full prompt of 96 tokens still gets one token;
    one more is refused with the count that fits."""
    hf, gpt = pair
    prompt = [5, 6, 7, 8, 9]
    config = GenerationConfig(max_new_tokens=92, eos_ids=(), use_cache=use_cache)
    ours = generate(gpt, [prompt], config).tokens[0]
    assert ours == _hf_generate(hf, prompt, 92, do_sample=False)[0, 5:].tolist()
    full = list(range(1, 97))
    one = dataclasses.replace(config, max_new_tokens=1)
    assert (
        generate(gpt, [full], one).tokens[0]
        == _hf_generate(hf, full, 1, do_sample=False)[0, 96:].tolist()
    )
    with pytest.raises(
        ValueError,
        match=r"max_new_tokens: the longest prompt has 5 tokens, so at most 92 new tokens fit the "
        r"model's context_length=96 \(it reads the prompt and every new token but the last\), "
        r"got 93",
    ):
        generate(gpt, [prompt], dataclasses.replace(config, max_new_tokens=93))


@pytest.mark.parametrize("prompts", [[], [[]]])
def test_bad_prompts(pair, prompts):
    with pytest.raises(ValueError, match="prompts"):
        generate(pair[1], prompts, GenerationConfig(max_new_tokens=2))


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        ("abc", r"prompts: expected a list of prompts, .* got the text 'abc'; for text, use gene"),
        (["hi"], r"prompts\[0\]: expected a list of int ids, got the text 'hi'; for text, use gen"),
        ([[[1, 2]]], r"prompts\[0\]: expected a list of int ids, got 2 dimensions, shape \(1, 2"),
        ([1, 2], r"prompts\[0\]: expected a list of int ids, got 1 \(prompts: a list of prompts"),
        (5, r"prompts: expected a list of prompts, each a list of int ids, .* got int"),
        ([[1.7, 2.2]], r"prompts\[0\]: expected int ids, got torch.float32 ones \[1.7, 2.2\] \("),
        ([[1, 2], [3.0]], r"prompts\[1\]: expected int ids, got torch.float32"),
        ([[True, False]], r"prompts\[0\]: expected int ids, got torch.bool"),
        (torch.tensor([[1.7, 2.2]]), r"prompts: expected an integer tensor of ids, got torch.f"),
    ],
)
def test_prompts_that_are_not_ids_are_refused_not_truncated(pair, prompts, message):
    with pytest.raises(TypeError, match=message):
        generate(pair[1], prompts, GenerationConfig(max_new_tokens=2))


def test_eos_ids_outside_the_vocabulary_are_refused(pair):
    _, gpt = pair  # vocab_size=300
    message = r"eos_ids: id 500 is outside the model's vocabulary \[0, 300\) \(vocab_size=300\)"
    with pytest.raises(ValueError, match=message):
        generate(gpt, PROMPTS, GenerationConfig(max_new_tokens=2, eos_ids=(3, 500)))
    assert generate(gpt, [[1]], GenerationConfig(max_new_tokens=2, eos_ids=299)).tokens[0]


def test_the_config_must_be_a_generation_config(pair):
    with pytest.raises(TypeError, match="config: expected a GenerationConfig .* got dict"):
        generate(pair[1], PROMPTS, {"max_new_tokens": 3})


@pytest.mark.parametrize("use_cache", [True, False])
def test_a_callers_autocast_does_not_reach_the_steps(use_cache):
    """Under a caller's bfloat16 autocast (a training loop's), generation computes in the
    model's dtype, as the Translator does: with the cache it crashed, mixing float32 queries
    from the prepacked products with bfloat16 keys. The caller's autocast is back on while it
    holds a step."""
    from attnkit.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=100, context_length=32, d_model=32, num_heads=4,
                          num_layers=2, d_ff=64, bos_token_id=0, eos_token_id=0)).eval()  # fmt: skip
    config = GenerationConfig(max_new_tokens=10, eos_ids=(), logprobs=True, use_cache=use_cache)
    want = generate(model, [[5, 6, 7], [8]], config)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = generate(model, [[5, 6, 7], [8]], config)
        for _ in generate_steps(model, [[5, 6, 7]], config):
            assert torch.is_autocast_enabled("cpu")
    assert got.tokens == want.tokens and got.logprobs == want.logprobs


def test_the_model_runs_in_eval_mode_and_gets_its_mode_back():
    """A model left in training mode (GPT's default, dropout 0.1) generates as in eval mode:
    the first log-probability is log_softmax of the eval model's logits, and runs agree."""
    from attnkit.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=100, context_length=32, d_model=32, num_heads=4,
                          num_layers=2, d_ff=64, bos_token_id=0, eos_token_id=0))  # fmt: skip
    assert model.training
    prompt = [5, 6, 7]
    with torch.no_grad():
        want = torch.log_softmax(model.eval()(torch.tensor([prompt])).logits[0, -1], dim=-1)
    model.train()
    config = GenerationConfig(max_new_tokens=12, eos_ids=(), logprobs=True)
    first = generate(model, [prompt], config)
    assert model.training
    assert first.logprobs[0][0] == pytest.approx(want[first.tokens[0][0]].item(), abs=1e-5)
    for _ in range(3):
        again = generate(model, [prompt], config)
        assert again.tokens == first.tokens and again.logprobs == first.logprobs
    steps = generate_steps(model, [prompt], config)
    next(steps)
    assert not model.training
    steps.close()  # a caller that stops early
    assert model.training


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=1.0, top_k=-1), "top_k"),
        (dict(temperature=1.0, top_p=0.0), "top_p"),
        (dict(temperature=1.0, top_p=1.5), "top_p"),
        (dict(top_p=0.9), "temperature=0 means greedy"),
        (dict(top_k=5), "temperature=0 means greedy"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(eos_ids=(-1,)), "eos_ids"),
        (dict(eos_ids="12"), "eos_ids: expected an id or a sequence of ids .* got str '12'"),
        (dict(eos_ids=True), "eos_ids: expected an id .* got bool"),
        (dict(eos_ids=1.5), "eos_ids: expected an id .* got float"),
        (dict(eos_ids=(1, None)), "eos_ids: expected ids >= 0"),
        (dict(stop_strings=("",)), "stop_strings"),
        (dict(stop_strings="END"), "stop_strings"),
        (dict(seed=1.5), "seed"),
        (dict(seed=True), "seed"),
        (dict(seed=-1), r"seed: expected an integer from 0 to 2\*\*64 - 1, got -1"),
        (dict(seed=2**64), r"seed: expected an integer from 0 to 2\*\*64 - 1"),
    ],
)
def test_config_errors_name_the_setting(kwargs, name):
    with pytest.raises((ValueError, TypeError), match=name):
        GenerationConfig(**kwargs)


def test_one_eos_id_may_be_given_as_an_int():
    assert GenerationConfig(eos_ids=5).eos_ids == (5,)
    assert GenerationConfig(eos_ids=[5, 7]).eos_ids == (5, 7)


def test_seed_range_is_the_generators():
    assert GenerationConfig(temperature=1.0, seed=2**64 - 1).seed == 2**64 - 1
    assert GenerationConfig(temperature=1.0, seed=0).seed == 0


# --------------------------------------------------------------------------- Llama's options


@pytest.mark.parametrize(
    "options", [{}, {"window": 4}, {"window": 6, "full_attention_layers": 1}], ids=str
)
def test_llama_generation_with_the_cache_equals_recomputing(options):
    # 40 tokens after prompts of 3-11 ids: a window of 4 or 6 is overrun many times; the cache
    # allocated for it holds the window only, with the key/value heads only.
    model = tiny_llama_gpt(**options)
    prompts = [list(range(1, 12)), [5, 6, 7], [9, 8, 7, 6, 5, 4]]
    allocated = []
    init_cache = model.init_cache
    model.init_cache = lambda *a, **k: allocated.append(init_cache(*a, **k)) or allocated[-1]
    config = GenerationConfig(max_new_tokens=40, eos_ids=(), logprobs=True)
    cached = generate(model, prompts, config)
    del model.init_cache
    recomputed = generate(model, prompts, dataclasses.replace(config, use_cache=False))
    assert cached.tokens == recomputed.tokens
    for a, b in zip(cached.logprobs, recomputed.logprobs, strict=True):
        assert a == pytest.approx(b, abs=1e-4)
    (cache,) = allocated
    window = options.get("window")
    for i, layer in enumerate(cache.layers):
        windowed = window is not None and i >= options.get("full_attention_layers", 0)
        # Every slot read: the prompts' 11 and the new tokens' but the last (never fed back).
        assert layer.k.shape == (3, 2, window if windowed else 11 + 40 - 1, 8)
