"""Linear layers on prepacked weights: the same products as ``F.linear``, a packed weight made
once and remade when the weight changes, and ``packed_linears`` patching only for its block."""

import pytest
import torch
from torch import nn

import attnkit.generation.packed as packed
from attnkit import hardware
from attnkit.generation import GenerationConfig, generate
from attnkit.generation.packed import linear, packed_linears, packed_weight, release
from attnkit.models import GPT, GPTConfig

pytestmark = pytest.mark.skipif(not packed._HAS_MKLDNN, reason="torch built without oneDNN")


def tiny_gpt() -> GPT:
    config = GPTConfig(
        vocab_size=97, context_length=32, d_model=32, num_heads=4, num_layers=2, d_ff=64,
        bos_token_id=0, eos_token_id=0, initializer_range=0.3,
    )  # fmt: skip
    return GPT(config).eval()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(3, 48), (2, 5, 48), (1, 1, 48)])
def test_float32_packed_product_equals_f_linear(bias, shape):
    torch.manual_seed(0)
    module = nn.Linear(48, 70, bias=bias)
    x = torch.randn(shape)
    weight = packed_weight(module)
    assert weight is not None
    with torch.inference_mode():
        got = linear(x, module, weight)
        strided = linear(torch.randn(shape[0], 3, 48)[:, -1], module, weight)  # a (B, D) view
    assert got.shape == (*shape[:-1], 70)
    torch.testing.assert_close(got, nn.functional.linear(x, module.weight, module.bias))
    assert strided.shape == (shape[0], 70)


def test_bfloat16_packed_product_is_close_to_f_linear():
    torch.manual_seed(0)
    module = nn.Linear(64, 40).to(torch.bfloat16)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    weight = packed_weight(module)  # bfloat16, or float32 where oneDNN has no bf16 kernels
    with torch.inference_mode():
        got = linear(x, module, weight).float()
    expected = nn.functional.linear(x.float(), module.weight.float(), module.bias.float())
    torch.testing.assert_close(got, expected, atol=3e-2, rtol=2e-2)


def test_bfloat16_is_packed_in_float32_where_onednn_has_no_bfloat16_kernels():
    """On this CPU: a bfloat16 weight packs as bfloat16 where oneDNN runs bfloat16, else in
    float32."""
    module = nn.Linear(64, 40).to(torch.bfloat16)
    native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    weight = packed_weight(module)
    assert weight is not None
    assert weight.dtype == (torch.bfloat16 if native else torch.float32)


def test_bfloat16_in_float32_only_where_the_copies_fit(monkeypatch):
    """The float32 copies of a bfloat16 model are made only if they fit in half of the memory
    still available; otherwise its layers keep F.linear within packed_linears."""
    monkeypatch.setattr(packed, "_bf16_in_float32", lambda d: d == torch.bfloat16)
    model = tiny_gpt().to(torch.bfloat16)
    linears = [m for m in model.modules() if type(m) is nn.Linear]
    need = sum(m.weight.numel() * 4 for m in linears)
    monkeypatch.setattr(hardware, "available_memory", lambda device: 2 * need - 1)
    with packed_linears(model):
        assert not any("forward" in m.__dict__ for m in linears)
    monkeypatch.setattr(hardware, "available_memory", lambda device: 2 * need)
    with packed_linears(model):
        assert all("forward" in m.__dict__ for m in linears)
    # once made, the copies are not counted again (they already hold their memory)
    monkeypatch.setattr(hardware, "available_memory", lambda device: 0)
    with packed_linears(model):
        assert all("forward" in m.__dict__ for m in linears)
    release(model)


def _count_f_linear(monkeypatch) -> list:
    """A list that gets an entry at each F.linear call of the packed module (which still
    computes F.linear's product)."""
    import types

    plain = []
    monkeypatch.setattr(
        packed,
        "F",
        types.SimpleNamespace(
            linear=lambda *a: plain.append(1) or nn.functional.linear(*a),
            relu=nn.functional.relu,
        ),
    )
    return plain


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("relu", [False, True])
def test_bfloat16_in_float32_rows_and_the_single_row(monkeypatch, relu, bias):
    """With the float32 packing (forced here on any CPU), several rows are the float32 product
    of the widened values rounded to bfloat16; one row takes torch's bfloat16 F.linear."""
    monkeypatch.setattr(packed, "_bf16_in_float32", lambda dtype: dtype == torch.bfloat16)
    plain = _count_f_linear(monkeypatch)
    torch.manual_seed(2)
    module = nn.Linear(96, 50, bias=bias).to(torch.bfloat16)
    weight = packed_weight(module)
    assert weight.dtype == torch.float32
    x = torch.randn(2, 3, 96).to(torch.bfloat16)
    row = x[:1, :1]  # (1, 1, 96)
    b = None if module.bias is None else module.bias.double()
    wide = nn.functional.linear(x.double(), module.weight.double(), b)
    wide = wide.relu() if relu else wide
    with torch.inference_mode():
        got = packed._product(x, module.weight, module.bias, weight, relu=relu)
        assert not plain
        one = packed._product(row, module.weight, module.bias, weight, relu=relu)
        assert plain == [1]
    assert got.dtype == one.dtype == torch.bfloat16 and got.shape == (2, 3, 50)
    # float32 sums of exact bfloat16 products, then one rounding: within bfloat16's half-ulp
    torch.testing.assert_close(got.double(), wide, rtol=2**-8, atol=1e-6)
    torch.testing.assert_close(one.double(), wide[:1, :1], rtol=2**-7, atol=1e-2)


needs_float16 = pytest.mark.skipif(
    not packed.float16_available(), reason="no FBGEMM float16 product in this torch or CPU"
)


def _count_float16(monkeypatch) -> list:
    """Records each call of FBGEMM's float16-weight product made through packed.py."""
    calls = []
    real = torch.ops.quantized.linear_dynamic_fp16

    class Ops:  # torch.ops.quantized, with the one product counted
        def __getattr__(self, name):
            return getattr(torch.ops.quantized, name)

        def linear_dynamic_fp16(self, *args):
            calls.append(args[0].shape)
            return real(*args)

    class Torch:  # packed.py's torch, with torch.ops.quantized above
        def __getattr__(self, name):
            return getattr(torch, name)

    fake = Torch()
    fake.ops = type("Namespace", (), {"quantized": Ops(), "mkldnn": torch.ops.mkldnn})()
    monkeypatch.setattr(packed, "torch", fake)
    return calls


def _bf16_linear(out_features: int, in_features: int, bias: bool, scale: float = 1.0):
    torch.manual_seed(3)
    module = nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        module.weight.mul_(scale)
    return module.to(torch.bfloat16)


def _force_half(monkeypatch, after_rows: int = 1) -> None:
    """bfloat16 packed in float32 (as where oneDNN has no bfloat16 kernels), on any CPU, and a
    float16 copy made after ``after_rows`` single rows."""
    monkeypatch.setattr(packed, "_bf16_in_float32", lambda dtype: dtype == torch.bfloat16)
    monkeypatch.setattr(packed, "HALF_AFTER_ROWS", after_rows)


def _count_packings(monkeypatch) -> list:
    """Records each float16 copy packed."""
    made = []
    pack = packed.pack_float16
    monkeypatch.setattr(packed, "pack_float16", lambda *a: made.append(1) or pack(*a))
    return made


@needs_float16
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize(
    "shape, scale",
    [((1100, 64), 1.0), ((48, 1024), 1.0), ((1030, 40), 1e6), ((1030, 40), 1e-7)],
)  # fmt: skip
def test_one_bfloat16_row_takes_the_float16_copy_of_a_long_weight(
    monkeypatch, shape, scale, bias, relu
):
    """Where bfloat16 is packed in float32 (forced here), one row on a weight of 1,024 or more
    on a side is multiplied through its float16 copy, scaled by a power of two so that float16
    holds it exactly (weights of 1e6 and 1e-7 too): float32 sums of exact products, one
    rounding to bfloat16, as torch's bfloat16 product has them."""
    _force_half(monkeypatch)
    module = _bf16_linear(*shape, bias=bias, scale=scale)
    weight = packed_weight(module)
    calls = _count_float16(monkeypatch)
    plain = _count_f_linear(monkeypatch)
    row = (torch.randn(1, 1, shape[1]) * 3).to(torch.bfloat16)
    b = None if module.bias is None else module.bias.double()
    wide = nn.functional.linear(row.double(), module.weight.double(), b)
    wide = wide.relu() if relu else wide
    with torch.inference_mode():
        one = packed._product(row, module.weight, module.bias, weight, relu=relu)
    assert calls == [(1, shape[1])] and not plain  # the float16 copy, not F.linear
    assert one.dtype == torch.bfloat16 and one.shape == (1, 1, shape[0])
    # the float32 sum of exact products within n 2^-24 of the sum of |products|, then one
    # rounding to bfloat16 (half an ulp, 2^-9 relative)
    spread = nn.functional.linear(row.double().abs(), module.weight.double().abs())
    spread = spread.relu() if relu else spread
    error = (one.double() - wide).abs()
    assert bool((error <= wide.abs() * 2**-8 + spread * shape[1] * 2**-23 + 1e-30).all())
    # ... and torch's own bfloat16 product agrees to within the same rounding
    reference = nn.functional.linear(row, module.weight, module.bias)
    reference = reference.relu() if relu else reference
    torch.testing.assert_close(
        one, reference, rtol=2**-7, atol=1e-30 + float(spread.max().detach()) * 1e-5
    )


@needs_float16
def test_narrow_weights_and_weights_float16_cannot_hold_take_f_linear(monkeypatch):
    """A 768 x 768 weight (FBGEMM's float16 product is slower there) and a long weight whose
    values span more than float16's range after scaling keep torch's bfloat16 product, the
    same values as F.linear."""
    _force_half(monkeypatch)
    narrow = _bf16_linear(768, 768, bias=True)
    wide_range = _bf16_linear(1030, 40, bias=False)
    with torch.no_grad():
        wide_range.weight[0, 0] = 2.0**-40 * (1 + 2**-7)  # 8 bits, far below float16's range
    calls = _count_float16(monkeypatch)
    for module in (narrow, wide_range):
        weight = packed_weight(module)
        row = torch.randn(1, module.in_features).to(torch.bfloat16)
        with torch.inference_mode():
            got = packed._product(row, module.weight, module.bias, weight)
        assert torch.equal(got, nn.functional.linear(row, module.weight, module.bias))
    assert not calls
    assert packed._HALF[id(packed_weight(wide_range))][1:] == [True, None, None]  # refused


@needs_float16
def test_the_float16_copy_follows_its_bias_and_overflows_as_torch_does(monkeypatch):
    """A new bias (the weight unchanged) makes a new copy; a row whose float32 sums overflow
    gives inf as torch's bfloat16 product does, not inf from the scaled weights."""
    _force_half(monkeypatch)
    module = _bf16_linear(1024, 16, bias=True)
    weight = packed_weight(module)
    row = torch.randn(1, 16).to(torch.bfloat16)
    with torch.inference_mode():
        before = packed._product(row, module.weight, module.bias, weight)
        module.bias.add_(100.0)
        after = packed._product(row, module.weight, module.bias, weight)
    torch.testing.assert_close(after.float() - before.float(), torch.full((1, 1024), 100.0),
                               rtol=0, atol=1.0)  # fmt: skip
    with torch.no_grad():
        module.weight.abs_()
        module.bias.zero_()
    weight = packed_weight(module)  # remade: the weight changed
    huge = torch.full((1, 16), 2.0**127).to(torch.bfloat16)  # 16 x 2^127 x |w|: overflows for most
    modest = torch.full((1, 16), 2.0**100).to(torch.bfloat16)  # 2^100 x 2^shift would not fit,
    with torch.inference_mode():  # but the row is scaled down, not the weights up
        got_huge = packed._product(huge, module.weight, module.bias, weight)
        got_modest = packed._product(modest, module.weight, module.bias, weight)
    assert torch.equal(got_huge.isinf(), nn.functional.linear(huge, module.weight).isinf())
    assert bool(got_huge.isinf().any()) and bool(torch.isfinite(got_modest).all())
    torch.testing.assert_close(got_modest, nn.functional.linear(modest, module.weight),
                               rtol=2**-7, atol=0)  # fmt: skip


@needs_float16
def test_the_float16_copy_is_made_after_enough_rows_and_goes_with_its_packed_weight(monkeypatch):
    """A weight multiplies its first HALF_AFTER_ROWS - 1 single rows with torch's product (a
    short call pays nothing for the copy), then through the copy; the copy is freed with the
    packed weight."""
    _force_half(monkeypatch, 3)
    module = _bf16_linear(1024, 8, bias=False)
    weight = packed_weight(module)
    made = _count_packings(monkeypatch)
    calls = _count_float16(monkeypatch)
    plain = _count_f_linear(monkeypatch)
    row = torch.ones(1, 8).to(torch.bfloat16)
    with torch.inference_mode():
        for _ in range(4):
            packed._product(row, module.weight, None, weight)
        packed._product(row.expand(2, 8), module.weight, None, weight)  # not a single row
    assert len(plain) == 2 and len(calls) == 2  # rows 1-2 torch's, rows 3-4 the copy
    assert len(made) == 1  # made once, at row 3
    key = id(weight)
    assert packed._HALF[key][0] == 4 and packed._HALF[key][3] is not None
    del weight
    release(module)
    import gc

    gc.collect()
    assert key not in packed._HALF


@needs_float16
@pytest.mark.parametrize("why", ["tiny", "memory"])
def test_no_float16_copy_for_tiny_weights_or_without_the_memory(monkeypatch, why):
    """Weights below 2^-112 would need a scale float32 cannot hold (2^127 and more), and a copy
    that does not fit in half of the memory still available is not made: torch's product."""
    _force_half(monkeypatch)
    module = _bf16_linear(1024, 8, bias=False)
    if why == "tiny":  # 2^-120 to 2^-119 each, none 0 (0 x an overflowed scale would be NaN)
        with torch.no_grad():
            tiny = (torch.rand(1024, 8) + 1) * 2.0**-120 * torch.randn(1024, 8).sign()
            module.weight.copy_(tiny.to(torch.bfloat16))
        assert bool((module.weight != 0).all())
    if why == "memory":
        monkeypatch.setattr(hardware, "available_memory", lambda device: 1024 * 8 * 11)
    weight = packed_weight(module)
    calls = _count_float16(monkeypatch)
    row = torch.randn(1, 8).to(torch.bfloat16)
    with torch.inference_mode():
        got = packed._product(row, module.weight, None, weight)
    assert not calls and packed._HALF[id(weight)][3] is None
    assert torch.equal(got, nn.functional.linear(row, module.weight))


@needs_float16
def test_threads_share_one_float16_copy(monkeypatch):
    """Threads that reach HALF_AFTER_ROWS together make one copy between them."""
    import threading

    _force_half(monkeypatch)
    module = _bf16_linear(4096, 256, bias=True)
    weight = packed_weight(module)
    made = _count_packings(monkeypatch)
    row = torch.randn(1, 256).to(torch.bfloat16)
    start = threading.Barrier(4)
    results = [None] * 4

    def work(slot: int) -> None:
        start.wait()
        with torch.inference_mode():
            results[slot] = packed._product(row, module.weight, module.bias, weight)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 1
    assert all(torch.equal(r, results[0]) for r in results)


def test_other_dtypes_and_gradients_take_f_linear():
    module = nn.Linear(8, 4).double()
    assert packed_weight(module) is None
    module = nn.Linear(8, 4)
    weight = packed_weight(module)
    x = torch.randn(2, 8, requires_grad=True)
    out = linear(x, module, weight)  # grad enabled: the autograd-aware F.linear
    assert out.grad_fn is not None
    assert torch.equal(out, nn.functional.linear(x, module.weight, module.bias))


def test_packed_weight_is_reused_and_remade_after_a_change():
    module = nn.Linear(16, 8)
    first = packed_weight(module)
    assert packed_weight(module) is first
    with torch.no_grad():
        module.weight.mul_(2)  # in place: the version counter moves
    second = packed_weight(module)
    assert second is not first
    module.load_state_dict({"weight": torch.ones(8, 16), "bias": torch.zeros(8)})
    x = torch.randn(3, 16)
    with torch.inference_mode():
        torch.testing.assert_close(
            linear(x, module, packed_weight(module)), x.sum(-1)[:, None].expand(3, 8)
        )
    release(nn.Sequential(module))
    assert module not in packed._PACKED


def test_packed_linears_patches_only_within_its_block(monkeypatch):
    model = tiny_gpt()
    calls = []
    real = packed.linear
    monkeypatch.setattr(packed, "linear", lambda *a, **k: calls.append(1) or real(*a, **k))
    ids = torch.randint(0, 97, (2, 7))
    with torch.inference_mode():
        plain = model(ids).logits
        assert not calls
        with packed_linears(model):
            with packed_linears(model):  # nested: patched once, restored by the outer block
                fast = model(ids).logits
            assert len(calls) == 2 * 4 + 1  # 4 linear layers per block and the head
            model(ids)
        assert len(calls) == 2 * 9
        model(ids)
    assert len(calls) == 2 * 9
    assert not any("forward" in m.__dict__ for m in model.modules())
    torch.testing.assert_close(fast, plain, atol=1e-5, rtol=0)


def test_packed_linears_restores_after_an_error():
    model = tiny_gpt()
    with pytest.raises(RuntimeError, match="boom"), packed_linears(model):
        assert "forward" in model.lm_head.__dict__
        raise RuntimeError("boom")
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_training_after_generation_uses_autograd_and_the_new_weights():
    """Generation leaves the model as it was: trainable, and its next generation follows the
    trained weights (the packed copies are remade)."""
    torch.manual_seed(0)
    model = tiny_gpt()
    config = GenerationConfig(max_new_tokens=6, eos_ids=())
    before = generate(model, [[1, 2, 3]], config).tokens
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model.train()
    loss = model(torch.tensor([[1, 2, 3, 4]])).logits.logsumexp(-1).mean()
    loss.backward()
    optimizer.step()
    model.eval()
    with torch.inference_mode():
        ids = torch.tensor([[1, 2, 3]])
        expected = []
        for _ in range(6):  # greedy, written out with the model's plain forward
            expected.append(int(model(ids).logits[0, -1].argmax()))
            ids = torch.cat([ids, torch.tensor([[expected[-1]]])], 1)
    after = generate(model, [[1, 2, 3]], config).tokens
    assert after == [expected]
    assert before != after


def test_llama_options_run_on_packed_weights():
    # Grouped-query in_proj (D + 2 H_kv hd rows), the gated feed-forward's stacked linear1 and
    # an untied head are plain nn.Linear: all packed, the same logits as F.linear.
    torch.manual_seed(0)
    config = GPTConfig.llama(
        vocab_size=97, context_length=32, d_model=32, num_heads=4, num_kv_heads=2,
        num_layers=2, d_ff=48, initializer_range=0.3, window=5,
    )  # fmt: skip
    model = GPT(config).eval()
    ids = torch.randint(0, 97, (2, 9))
    with torch.inference_mode():
        want = model(ids).logits
        with packed_linears(model):
            patched = [m for m in model.modules() if "forward" in m.__dict__]
            got = model(ids).logits
    assert model.blocks.layers[0].self_attn.in_proj in patched
    assert model.blocks.layers[0].ffn.linear1 in patched and model.lm_head in patched
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mkl", ["intel", "generic", "none"])
def test_one_float32_row_takes_mkl_where_it_is_faster(monkeypatch, mkl):
    """A single float32 row: on an Intel CPU F.linear (MKL's matrix-vector product), where MKL
    is generic (AMD) the product with a row-major copy of the weight, made once; two rows or
    bfloat16 take the packed weight, and so does every call elsewhere. The product is
    F.linear's, to float32 rounding, either way."""
    monkeypatch.setattr(packed, "_MKL_GEMV", mkl == "intel")
    monkeypatch.setattr(packed, "_MKL_GENERIC", mkl == "generic")
    plain = _count_f_linear(monkeypatch)
    torch.manual_seed(1)
    module = nn.Linear(48, 70)
    weight = packed_weight(module)
    with torch.inference_mode():
        one = linear(torch.randn(1, 1, 48), module, weight)
        assert len(plain) == (1 if mkl == "intel" else 0)
        assert (id(weight) in packed._ROW_MAJOR) == (mkl == "generic")
        copy = packed._ROW_MAJOR.get(id(weight))
        linear(torch.randn(1, 48), module, weight)
        assert packed._ROW_MAJOR.get(id(weight)) is copy  # made once
        two = linear(torch.randn(2, 1, 48), module, weight)
        assert len(plain) == (2 if mkl == "intel" else 0)
    assert one.shape == (1, 1, 70) and two.shape == (2, 1, 70)
    x = torch.randn(1, 48)
    with torch.inference_mode():
        torch.testing.assert_close(
            linear(x, module, weight), nn.functional.linear(x, module.weight, module.bias)
        )
        no_bias = nn.Linear(48, 70, bias=False)
        torch.testing.assert_close(
            linear(x, no_bias, packed_weight(no_bias)), nn.functional.linear(x, no_bias.weight)
        )


def test_the_row_major_copy_is_made_on_huge_pages(monkeypatch):
    """The (in, out) copy that one-row products stream is allocated by hugepages.empty."""
    from attnkit.generation import hugepages

    monkeypatch.setattr(packed, "_MKL_GENERIC", True)
    monkeypatch.setattr(packed, "_MKL_GEMV", False)
    made = []
    real = hugepages.empty

    def spy(shape, dtype):
        made.append(real(shape, dtype))
        return made[-1]

    monkeypatch.setattr(hugepages, "empty", spy)
    module = nn.Linear(40, 96)
    weight = packed_weight(module)
    x = torch.randn(1, 40)
    with torch.inference_mode():
        got = linear(x, module, weight)
    copy = packed._ROW_MAJOR[id(weight)][0]
    assert len(made) == 1 and copy is made[0] and copy.shape == (40, 96)
    assert torch.equal(copy, module.weight.detach().t())
    torch.testing.assert_close(got, nn.functional.linear(x, module.weight, module.bias))


def test_the_row_major_copy_goes_with_its_packed_weight(monkeypatch):
    """Where MKL is generic, the copy a one-row call makes is freed with the packed weight
    (release, or a changed weight whose packed weight is remade)."""
    import gc

    monkeypatch.setattr(packed, "_MKL_GENERIC", True)
    monkeypatch.setattr(packed, "_MKL_GEMV", False)
    module = nn.Linear(16, 24)
    with torch.inference_mode():
        linear(torch.randn(1, 16), module, packed_weight(module))
    key = id(packed_weight(module))
    assert key in packed._ROW_MAJOR
    packed.release(module)
    gc.collect()
    assert key not in packed._ROW_MAJOR
    with torch.inference_mode():
        linear(torch.randn(1, 16), module, packed_weight(module))
    key = id(packed_weight(module))
    with torch.no_grad():
        module.weight.mul_(2)  # a new version: the packed weight is remade, the copy dropped
    x = torch.randn(1, 16)
    with torch.inference_mode():
        got = linear(x, module, packed_weight(module))
    gc.collect()
    assert key not in packed._ROW_MAJOR
    torch.testing.assert_close(got, nn.functional.linear(x, module.weight, module.bias))


def test_mkl_gemv_rule_reads_the_vendor(monkeypatch):
    from attnkit import hardware

    monkeypatch.setattr(hardware, "cpu_vendor", lambda: "GenuineIntel")
    assert hardware.mkl_gemv_is_fast() is torch.backends.mkl.is_available()
    monkeypatch.setattr(hardware, "cpu_vendor", lambda: "AuthenticAMD")
    assert hardware.mkl_gemv_is_fast() is False


def tiny_translator():
    from attnkit.models import Transformer, TransformerConfig

    config = TransformerConfig(
        src_vocab_size=60, tgt_vocab_size=60, d_model=32, num_heads=4, num_encoder_layers=1,
        num_decoder_layers=2, d_ff=64, dropout=0.0, max_len=32,
    )  # fmt: skip
    torch.manual_seed(0)
    return Transformer(config).eval()


@pytest.mark.parametrize(
    "dtype, widen", [(torch.float32, None), (torch.bfloat16, None), (torch.bfloat16, True)]
)
def test_translation_model_cross_queries_and_relu_feed_forward_are_packed(
    monkeypatch, dtype, widen
):
    """Cross-attention's query rows of in_proj and the ReLU feed-forward layers run on packed
    weights within the block only, and the decoder gives F.linear's logits (float32: to
    rounding; bf16: the fused ReLU rounds as ReLU after the product does, so the packed
    product with and without fusion agree, here exactly). ``widen``: bfloat16 packed in float32
    (:func:`packed._bf16_in_float32`) forced on any CPU; None: this CPU's rule. Where oneDNN
    refuses a weight, the query rows stay unpatched and the feed-forward layer takes F.linear
    and ReLU."""
    from attnkit.modules import FeedForward, MultiHeadAttention

    if widen:
        monkeypatch.setattr(packed, "_bf16_in_float32", lambda d: d == torch.bfloat16)
    model = tiny_translator().to(dtype)
    packable = packed_weight(model.output) is not None  # None only where oneDNN refuses it
    if widen:
        assert packed_weight(model.output).dtype == torch.float32
    src, tgt = torch.randint(1, 60, (3, 9)), torch.randint(1, 60, (3, 6))
    with torch.inference_mode():
        want = model(src, tgt)
        with packed_linears(model):
            crosses = [m for m in model.modules() if type(m) is MultiHeadAttention]
            ffns = [m for m in model.modules() if type(m) is FeedForward]
            # every MHA has stacked in_proj here; the decoder's cross-attentions use _project_q
            assert all(("_project_q" in m.__dict__) is packable for m in crosses)
            assert ffns and all("forward" in m.__dict__ for m in ffns)
            got = model(src, tgt)
            ffn = ffns[0]
            x = torch.randn(4, 32).to(dtype)
            fused = ffn.forward(x)
            hidden = torch.relu(linear(x, ffn.linear1, packed_weight(ffn.linear1)))
            separate = linear(hidden, ffn.linear2, packed_weight(ffn.linear2))
    assert not any("_project_q" in m.__dict__ or "forward" in m.__dict__ for m in model.modules())
    # The same products with and without the fused ReLU: equal here, and within one rounding
    # step of the dtype on a CPU whose library might pick another kernel for the fused form
    # (native bfloat16 runs only on AVX-512 and AMX CPUs). A ReLU left out would put negative
    # hidden values through the second product, far more than a step apart.
    step = 2**-7 if dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(fused, separate, rtol=step, atol=step)
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


def test_relu_feed_forward_keeps_its_own_forward_in_training():
    """With gradients (training) the patched layer runs FeedForward.forward: autograd records."""
    from attnkit.modules import FeedForward

    ffn = FeedForward(16, 32, activation="relu", dropout=0.0)
    x = torch.randn(2, 16, requires_grad=True)
    with packed_linears(ffn):
        out = ffn(x)
    assert out.grad_fn is not None
    torch.testing.assert_close(out, ffn.linear2(torch.relu(ffn.linear1(x))))
