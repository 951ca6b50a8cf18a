"""Text in, text out: normalisation, tokenization, batching by tokens, decoding, detokenization.

Every line is first normalised (:func:`normalize_source`): a byte-order mark is dropped,
control characters (NUL included) become spaces, runs of white space become one space and the
ends are stripped. A line that is then empty gives an empty translation without running the
model, so the output has one line per input line.

Sentences are sorted by length so that a batch holds sentences of similar length (little
padding, similar output lengths), batched under a token budget, split further when the
decoder's caches would not fit in the memory available, decoded with
:func:`~attnkit.decoding.generate.generate`, and put back in input order. Since decoding is
batch-size invariant, the batching changes the speed, not the output.

On a CPU several batches can be decoded at once (``workers``), by threads of this process or by
forked worker processes (``parallel="processes"``, Linux): a decoding step is a long chain of
small operators, and threads of one process still take turns at Python's interpreter lock
between them, where processes do not (docs/benchmarks.md, "Against CTranslate2").
"""

from __future__ import annotations

import bisect
import itertools
import logging
import multiprocessing
import numbers
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

import torch

from attnkit.decoding.config import DecodingConfig
from attnkit.decoding.generate import check_special_ids, generate, max_lengths
from attnkit.decoding.memory_bound import available_memory, decoding_memory
from attnkit.generation.packed import int8_available, packed_linears, release
from attnkit.texts import check_texts

logger = logging.getLogger(__name__)

PARALLEL = ("threads", "processes")  # what Translator's workers are


# Control characters (C0, DEL, C1) become spaces; the byte-order mark / zero-width no-break
# space disappears. White space among them (tab, line feed, ...) is collapsed afterwards.
_CLEAN = {c: " " for c in (*range(0x00, 0x20), *range(0x7F, 0xA0))} | {0xFEFF: None}


def normalize_source(line: str) -> str:
    """A source line as the model should see it.

    Drops every U+FEFF (byte-order mark), turns control characters (U+0000-U+001F,
    U+007F-U+009F, NUL included) into spaces, collapses runs of white space (as
    :meth:`str.split` knows it: tab, no-break space, the Unicode spaces and line separators)
    into one space, and strips both ends. Letters, punctuation and other characters are kept
    as they are (no Unicode normalisation).
    """
    return " ".join(line.translate(_CLEAN).split())


@dataclass
class TranslationOutput:
    """Translations in input order, and which inputs were cut to fit the model.

    Attributes:
        translations: one string per input line ("" for a line that is empty after
            :func:`normalize_source`).
        truncated: 0-based indices of the inputs longer than the model allows.
        max_src_tokens: the source token limit those inputs were cut to.
    """

    translations: list[str]
    truncated: list[int] = field(default_factory=list)
    max_src_tokens: int = 0


def token_batches(lengths: Sequence[int], batch_tokens: int) -> Iterator[list[int]]:
    """Group indices, sorted by length, so that ``rows x longest <= batch_tokens``.

    A single sentence longer than the budget gets a batch of its own. The order is by
    decreasing length (long batches first: memory problems show up at once), ties in input
    order, so the grouping is deterministic.

    Args:
        lengths: per-item length in tokens.
        batch_tokens: the budget of padded source tokens per batch, >= 1.
    """
    if batch_tokens < 1:
        raise ValueError(f"batch_tokens: expected >= 1, got {batch_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batch: list[int] = []
    for i in order:
        longest = lengths[batch[0]] if batch else lengths[i]  # sorted: the first is longest
        if batch and (len(batch) + 1) * longest > batch_tokens:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


# A sentence's share of a worker's decoding time grows faster than its length: a long sentence's
# steps attend to more positions, and a batch of long sentences runs more steps, each with the
# same fixed cost per operator. On test2016 (the shipped model, beam 5, two workers), shares of
# equal tokens left the worker with the long sentences 5-13% longer than the other (median
# 12%); shares cut by length ** 1.3 ended 1-10% apart (median 3%), and the calls made 1.04x the
# sentences/s in two runs of benchmarks/decode_shares.py (medians of the per-round ratios;
# 0.98x in a third, 5-round run; 1.2 gave 1.04x too; docs/benchmarks.md, "Run 13").
DECODE_COST_EXPONENT = 1.3


def decode_cost(length: int) -> float:
    """The relative decoding time of a sentence of ``length`` source tokens
    (:data:`DECODE_COST_EXPONENT`), by which :func:`length_shares` splits a call."""
    return length**DECODE_COST_EXPONENT


def length_shares(costs: Sequence[float], parts: int) -> list[range]:
    """Cut ``costs``, the costs of sentences sorted shortest first (:func:`decode_cost`), into
    at most ``parts`` consecutive runs of about equal cost (none empty, unless ``costs`` is).

    A worker given a run of similar lengths decodes them in one batch whose sentences finish
    at about the same step. Dealt in turn (every worker sees every length) each batch ends
    with a few long sentences decoded at a fixed cost per step, and pays it in every worker:
    at 250 sentences per call on the Xeon, 12% more wall time and 17% more CPU time for the
    same translations (docs/benchmarks.md, "Run 10").

    Returns:
        ``parts`` (fewer when there are fewer sentences) ranges of indices into ``costs``.
    """
    n = len(costs)
    parts = max(1, min(parts, n))
    prefix = list(itertools.accumulate(costs, initial=0))  # prefix[i]: the cost before i
    cuts = [0]
    for j in range(1, parts):
        target = prefix[-1] * j / parts
        cut = bisect.bisect_left(prefix, target)  # the first prefix reaching the target
        if cut > 0 and target - prefix[cut - 1] <= prefix[cut] - target:
            cut -= 1  # the prefix just below it is closer
        cuts.append(min(max(cut, cuts[-1] + 1), n - (parts - j)))  # no run left empty
    cuts.append(n)
    return [range(a, b) for a, b in itertools.pairwise(cuts)]


def _decode_in_threads(decode, jobs: list, workers: int) -> None:
    """``decode(job)`` for every job on ``workers`` threads, each running torch's operators on
    its share of the operator threads; the process's thread count is restored afterwards."""
    threads = torch.get_num_threads()
    share = max(1, threads // workers)

    def run(job) -> None:
        torch.set_num_threads(share)  # this thread's operators (OpenMP is per thread)
        decode(job)

    torch.set_num_threads(share)
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="attnkit-decode") as pool:
            for future in [pool.submit(run, job) for job in jobs]:
                future.result()  # re-raises a worker's error here
    finally:
        torch.set_num_threads(threads)


def can_fork() -> bool:
    """Whether worker processes can be forked here (Linux: a forked child shares the parent's
    model pages until they are written; other systems take ``parallel="threads"``)."""
    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


_FORKED: Translator | None = None  # in a forked worker process: the translator it runs
_ORPHAN_CHECK_SECONDS = 0.5  # how often a worker checks that its parent is alive


def _start_worker(translator: Translator, parent: int) -> None:
    """A forked worker's setup: one operator thread (GNU OpenMP, torch's on Linux, can hang
    in a forked child that opens a multi-thread region), the translator it runs, and a watch
    that ends it when its parent process is gone (a killed `attnkit translate` leaves no
    worker behind; prctl's parent-death signal would follow the forking thread instead)."""
    global _FORKED
    torch.set_num_threads(1)
    _FORKED = translator

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_ORPHAN_CHECK_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="attnkit-orphan-watch", daemon=True).start()


def _check_int8(model) -> None:
    """Refuse ``int8=True`` for a model that the int8 kernels cannot run, naming why."""
    param = next(model.parameters())
    if not int8_available():
        raise ValueError(
            "int8: this torch has no int8 CPU kernels (FBGEMM, x86 with AVX2); use float32"
        )
    if param.device.type != "cpu" or param.dtype != torch.float32:
        raise ValueError(
            f"int8: expected a float32 model on a CPU (its weights are quantized from float32), "
            f"got {param.dtype} on {param.device}"
        )


def _translate_part(sources: list[list[int]]) -> list[list[int]]:
    return _FORKED.translate_ids(sources)


class Translator:
    """Translate sentences with a model and its tokenizer.

    Args:
        model: a :class:`~attnkit.models.Transformer` (put in eval mode).
        tokenizer: its :class:`~attnkit.data.SubwordTokenizer`; bos and eos ids come from it.
            Its pad id must be the model's, its eos id another, and its vocabulary (if it
            states ``vocab_size``) must fit the model's.
        config: a :class:`DecodingConfig` (default: beam 5); its ``bos_id`` / ``eos_id``, if
            set, must be the tokenizer's; ``n_best`` must be 1 (one translation a line) and
            ``min_len`` within the model's ``max_len - 1``.
        batch_tokens: padded source tokens per batch (sentences x longest source); a batch is
            split further when its decoder caches would take more than half the free memory.
        workers: batches decoded at once on a CPU (CTranslate2's ``inter_threads``), by the
            workers ``parallel`` says. Decoding is a long chain of small operators, so several
            batches side by side keep the cores busier than one batch split across them: 2
            workers of 1 thread translate test2016 faster than 1 worker of 2 threads, and hold
            up far better when other processes share the cores (docs/benchmarks.md). Outputs
            do not depend on it beyond the float rounding of a different thread count (with
            ``int8`` they may: int8 products depend on the batch, below).
        parallel: what the workers are. ``"threads"`` (the default): threads of this process,
            each running its operators on ``torch.get_num_threads() // workers`` threads (the
            process-wide count is lowered for the duration of :meth:`translate` and restored
            afterwards). ``"processes"`` (Linux; elsewhere threads): ``workers`` processes
            forked at the first call, one operator thread each, each given a run of every
            call's sentences by length with an equal share of the decoding time
            (:func:`length_shares`, :func:`decode_cost`); they share the model's memory
            with this process, receive source ids and send back output ids. They are kept for the next calls (with
            the oneDNN kernels they made for the shapes they met) while the model's weights are
            unchanged, keyed on storage and version counter as the packed weights of
            :mod:`attnkit.generation.packed` are (writes that do not bump the counter, as a
            fused optimizer step, need :meth:`close`), and stop with :meth:`close`, the
            Translator, or the program (a killed one included); meanwhile they keep the
            weights' pages as they were forked (an in-place change in this process copies
            them). Other state (a module swapped for one without weights, hooks) is not
            seen either: call :meth:`close`. Faster than threads (no
            interpreter lock between the workers), for programs such as ``attnkit translate``;
            forking is unsafe where other threads hold locks (a server). The translations are
            the ones ``"threads"`` gives (with ``int8``, up to the batches' effect below).
        int8: run the linear layers in int8 (dynamic quantization, CTranslate2's
            ``compute_type="int8"``: :mod:`attnkit.generation.packed`; the cross-attention
            keys and values, computed once per sentence, stay float32); the model must be
            float32 on a CPU with torch's int8 kernels (:func:`int8_available`). 1.2-1.3x the
            sentences/s of float32 for the shipped model (bfloat16, where native, is faster),
            test2016 BLEU 42.88-43.35 against float32's 43.04; a sentence's translation may
            change with the batch it is decoded in (one input scale per product).
    """

    def __init__(
        self,
        model,
        tokenizer,
        config: DecodingConfig | None = None,
        *,
        batch_tokens: int = 4000,
        workers: int = 1,
        parallel: str = "threads",
        int8: bool = False,
    ) -> None:
        if isinstance(batch_tokens, bool) or not isinstance(batch_tokens, int) or batch_tokens < 1:
            raise ValueError(f"batch_tokens: expected an integer >= 1, got {batch_tokens!r}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers: expected an integer >= 1, got {workers!r}")
        if parallel not in PARALLEL:
            raise ValueError(f"parallel: expected one of {PARALLEL}, got {parallel!r}")
        if not isinstance(int8, bool):
            raise TypeError(f"int8: expected True or False, got {int8!r}")
        if int8:
            _check_int8(model)
        config = DecodingConfig.of(config)
        missing = [name for name in ("bos_id", "eos_id") if not hasattr(tokenizer, name)]
        if missing:  # (None, or a Hugging Face tokenizer without attnkit's special ids)
            raise TypeError(
                f"tokenizer: expected the model's SubwordTokenizer (load_translation_model "
                f"returns it with the model), got {type(tokenizer).__name__} without "
                f"{' and '.join(missing)}"
            )
        pad = getattr(tokenizer, "pad_id", model.config.pad_id)
        if pad != model.config.pad_id:
            raise ValueError(
                f"tokenizer: its pad id {pad} is not the model's pad_id={model.config.pad_id}"
            )
        vocab = getattr(tokenizer, "vocab_size", None)
        for name in ("src_vocab_size", "tgt_vocab_size"):
            size = getattr(model.config, name)
            if vocab is not None and vocab > size:  # its ids would index past the embeddings
                raise ValueError(
                    f"tokenizer: its vocabulary of {vocab} ids does not fit the model's "
                    f"{name}={size} (a tokenizer trained with another model?)"
                )
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = config.with_ids(tokenizer)
        check_special_ids(model, self.config)  # the tokenizer's eos must not be the pad
        if self.config.n_best != 1:  # it was accepted, and one translation came back anyway
            raise ValueError(
                f"n_best: {self.config.n_best}; a Translator returns one translation a line (the "
                "best): attnkit.decoding.generate(model, src, config) returns the n best "
                "hypotheses of every sentence"
            )
        longest = model.config.max_len - 1  # decoder positions after bos
        if self.config.min_len > longest:
            raise ValueError(
                f"min_len: {self.config.min_len} tokens is more than this model can write: its "
                f"outputs end within {longest} tokens (max_len={model.config.max_len}, one "
                "position for bos)"
            )
        self.batch_tokens = batch_tokens
        self.int8 = int8
        self.device = next(model.parameters()).device
        self.workers = workers if self.device.type == "cpu" else 1
        self.parallel = parallel if can_fork() else "threads"
        self._siblings = 1  # processes decoding at once, this one included (share the memory)
        self._pool: ProcessPoolExecutor | None = None  # parallel="processes": the workers
        self._pool_key: tuple | None = None  # what they were forked with (_state_key)
        self._pool_pid = os.getpid()  # the process the pool and its lock belong to
        self._pool_lock = threading.Lock()

    @property
    def max_src_tokens(self) -> int:
        """The most subword tokens of a source line; the eos takes the last position."""
        return self.model.config.max_len - 1

    def encode(self, lines: Sequence[str]) -> tuple[list[list[int]], list[int]]:
        """Source ids (eos appended) per line, and the indices of the lines cut to fit."""
        limit = self.max_src_tokens
        eos = self.tokenizer.eos_id
        encoded, truncated = [], []
        for i, ids in enumerate(self.tokenizer.encode_batch(list(lines))):
            if len(ids) > limit:
                truncated.append(i)
                ids = ids[:limit]
            encoded.append([*ids, eos])
        return encoded, truncated

    def _pad(self, batch: list[int], sources: Sequence[list[int]]) -> torch.Tensor:
        width = max(len(sources[i]) for i in batch)
        src = torch.full((len(batch), width), self.model.config.pad_id, dtype=torch.long)
        for row, i in enumerate(batch):  # src: (B, S)
            src[row, : len(sources[i])] = torch.tensor(sources[i], dtype=torch.long)
        return src

    def _memory_batches(self, src: torch.Tensor, workers: int) -> list[slice]:
        """Split the rows of ``src`` (B, S) so that each part's decoder caches take at most half
        the free memory (the rest is for the model and the activations), shared by the
        ``workers`` parts this process decodes at once and by the worker processes beside it. A
        sentence that does not fit alone is left to :func:`generate` to report."""
        available = available_memory(self.device)
        if available is None:
            return [slice(0, src.shape[0])]
        available //= workers * self._siblings
        c = self.model.config
        positions = int(max_lengths(src, self.config, c.max_len, c.pad_id).max()) + 1
        one = decoding_memory(
            self.model, sentences=1, beam_size=self.config.beam_size, num_positions=positions,
            src_len=src.shape[1], use_cache=self.config.use_cache,
        )  # fmt: skip
        rows = max(1, available // 2 // one)
        return [slice(start, start + rows) for start in range(0, src.shape[0], rows)]

    def translate_ids(self, sources: Sequence[list[int]]) -> list[list[int]]:
        """Best output ids per source (each eos-terminated, as :meth:`encode` makes them).

        Raises:
            TypeError: for a source that is not a sequence of integers (a float id would be
                cut to an int, a str is not ids), naming its index.
            ValueError: for an id outside the model's source vocabulary, naming the index.
        """
        sources = self._check_sources(sources)
        if not sources:
            return []
        if self.parallel == "processes" and self.workers > 1 and len(sources) > 1:
            return self._translate_in_processes(sources)
        outputs: list[list[int]] = [[] for _ in sources]
        lengths = [len(s) for s in sources]
        budget = self.batch_tokens
        if self.workers > 1:  # enough batches to keep every worker busy: 2 each, at least
            budget = max(1, min(budget, -(-sum(lengths) // (2 * self.workers))))
        batches = list(token_batches(lengths, budget))
        workers = min(self.workers, len(batches))
        jobs = []  # (sentence indices, (b, S) source ids), longest batches first
        for batch in batches:
            src = self._pad(batch, sources)  # (B, S)
            jobs += [(batch[part], src[part]) for part in self._memory_batches(src, workers)]

        def decode(job) -> None:
            indices, src = job
            # The translator computes in its model's dtype: a caller's autocast (a training
            # run's val_bleu hook) would mix float32 queries with bf16 cached keys.
            with torch.autocast(self.device.type, enabled=False):
                hyps = generate(self.model, src.to(self.device), self.config)
            for i, best in zip(indices, hyps, strict=True):
                outputs[i] = best[0].tokens

        # On a CPU the linear layers run on weights prepacked for oneDNN (made once, kept with
        # the model): +30% sentences/s in float32 on test2016 (docs/benchmarks.md); elsewhere,
        # or where oneDNN declines a weight, it changes nothing.
        with packed_linears(self.model, int8=self.int8):
            if workers == 1:
                for job in jobs:
                    decode(job)
            else:
                _decode_in_threads(decode, jobs, workers)
        return outputs

    def _check_sources(self, sources: Sequence[list[int]]) -> list[list[int]]:
        """``sources`` as a list, every id checked: once per call, in Python (the ids are
        lists), before any batch is padded or sent to a worker process."""
        if isinstance(sources, str | bytes):
            raise TypeError(
                f"sources: expected a sequence of token id lists, got {type(sources).__name__}"
            )
        sources = list(sources)
        vocab = self.model.config.src_vocab_size
        for i, ids in enumerate(sources):
            if isinstance(ids, str | bytes) or not isinstance(ids, Sequence):
                raise TypeError(
                    f"sources[{i}]: expected a list of int token ids, got {type(ids).__name__}"
                )
            for j, token in enumerate(ids):  # int first: the usual case costs one type test
                if type(token) is not int and (
                    isinstance(token, bool) or not isinstance(token, numbers.Integral)
                ):
                    raise TypeError(
                        f"sources[{i}][{j}]: expected an int token id, got "
                        f"{type(token).__name__} {token!r}"
                    )
            low, high = (min(ids), max(ids)) if ids else (0, 0)
            if low < 0 or high >= vocab:
                bad = low if low < 0 else high
                raise ValueError(
                    f"sources[{i}]: token id {bad} is outside the vocabulary [0, {vocab})"
                )
        return sources

    def _translate_in_processes(self, sources: Sequence[list[int]]) -> list[list[int]]:
        """:meth:`translate_ids` with the sentences split by length among the worker processes
        (:func:`length_shares`), each translating its share one batch at a time on one
        operator thread."""
        order = sorted(range(len(sources)), key=lambda i: (len(sources[i]), i))
        runs = length_shares([decode_cost(len(sources[i])) for i in order], self.workers)
        parts = [[order[j] for j in run] for run in runs]
        shares = [[sources[i] for i in part] for part in parts]
        if self._pool_pid != os.getpid():  # this Translator was forked: the pool is not ours
            self._pool, self._pool_key, self._pool_pid = None, None, os.getpid()
            self._pool_lock = threading.Lock()
        with self._pool_lock:
            try:
                results = list(self._worker_pool().map(_translate_part, shares))
            except BrokenProcessPool:
                self._close_pool()
                raise RuntimeError(
                    "a translation worker process died (killed, or out of memory?); decode with "
                    "fewer workers (--workers) or with threads (--parallel threads, "
                    "Translator(parallel='threads'))"
                ) from None
        outputs: list[list[int]] = [[] for _ in sources]
        for part, result in zip(parts, results, strict=True):
            for i, ids in zip(part, result, strict=True):
                outputs[i] = ids
        return outputs

    def _state_key(self) -> tuple:
        """What the worker processes were forked with: every parameter's and buffer's storage
        and version counter, the search settings, the batch budget, the worker count and int8."""
        tensors = [*self.model.parameters(), *self.model.buffers()]
        return (
            tuple((t.data_ptr(), None if t.is_inference() else t._version) for t in tensors),
            self.config,
            self.batch_tokens,
            self.workers,
            self.int8,
        )

    def _worker_pool(self) -> ProcessPoolExecutor:
        """The worker processes: those of the last call if :meth:`_state_key` is unchanged, else
        new ones (forked with the model's weights packed, which they inherit)."""
        key = self._state_key()
        broken = getattr(self._pool, "_broken", False)  # a worker died while idle
        if self._pool is not None and self._pool_key == key and not broken:
            return self._pool
        self._close_pool()
        single = Translator(
            self.model, self.tokenizer, self.config, batch_tokens=self.batch_tokens,
            int8=self.int8,
        )  # fmt: skip
        single._siblings = self.workers
        pool = ProcessPoolExecutor(
            self.workers,
            mp_context=multiprocessing.get_context("fork"),
            initializer=_start_worker,
            initargs=(single, os.getpid()),
        )
        self._pool, self._pool_key = pool, key
        with packed_linears(self.model, int8=self.int8):
            pool.submit(int).result()  # the first task forks every worker, inside the block
        return pool

    def _close_pool(self) -> None:
        pool, self._pool, self._pool_key = self._pool, None, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        """Stop the worker processes of ``parallel="processes"``; a later call starts new ones.
        (They also stop when the Translator is garbage-collected or the program ends.) Also
        drop the model's prepacked weights (:func:`attnkit.generation.packed.release`), so
        that the next call packs the weights as they are then: after writes that do not bump
        autograd's version counter (a fused optimizer step, ``.data``), threads and processes
        alike see the new weights."""
        with self._pool_lock:
            self._close_pool()
        release(self.model)

    def __enter__(self) -> Translator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def translate(self, lines: Iterable[str]) -> TranslationOutput:
        """Translate ``lines`` (one sentence each) in order.

        ``lines`` may be any iterable of str (a generator is read once). Each line goes
        through :func:`normalize_source` first; a line that is then empty gives "" and is not
        decoded. Lines longer than the model allows are cut to their first
        :attr:`max_src_tokens` tokens; their indices are reported (and logged at debug
        level), never raised.

        Raises:
            TypeError: for a single str, a mapping, or an item that is not a str.
            ValueError: for a line that is not valid UTF-8 text (a lone surrogate), naming
                its index (:func:`~attnkit.texts.check_texts`).
        """
        lines = check_texts(lines, "lines", item="line")
        clean = [normalize_source(line) for line in lines]
        nonempty = [i for i, line in enumerate(clean) if line]
        sources, cut = self.encode([clean[i] for i in nonempty])
        truncated = [nonempty[j] for j in cut]
        for i in truncated:
            logger.debug("line %d: longer than %d tokens, truncated", i + 1, self.max_src_tokens)
        texts = self.tokenizer.decode_batch(self.translate_ids(sources)) if sources else []
        translations = [""] * len(lines)
        for i, text in zip(nonempty, texts, strict=True):
            translations[i] = text
        return TranslationOutput(translations, truncated, self.max_src_tokens)
