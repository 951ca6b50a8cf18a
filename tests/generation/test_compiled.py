"""Generation with the one-token steps compiled (``GenerationConfig(compile=True)``): the same
tokens as Hugging Face's ``generate`` and as eager steps, graphs that really ran (no graph
break), weights changed in place that are seen, a compiled generation beside an eager one, and
clear errors where compiling cannot run."""

import gc
import os
import weakref

import pytest
import torch
from torch._dynamo.utils import counters

from attnkit.generation import GenerationConfig, generate, generate_steps
from attnkit.generation import compiled as compiled_module
from attnkit.generation import packed as packed_module
from tests.helpers.generation import load_pair, tiny_llama_gpt

# Left-padded in one batch: the compiled steps see a key mask and several rows.
PROMPTS = [[1, 2, 3], [50, 60, 70, 80, 90, 96, 7], [42], [10, 20, 30, 40]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return load_pair(tmp_path_factory.mktemp("gpt2"))


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
    counters.clear()
    ours = generate(gpt, PROMPTS, GenerationConfig(max_new_tokens=24, eos_ids=(), compile=True))
    # Every frame dynamo met traced whole: the step, not its layers one by one after a frame
    # it gave up on (a padding mask checked against a symbolic key length did that once).
    assert counters["frames"]["total"] == counters["frames"]["ok"] >= 1, dict(counters["frames"])
    for prompt, tokens in zip(PROMPTS, ours.tokens, strict=True):
        assert tokens == _hf_greedy(hf, prompt, 24)


@pytest.mark.parametrize("options", [{}, {"window": 4}], ids=["gqa", "gqa-window-4"])
def test_compiled_llama_equals_eager(options):
    # RMSNorm, rotary positions, grouped-query attention, SwiGLU; a window of 4 is overrun
    # many times in 40 tokens (the ring cache). Log-probabilities come from the logits, so
    # they show that every step's logits agree, not only the argmax.
    model = tiny_llama_gpt(**options)
    config = GenerationConfig(max_new_tokens=40, eos_ids=(), logprobs=True)
    eager = generate(model, PROMPTS, config)
    counters.clear()
    fast = generate(model, PROMPTS, GenerationConfig(**{**vars(config), "compile": True}))
    assert counters["stats"]["unique_graphs"] >= 1  # the steps ran compiled ...
    assert not counters["graph_break"], dict(counters["graph_break"])  # ... in whole graphs
    assert fast.tokens == eager.tokens
    for ours, ref in zip(fast.logprobs, eager.logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(ours), torch.tensor(ref), rtol=0, atol=1e-5)


def test_compiled_sampling_equals_eager():
    model = tiny_llama_gpt()
    config = GenerationConfig(max_new_tokens=30, eos_ids=(), temperature=1.0, top_p=0.9, seed=3)
    eager = generate(model, PROMPTS[:2], config)
    fast = generate(model, PROMPTS[:2], GenerationConfig(**{**vars(config), "compile": True}))
    assert fast.tokens == eager.tokens


def test_one_token_prompt_past_the_short_kernel_limit_equals_eager():
    # One row, a one-token prompt (its prefill stays eager) and 110 new tokens: the keys grow
    # past attention's SHORT_KEYS_MAX (96), where the step's path and graph change.
    model = tiny_llama_gpt()
    config = GenerationConfig(max_new_tokens=110, eos_ids=(), logprobs=True)
    eager = generate(model, [[5]], config)
    fast = generate(model, [[5]], GenerationConfig(**{**vars(config), "compile": True}))
    assert fast.tokens == eager.tokens
    torch.testing.assert_close(
        torch.tensor(fast.logprobs[0]), torch.tensor(eager.logprobs[0]), rtol=0, atol=1e-5
    )


def test_compiled_steps_read_weights_changed_in_place():
    # The graphs take the weights as inputs: weights inside the compiled layers (a norm, a
    # gated layer's product) changed in place between two calls are the ones used.
    model = tiny_llama_gpt()
    config = GenerationConfig(max_new_tokens=20, eos_ids=(), logprobs=True)
    fast = GenerationConfig(**{**vars(config), "compile": True})
    before = generate(model, PROMPTS[:2], fast)
    step = compiled_module._COMPILED[model][1]
    assert generate(model, PROMPTS[:2], fast).tokens == before.tokens
    assert compiled_module._COMPILED[model][1] is step  # unchanged: the same step
    with torch.no_grad():
        model.blocks.layers[1].attn_block.norm.weight.mul_(-2.5)
        model.blocks.layers[0].ffn.linear2.weight.mul_(3.0)
    eager = generate(model, PROMPTS[:2], config)
    after = generate(model, PROMPTS[:2], fast)
    # weights changed in place (its packed product remade) keep the step and its graphs
    assert compiled_module._COMPILED[model][1] is step
    assert eager.logprobs != before.logprobs  # the change matters
    assert after.tokens == eager.tokens
    for ours, ref in zip(after.logprobs, eager.logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(ours), torch.tensor(ref), rtol=0, atol=1e-5)


def _same_generation(model, prompts, config):
    eager = generate(model, prompts, config)
    fast = generate(model, prompts, GenerationConfig(**{**vars(config), "compile": True}))
    assert fast.tokens == eager.tokens
    for ours, ref in zip(fast.logprobs, eager.logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(ours), torch.tensor(ref), rtol=0, atol=1e-5)
    return eager


def _counted(monkeypatch, name: str) -> list:
    """Replace ``packed_module.<name>`` by a wrapper that appends to the returned list."""
    calls: list = []
    original = getattr(packed_module, name)

    def counting(*args, **kwargs):
        calls.append(name)
        return original(*args, **kwargs)

    monkeypatch.setattr(packed_module, name, counting)
    return calls


def _eager_then_compiled(model, config, *counted: list):
    """One generation with eager steps, then one compiled in whole graphs; returns both and
    how many calls each ``counted`` list took in the eager one (the lists then hold the
    compiled one's)."""
    eager = generate(model, [[5, 6, 7]], config)
    in_eager = [len(calls) for calls in counted]
    for calls in counted:
        calls.clear()
    counters.clear()
    fast = generate(model, [[5, 6, 7]], GenerationConfig(**{**vars(config), "compile": True}))
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"]
    return eager, fast, in_eager


@pytest.mark.skipif(
    not packed_module.float16_available(), reason="this torch has no FBGEMM float16 product"
)
def test_compiled_steps_take_the_float16_copies_of_bfloat16_weights(monkeypatch):
    # Where oneDNN has no bfloat16 kernels (an AVX2 CPU, made here by the flag), one bfloat16
    # row is multiplied by an exact float16 copy of the weight, made and counted in Python:
    # a compiled step calls that path as one operator, once a product, as eager steps do.
    monkeypatch.setattr(packed_module, "_ONEDNN_BF16", False)
    monkeypatch.setattr(packed_module, "HALF_MIN_SIDE", 1)  # the tiny model's weights too
    monkeypatch.setattr(packed_module, "HALF_AFTER_ROWS", 1)  # a copy from the first row
    made = _counted(monkeypatch, "_make_half")
    rows = _counted(monkeypatch, "_one_bf16_row")
    model = tiny_llama_gpt().to(torch.bfloat16)
    config = GenerationConfig(max_new_tokens=12, eos_ids=())
    _, _, (eager_rows, eager_made) = _eager_then_compiled(model, config, rows, made)
    assert eager_rows >= 12 * 2 * 4 and eager_made  # 12 steps x 2 layers x 4 products, copies
    assert len(rows) == eager_rows  # every product of every compiled step took the path ...
    assert made == []  # ... on the copies the eager steps made
    # (their tokens leave eager ones within a few steps, as bfloat16 steps compiled or not do)
    # In a graph, the operator gives what the path gives eagerly, F.linear to bfloat16 rounding.
    layer = model.blocks.layers[0].ffn.linear2
    packed = packed_module.packed_weight(layer)
    assert packed is not None and packed.dtype == torch.float32  # bfloat16 packed in float32
    x = torch.randn(1, 1, layer.in_features).to(torch.bfloat16)
    with torch.no_grad():
        eager_row = packed_module.linear(x, layer, packed)
        compiled_row = torch.compile(packed_module.linear, fullgraph=True)(x, layer, packed)
        reference = torch.nn.functional.linear(x.float(), layer.weight.float(), layer.bias)
    assert torch.equal(compiled_row, eager_row)
    torch.testing.assert_close(compiled_row.float(), reference, rtol=2**-7, atol=1e-6)


def test_compiled_steps_take_the_row_major_copies_where_mkl_is_generic(monkeypatch):
    # Where MKL runs generic code (AMD, made here by the flags), one float32 row is multiplied
    # by a row-major copy of the weight made in Python: the same in a compiled step.
    monkeypatch.setattr(packed_module, "_MKL_GENERIC", True)
    monkeypatch.setattr(packed_module, "_MKL_GEMV", False)
    copies = _counted(monkeypatch, "_row_major")
    model = tiny_llama_gpt()
    config = GenerationConfig(max_new_tokens=12, eos_ids=(), logprobs=True)
    eager, fast, (eager_copies,) = _eager_then_compiled(model, config, copies)
    assert eager_copies >= 12 * 2 * 4
    assert len(copies) == eager_copies  # every product of every compiled step took the path
    assert fast.tokens == eager.tokens
    for ours, ref in zip(fast.logprobs, eager.logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(ours), torch.tensor(ref), rtol=0, atol=1e-5)


def test_a_layer_replaced_by_one_with_a_bias_is_compiled_again():
    # The steps skip dynamo's guards on the model's built-in modules (a bias of None traced
    # into the graph would stay None); the model's parameters and modules, compared once a
    # call, make a new compiled step when they changed.
    model = tiny_llama_gpt()
    config = GenerationConfig(max_new_tokens=16, eos_ids=(), logprobs=True)
    before = _same_generation(model, PROMPTS[:2], config)
    old = model.blocks.layers[0].ffn.linear2
    new = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        new.weight.copy_(old.weight)
        new.bias.normal_(0.0, 0.5)
    model.blocks.layers[0].ffn.linear2 = new
    after = _same_generation(model, PROMPTS[:2], config)
    assert after.logprobs != before.logprobs  # the bias matters


def test_a_changed_attribute_of_a_layer_is_compiled_again():
    # Where every attribute of the model could be read (complete), the steps skip all of
    # dynamo's guards on the model: an attribute the graph was traced with (pre- or post-norm)
    # changed since makes a new compiled step, which agrees with eager steps.
    model = tiny_llama_gpt()
    assert compiled_module._Assumptions(model).complete
    config = GenerationConfig(max_new_tokens=16, eos_ids=(), logprobs=True)
    before = _same_generation(model, PROMPTS[:2], config)
    block = model.blocks.layers[1].ffn_block
    assert block.norm_first
    block.norm_first = False
    after = _same_generation(model, PROMPTS[:2], config)
    assert after.logprobs != before.logprobs  # the attribute matters


def test_a_compiled_step_refuses_another_models_layers():
    model, other = tiny_llama_gpt(), tiny_llama_gpt()
    step = compiled_module.compiled_step(model)
    with pytest.raises(ValueError, match="made for another model"):
        step(other._run)


def test_an_attribute_it_cannot_read_keeps_dynamos_guards():
    model = tiny_llama_gpt()
    model.blocks.layers[0].note = object()  # no attributes of its own, not a plain value
    assumptions = compiled_module._Assumptions(model)
    assert not assumptions.complete
    config = GenerationConfig(max_new_tokens=16, eos_ids=(), logprobs=True)
    _same_generation(model, PROMPTS[:2], config)
    model.blocks.layers[1].ffn_block.norm_first = False  # dynamo's guards see it
    _same_generation(model, PROMPTS[:2], config)


def test_assumptions_read_closures_by_code_and_contents_and_hold_the_model_weakly():
    model = tiny_llama_gpt()
    linear = model.blocks.layers[0].ffn.linear2
    weight = torch.zeros(1)

    def make(value):
        return lambda x: x + value  # a new function of the same code each call

    linear.forward = make(weight)
    first = compiled_module._Assumptions(model).hold()
    linear.forward = make(weight)
    assert first.still(compiled_module._Assumptions(model))  # same code, same tensor
    linear.forward = make(torch.zeros(1))
    assert first.still(compiled_module._Assumptions(model))  # a tensor alike (a graph input)
    linear.forward = make(torch.zeros(2))
    assert not first.still(compiled_module._Assumptions(model))  # another shape
    linear.forward = make(torch.zeros(1, dtype=torch.float64))
    assert not first.still(compiled_module._Assumptions(model))  # another dtype
    del linear.forward
    ref = weakref.ref(model)
    del model, linear
    gc.collect()
    assert ref() is None  # the stored assumptions do not keep the model alive


def test_a_hook_on_a_layer_is_refused_by_name_and_its_removal_compiles_again():
    # A compiled step's products do not call the layers, so a forward hook would not run:
    # refused, naming the module; once removed, the steps compile again and agree with eager.
    model = tiny_llama_gpt()
    config = GenerationConfig(max_new_tokens=16, eos_ids=(), logprobs=True)
    before = _same_generation(model, PROMPTS[:2], config)
    handle = model.blocks.layers[1].ffn.linear2.register_forward_hook(
        lambda mod, args, out: out * 2.0
    )
    hooked = generate(model, PROMPTS[:2], config)
    assert hooked.logprobs != before.logprobs  # eager steps run the hook
    with pytest.raises(ValueError, match=r"forward hooks on blocks\.layers\.1\.ffn\.linear2"):
        generate(model, PROMPTS[:2], GenerationConfig(**{**vars(config), "compile": True}))
    handle.remove()
    assert _same_generation(model, PROMPTS[:2], config).logprobs == before.logprobs


def test_a_compiled_generation_beside_an_eager_one_on_the_same_model():
    # The compiled step belongs to the cache of the generation that asked for it: steps of
    # both generators taken in turns give each its own result.
    model = tiny_llama_gpt()
    config = GenerationConfig(max_new_tokens=12, eos_ids=())
    alone = generate(model, PROMPTS[:2], config).tokens
    fast = generate_steps(model, PROMPTS[:2], GenerationConfig(**{**vars(config), "compile": True}))
    slow = generate_steps(model, PROMPTS[:2], config)
    got = {"fast": [[], []], "slow": [[], []]}
    for a, b in zip(fast, slow, strict=True):
        for name, step in (("fast", a), ("slow", b)):
            for row, tok in zip(step.rows, step.tokens, strict=True):
                got[name][row].append(tok)
    assert got["fast"] == alone and got["slow"] == alone


def test_a_compiled_model_is_freed():
    model = tiny_llama_gpt()
    generate(model, PROMPTS[:1], GenerationConfig(max_new_tokens=4, compile=True))
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


def test_compile_setting_is_checked():
    with pytest.raises(TypeError, match="compile: expected True or False"):
        GenerationConfig(compile="yes")
    with pytest.raises(ValueError, match="needs use_cache=True"):
        GenerationConfig(compile=True, use_cache=False)


def test_compile_without_a_cpp_compiler_is_refused_by_name(monkeypatch):
    def missing():
        raise RuntimeError("no working C++ compiler found in ('g++',)")

    monkeypatch.setattr(compiled_module, "_cpp_compiler", missing)
    with pytest.raises(RuntimeError, match=r"compile: TorchInductor needs a C\+\+ compiler.*g\+\+"):
        generate_steps(tiny_llama_gpt(), PROMPTS, GenerationConfig(max_new_tokens=2, compile=True))


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
        generate_steps(Wrapped(tiny_llama_gpt()), PROMPTS, GenerationConfig(compile=True))
    assert compiled_module.check_compilable(tiny_llama_gpt(), torch.device("cpu")) is None


def test_kernel_caps_get_an_inductor_cache_of_their_own(monkeypatch, tmp_path):
    # Inductor's cache mixes up kernels built with and without the CPU kernel caps (a native
    # run after a capped one aborted on the Xeon): each combination of caps gets its folder.
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    default = os.path.abspath(default_cache_dir())
    for name in compiled_module.KERNEL_CAPS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    compiled_module._separate_capped_cache()
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ  # no caps: Inductor's default

    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default)  # set by Inductor itself
    compiled_module._separate_capped_cache()
    avx2 = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    assert os.path.dirname(avx2) == default and avx2 != default

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    compiled_module._separate_capped_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] not in (default, avx2)  # another combination

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # the user's choice is kept
    compiled_module._separate_capped_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path)
