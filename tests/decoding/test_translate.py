"""Text translation: batching by tokens, order, empty lines, truncation."""

from __future__ import annotations

import copy
import os
import time

import pytest
import torch

from attnkit.data import SubwordTokenizer, load_named_corpus
from attnkit.decoding import DecodingConfig, Translator, normalize_source, token_batches
from attnkit.decoding.translate import PARALLEL, can_fork, decode_cost, length_shares
from attnkit.models import Transformer
from tests.helpers.decoding import tiny_config

# parallel="processes" exists only where workers can be forked (Linux); elsewhere Translator
# takes threads, which test_workers_translate_as_one_batch_at_a_time checks. On Linux, CI's
# platform, these tests always run: test_linux_can_fork_worker_processes fails otherwise.
needs_fork = pytest.mark.skipif(not can_fork(), reason="forked worker processes need Linux")


@pytest.mark.parametrize("budget", [1, 10, 25, 1000])
def test_token_batches_cover_everything_within_budget(budget):
    lengths = [3, 9, 1, 9, 4, 12, 2, 7, 7, 5]
    batches = list(token_batches(lengths, budget))
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        width = max(lengths[i] for i in batch)
        assert len(batch) == 1 or len(batch) * width <= budget
    # Long first, ties in input order.
    assert [i for b in batches for i in b] == [5, 1, 3, 7, 8, 9, 4, 0, 6, 2]
    with pytest.raises(ValueError, match=r"batch_tokens: expected >= 1, got 0"):
        list(token_batches(lengths, 0))


@pytest.mark.parametrize(
    "lengths, parts, expected",
    [
        ([3] * 10, 2, [range(0, 5), range(5, 10)]),
        ([1, 2, 3, 4, 5, 6, 7, 9], 2, [range(0, 6), range(6, 8)]),  # 21 | 16: the closest cut
        ([1, 1, 1, 1, 10], 2, [range(0, 4), range(4, 5)]),  # one long sentence alone
        ([2, 2, 2, 2], 3, [range(0, 1), range(1, 3), range(3, 4)]),
        ([1, 2], 3, [range(0, 1), range(1, 2)]),  # fewer sentences than workers
        ([5], 2, [range(0, 1)]),
        ([], 2, [range(0, 0)]),
    ],
)
def test_length_shares_cut_runs_with_equal_tokens(lengths, parts, expected):
    """Consecutive runs of the sorted lengths, about equal in tokens, each worker one run."""
    got = length_shares(lengths, parts)
    assert got == expected
    assert [i for run in got for i in run] == list(range(len(lengths)))


def test_length_shares_of_a_real_length_profile_are_balanced():
    """Lengths as a test set's: two runs within one longest sentence of half the tokens each."""
    lengths = sorted((7 * i) % 23 + 3 for i in range(250))
    first, second = length_shares(lengths, 2)
    half = sum(lengths) / 2
    assert abs(sum(lengths[i] for i in first) - half) <= max(lengths)
    assert len(first) > len(second)  # the short run holds more sentences


def test_shares_by_decode_cost_give_the_long_run_fewer_tokens():
    """Split by decode_cost (length ** 1.3), the run of long sentences holds fewer tokens
    than the short run (it takes longer per token), and the costs are about equal."""
    lengths = sorted((7 * i) % 23 + 3 for i in range(250))
    costs = [decode_cost(n) for n in lengths]
    assert costs[0] == pytest.approx(3**1.3)
    first, second = length_shares(costs, 2)
    tokens = [sum(lengths[i] for i in run) for run in (first, second)]
    assert tokens[1] < tokens[0] - max(lengths)  # beyond the rounding of one sentence
    cost = [sum(costs[i] for i in run) for run in (first, second)]
    assert abs(cost[0] - cost[1]) <= decode_cost(max(lengths))


@pytest.fixture(scope="module")
def translator_parts():
    corpus = load_named_corpus("multi30k", split="val")
    tokenizer = SubwordTokenizer.train(corpus.src[:200] + corpus.tgt[:200], vocab_size=400)
    torch.manual_seed(0)
    model = Transformer(tiny_config(tokenizer.vocab_size, max_len=16)).eval()
    return model, tokenizer, corpus.src[:12]


def test_order_and_output_do_not_depend_on_batching(translator_parts):
    model, tokenizer, lines = translator_parts
    config = DecodingConfig(beam_size=2, max_len_a=0.5, max_len_b=3)
    small = Translator(model, tokenizer, config, batch_tokens=8).translate(lines)
    big = Translator(model, tokenizer, config, batch_tokens=10_000).translate(lines)
    assert small.translations == big.translations
    # Reference: each line alone, in order.
    alone = [
        Translator(model, tokenizer, config).translate([line]).translations[0] for line in lines
    ]
    assert big.translations == alone


def test_empty_lines_and_truncation(translator_parts):
    model, tokenizer, lines = translator_parts
    config = DecodingConfig(beam_size=2, max_len_a=0.5, max_len_b=3)
    translator = Translator(model, tokenizer, config)
    assert translator.max_src_tokens == 15
    long_line = " ".join(lines)  # far more than 15 tokens
    inputs = ["", "Ein Hund.", "", long_line, "Zwei Männer.", ""]
    assert [len(tokenizer.encode(line)) <= 15 for line in inputs] == [1, 1, 1, 0, 1, 1]
    out = translator.translate(inputs)
    assert len(out.translations) == 6
    assert out.translations[0] == out.translations[2] == out.translations[5] == ""
    assert out.truncated == [3] and out.max_src_tokens == 15
    # A truncated line translates as its first 15 tokens would.
    prefix = [*tokenizer.encode(long_line)[:15], tokenizer.eos_id]
    assert out.translations[3] == tokenizer.decode(translator.translate_ids([prefix])[0])
    assert translator.translate([]).translations == []


# --------------------------------------------------------------------------- normalisation


@pytest.mark.parametrize(
    "line, clean",
    [
        ("Ein Hund.", "Ein Hund."),
        ("Ein Hund.\t", "Ein Hund."),  # a trailing tab (it halved BLEU)
        ("  Ein   Hund. ", "Ein Hund."),
        ("\ufeffEin Hund.", "Ein Hund."),  # byte-order mark
        ("Ein\ufeff Hund.", "Ein Hund."),
        ("Ein\x00Hund.\x00", "Ein Hund."),  # NUL bytes separate, never glue
        ("Ein\x07\x1b[31mHund\x7f\x85.", "Ein [31mHund ."),  # C0, DEL and C1 controls
        ("Ein\u00a0Hund\u2009\u3000rennt", "Ein Hund rennt"),  # no-break, thin, ideographic
        ("Ein\u2028Hund\r\x0b\x0crennt", "Ein Hund rennt"),  # separators, CR, VT, FF
        (" \t \u00a0 ", ""),
        ("", ""),
        ("\x00\ufeff", ""),
        ("Straße — ½ ▁ \u200b", "Straße — ½ ▁ \u200b"),  # other characters are kept as they are
        ("e\u0301", "e\u0301"),  # no Unicode normalisation
    ],
)
def test_normalize_source(line, clean):
    assert normalize_source(line) == clean


def test_normalised_lines_translate_like_clean_ones(translator_parts, monkeypatch):
    """Dirty copies of lines translate exactly as the clean lines; blank lines give blank
    output without reaching the model; the line count is kept."""
    import importlib

    model, tokenizer, lines = translator_parts
    translator = Translator(
        model, tokenizer, DecodingConfig(beam_size=2, max_len_a=0.5, max_len_b=3)
    )
    clean = translator.translate(lines[:4]).translations
    dirty = [
        "\ufeff" + lines[0] + "\t",
        "  " + lines[1].replace(" ", "   ") + "\x00",
        lines[2].replace(" ", "\u00a0"),
        "\x00" + lines[3] + "\r",
    ]
    blank = ["", " ", "\t\t", "\ufeff", "\x00\x00", "\u3000"]
    module = importlib.import_module("attnkit.decoding.translate")
    rows = []
    real = module.generate

    def counting(model, src, config):
        rows.append(src.shape[0])
        return real(model, src, config)

    monkeypatch.setattr(module, "generate", counting)
    out = translator.translate([*dirty, *blank])
    assert out.translations == [*clean, *[""] * len(blank)]
    assert sum(rows) == 4  # the blank lines never reached the model
    rows.clear()
    assert translator.translate(blank).translations == [""] * len(blank) and rows == []


def test_translate_checks_its_input(translator_parts):
    model, tokenizer, _ = translator_parts
    translator = Translator(model, tokenizer, DecodingConfig(beam_size=1))
    with pytest.raises(TypeError, match=r"lines: expected an iterable of strings .* got a str"):
        translator.translate("Ein Hund.")
    with pytest.raises(TypeError, match=r"lines\[1\]: expected a str, got bytes"):
        translator.translate(["a", b"b"])
    with pytest.raises(TypeError, match=r"lines: expected an iterable of strings .* got dict"):
        translator.translate({"Ein Hund.": 1})
    with pytest.raises(TypeError, match=r"lines: expected an iterable of strings .* got int"):
        translator.translate(5)
    # Undecodable bytes arrive as lone surrogates, which no tokenizer can encode.
    with pytest.raises(
        ValueError,
        match=r"lines\[1\]: not valid UTF-8 text \(a lone surrogate U\+DC80 at character 5",
    ):
        translator.translate(["ein hund", "ein \udc80 hund"])


def test_translate_reads_any_iterable_once(translator_parts):
    """A generator is read once (it used to be consumed by the type check)."""
    model, tokenizer, lines = translator_parts
    translator = Translator(model, tokenizer, DecodingConfig(beam_size=1))
    expected = translator.translate(lines[:3]).translations
    assert translator.translate(line for line in lines[:3]).translations == expected
    assert translator.translate(tuple(lines[:3])).translations == expected


@pytest.mark.parametrize(
    ("workers", "parallel"), [(1, "threads"), (2, "threads"), (2, "processes")]
)
def test_a_callers_autocast_does_not_change_the_translation(translator_parts, workers, parallel):
    """The translator computes in its model's dtype: under a caller's bf16 autocast (a training
    run's val_bleu hook) a float32 model translates as it does without it (before the fix, the
    cached keys came out bf16 beside float32 queries and decoding raised)."""
    model, tokenizer, lines = translator_parts
    config = DecodingConfig(beam_size=2, max_len_a=0.5, max_len_b=3)
    plain = Translator(model, tokenizer, config, batch_tokens=8, workers=workers, parallel=parallel)
    expected = plain.translate(lines).translations
    plain.close()  # worker processes forked anew, under the autocast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert plain.translate(lines).translations == expected


@pytest.mark.parametrize("parallel", PARALLEL)
@pytest.mark.parametrize("workers", [2, 3])
def test_workers_translate_as_one_batch_at_a_time(translator_parts, workers, parallel):
    """Batches decoded side by side on threads or forked processes give the sequential output,
    in input order, and leave torch's thread count as it was."""
    model, tokenizer, lines = translator_parts
    config = DecodingConfig(beam_size=2, max_len_a=0.5, max_len_b=3)
    one = Translator(model, tokenizer, config, batch_tokens=8).translate(lines)
    threads = torch.get_num_threads()
    many = Translator(model, tokenizer, config, batch_tokens=8, workers=workers, parallel=parallel)
    assert many.parallel == (parallel if can_fork() else "threads")
    assert many.translate([*lines, "", lines[0]]).translations == [
        *one.translations,
        "",
        one.translations[0],
    ]
    assert torch.get_num_threads() == threads


@needs_fork
def test_processes_decode_in_other_processes_and_errors_come_back(translator_parts, monkeypatch):
    """With parallel="processes" the decoding runs in forked workers (their pid is not this
    one's), a worker's exception reaches the caller, and a worker that dies is named."""
    from attnkit.decoding import translate as module

    model, tokenizer, lines = translator_parts

    def failing(model, src, config):
        raise RuntimeError(f"decoder broke in {os.getpid()} on {torch.get_num_threads()} threads")

    monkeypatch.setattr(module, "generate", failing)  # inherited by the forked workers
    translator = Translator(model, tokenizer, DecodingConfig(beam_size=1), workers=2,
                            parallel="processes")  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(RuntimeError, match=r"decoder broke in \d+ on 1 threads") as error:
            translator.translate(lines)
    finally:
        torch.set_num_threads(threads)
    assert int(str(error.value).split()[3]) != os.getpid()  # a worker, one operator thread
    monkeypatch.setattr(module, "_translate_part", _die)
    with pytest.raises(RuntimeError, match=r"a translation worker process died"):
        translator.translate(lines)


def _die(sources):
    os._exit(3)  # a worker killed mid-translation (by the OOM killer, say)


@pytest.mark.parametrize("parallel", ["process", None, ""])
def test_parallel_must_be_threads_or_processes(translator_parts, parallel):
    model, tokenizer, _ = translator_parts
    with pytest.raises(ValueError, match=r"parallel: expected one of \('threads', 'processes'\)"):
        Translator(model, tokenizer, parallel=parallel)


def test_a_worker_error_reaches_the_caller_and_threads_are_restored(translator_parts, monkeypatch):
    from attnkit.decoding import translate as module

    model, tokenizer, lines = translator_parts
    calls = []

    def failing(model, src, config):
        calls.append(src.shape[0])
        raise RuntimeError("decoder broke")

    monkeypatch.setattr(module, "generate", failing)
    threads = torch.get_num_threads()
    translator = Translator(model, tokenizer, DecodingConfig(beam_size=1), batch_tokens=8,
                            workers=2)  # fmt: skip
    with pytest.raises(RuntimeError, match="decoder broke"):
        translator.translate(lines)
    assert calls and torch.get_num_threads() == threads


def test_n_best_is_refused_not_ignored(translator_parts):
    """A Translator returns one translation a line; n_best=2 was accepted and ignored."""
    model, tokenizer, _ = translator_parts
    with pytest.raises(ValueError, match=r"n_best: 2; a Translator returns one translation a line"):
        Translator(model, tokenizer, DecodingConfig(beam_size=3, n_best=2))


@pytest.mark.parametrize("tokenizer", [None, "a string"])
def test_a_tokenizer_that_is_not_one_is_named(translator_parts, tokenizer):
    """Before: "'NoneType' object has no attribute 'bos_id'"."""
    model, _, _ = translator_parts
    with pytest.raises(TypeError, match=r"^tokenizer: expected the model's SubwordTokenizer "):
        Translator(model, tokenizer)


def test_min_len_the_model_cannot_reach_is_refused(translator_parts):
    """max_len 16: bos and at most 15 tokens (the last one eos) - a minimum of 15 is the most."""
    model, tokenizer, lines = translator_parts
    config = DecodingConfig(beam_size=1, max_len_a=0, max_len_b=20, min_len=15)
    (out,) = Translator(model, tokenizer, config).translate(lines[:1]).translations
    assert len(tokenizer.encode(out)) >= 12  # 15 ids before detokenization merges any
    with pytest.raises(ValueError, match=r"min_len: 16 tokens is more than this model can write"):
        Translator(model, tokenizer, DecodingConfig(min_len=16))


@pytest.mark.parametrize("workers", [0, -1, 1.5, True, "2"])
def test_workers_must_be_a_positive_integer(translator_parts, workers):
    model, tokenizer, _ = translator_parts
    with pytest.raises(ValueError, match=r"workers: expected an integer >= 1"):
        Translator(model, tokenizer, workers=workers)


@pytest.mark.parametrize("parallel", PARALLEL)
@pytest.mark.parametrize("count", [0, 1, 3])
def test_fewer_sentences_than_workers(translator_parts, parallel, count):
    model, tokenizer, lines = translator_parts
    config = DecodingConfig(beam_size=2, max_len_a=0.5, max_len_b=3)
    one = Translator(model, tokenizer, config)
    many = Translator(model, tokenizer, config, workers=4, parallel=parallel)
    sources, _ = one.encode(lines[:count])
    assert many.translate_ids(sources) == one.translate_ids(sources)
    assert len(many.translate_ids(sources)) == count


_ORPHAN_CHECK = """
import os, sys, time
import torch
from attnkit.data import SubwordTokenizer, load_named_corpus
from attnkit.decoding import DecodingConfig, Translator, translate
from attnkit.models import Transformer
from tests.helpers.decoding import tiny_config

def stuck(model, src, config):
    os.write(1, f"{os.getpid()}\\n".encode())  # one write: the two workers' lines stay whole
    time.sleep(120)

translate.generate = stuck
corpus = load_named_corpus("multi30k", split="val")
tokenizer = SubwordTokenizer.train(corpus.src[:50] + corpus.tgt[:50], vocab_size=300)
model = Transformer(tiny_config(tokenizer.vocab_size, max_len=16)).eval()
Translator(model, tokenizer, DecodingConfig(beam_size=1), workers=2, parallel="processes")\
    .translate(corpus.src[:4])
"""


@needs_fork
def test_workers_die_with_a_killed_parent(tmp_path):
    """`attnkit translate` killed mid-file (SIGKILL: no clean-up runs) leaves no worker process
    behind: each asks Linux for SIGKILL when its parent dies."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_CHECK], cwd=root, stdout=subprocess.PIPE, text=True
    )
    try:
        workers = [int(parent.stdout.readline()) for _ in range(2)]  # both are decoding
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in workers):
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in workers)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by init, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or while reading
        return False


@needs_fork
def test_worker_processes_are_kept_until_the_weights_change_or_close(translator_parts):
    """The workers forked at the first call serve the next calls; a change to the weights
    (seen by the version counter, as packed weights see it) forks new ones with the new
    weights; close() stops them."""
    model, tokenizer, lines = translator_parts
    model = copy.deepcopy(model)
    config = DecodingConfig(beam_size=2, max_len_a=0.5, max_len_b=3)
    with Translator(model, tokenizer, config, workers=2, parallel="processes") as translator:
        first = translator.translate(lines).translations
        pids = set(translator._pool._processes)
        assert translator.translate(lines).translations == first
        assert set(translator._pool._processes) == pids  # the same workers
        with torch.no_grad():
            model.output.weight.mul_(-1.0)  # in place: a new version, the same storage
        changed = translator.translate(lines).translations
        assert changed == Translator(model, tokenizer, config).translate(lines).translations
        assert changed != first and not set(translator._pool._processes) & pids
        pids = set(translator._pool._processes)
    assert translator._pool is None and not any(_alive(pid) for pid in pids)


@pytest.mark.parametrize("parallel", ["threads", "processes"])
def test_close_makes_writes_the_version_counter_misses_seen(translator_parts, parallel):
    """A write through ``.data`` (as a fused optimizer step) bumps no version counter, so the
    packed weights and forked workers cannot see it; close() is the documented remedy, and
    with threads it used to leave the old packed weights in use."""
    model, tokenizer, lines = translator_parts
    model = copy.deepcopy(model)
    config = DecodingConfig(beam_size=2, max_len_a=0.5, max_len_b=3)
    translator = Translator(model, tokenizer, config, workers=2, parallel=parallel)
    first = translator.translate(lines).translations
    for layer in model.decoder.layers:
        layer.ffn.linear2.weight.data.mul_(-3.0)
    translator.close()
    after = translator.translate(lines).translations
    translator.close()
    fresh = Translator(copy.deepcopy(model), tokenizer, config).translate(lines).translations
    assert after == fresh != first


@needs_fork
def test_worker_processes_outlive_the_thread_that_forked_them(translator_parts):
    """A translator first called from a thread that then ends (a server's request thread)
    keeps its workers: they watch their parent process, not the forking thread."""
    import threading

    model, tokenizer, lines = translator_parts
    config = DecodingConfig(beam_size=2, max_len_a=0.5, max_len_b=3)
    expected = Translator(model, tokenizer, config).translate(lines).translations
    with Translator(model, tokenizer, config, workers=2, parallel="processes") as translator:
        first = threading.Thread(target=translator.translate, args=(lines,))
        first.start()
        first.join()
        pids = set(translator._pool._processes)
        time.sleep(1.5)  # three of the workers' checks of their parent
        assert all(_alive(pid) for pid in pids)
        assert translator.translate(lines).translations == expected
        assert set(translator._pool._processes) == pids


@needs_fork
def test_a_worker_killed_while_idle_is_replaced_at_the_next_call(translator_parts):
    import signal

    model, tokenizer, lines = translator_parts
    config = DecodingConfig(beam_size=2, max_len_a=0.5, max_len_b=3)
    expected = Translator(model, tokenizer, config).translate(lines).translations
    with Translator(model, tokenizer, config, workers=2, parallel="processes") as translator:
        translator.translate(lines)
        victim = next(iter(translator._pool._processes))
        os.kill(victim, signal.SIGKILL)  # the OOM killer, say
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not getattr(translator._pool, "_broken", True):
            time.sleep(0.05)
        assert translator.translate(lines).translations == expected  # new workers
        assert victim not in translator._pool._processes


@needs_fork
def test_worker_processes_end_with_the_translator(translator_parts):
    import gc

    model, tokenizer, lines = translator_parts
    translator = Translator(model, tokenizer, DecodingConfig(beam_size=1), workers=2,
                            parallel="processes")  # fmt: skip
    translator.translate(lines)
    pids = set(translator._pool._processes)
    del translator
    gc.collect()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)


def test_linux_can_fork_worker_processes():
    """The worker-process tests are skipped only off Linux, never silently on it."""
    import sys

    assert can_fork() == sys.platform.startswith("linux")
