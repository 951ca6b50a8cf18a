"""attnkit.generation.blas: one-row products through numpy's OpenBLAS, held at one thread."""

import threading

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_info
from torch import nn

from attnkit.generation import blas, packed
from attnkit.generation.packed import linear, packed_linears, packed_weight


def _openblas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["internal_api"] == "openblas"]


def test_available_follows_numpys_blas(monkeypatch):
    """PyPI's numpy wheels are built with OpenBLAS; a numpy built otherwise (MKL, Accelerate)
    or one that does not say takes MKL's product instead."""
    name = np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"]
    assert blas.available() is ("openblas" in name.lower() and bool(_openblas_threads()))
    for other in ("mkl-sdl", "accelerate", ""):
        monkeypatch.setattr(blas, "_numpy_blas", lambda other=other: other)
        assert blas.available() is False
        before = _openblas_threads()
        with blas.one_thread():  # nothing to hold: the counts are left alone
            assert not blas.single_threaded() and _openblas_threads() == before


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


needs_openblas = pytest.mark.skipif(
    not blas.available(), reason="numpy here is not built with OpenBLAS (PyPI's wheels are)"
)


@needs_openblas
def test_one_thread_holds_openblas_and_puts_the_counts_back():
    """Blocks nest and overlap across threads: the counts come back when the last one exits
    (here in the main thread, the only one whose thread counts OpenBLAS takes)."""
    before = _openblas_threads()
    assert blas.single_threaded() is (set(before) == {1})
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
        assert blas.single_threaded() and set(_openblas_threads()) == {1}
        with blas.one_thread():  # nested
            assert blas.single_threaded()
        assert blas.single_threaded()
        worker.start()
        assert entered.wait(10)
        leave.set()
        assert left.wait(10)
    worker.join(10)
    assert seen == [True]  # the main thread's block held it for the other thread too
    assert _openblas_threads() == before


@needs_openblas
def test_a_block_alone_in_another_thread_holds_nothing():
    """OpenBLAS ignores a thread count set outside the main thread: there the block holds
    nothing and one-row products take MKL (single_threaded is False), unless OpenBLAS already
    runs on one thread."""
    before = _openblas_threads()
    if set(before) == {1}:
        pytest.skip("OpenBLAS runs on one thread in this process (OPENBLAS_NUM_THREADS=1)")
    seen = []

    def other():
        with blas.one_thread():
            seen.append((blas.single_threaded(), _openblas_threads()))

    worker = threading.Thread(target=other)
    worker.start()
    worker.join(10)
    assert seen == [(False, before)]
    assert _openblas_threads() == before


@needs_openblas
def test_a_block_that_raises_puts_the_counts_back():
    before = _openblas_threads()
    with pytest.raises(RuntimeError, match="boom"), blas.one_thread():
        raise RuntimeError("boom")
    assert _openblas_threads() == before


@needs_openblas
def test_one_float32_row_takes_openblas_within_packed_linears(monkeypatch):
    """Where MKL is generic (AMD): one float32 row through a weight with fewer than
    MAX_OUT_FEATURES outputs takes OpenBLAS inside packed_linears; an output layer as wide as
    the limit, several rows, or a call outside the block take MKL or oneDNN."""
    monkeypatch.setattr(packed, "_MKL_GENERIC", True)
    monkeypatch.setattr(packed, "_MKL_GEMV", False)
    monkeypatch.setattr(blas, "MAX_OUT_FEATURES", 64)
    calls = []
    product = blas.row_product
    monkeypatch.setattr(blas, "row_product", lambda *a: calls.append(a[1].shape) or product(*a))
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(40, 63), nn.ReLU(), nn.Linear(63, 64))  # 64: the limit
    x = torch.randn(1, 40)
    with torch.inference_mode():
        want = model(x)
        outside = linear(x, model[0], packed_weight(model[0]))
        assert calls == []
        with packed_linears(model):
            got = model(x)
            assert calls == [(40, 63)]  # the 64-wide layer took MKL
            model(torch.randn(3, 40))  # several rows: oneDNN
            assert calls == [(40, 63)]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with torch.inference_mode():
        torch.testing.assert_close(outside, model[0](x), atol=1e-5, rtol=1e-5)


@needs_openblas
def test_greedy_generation_is_the_same_through_openblas(monkeypatch):
    """A GPT at one row: the same greedy tokens and close log-probabilities with the one-row
    products through OpenBLAS as through MKL (the order of the float sums differs)."""
    from attnkit.generation import GenerationConfig, generate
    from attnkit.models import GPT, GPTConfig

    monkeypatch.setattr(packed, "_MKL_GENERIC", True)
    monkeypatch.setattr(packed, "_MKL_GEMV", False)
    calls = []
    product = blas.row_product
    monkeypatch.setattr(blas, "row_product", lambda *a: calls.append(1) or product(*a))
    torch.manual_seed(3)
    config = GPTConfig(
        vocab_size=211, context_length=64, d_model=48, num_heads=4, num_layers=2, d_ff=96,
        bos_token_id=0, eos_token_id=0, initializer_range=0.2,
    )  # fmt: skip
    model = GPT(config).eval()
    settings = GenerationConfig(max_new_tokens=20, eos_ids=(), logprobs=True)
    via_openblas = generate(model, [[5, 6, 7, 8]], settings)
    assert calls  # every layer and the head (211 < MAX_OUT_FEATURES) went through it
    monkeypatch.setattr(blas, "MAX_OUT_FEATURES", 0)
    calls.clear()
    via_mkl = generate(model, [[5, 6, 7, 8]], settings)
    assert calls == []
    assert via_openblas.tokens == via_mkl.tokens
    np.testing.assert_allclose(via_openblas.logprobs, via_mkl.logprobs, rtol=1e-4, atol=1e-5)
