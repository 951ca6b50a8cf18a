"""The int8 and float16 screens of greedy decoding (attnkit.generation.screen): their error
bounds against float64 logits, their tokens against float32's argmax (near-ties, exact ties,
rows they cannot decide), when they apply, and greedy generation through them against Hugging
Face's. Tests that take the ``kind`` fixture run for both kinds; those about float16's own
rounding take ``float16``; the rest use the default kind (int8 where FBGEMM's int8 runs)."""

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers
from torch import nn

from attnkit.generation import GenerationConfig, generate, packed, screen
from attnkit.models import GPT, GPTConfig
from tests.helpers.generation import write_hf_gpt2_folder

pytestmark = pytest.mark.skipif(not screen.available(), reason="no FBGEMM int8 or float16 product")

VOCAB = 5000  # at least screen.MIN_OUTPUTS
RUNS = {"int8": packed.int8_available, "float16": packed.float16_available}
# FBGEMM runs on x86 CPUs with AVX2 (every machine CI lands on); elsewhere these tests say why
needs_int8 = pytest.mark.skipif(not RUNS["int8"](), reason="FBGEMM's int8 product does not run")
needs_float16 = pytest.mark.skipif(
    not RUNS["float16"](), reason="FBGEMM's float16 product does not run"
)


@pytest.fixture(params=["int8", "float16"])
def kind(request, monkeypatch) -> str:
    """The screen kind a test runs with (screen.KIND), each where FBGEMM runs it."""
    if not RUNS[request.param]():
        pytest.skip(f"FBGEMM's {request.param} product does not run here")
    monkeypatch.setattr(screen, "KIND", request.param)
    return request.param


@pytest.fixture
def float16(monkeypatch) -> None:
    """Tests of float16's own rounding: the float16 screen."""
    if not RUNS["float16"]():
        pytest.skip("FBGEMM's float16 product does not run here")
    monkeypatch.setattr(screen, "KIND", "float16")


def test_the_default_kind_is_int8_where_it_runs_else_float16():
    head = _head()
    found = screen.screen(head)
    assert found.kind == ("int8" if packed.int8_available() else "float16")
    assert found.kind == "float16" or isinstance(found, screen.Int8Screen)


def _head(n_in=64, vocab=VOCAB, *, bias=False, seed=0, std=0.02) -> nn.Linear:
    torch.manual_seed(seed)
    head = nn.Linear(n_in, vocab, bias=bias)
    with torch.no_grad():
        head.weight.normal_(0, std)
        if bias:
            head.bias.normal_(0, 0.5)
    return head


def _argmax32(head: nn.Linear, x: torch.Tensor) -> list[int]:
    with torch.no_grad():
        return F.linear(x, head.weight, head.bias).argmax(dim=1).tolist()


def _inputs(kind: str, m: int, n: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(m, n, generator=gen)
    if kind == "normal":
        return x
    if kind == "tiny":
        return x * 1e-6
    if kind == "huge":
        return x * 1e6
    if kind == "positive":
        return x.abs() + 3.0
    if kind == "heavy":  # Cauchy-like tails
        return x / torch.rand(m, n, generator=gen).clamp(min=1e-3)
    if kind == "spike":  # one value dwarfs the others
        x[:, 0] = 1e4
        return x
    raise ValueError(kind)


KINDS = ["normal", "tiny", "huge", "positive", "heavy", "spike"]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("inputs", KINDS)
def test_the_bound_holds_against_float64_and_float32_logits(inputs, bias, kind):
    head = _head(n_in=96, bias=bias, seed=1)
    with torch.no_grad():  # rows of very different sizes, and float16 subnormal weights
        head.weight[:50] *= 300.0
        head.weight[50:100] *= 1e-5
    found = screen.screen(head)
    assert found is not None and found.kind == kind
    x = _inputs(inputs, 8, 96, torch.Generator().manual_seed(2))
    approx = found.approx(x)  # (8, V)
    if bias:
        approx = approx + head.bias
    err = _bound(found, x)
    w64 = head.weight.double()
    exact = x.double() @ w64.T + (0 if not bias else head.bias.double())  # (8, V)
    float32 = F.linear(x, head.weight, head.bias).detach().double()
    assert ((exact - approx.double()).abs() <= err).all()
    assert ((float32 - approx.double()).abs() <= err).all()
    # and it is not vacuous: the bound is far below the spread of the logits (int8's, whose
    # inputs share one quantization step, where no input dwarfs the others)
    if kind == "float16":
        assert err.median() < 0.05 * exact.std(dim=1).min()
    elif inputs not in ("heavy", "spike"):
        assert err.median() < 0.2 * exact.std(dim=1).min()


def _bound(found: screen.Screen, x: torch.Tensor) -> torch.Tensor:
    """The bound (M, V) float64 the screen claims for its logits of x (M, n): |x|_2 times
    spread, plus the input step times step (int8), the bias's rounding and tiny."""
    err = torch.linalg.vector_norm(x.double(), dim=1, keepdim=True) * found.spread.double()
    if found.step is not None:
        err = err + found.input_step(x.numpy()) * found.step.double()
    if found.bias_error is not None:
        err = err + torch.from_numpy(found.bias_error).double()
    return err + found.tiny


@pytest.mark.parametrize("n_in", [64, 768, 4096])
@needs_int8
def test_the_int8_bound_holds_at_model_widths(n_in):
    """Hidden states of real models' widths and an input with a large range: the one input
    step of FBGEMM's quantization, the rounding of its 32-bit sums, at the sizes it runs."""
    head = _head(n_in=n_in, seed=11, vocab=screen.MIN_OUTPUTS)
    found = screen.Int8Screen(head.weight, None)
    gen = torch.Generator().manual_seed(12)
    for scale in (1e-3, 1.0, 40.0):
        x = torch.randn(4, n_in, generator=gen) * scale
        x[1, 3] = 30 * scale  # one large value in one row: the step of all four
        exact = x.double() @ head.weight.double().T
        err = (exact - found.approx(x).double()).abs()
        assert (err <= _bound(found, x)).all()
        assert (err > 0.01 * _bound(found, x)).any()  # a bound of the right size


@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("bias", [False, True])
def test_tokens_are_float32_argmax(m, bias, kind):
    head = _head(bias=bias)
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        x = torch.randn(m, 64, generator=gen)
        tokens = screen.greedy_tokens(head, x)
        assert tokens is not None and tokens.dtype == torch.int64
        assert tokens.tolist() == _argmax32(head, x)


def _spy_verification(monkeypatch) -> list[int]:
    """Counts the candidates screen.py multiplies again in float32 (np.einsum's rows)."""
    seen = []
    einsum = np.einsum

    def spy(spec, *operands):
        seen.append(operands[0].shape[0])
        return einsum(spec, *operands)

    monkeypatch.setattr(screen.np, "einsum", spy)
    return seen


def test_near_ties_are_decided_in_float32(monkeypatch, kind):
    head = _head()
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 64, generator=gen)
    best = _argmax32(head, x)
    with torch.no_grad():  # a rival row a hair above / below each row's best: float16 cannot
        for sign, row, target in [(1, 0, 4001), (-1, 1, 4002)]:  # tell them apart
            w = head.weight[best[row]]
            head.weight[target] = w + sign * 1e-4 * w.abs() * x[row].sign()
    seen = _spy_verification(monkeypatch)
    tokens = screen.greedy_tokens(head, x)
    assert seen and seen[0] >= 4  # both rows had at least two candidates
    assert tokens.tolist() == _argmax32(head, x) == [4001, best[1]]


def test_exact_ties_pick_the_first_id_as_argmax_does(kind):
    head = _head()
    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(5))
    best = _argmax32(head, x)[0]
    with torch.no_grad():
        head.weight[10] = head.weight[best]
        head.weight[4990] = head.weight[best]
    assert screen.greedy_tokens(head, x).tolist() == [10] == _argmax32(head, x)


def _argmax_bf16(head: nn.Linear, x: torch.Tensor) -> list[int]:
    """The greedy tokens of a bfloat16 head, independently: its logits in float64, rounded to
    bfloat16 as its product rounds its float32 sums, the first of ties."""
    with torch.no_grad():
        bias = None if head.bias is None else head.bias.double()
        logits = F.linear(x.double(), head.weight.double(), bias).to(torch.bfloat16)
    return logits.float().argmax(dim=1).tolist()


@pytest.mark.parametrize("m", [1, 8])
@pytest.mark.parametrize("bias", [False, True])
def test_bfloat16_tokens_are_the_argmax_of_bfloat16_logits(m, bias, kind):
    head = _head(bias=bias).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(6)
    for _ in range(20):
        x = torch.randn(m, 64, generator=gen).to(torch.bfloat16)
        tokens = screen.greedy_tokens(head, x)
        assert tokens is not None
        assert tokens.tolist() == _argmax_bf16(head, x)
        with torch.no_grad():  # the layer's own product (oneDNN or torch): the same tokens
            assert tokens.tolist() == head(x).float().argmax(dim=1).tolist()


def test_bfloat16_logits_that_round_to_the_best_value_tie_with_it(kind):
    # ids 10 and 20 at float32 logits 199.7 and 200.3, outside each other's bound, both round
    # to bfloat16's 200: a tie, which the first id wins, as the rounded logits' argmax has it.
    torch.manual_seed(0)
    head = _head(bias=True)
    x = torch.randn(1, 64)
    with torch.no_grad():
        unit = x[0] / x[0].norm() ** 2  # x . unit = 1
        head.weight[20], head.weight[10] = 0.3 * unit, -0.3 * unit
        head.bias[20] = head.bias[10] = 200.0
    head, x = head.to(torch.bfloat16), x.to(torch.bfloat16)
    with torch.no_grad():
        exact = F.linear(x.double(), head.weight.double(), head.bias.double())[0]  # (V,)
        layer = head(x).float()[0]  # the layer's own product, rounded to bfloat16
    assert exact[10] < 200 < exact[20] and int(exact.argmax()) == 20  # float32's argmax: 20
    assert exact[10].to(torch.bfloat16) == exact[20].to(torch.bfloat16) == layer.max()
    assert screen.greedy_tokens(head, x).tolist() == [10] == _argmax_bf16(head, x)
    assert int(layer.argmax()) == 10


@needs_int8  # (a bfloat16 layer gets no float16 screen)
def test_subnormal_bfloat16_weights_and_inputs_are_left_to_the_logits():
    # oneDNN's bfloat16 kernels flush subnormals to zero; the bound holds for exact values.
    head = _head().to(torch.bfloat16)
    x = torch.randn(2, 64).to(torch.bfloat16)
    assert screen.greedy_tokens(head, x) is not None
    x[1, 3] = 2.0**-130
    assert screen.greedy_tokens(head, x) is None
    with torch.no_grad():
        head.weight[7, 0] = 2.0**-130
    assert screen.screen(head) is None
    assert screen.greedy_tokens(head, torch.randn(2, 64).to(torch.bfloat16)) is None


def test_no_screen_where_making_it_would_not_fit_in_memory(monkeypatch):
    head = _head()
    monkeypatch.setattr(packed.hardware, "available_memory", lambda device: 16 * VOCAB * 64)
    assert screen.screen(head) is None  # it would take all of it; half is the limit
    monkeypatch.setattr(packed.hardware, "available_memory", lambda device: 32 * VOCAB * 64)
    screen.release(head)
    assert screen.screen(head) is not None


def test_a_row_it_cannot_decide_is_left_to_the_logits(kind):
    head = _head(bias=False)
    with torch.no_grad():
        head.weight[: screen.MAX_CANDIDATES + 1] = head.weight[0]  # many equal best logits
    x = head.weight[:1].detach().clone()  # the row that makes weight[0] the best
    assert screen.greedy_tokens(head, x) is None


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_inputs_that_are_not_finite_are_left_to_the_logits(value, kind):
    x = torch.randn(3, 64)
    x[1, 5] = value
    assert screen.greedy_tokens(_head(), x) is None


def test_an_overflow_is_left_to_the_logits(kind):
    x = torch.full((1, 64), 3e37)
    assert screen.greedy_tokens(_head(std=10.0), x) is None


@pytest.mark.parametrize(
    "head",
    [
        _head(vocab=screen.MIN_OUTPUTS - 1),  # small: float32 costs little
        _head().half(),
        _head().double(),
        nn.Sequential(_head()),  # not a plain nn.Linear
    ],
    ids=["small", "float16", "float64", "not-linear"],
)
def test_heads_it_does_not_apply_to(head, kind):
    assert screen.screen(head) is None
    assert screen.greedy_tokens(head, torch.randn(1, 64)) is None


def test_weights_float16_cannot_hold_get_no_screen(float16):
    head = _head()
    with torch.no_grad():
        head.weight[3, 3] = 1e5
    assert screen.screen(head) is None


@needs_int8
def test_weights_int8_holds_and_float16_does_not_get_an_int8_screen():
    head = _head()
    with torch.no_grad():
        head.weight[3, 3] = 1e5
    x = torch.randn(2, 64)
    assert screen.screen(head).kind == "int8"
    assert screen.greedy_tokens(head, x).tolist() == _argmax32(head, x)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e-30])
@needs_int8
def test_weights_the_int8_bound_cannot_hold_take_the_float16_screen(value):
    """Not finite weights (no screen) and rows so small that FBGEMM's scales would multiply
    into float32's subnormal range (float16)."""
    head = _head()
    with torch.no_grad():
        head.weight[5] = 0.0
        head.weight[5, 2] = value
    found = screen.screen(head)
    assert (found is None) if value != 1e-30 else (found.kind == "float16")


def test_made_once_remade_when_the_weight_changes_and_released(kind):
    head = _head()
    first = screen.screen(head)
    assert screen.ready(head) and screen.screen(head) is first
    x = torch.randn(1, 64)
    with torch.no_grad():
        head.weight.mul_(-1.0)  # a new version: the old screen would answer wrongly
    assert not screen.ready(head)
    assert screen.greedy_tokens(head, x).tolist() == _argmax32(head, x)
    assert screen.screen(head) is not first
    packed.release(head)
    assert not screen.ready(head)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(Hugging Face GPT2LMHeadModel, attnkit GPT) with a vocabulary the screen applies to."""
    folder = tmp_path_factory.mktemp("gpt2-screen")
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=128, n_embd=64, n_layer=2, n_head=4,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    hf = write_hf_gpt2_folder(folder, config, None, seed=0)
    return hf, GPT.from_pretrained(folder)


def _count_screened(monkeypatch) -> list[bool]:
    decided = []
    tokens = screen.Screen.tokens

    def spy(self, *args):
        out = tokens(self, *args)
        decided.append(out is not None)
        return out

    monkeypatch.setattr(screen.Screen, "tokens", spy)
    return decided


def test_greedy_generation_through_the_screen_equals_hugging_face(pair, monkeypatch, kind):
    hf, gpt = pair
    decided = _count_screened(monkeypatch)
    prompts = [[1, 2, 3], [50, 60, 70, 80, 90, 100, 7], [42]]
    config = GenerationConfig(max_new_tokens=40, eos_ids=())
    ours = generate(gpt, prompts, config).tokens  # 40 new tokens: not worth making a screen
    assert decided == []
    monkeypatch.setattr(screen, "MIN_NEW_TOKENS", 2)
    assert generate(gpt, prompts, config).tokens == ours
    assert len(decided) == 40 and all(decided)
    ids = torch.zeros(3, 7, dtype=torch.long)
    mask = torch.zeros(3, 7, dtype=torch.long)
    for row, prompt in enumerate(prompts):  # left-padded, as HF wants for generation
        ids[row, 7 - len(prompt) :] = torch.tensor(prompt)
        mask[row, 7 - len(prompt) :] = 1
    with torch.inference_mode():
        theirs = hf.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=40, min_new_tokens=40,
            do_sample=False, pad_token_id=0,
        )[:, 7:].tolist()  # fmt: skip
    assert ours == theirs


def test_bfloat16_generation_through_the_screen_equals_its_logits(pair, monkeypatch, kind):
    _, gpt = pair
    model = GPT(gpt.config).eval()  # a copy in bfloat16 (the fixture's stays float32)
    model.load_state_dict(gpt.state_dict())
    model.to(torch.bfloat16)
    decided = _count_screened(monkeypatch)
    prompts = [[1, 2, 3], [50, 60, 70, 80, 90, 100, 7], [42]]
    config = GenerationConfig(max_new_tokens=40, eos_ids=())
    logits = generate(model, prompts, config).tokens  # 40 new tokens: not worth a screen
    assert decided == []
    monkeypatch.setattr(screen, "MIN_NEW_TOKENS", 2)
    assert generate(model, prompts, config).tokens == logits
    assert len(decided) == 40 and all(decided)


@pytest.mark.parametrize(
    "options", [dict(repetition_penalty=1.3), dict(logprobs=True), dict(temperature=0.7)]
)
def test_steps_that_need_the_logits_do_not_use_the_screen(pair, monkeypatch, options):
    _, gpt = pair
    decided = _count_screened(monkeypatch)
    monkeypatch.setattr(screen, "MIN_NEW_TOKENS", 2)
    generate(gpt, [[1, 2, 3]], GenerationConfig(max_new_tokens=5, seed=0, **options))
    assert decided == []


def test_the_kernel_rounds_weights_to_float16_as_the_bound_assumes(float16):
    """The bound's gap is w - w.half(); the packed weights must be exactly those values
    (ties, float16 subnormals, values that underflow to 0, the largest finite)."""
    torch.manual_seed(6)
    w = torch.randn(4096, 64) * 0.02
    w[0, :8] = torch.tensor([2.0**-24, 2.0**-25, 1.5 * 2.0**-25, 3e-8, 6e-5, 65504.0, 1 + 2.0**-11,
                             1 + 3 * 2.0**-11])  # fmt: skip
    w[1] *= 1e-4  # rows of subnormals
    found = screen.Screen(w, None)
    unpacked, _ = torch.ops.quantized.linear_unpack_fp16(found.packed)
    assert torch.equal(unpacked.float(), w.half().float())


@needs_int8
def test_the_int8_kernel_holds_the_integers_and_scales_the_bound_assumes():
    """The bound's copy is q_j s_j (q_j in [-127, 127], s_j = max |w_j| / 127, 1 for a zero
    row); FBGEMM's packed weight must hold exactly those integers and float32 scales."""
    torch.manual_seed(13)
    w = torch.randn(4096, 64) * 0.02
    w[0] = 0.0
    w[1, :4] = torch.tensor([1.0, -1.0, 0.5 / 127, 1.5 / 127])  # the largest, and ties at .5
    found = screen.Int8Screen(w, None)
    unpacked, _ = torch.ops.quantized.linear_unpack(found.packed)
    scales = unpacked.q_per_channel_scales()
    largest = w.abs().amax(dim=1)
    expected = torch.where(largest > 0, largest / 127, torch.ones_like(largest))  # float32
    assert torch.equal(scales.float(), expected) and torch.equal(scales, scales.float().double())
    ints = unpacked.int_repr()
    assert torch.equal(ints, torch.round(w / expected[:, None]).to(torch.int8))
    assert int(ints.abs().max()) == 127 and int(ints[0].abs().max()) == 0


def test_a_screen_is_made_for_calls_long_enough_to_win_its_time_back():
    n = screen.MIN_NEW_TOKENS
    assert screen.worth_making(1, n) and not screen.worth_making(1, n - 1)
    assert screen.worth_making(8, n // 2) and not screen.worth_making(8, n // 2 - 1)


def test_steps_are_counted_toward_a_screen_while_the_weight_is_unchanged():
    """One a step at one row, two at more; the count that reaches MIN_NEW_TOKENS says make it;
    a new weight version or release starts again; heads it cannot apply to never count."""
    n = screen.MIN_NEW_TOKENS
    head = _head()
    assert not any(screen.served(head, 1) for _ in range(n - 1))
    assert screen.served(head, 1)  # the n-th step at one row
    with torch.no_grad():
        head.weight.mul_(2.0)  # a new version: counted again from 0
    assert not any(screen.served(head, 8) for _ in range(n // 2 - 1))
    assert screen.served(head, 8)  # n // 2 steps at 8 rows
    packed.release(head)
    assert not screen.served(head, 8)
    assert not any(screen.served(nn.Identity(), 1) for _ in range(n + 1))


def test_short_calls_make_the_screen_once_their_steps_add_up(monkeypatch):
    """Calls too short to be worth a screen each (20 new tokens, one row) count their steps;
    the step that brings the count to MIN_NEW_TOKENS (30 here) makes it and takes its token
    from it, and the tokens are float32's argmax all along."""
    monkeypatch.setattr(screen, "MIN_NEW_TOKENS", 30)
    config = GPTConfig(
        vocab_size=VOCAB, context_length=64, d_model=32, num_heads=4, num_layers=1, d_ff=64,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(9)
    gpt = GPT(config).eval()
    decided = _count_screened(monkeypatch)
    call = GenerationConfig(max_new_tokens=20, eos_ids=())
    first = generate(gpt, [[5, 6, 7]], call).tokens
    assert decided == [] and not screen.ready(gpt.lm_head)  # 20 steps counted
    second = generate(gpt, [[5, 6, 7]], call).tokens
    assert screen.ready(gpt.lm_head)
    assert decided == [True] * 11  # steps 10-20 of the second call: counts 30 and on
    assert second == first
    sampled = GenerationConfig(max_new_tokens=5, temperature=0.8, seed=0)
    before = list(decided)
    generate(gpt, [[5, 6, 7]], sampled)  # sampling needs the logits: neither counts nor screens
    assert decided == before


def test_threads_asking_together_share_one_screen(monkeypatch):
    """Two generations reaching the count at once (a server's two workers) make one screen."""
    import threading
    import time

    made = []
    real = screen.Screen.__init__

    def slow(self, *args):
        made.append(1)
        time.sleep(0.2)  # making one takes about a second for GPT-2's output layer
        real(self, *args)

    monkeypatch.setattr(screen.Screen, "__init__", slow)
    head = _head()
    start = threading.Barrier(2)
    found = [None, None]

    def ask(slot: int) -> None:
        start.wait()
        found[slot] = screen.screen(head)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 1 and found[0] is found[1] is not None


def _rival_head(pruned_rows: int = 0) -> tuple[nn.Linear, torch.Tensor, int]:
    """A head and an input where the float16 copy ranks a rival id below the best one by half
    the rival's bound while its float32 logit is above: only the bound, used in full, finds it.

    x is +-1 (|x|_2 = 8 for n = 64). Row 7 is 1.5 x sign (float16-exact): logit 96. The rival,
    row 4000, is 1.5 lowered by one float16 step (2^-10) in 14 places, plus 0.9 of half a step
    along x that float16 rounds away: float16 logit 96 - 14 * 2^-10 = 95.9863, float32 logit
    95.9863 + 64 * 0.9 * 2^-11 = 96.0145, bound about 8 * |that part|_2 = 0.0281. With
    ``pruned_rows``, as many float16-exact rows at 96 - 20 * 2^-10 (inside the first pass's
    band, each one's own bound tiny) make the first pass keep more than MAX_CANDIDATES ids.
    """
    head = _head(std=0.002, seed=7)
    sign = torch.where(torch.arange(64) % 3 == 0, -1.0, 1.0)
    x = sign[None].clone()  # (1, 64)
    with torch.no_grad():
        head.weight[7] = 1.5 * sign
        lowered = torch.full((64,), 1.5)
        lowered[:14] -= 2.0**-10
        head.weight[4000] = (lowered + 0.9 * 2.0**-11) * sign
        for row in range(100, 100 + pruned_rows):
            band = torch.full((64,), 1.5)
            band[:20] -= 2.0**-10
            head.weight[row] = band * sign
    return head, x, 4000


@pytest.mark.parametrize("pruned_rows", [0, screen.MAX_CANDIDATES + 6])
def test_a_rival_that_only_the_whole_bound_reaches_is_found(pruned_rows, float16):
    head, x, rival = _rival_head(pruned_rows)
    assert _argmax32(head, x) == [rival]
    found = screen.screen(head)
    approx = found.approx(x)[0]
    assert approx[rival] < approx[7] - 0.01  # the float16 copy ranks the rival below row 7
    assert screen.greedy_tokens(head, x).tolist() == [rival]


def test_weights_whose_squares_underflow_still_have_a_bound():
    """(Rows too small for the int8 bound: the float16 screen, by default.)"""
    head = _head(bias=True, std=0.0)  # rows 0 and 1 carry the best logits through their bias
    with torch.no_grad():
        head.bias.zero_()
        head.bias[0], head.bias[1] = 1.0, 1.0 - 1e-6
        head.weight[1] = 1e-25  # float16 holds none of it; its square underflows in float32
        head.weight[2] = torch.tensor([0.5, -0.5]).repeat(32)  # x . w = 0: not a rival
    x = torch.full((1, 64), 1e18)
    assert _argmax32(head, x) == [1]
    assert screen.greedy_tokens(head, x).tolist() == [1]


def test_products_in_the_subnormal_range_are_bounded(kind):
    head = _head(std=0.0)
    with torch.no_grad():
        head.weight[2:] = -1.0  # logits -320 x 2^-149: far below rows 0 and 1
        head.weight[0] = 1.10005  # float16 rounds it to 1.0996
        head.weight[1, :63] = 1.25
    # x_i * w_i: 5.5 or 6.25 times float32's least value, rounded to 5 or 6 of it
    x = torch.full((1, 64), 5 * 2.0**-149)  # float32 logits 384 and 378 x 2^-149
    assert _argmax32(head, x) == [0]
    tokens = screen.greedy_tokens(head, x)
    if kind == "float16":
        assert tokens.tolist() == [0]
    else:  # inputs below 2^-126 keep FBGEMM's smallest step, 6.1e-5: every id a candidate
        assert tokens is None
        bound = _bound(screen.screen(head), x)
        exact = x.double() @ head.weight.double().T
        assert ((exact - screen.screen(head).approx(x).double()).abs() <= bound).all()


def test_logits_near_float32s_range_are_left_to_the_logits(kind):
    x = torch.full((1, 64), 1e36)
    assert screen.greedy_tokens(_head(std=1.0), x) is None


def test_a_head_made_in_inference_mode_is_screened_outside_it(kind):
    with torch.inference_mode():
        head = _head()
    x = torch.randn(2, 64)
    assert screen.greedy_tokens(head, x).tolist() == _argmax32(head, x)


def test_the_best_float16_id_loses_to_a_rival_below_it(float16):
    """Row 7's float16 copy rounds up (1.5 - 0.9 of half a step -> 1.5): float16 logit 96,
    float32 logit 96 - 0.0281. The rival (row 4000, float16-exact) sits at 96 - 14 * 2^-10 =
    95.9863 in both, so it is the argmax, inside row 7's bound but not its own. MAX_CANDIDATES + 6 exact rows
    at 96 - 33 * 2^-10 = 95.9678 (their upper bounds 95.9693 just below row 7's lower bound
    95.9704, which the float rounding terms widen; inside the first pass's band) make the screen prune the first pass, where each id is kept only if its upper
    bound reaches the lower bound of row 7, taken in full."""
    head = _head(std=0.002, seed=10)
    sign = torch.where(torch.arange(64) % 3 == 0, -1.0, 1.0)
    x = sign[None].clone()  # (1, 64)
    with torch.no_grad():
        head.weight[7] = (1.5 - 0.9 * 2.0**-11) * sign
        rival = torch.full((64,), 1.5)
        rival[:14] -= 2.0**-10
        head.weight[4000] = rival * sign
        band = torch.full((64,), 1.5)
        band[:33] -= 2.0**-10
        head.weight[100 : 100 + screen.MAX_CANDIDATES + 6] = band * sign
    assert _argmax32(head, x) == [4000]
    approx = screen.screen(head).approx(x)[0]
    assert approx[7] > approx[4000]
    assert screen.greedy_tokens(head, x).tolist() == [4000]


def _flat_head() -> tuple[nn.Linear, torch.Tensor]:
    """A head whose best 600 logits lie within 0.6% of each other (row k at 1 - k 1e-5 of
    row 0's): inside the int8 bound (candidates beyond MAX_CANDIDATES), outside float16's."""
    head = _head(seed=14)
    with torch.no_grad():
        first = head.weight[0].clone()
        for k in range(1, 600):
            head.weight[k] = first * (1 - k * 1e-5)
    return head, first[None].clone()


@needs_int8
@needs_float16
def test_an_int8_screen_that_cannot_decide_gives_way_to_float16():
    head, x = _flat_head()
    assert _argmax32(head, x) == [0]
    first = screen.screen(head)
    assert first.kind == "int8"
    for _ in range(screen.GIVE_UP_UNDECIDED - 1):
        assert screen.greedy_tokens(head, x) is None
    assert screen.screen(head) is first  # kept while fewer than GIVE_UP_UNDECIDED of a window
    assert screen.greedy_tokens(head, x) is None
    assert first.given_up and not screen.ready(head)  # the float16 one is still to be made
    assert screen.greedy_tokens(head, x).tolist() == [0]  # float16 decides it
    assert screen.screen(head).kind == "float16"


@needs_int8
def test_a_bfloat16_layer_whose_int8_screen_gives_up_keeps_its_own_product():
    # A float16 copy of a bfloat16 layer reads as many bytes as the layer: none is made.
    head, x = _flat_head()
    head, x = head.to(torch.bfloat16), x.to(torch.bfloat16)
    first = screen.screen(head)
    assert first.kind == "int8"
    for _ in range(screen.GIVE_UP_UNDECIDED):
        assert screen.greedy_tokens(head, x) is None
    assert first.given_up
    assert screen.greedy_tokens(head, x) is None
    assert screen.screen(head) is None and not screen.ready(head)


@needs_int8
def test_an_int8_screen_counts_its_undecided_calls_per_window():
    found = screen.Int8Screen(_head().weight, None)
    for _ in range(3):  # a window with one call short of giving up, three times over
        for call in range(screen.GIVE_UP_WINDOW):
            found.record(call >= screen.GIVE_UP_UNDECIDED - 1)
    assert not found.given_up
    for _ in range(screen.GIVE_UP_UNDECIDED):
        found.record(False)
    assert found.given_up


@needs_int8
def test_a_forced_int8_screen_is_kept_however_often_it_cannot_decide(monkeypatch):
    monkeypatch.setattr(screen, "KIND", "int8")
    head, x = _flat_head()
    first = screen.screen(head)
    for _ in range(screen.GIVE_UP_UNDECIDED + 1):
        assert screen.greedy_tokens(head, x) is None
    assert first.given_up and screen.screen(head) is first


@needs_int8
def test_inputs_no_kind_can_take_do_not_count_toward_giving_up():
    head = _head()
    x = torch.randn(1, 64)
    x[0, 3] = float("nan")
    for _ in range(screen.GIVE_UP_UNDECIDED + 1):
        assert screen.greedy_tokens(head, x) is None
    assert screen.screen(head).kind == "int8" and not screen.screen(head).given_up


@pytest.mark.parametrize("inputs", KINDS)
@pytest.mark.parametrize("rows", [1, 8])
@needs_int8
def test_the_int8_step_is_at_least_the_one_torch_quantizes_with(inputs, rows):
    """The bound takes the inputs' quantization step from their range; torch's own dynamic
    quantization (the rule FBGEMM's product applies, reduce_range) must not pick a larger
    one for the same (scaled) inputs."""
    found = screen.Int8Screen(_head().weight, None)
    x = _inputs(inputs, rows, 64, torch.Generator().manual_seed(15))
    power = screen._power(x.numpy())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch deprecates quantized tensors)
        torch_step = torch.quantize_per_tensor_dynamic(x * power, torch.quint8, True).q_scale()
    assert torch_step / power <= found.input_step(x.numpy()) <= torch_step / power * 1.001


def test_weights_beyond_the_int8_bounds_assumptions_are_not_fitted():
    assert not screen.Int8Screen.fits(torch.zeros(1, 2**31 // (127 * 128) + 1), None)
    assert not screen.Int8Screen.fits(torch.full((2, 64), 2.0**120), None)
    assert screen.Int8Screen.fits(torch.full((2, 64), 2.0**100), None)
