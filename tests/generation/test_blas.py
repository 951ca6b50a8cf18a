"""attnkit.generation.blas: one-row products through numpy's OpenBLAS, held at one thread."""

import threading

import numpy as np
import pytest
import torch
from torch import nn

from attnkit.generation import blas, packed
from attnkit.generation.packed import linear, packed_linears, packed_weight
from tests.helpers.blas import openblas_at_two_threads, openblas_threads


def test_available_needs_generic_mkl_and_numpys_openblas(monkeypatch):
    """Only where torch's MKL runs generic code (AMD) and numpy is built with OpenBLAS (PyPI's
    wheels are); elsewhere nothing is held and the counts are left alone."""
    try:
        name = np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"]
    except TypeError:  # numpy before 1.25 does not say
        name = ""
    monkeypatch.setattr(blas, "mkl_gemv_is_generic", lambda: True)
    assert blas.available() is ("openblas" in name.lower() and bool(openblas_threads()))
    before = openblas_threads()
    cases = [("mkl-sdl", True), ("accelerate", True), ("", True), ("scipy-openblas", False)]
    for numpy_blas, generic in cases:
        monkeypatch.setattr(blas, "_numpy_blas", lambda numpy_blas=numpy_blas: numpy_blas)
        monkeypatch.setattr(blas, "mkl_gemv_is_generic", lambda generic=generic: generic)
        assert blas.available() is False
        with blas.one_thread():  # nothing to hold: the counts are left alone
            assert not blas.single_threaded() and openblas_threads() == before


@pytest.mark.parametrize("bias", [True, False])
def test_row_product_is_f_linear(bias):
    torch.manual_seed(0)
    module = nn.Linear(96, 130, bias=bias)
    row = torch.randn(1, 96)
    weight_t = module.weight.detach().t().contiguous().numpy()  # (in, out)
    with torch.inference_mode():
        got = blas.row_product(row, weight_t, module.bias)
        want = nn.functional.linear(row, module.weight, module.bias)
    assert got.shape == (1, 130) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    strided = torch.randn(96, 2)[:, :1].t()  # (1, 96), not contiguous
    with torch.inference_mode():
        torch.testing.assert_close(
            blas.row_product(strided, weight_t, module.bias),
            nn.functional.linear(strided, module.weight, module.bias),
            atol=1e-5,
            rtol=1e-5,
        )


def test_row_product_refuses_a_wrong_width_and_overflows_silently():
    weight_t = np.ones((8, 3), dtype=np.float32)
    with pytest.raises(ValueError, match="expected 8 input features.*got shape \\(1, 7\\)"):
        blas.row_product(torch.ones(1, 7), weight_t, None)
    huge = torch.full((1, 8), 3e38)
    with np.errstate(all="raise"):  # as under -W error: torch's product does not warn either
        out = blas.row_product(huge, weight_t, None)
    assert torch.isinf(out).all()


def test_one_thread_holds_openblas_and_puts_the_counts_back(monkeypatch):
    """Blocks nest and overlap across threads; the count comes back when the last one exits.
    A block the main thread holds serves every thread."""
    with openblas_at_two_threads(monkeypatch):
        assert not blas.single_threaded()
        entered, leave, left = threading.Event(), threading.Event(), threading.Event()
        seen = []

        def other():
            with blas.one_thread():
                entered.set()
                leave.wait(10)
                seen.append(blas.single_threaded())
            left.set()

        worker = threading.Thread(target=other)
        with blas.one_thread():
            assert blas.single_threaded() and set(openblas_threads()) == {1}
            with blas.one_thread():  # nested
                assert blas.single_threaded()
            assert blas.single_threaded()
            worker.start()
            assert entered.wait(10)
            leave.set()
            assert left.wait(10)
        worker.join(10)
        assert seen == [True]
        assert set(openblas_threads()) == {2} and not blas.single_threaded()


def test_a_block_alone_in_another_thread_may_hold_nothing(monkeypatch):
    """Once the main thread has set OpenBLAS's count, a count set from another thread is
    ignored: a block there holds nothing and its one-row products take MKL."""
    with openblas_at_two_threads(monkeypatch):
        seen = []

        def other():
            with blas.one_thread():
                seen.append((blas.single_threaded(), openblas_threads()))

        worker = threading.Thread(target=other)
        worker.start()
        worker.join(10)
        assert seen == [(False, openblas_threads())]
        assert set(openblas_threads()) == {2}


def test_a_block_that_raises_puts_the_counts_back(monkeypatch):
    with openblas_at_two_threads(monkeypatch):
        with pytest.raises(RuntimeError, match="boom"), blas.one_thread():
            assert set(openblas_threads()) == {1}
            raise RuntimeError("boom")
        assert set(openblas_threads()) == {2}


needs_onednn = pytest.mark.skipif(not packed._HAS_MKLDNN, reason="torch built without oneDNN")


def _generic_mkl_rows(monkeypatch, **rule) -> list[tuple[int, int]]:
    """As where MKL is generic (AMD), with blas's ``rule`` constants set (MIN_WEIGHTS=0 for
    test-sized layers, ...): the (in, out) shape of every row_product call from now on."""
    monkeypatch.setattr(packed, "_MKL_GENERIC", True)
    monkeypatch.setattr(packed, "_MKL_GEMV", False)
    for name, value in rule.items():
        monkeypatch.setattr(blas, name, value)
    return _count_row_products(monkeypatch)


def _count_row_products(monkeypatch) -> list[tuple[int, int]]:
    """The (in, out) shape of the weight of every row_product call, from now on."""
    calls = []
    product = blas.row_product
    monkeypatch.setattr(blas, "row_product", lambda *a: calls.append(a[1].shape) or product(*a))
    return calls


@needs_onednn
def test_one_float32_row_takes_openblas_within_packed_linears(monkeypatch):
    """Where MKL is generic (AMD): one float32 row through a weight with at least MIN_WEIGHTS
    weights and fewer than MAX_OUT_FEATURES outputs takes OpenBLAS inside packed_linears; a
    smaller layer, an output layer as wide as the limit, several rows, or a call outside the
    block take MKL or oneDNN."""
    calls = _generic_mkl_rows(monkeypatch, MAX_OUT_FEATURES=64, MIN_WEIGHTS=1920)
    torch.manual_seed(2)
    model = nn.Sequential(
        nn.Linear(40, 63), nn.ReLU(), nn.Linear(63, 30), nn.ReLU(), nn.Linear(30, 64)
    )  # 2,520 weights: OpenBLAS; 1,890 (< MIN_WEIGHTS): MKL; 1,920 but 64 outputs (the limit): MKL
    x = torch.randn(1, 40)
    with openblas_at_two_threads(monkeypatch), torch.inference_mode():
        want = model(x)
        outside = linear(x, model[0], packed_weight(model[0]))
        assert calls == []
        with packed_linears(model):
            got = model(x)
            assert calls == [(40, 63)]
            model(torch.randn(3, 40))  # several rows: oneDNN
            assert calls == [(40, 63)]
        torch.testing.assert_close(outside, model[0](x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@needs_onednn
def test_a_block_where_openblas_is_not_held_takes_mkl(monkeypatch):
    """packed_linears asks once whether OpenBLAS runs on one thread: a block alone in another
    thread, where the hold cannot be taken (the main thread set the count), takes MKL."""
    calls = _generic_mkl_rows(monkeypatch, MIN_WEIGHTS=0)
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(40, 63))
    x = torch.randn(1, 40)
    seen = []

    def other():
        with torch.inference_mode(), packed_linears(model):
            seen.append(blas.single_threaded())
            model(x)

    with openblas_at_two_threads(monkeypatch):
        worker = threading.Thread(target=other)
        worker.start()
        worker.join(10)
        assert seen == [False] and calls == []
        with torch.inference_mode(), packed_linears(model):  # the main thread: held
            model(x)
        assert calls == [(40, 63)]


@needs_onednn
def test_greedy_generation_is_the_same_through_openblas(monkeypatch):
    """A GPT at one row: the same greedy tokens and close log-probabilities with the one-row
    products through OpenBLAS as through MKL (the order of the float sums differs)."""
    from attnkit.generation import GenerationConfig, generate
    from attnkit.models import GPT, GPTConfig

    calls = _generic_mkl_rows(monkeypatch, MIN_WEIGHTS=0)  # test-sized layers
    torch.manual_seed(3)
    config = GPTConfig(
        vocab_size=211, context_length=64, d_model=48, num_heads=4, num_layers=2, d_ff=96,
        bos_token_id=0, eos_token_id=0, initializer_range=0.2,
    )  # fmt: skip
    model = GPT(config).eval()
    settings = GenerationConfig(max_new_tokens=20, eos_ids=(), logprobs=True)
    with openblas_at_two_threads(monkeypatch):
        via_openblas = generate(model, [[5, 6, 7, 8]], settings)
        # The prompt's output layer (its last position), then each of the 19 one-row steps:
        # per layer the stacked q/k/v projection, the attention's output and the two
        # feed-forward products, then the output layer.
        step = [(48, 144), (48, 48), (48, 96), (96, 48)] * 2 + [(48, 211)]
        assert calls == [(48, 211)] + step * 19
        monkeypatch.setattr(blas, "MAX_OUT_FEATURES", 0)
        calls.clear()
        via_mkl = generate(model, [[5, 6, 7, 8]], settings)
        assert calls == []
    assert via_openblas.tokens == via_mkl.tokens
    np.testing.assert_allclose(via_openblas.logprobs, via_mkl.logprobs, rtol=1e-4, atol=1e-5)


def test_dot_form_rule():
    """Narrow outputs (at most DOT_FORM_MAX_OUT) from inputs at least twice as wide keep the
    weight as stored, (out, in); every other weight is copied to (in, out)."""
    cases = [((256, 1024), True), ((256, 512), True), ((256, 256), False), ((128, 768), True),
             ((257, 1024), False), ((768, 3072), False), ((512, 1408), False)]  # fmt: skip
    for (out_features, in_features), expected in cases:
        assert blas.dot_form(torch.empty(out_features, in_features)) is expected


@needs_onednn
def test_a_narrow_layer_is_read_as_stored_through_either_blas(monkeypatch):
    """Where MKL is generic, a narrow-output weight's one-row copy is kept (out, in): the
    (in, out) tensor and numpy views are its transpose, and the products through OpenBLAS
    (inside packed_linears) and MKL (outside) are F.linear's."""
    calls = _generic_mkl_rows(monkeypatch, MIN_WEIGHTS=0, DOT_FORM_MAX_OUT=48)
    torch.manual_seed(5)
    narrow, wide = nn.Linear(120, 40), nn.Linear(40, 120)  # (out, in) = (40, 120), (120, 40)
    x_narrow, x_wide = torch.randn(1, 120), torch.randn(1, 40)
    with openblas_at_two_threads(monkeypatch), torch.inference_mode():
        outside = linear(x_narrow, narrow, packed_weight(narrow))  # MKL on the copy
        assert calls == []
        with packed_linears(narrow), packed_linears(wide):
            got_narrow, got_wide = narrow(x_narrow), wide(x_wide)
        assert calls == [(120, 40), (40, 120)]
    t, view = packed._ROW_MAJOR[id(packed_weight(narrow))]
    assert t.shape == (120, 40) and not t.is_contiguous() and t.t().is_contiguous()
    assert view.shape == (120, 40) and view.flags["F_CONTIGUOUS"]
    t_wide, _ = packed._ROW_MAJOR[id(packed_weight(wide))]
    assert t_wide.shape == (40, 120) and t_wide.is_contiguous()
    for got, module, x in ((got_narrow, narrow, x_narrow), (outside, narrow, x_narrow),
                           (got_wide, wide, x_wide)):  # fmt: skip
        torch.testing.assert_close(
            got, nn.functional.linear(x, module.weight, module.bias), atol=1e-5, rtol=1e-5
        )
