"""Generation with the one-token steps compiled (``GenerationConfig(compile=True)``): the same
tokens as Hugging Face's ``generate`` and as eager steps, a new graph when the weights change,
and clear errors where compiling cannot run."""

import shutil

import pytest
import torch

from attnkit.generation import GenerationConfig, generate, generate_steps
from attnkit.generation import compiled as compiled_module
from attnkit.models import GPT, GPTConfig
from tests.helpers.generation import load_pair

# Left-padded in one batch: the compiled steps see a key mask and several rows.
PROMPTS = [[1, 2, 3], [50, 60, 70, 80, 90, 96, 7], [42], [10, 20, 30, 40]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return load_pair(tmp_path_factory.mktemp("gpt2"))


def _llama(**options) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig.llama(
        vocab_size=97, context_length=128, d_model=32, num_heads=4, num_kv_heads=2,
        num_layers=2, d_ff=48, initializer_range=0.3, **options,
    )  # fmt: skip
    return GPT(config).eval()


def _hf_greedy(hf, prompt, n):
    with torch.inference_mode():
        out = hf.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=n, min_new_tokens=n, pad_token_id=0, do_sample=False,
        )  # fmt: skip
    return out[0, len(prompt) :].tolist()


def test_compiled_greedy_equals_hugging_face(pair):
    # GPT-2's layers (LayerNorm, learned positions, GELU, biases), four prompts in one batch.
    hf, gpt = pair
    ours = generate(gpt, PROMPTS, GenerationConfig(max_new_tokens=24, eos_ids=(), compile=True))
    for prompt, tokens in zip(PROMPTS, ours.tokens, strict=True):
        assert tokens == _hf_greedy(hf, prompt, 24)
    assert "_run" not in vars(gpt)  # the class's forward pass again after the call


@pytest.mark.parametrize("options", [{}, {"window": 4}], ids=["gqa", "gqa-window-4"])
def test_compiled_llama_equals_eager(options):
    # RMSNorm, rotary positions, grouped-query attention, SwiGLU; a window of 4 is overrun
    # many times in 40 tokens (the ring cache). Log-probabilities come from the logits, so
    # they show that every step's logits agree, not only the argmax.
    model = _llama(**options)
    config = GenerationConfig(max_new_tokens=40, eos_ids=(), logprobs=True)
    eager = generate(model, PROMPTS, config)
    fast = generate(model, PROMPTS, GenerationConfig(**{**vars(config), "compile": True}))
    assert fast.tokens == eager.tokens
    for ours, ref in zip(fast.logprobs, eager.logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(ours), torch.tensor(ref), rtol=0, atol=1e-5)


def test_compiled_sampling_equals_eager():
    model = _llama()
    config = GenerationConfig(max_new_tokens=30, eos_ids=(), temperature=1.0, top_p=0.9, seed=3)
    eager = generate(model, PROMPTS[:2], config)
    fast = generate(model, PROMPTS[:2], GenerationConfig(**{**vars(config), "compile": True}))
    assert fast.tokens == eager.tokens


def test_compiled_steps_follow_changed_weights():
    # The graphs hold the weights as constants: a weight changed in place (its version
    # counter moves) must give a new graph, not the old weights' tokens.
    model = _llama()
    config = GenerationConfig(max_new_tokens=20, eos_ids=(), logprobs=True)
    fast = GenerationConfig(**{**vars(config), "compile": True})
    before = generate(model, PROMPTS[:2], fast)
    with torch.no_grad():
        model.blocks.layers[1].ffn.linear2.weight.mul_(-3.0)
        model.lm_head.weight[5:9].mul_(4.0)
    eager = generate(model, PROMPTS[:2], config)
    after = generate(model, PROMPTS[:2], fast)
    assert eager.logprobs != before.logprobs  # the change matters
    assert after.tokens == eager.tokens
    for ours, ref in zip(after.logprobs, eager.logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(ours), torch.tensor(ref), rtol=0, atol=1e-5)


def test_compile_setting_is_checked():
    with pytest.raises(TypeError, match="compile: expected True or False"):
        GenerationConfig(compile="yes")
    with pytest.raises(ValueError, match="needs use_cache=True"):
        GenerationConfig(compile=True, use_cache=False)


def test_compile_without_a_cpp_compiler_is_refused_by_name(monkeypatch):
    model = _llama()
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match=r"C\+\+ compiler.*g\+\+"):
        generate_steps(model, PROMPTS, GenerationConfig(max_new_tokens=2, compile=True))
    assert "_run" not in vars(model)


def test_compile_of_a_model_without_gpt_layers_is_refused():
    class Wrapped(torch.nn.Module):  # generate's duck-typed model: a GPT's calls, not its _run
        def __init__(self, gpt):
            super().__init__()
            self.gpt, self.lm_head, self.config = gpt, gpt.lm_head, gpt.config

        def forward(self, *args, **kwargs):
            return self.gpt(*args, **kwargs)

        def init_cache(self, *args, **kwargs):
            return self.gpt.init_cache(*args, **kwargs)

    with pytest.raises(TypeError, match="compile: compiles the layers of an attnkit GPT"):
        generate_steps(Wrapped(_llama()), PROMPTS, GenerationConfig(compile=True))
    assert compiled_module.check_compilable(_llama(), torch.device("cpu")) is None
