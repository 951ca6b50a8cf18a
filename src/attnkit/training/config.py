"""Training configuration: a task and three dataclasses (model, data, optimisation) read from
TOML.

A config file names its task at the top (``task = "translation"``, the default, or
``task = "lm"``) and has the sections ``[model]``, ``[data]`` and ``[optim]``. For
translation every key is a field of :class:`~attnkit.models.TransformerConfig`,
:class:`DataConfig` or :class:`OptimConfig`; for a language model (``task = "lm"``) of
:class:`~attnkit.models.GPTConfig`, :class:`LMDataConfig` or :class:`OptimConfig`. Every key
may be left out (the translation defaults are the paper's recipe at Multi30k size)::

    [model]
    d_model = 256
    dropout = 0.1

    [optim]
    warmup_steps = 2000

Command-line overrides ``section.key=value`` are parsed as TOML values
(``model.dropout=0.3``, ``optim.betas=[0.9, 0.98]``); a bare word is accepted for a string
field (``data.corpus=copy``). Unknown sections or keys raise ``ValueError`` naming them and
listing the known ones. The vocabulary sizes and the pad id of the model come from the
tokenizer and cannot be set (for a language model: ``vocab_size``, ``bos_token_id`` and
``eos_token_id``).

Every value is checked where it is read: its type, and its range from
:mod:`attnkit.training.limits` (so ``model.d_model=-1``, ``=0``, ``=true``, ``="64"``
or ``=10**12`` fail at once). An error names where the value came from (the file, or the
``--set`` item) and the field. ``[model]`` values are checked by
:class:`~attnkit.models.TransformerConfig` or :class:`~attnkit.models.GPTConfig`.
``data.corpus`` must name a shipped corpus, the copy task or ``""`` (files), and a shipped
corpus's languages and splits are checked too, so that no such error waits until the run
folder is made.

Length: about 540 lines, over the house's ~400: the two tasks share the reading, checking,
override and writing code here and differ in their section types and the keys they fix; the
language model's own ``[data]`` section, its checks across sections and its resume rule are in
:mod:`attnkit.training.lm_config`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tomllib
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnkit.data.corpus import NAMED_CORPORA
from attnkit.metrics.io import decode_utf8
from attnkit.models.config_checks import check_choice, check_number
from attnkit.models.gpt import GPTConfig
from attnkit.models.transformer import TransformerConfig
from attnkit.training import limits
from attnkit.training.limits import TOKENIZER_MODEL_KEYS, check_range, check_section
from attnkit.training.lm_config import (
    LM_TOKENIZER_MODEL_KEYS,
    LMDataConfig,
    check_lm_config,
    lm_resume_conflicts,
)

AUTOCAST_MODES = ("auto", "bf16", "fp16", "none")
BEST_METRICS = ("auto", "val_loss", "val_bleu")
SCHEDULES = ("inverse_sqrt", "cosine")
TASKS = ("translation", "lm")
COPY_CORPUS = "copy"  # data.corpus of the synthetic copy task


@dataclass
class DataConfig:
    """Where the parallel text comes from and how it becomes token batches."""

    corpus: str = "multi30k"  # shipped corpus name, "copy" (synthetic copy task) or "" (files)
    src_lang: str = "de"  # source language of a named corpus
    tgt_lang: str = "en"  # target language of a named corpus
    train_split: str = "train"  # split of a named corpus used for training
    val_split: str = "val"  # split of a named corpus used for validation
    train_src: str = ""  # with corpus = "": training source file (plain or gzipped)
    train_tgt: str = ""  # with corpus = "": training target file
    val_src: str = ""  # with corpus = "": validation source file
    val_tgt: str = ""  # with corpus = "": validation target file
    max_train_pairs: int = 0  # keep only the first N training pairs (0 = all)
    vocab_size: int = 8000  # joint BPE vocabulary, specials and 256 byte tokens included
    min_frequency: int = 2  # a BPE merge needs this many occurrences
    max_tokens: int = 4096  # padded tokens per batch (per rank, per micro-batch)
    max_len: int = 0  # longest pair in tokens (with eos); 0 = the model's max_len
    seed: int = 0  # seed of the batch order (epoch e uses (seed, e))
    # BPE-dropout (Provilkov et al. 2020): each training batch is segmented afresh with every
    # merge dropped with this probability (0.1 in the paper); validation and inference keep
    # the deterministic segmentation. 0 = off.
    bpe_dropout: float = 0.0
    # Pass each source line through normalize_source, as the Translator does (runs saved
    # before this option existed read as false: they trained on the sources as written).
    clean_sources: bool = True
    # Pad each batch's source and target widths up to a multiple of this (1 = to the longest
    # row): fewer distinct shapes, whose CPU kernels oneDNN compiles once and then reuses.
    pad_multiple: int = 1
    copy_train_pairs: int = 500  # corpus = "copy": training pairs
    copy_val_pairs: int = 100  # corpus = "copy": validation pairs
    copy_words: int = 20  # corpus = "copy": distinct pseudo-words
    copy_min_len: int = 3  # corpus = "copy": shortest sequence, in words
    copy_max_len: int = 10  # corpus = "copy": longest sequence, in words

    def __post_init__(self) -> None:
        corpora = [*sorted(NAMED_CORPORA), COPY_CORPUS, ""]
        if self.corpus not in corpora:
            raise ValueError(
                f"data.corpus: expected one of {corpora} ('' = your own files, train_src and "
                f"train_tgt), got {self.corpus!r}"
            )
        self._check_named_corpus()
        if not self.corpus and not (self.train_src and self.train_tgt):
            raise ValueError('data: with corpus = "" both train_src and train_tgt must name files')
        if bool(self.val_src) != bool(self.val_tgt):
            raise ValueError(
                f"data: val_src={self.val_src!r} and val_tgt={self.val_tgt!r}: give both or neither"
            )
        check_section("data", self)
        if self.copy_max_len < self.copy_min_len:
            raise ValueError(
                f"data.copy_max_len={self.copy_max_len} must be >= "
                f"data.copy_min_len={self.copy_min_len}"
            )

    def _check_named_corpus(self) -> None:
        """The languages and splits of a shipped corpus, checked here rather than when it is
        read, after the run folder is made."""
        spec = NAMED_CORPORA.get(self.corpus)
        if spec is None:
            return
        for key in ("src_lang", "tgt_lang", "train_split", "val_split"):
            value = getattr(self, key)
            choices = spec.languages if key.endswith("lang") else list(spec.splits)
            if key == "val_split":
                choices = [*choices, ""]  # "" = no validation
            if value not in choices:
                raise ValueError(
                    f"data.{key}: expected one of {list(choices)} for corpus {self.corpus!r}, "
                    f"got {value!r}"
                )
        if self.src_lang == self.tgt_lang:
            raise ValueError(
                f"data.src_lang and data.tgt_lang: both {self.src_lang!r}; corpus "
                f"{self.corpus!r} translates between two different languages"
            )


@dataclass
class OptimConfig:
    """Optimiser, schedule, loss, budgets and run-time settings."""

    schedule: str = "inverse_sqrt"  # "inverse_sqrt" (the paper's) or "cosine" (warmup, cosine)
    lr_scale: float = 1.0  # peak scale: lr = lr_scale * d_model^-0.5 * min(s^-0.5, s * w^-1.5)
    peak_lr: float = 1e-3  # schedule = "cosine": the learning rate reached after warmup
    min_lr: float = 1e-4  # schedule = "cosine": the learning rate at the end of the budget
    warmup_steps: int = 4000  # w in the schedule above (the paper: 4000)
    cooldown: float = 0.0  # last fraction of the budget with lr falling linearly to 0 (0 = none)
    betas: tuple[float, float] = (0.9, 0.98)  # Adam betas (the paper)
    eps: float = 1e-9  # Adam epsilon (the paper)
    # Decoupled (AdamW-style) weight decay of matrices and embeddings, none for biases and
    # norms (nanoGPT's groups); 0 = the paper's Adam.
    weight_decay: float = 0.0
    clip_norm: float = 1.0  # clip the global gradient norm to this; 0 = no clipping
    accumulation: int = 1  # micro-batches per optimizer step
    label_smoothing: float = 0.1  # epsilon of seed 003's smoothing (the paper: 0.1)
    max_steps: int = 0  # stop after this many optimizer steps (0 = no limit)
    max_epochs: int = 0  # stop after this many epochs (0 = no limit)
    max_minutes: float = 0.0  # stop after this much wall time, resumed time included (0 = none)
    patience: int = 0  # stop after this many evaluations without a new best (0 = never)
    val_bleu: bool = False  # also decode the validation set (greedy) and log val_bleu
    val_bleu_sentences: int = 0  # decode only the first N validation pairs (0 = all)
    best_metric: str = "auto"  # "val_loss", "val_bleu", or "auto" (val_bleu when logged)
    log_every: int = 50  # steps between training-loss records
    eval_every: int = 0  # steps between evaluations; 0 = at the end of every epoch
    save_every: int = 0  # steps between `last` checkpoints; 0 = at every evaluation
    keep_checkpoints: int = 0  # keep the weights of the newest N `last` saves in steps/ (averaging)
    autocast: str = "auto"  # "auto", "bf16", "fp16" or "none" (see attnkit.training.precision)
    compile: bool = False  # torch.compile the model (measured slower on a 2-core AVX2 CPU)
    seed: int = 0  # seed of weight initialisation and dropout
    threads: int = 0  # torch intra-op threads per process; 0 = physical cores / local ranks
    device: str = "auto"  # "auto" (CUDA when available), "cpu", "cuda", "cuda:1", ...

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        if len(self.betas) != 2:
            raise ValueError(f"optim.betas: expected two numbers in [0, 1), got {self.betas!r}")
        check_section("optim", self)
        if self.autocast not in AUTOCAST_MODES:
            raise ValueError(
                f"optim.autocast: expected one of {list(AUTOCAST_MODES)}, got {self.autocast!r}"
            )
        if self.best_metric not in BEST_METRICS:
            raise ValueError(
                f"optim.best_metric: expected one of {list(BEST_METRICS)}, got {self.best_metric!r}"
            )
        check_choice("optim.schedule", self.schedule, SCHEDULES)
        check_number("optim.peak_lr", self.peak_lr, low=0.0, high=10.0, low_open=True)
        check_number("optim.min_lr", self.min_lr, low=0.0, high=self.peak_lr)


SECTIONS: dict[str, type] = {"model": TransformerConfig, "data": DataConfig, "optim": OptimConfig}
LM_SECTIONS: dict[str, type] = {"model": GPTConfig, "data": LMDataConfig, "optim": OptimConfig}


def task_sections(task: str) -> dict[str, type]:
    """The section types of ``task`` (``"translation"`` or ``"lm"``)."""
    check_choice("task", task, TASKS)
    return LM_SECTIONS if task == "lm" else SECTIONS


def tokenizer_model_keys(task: str) -> tuple[str, ...]:
    """The ``[model]`` keys of ``task`` that come from the tokenizer."""
    return LM_TOKENIZER_MODEL_KEYS if task == "lm" else TOKENIZER_MODEL_KEYS


@dataclass
class TrainConfig:
    """Everything a training run needs: its ``task`` and the ``model``, ``data`` and ``optim``
    sections (of the types :func:`task_sections` gives)."""

    model: TransformerConfig | GPTConfig = field(default_factory=TransformerConfig)
    data: DataConfig | LMDataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    task: str = "translation"

    def __post_init__(self) -> None:
        sections = task_sections(self.task)
        for name in ("model", "data"):
            if not isinstance(getattr(self, name), sections[name]):
                raise TypeError(
                    f"{name}: task {self.task!r} needs a {sections[name].__name__}, got "
                    f"{type(getattr(self, name)).__name__}"
                )
        if self.task == "lm":
            check_lm_config(self.model, self.data, self.optim)
        else:
            self._check_translation()

    def check_new_run(self, *, resumed: bool = False) -> None:
        """The checks of a run about to start (new, or ``resumed`` with its overrides), which a
        saved config read back is not held to (a run saved before them must still load).

        Raises:
            ValueError: for ``optim.best_metric = "val_bleu"`` where no BLEU is computed (the
                first evaluation would end the run before its first checkpoint), or, for a new
                run, data files beside a named corpus (they would be ignored: the corpus is
                read; a resumed run keeps the data it was saved with, whatever the config says).
        """
        o = self.optim
        if o.best_metric == "val_bleu" and (self.task == "lm" or not o.val_bleu):
            why = (
                "BLEU is for translation, not task = 'lm'"
                if self.task == "lm"
                else ("it needs optim.val_bleu=true (BLEU is computed only then)")
            )
            raise ValueError(f"optim.best_metric='val_bleu': {why}; use 'val_loss' or 'auto'")
        keys = (
            ("train_file", "val_file")
            if self.task == "lm"
            else ("train_src", "train_tgt", "val_src", "val_tgt")
        )
        for key in () if resumed else keys:
            if self.data.corpus and getattr(self.data, key):
                raise ValueError(
                    f"data.{key}={getattr(self.data, key)!r}: your own files are read only "
                    f'with corpus = "" (here corpus = {self.data.corpus!r}); set data.corpus = '
                    f'"" to train on them, or leave {key} out'
                )

    def _check_translation(self) -> None:
        m, d = self.model, self.data
        # The model checks its own fields; built once more at the data's vocabulary size, it
        # also refuses a vocabulary that would make it too large before a tokenizer is trained.
        try:
            dataclasses.replace(m, src_vocab_size=d.vocab_size, tgt_vocab_size=d.vocab_size)
        except ValueError as err:
            raise ValueError(f"[model] with data.vocab_size={d.vocab_size}: {err}") from None
        if d.max_len > m.max_len:
            raise ValueError(
                f"data.max_len={d.max_len} exceeds model.max_len={m.max_len}, the longest "
                "sequence the model encodes"
            )
        longest = d.max_len or m.max_len
        if d.max_tokens < longest:
            raise ValueError(
                f"data.max_tokens={d.max_tokens} must be >= the longest pair, "
                f"data.max_len={d.max_len} (0 = model.max_len={m.max_len}): a pair of that "
                "length would fit in no batch"
            )

    @property
    def context_length(self) -> int:
        """A language model's window: ``data.context_length``, or the model's (0)."""
        return self.data.context_length or self.model.context_length

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (tuples as lists), the inverse of :meth:`from_dict`: ``"task"``
        and the three sections."""
        out: dict[str, Any] = {"task": self.task}
        for name in SECTIONS:
            values = dataclasses.asdict(getattr(self, name))
            out[name] = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
        return out

    @classmethod
    def from_dict(
        cls,
        raw: Mapping[str, Any],
        *,
        allow_tokenizer_keys: bool = False,
        source: str = "config",
        origins: Mapping[str, str] | None = None,
    ) -> TrainConfig:
        """Builds a config from ``{"task": ..., "model": {...}, "data": {...}, "optim": {...}}``.

        Args:
            raw: The task (default ``"translation"``) and the sections as mappings; a missing
                section or key takes its default.
            allow_tokenizer_keys: Accept ``model.src_vocab_size`` etc. (true when reading a
                checkpoint's ``config.json``, where they were filled in from the tokenizer).
            source: Where ``raw`` came from (a file name), named in errors.
            origins: ``"section.key"`` -> where that value came from when it is not
                ``source`` (e.g. ``"--set 'model.d_model=-1'"``), named in errors.

        Raises:
            ValueError: On an unknown section or key, a value of the wrong type, or a value
                out of range; the message starts with the value's source.
        """
        origins = dict(origins or {})
        unknown = sorted(set(raw) - {"task", *SECTIONS})
        if unknown:
            raise ValueError(
                f"{source}: unknown config section(s) {unknown}; known: the key 'task' and "
                f"the sections {list(SECTIONS)}"
            )
        task = raw.get("task", "translation")
        try:
            section_types = task_sections(task)
        except ValueError as err:
            raise ValueError(f"{source}: {err}") from None
        tokenizer_keys = tokenizer_model_keys(task)
        sections = {}
        for name, section_type in section_types.items():
            values = raw.get(name, {})
            if not isinstance(values, Mapping):
                raise ValueError(f"{source}: [{name}]: expected a table of keys, got {values!r}")
            hints = _field_types(section_type)
            if name == "model" and not allow_tokenizer_keys:
                for key in tokenizer_keys:
                    if key in values:
                        raise ValueError(
                            f"{origins.get(f'model.{key}', source)}: model.{key}: set from the "
                            "tokenizer, not in the config (use data.vocab_size for the vocabulary)"
                        )
                hints = {k: v for k, v in hints.items() if k not in tokenizer_keys}
            bad = sorted(set(values) - set(hints))
            if bad:
                raise ValueError(
                    f"{source}: unknown key(s) {[f'{name}.{k}' for k in bad]}; known [{name}] "
                    f"keys: {sorted(hints)}"
                )
            kwargs = {}
            for key, value in values.items():
                where = f"{name}.{key}"
                try:
                    kwargs[key] = _coerce(where, value, hints[key])
                    check_range(where, kwargs[key])
                except ValueError as err:
                    raise ValueError(f"{origins.get(where, source)}: {err}") from None
            with _named_source(source, origins, name):
                sections[name] = section_type(**kwargs)
        with _named_source(source, origins, ""):
            return cls(**sections, task=task)

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str], overrides: Iterable[str] = ()) -> TrainConfig:
        """Reads a TOML config file and applies ``section.key=value`` overrides.

        Raises:
            FileNotFoundError: If ``path`` does not exist.
            ValueError: If ``path`` is a directory or another non-file, is not UTF-8 (naming
                the line and byte offset), holds no settings, on TOML syntax errors, bad
                overrides, unknown keys or bad values.
        """
        path = Path(path)
        name = f"config file {os.fspath(path)!r}"
        raw = read_toml(path)
        if not raw:  # every setting a default: the full Multi30k recipe, likely by mistake
            raise ValueError(
                f"{name} holds no settings (it is empty, or only comments); start from a "
                "shipped config such as configs/multi30k_de_en.toml or configs/tiny_copy.toml"
            )
        overrides = list(overrides)
        return cls.from_dict(
            apply_overrides(raw, overrides),
            source=f"config file {os.fspath(path)!r}",
            origins=override_origins(overrides),
        )

    def with_overrides(
        self, overrides: Iterable[str], *, source: str = "saved config"
    ) -> TrainConfig:
        """A copy with ``section.key=value`` overrides applied (see :func:`apply_overrides`).

        Args:
            overrides: ``section.key=value`` items.
            source: What this config is (e.g. a checkpoint's ``config.json``), named in errors.
        """
        overrides = list(overrides)
        return TrainConfig.from_dict(
            apply_overrides(self.to_dict(), overrides),
            allow_tokenizer_keys=True,
            source=source,
            origins=override_origins(overrides),
        )

    def to_toml(self) -> str:
        """The config as TOML text, every key written out (vocabulary sizes left out)."""
        lines = [f"task = {_toml_value(self.task)}", ""]
        tokenizer_keys = tokenizer_model_keys(self.task)
        for name, values in self.to_dict().items():
            if name == "task":
                continue
            lines.append(f"[{name}]")
            for key, value in values.items():
                if name == "model" and key in tokenizer_keys:
                    continue
                if value is None:  # TOML has no null: a left-out key takes its default
                    lines.append(f"# {key} = (default)")
                    continue
                lines.append(f"{key} = {_toml_value(value)}")
            lines.append("")
        return "\n".join(lines)


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The settings of a TOML config file, as a dict.

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If ``path`` is a directory or another non-file, is not UTF-8 (naming the
            line and byte offset), or on TOML syntax errors.
    """
    path = Path(path)
    name = f"config file {os.fspath(path)!r}"
    if not path.exists():
        raise FileNotFoundError(f"{name} does not exist")
    if path.is_dir():
        raise ValueError(f"{name} is a directory, not a TOML config file")
    if not path.is_file():
        raise ValueError(f"{name} is not a regular file, expected a TOML config file")
    text = decode_utf8(path.read_bytes(), name)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{name} is not valid TOML: {err}") from None


def with_saved_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    """A config a run saved, with the keys added since it was saved at the values that run
    used: ``data.clean_sources`` false (a translation run saved before training cleaned its
    sources trained on them as written)."""
    data = raw.get("data")
    if raw.get("task", "translation") == "translation" and isinstance(data, dict):
        return {**raw, "data": {"clean_sources": False, **data}}
    return raw


def check_resume(saved: TrainConfig, new: TrainConfig, saved_file: str | os.PathLike[str]) -> None:
    """Raises ``ValueError`` if a resume would change what the run's weights and tokenizer
    were made with: its task, or the keys that shaped them
    (:func:`attnkit.training.limits.resume_conflicts` for translation,
    :func:`attnkit.training.lm_config.lm_resume_conflicts` for a language model).

    Args:
        saved: The run's saved config.
        new: The config the resumed run would use.
        saved_file: Where ``saved`` was read, named in the message.
    """
    if saved.task != new.task:
        raise ValueError(
            f"--resume: cannot change task = {new.task!r} (the run has {saved.task!r}, "
            f"{os.fspath(saved_file)}); start a new run to change it"
        )
    rule = lm_resume_conflicts if new.task == "lm" else limits.resume_conflicts
    limits.check_resume(saved, new, saved_file, rule=rule)


def run_conflicts(run: TrainConfig, other: TrainConfig) -> list[str]:
    """What ``other`` changes of the run's ``run`` that a resume may not (the task, and the
    keys :func:`check_resume` guards), as lines ``"model.d_model = 64 (the run has 32)"``;
    empty when ``other`` may be a checkpoint of the run."""
    if run.task != other.task:
        return [f"task = {other.task!r} (the run has {run.task!r})"]
    rule = lm_resume_conflicts if run.task == "lm" else limits.resume_conflicts
    return rule(run, other)


def apply_overrides(raw: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Returns a copy of ``raw`` with each ``section.key=value`` override set.

    The value is parsed as a TOML value; if that fails and the field is a string, the text is
    taken as it is.

    Raises:
        ValueError: If an override is not ``section.key=value``, names an unknown section or
            key, or has a value that is not TOML (for a non-string field).
    """
    out = {name: dict(values) for name, values in raw.items() if isinstance(values, Mapping)}
    out.update({name: values for name, values in raw.items() if not isinstance(values, Mapping)})
    task = out.get("task", "translation")
    sections = LM_SECTIONS if task == "lm" else SECTIONS  # a bad task is from_dict's to name
    for item in overrides:
        target, sep, text = item.partition("=")
        section, dot, key = target.strip().partition(".")
        if sep and target.strip() == "task":  # it decides which sections the file may have
            raise ValueError(
                f"--set {item!r}: the task is set at the top of the config file (task = "
                '"lm" or "translation"), since it decides the [model] and [data] keys; start '
                "from a config of that task (configs/)"
            )
        if not sep or not dot or not section or not key:
            raise ValueError(f"--set {item!r}: expected section.key=value, e.g. model.dropout=0.3")
        if section not in SECTIONS:
            raise ValueError(
                f"--set {item!r}: unknown section {section!r}; known: {list(SECTIONS)}"
            )
        hints = _field_types(sections[section])
        if key not in hints:
            raise ValueError(
                f"--set {item!r}: unknown key {section}.{key}; known [{section}] keys: "
                f"{sorted(hints)}"
            )
        try:
            value = tomllib.loads(f"v = {text.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            if hints[key] is not str:
                raise ValueError(
                    f"--set {item!r}: {text.strip()!r} is not a TOML value "
                    f"(numbers as 0.3, booleans as true/false, lists as [0.9, 0.98])"
                ) from None
            value = text.strip()
        out.setdefault(section, {})[key] = value
    return out


def override_origins(overrides: Iterable[str]) -> dict[str, str]:
    """``"section.key"`` -> ``"--set 'section.key=value'"`` for each override (the last wins)."""
    out = {}
    for item in overrides:
        target = item.partition("=")[0].strip()
        out[target] = f"--set {item!r}"
    return out


@contextlib.contextmanager
def _named_source(source: str, origins: Mapping[str, str], section: str) -> Iterator[None]:
    """Prefixes a ``ValueError`` raised by a section's own checks with where its values came
    from: the source, and the ``--set`` items that touched the section (all, for ``""``)."""
    try:
        yield
    except ValueError as err:
        sets = [o for k, o in origins.items() if not section or k.startswith(f"{section}.")]
        where = source + (f" with {', '.join(sets)}" if sets else "")
        raise ValueError(f"{where}: {err}") from None


def _field_types(section_type: type) -> dict[str, Any]:
    hints = typing.get_type_hints(section_type)
    return {f.name: hints[f.name] for f in dataclasses.fields(section_type)}


def _coerce(name: str, value: Any, hint: Any) -> Any:
    """Checks ``value`` against the field type; ints are accepted for floats, lists for tuples.

    ``X | None`` fields (TOML has no null: None means "left out") take None or an X."""
    args = typing.get_args(hint)
    if type(None) in args and len(args) == 2:
        if value is None:
            return None
        hint = next(a for a in args if a is not type(None))
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif hint is str:
        ok = isinstance(value, str)
    elif typing.get_origin(hint) is tuple:  # a TOML list of numbers, e.g. [0.9, 0.98]
        size = len(typing.get_args(hint))
        numbers = isinstance(value, (list, tuple)) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
        )
        if not numbers or len(value) != size:
            got = f"{len(value)} number{'' if len(value) == 1 else 's'}" if numbers else None
            raise ValueError(
                f"{name}: expected a list of {size} numbers, got {value!r} "
                f"({got or type(value).__name__})"
            )
        return tuple(float(v) for v in value)
    else:  # pragma: no cover - every field above is one of these types
        raise TypeError(f"{name}: unsupported field type {hint!r}")
    if not ok:
        expected = getattr(hint, "__name__", str(hint))
        raise ValueError(f"{name}: expected {expected}, got {value!r} ({type(value).__name__})")
    return value


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)
