"""Test corpora: Multi30k references with corrupted hypotheses, deterministic by seed.

The corruptions are the ways real system output differs from a reference, plus the inputs that
break tokenizers: dropped, repeated and swapped words, case changes, punctuation, empty and
blank lines, accented and other Unicode text (odd whitespace, combining marks, emoji, digits of
other scripts, HTML entities) and Chinese text.
"""

from __future__ import annotations

import gzip
import random
from dataclasses import dataclass
from functools import cache
from pathlib import Path

# The Multi30k copy shipped in the package (src/attnkit/data/multi30k): in every clone.
DATA_DIR = Path(__file__).resolve().parents[2] / "src" / "attnkit" / "data" / "multi30k"

UNICODE = [
    "café",
    "naïve",
    "Ørsted",
    "İstanbul",
    "STRASSE",
    "Straße",
    "ẞ",
    "ΣΊΣΥΦΟΣ",
    "ﬁne",
    "Ǆemal",
    "Ⅻ",
    "①",
    "x²",
    "½",
    "—",
    "–",
    "“quoted”",
    "‘single’",
    "«guillemets»",
    "…",
    "€5",
    "£3.50",
    "¥",
    "©",
    "™",
    "😀",
    "👍🏽",
    "e\u0301",
    "a\u00a0b",
    "a\u2009b",
    "zero\u200bwidth",
    "a\u3000b",
    "tab\there",
    "v\x0btab",
    "sep\x1cfs",
    "nel\x85x",
    "ls\u2028x",
    "١٢٣",
    "٣.٥",
    "日本語",
    "한국어",
    "カタカナ",
    "ｆｕｌｌ",
    "ＡＢＣ１２３",
    "𠀀",
    "𝔘𝔫𝔦",
    "\ufeffbom",
    "a&amp;b",
    "&quot;x&quot;",
    "&lt;tag&gt;",
    "<skipped>",
    "well-\nknown",
    "line\nbreak",
    "3.14",
    "1,000",
    "2-3",
    "-5",
    "5-",
    "U.S.A.",
    "e.g.,",
    "...",
    "?!",
    "'s",
    "(parens)",
    "[brackets]",
    "{braces}",
    "#tag",
    "@user",
    "50%",
    "a/b",
    "back\\slash",
    "^caret",
    "_under_",
    "`tick`",
    "~tilde",
    "|pipe|",
    "+plus",
    "*star*",
    "x=1",
    "1.",
    ".5",
    ",,",
    "..,",
    "9.,a",
    "a.,9",
    "1-2-3",
    "\r",
    "Ǳ",
    "ǅ",
    "ﬃ",
]
CHINESE = [
    "我们是学生。",
    "一只狗在草地上奔跑",
    "2019年",
    "三点五公斤",
    "，",
    "！",
    "？",
    "“你好”",
    "《书名》",
    "（括号）",
    "中文English混合",
    "１２３",
    "　",
    "3.5元",
    "第1-2章",
    "…",
]
PUNCT = [".", ",", "!", "?", ";", ":", '"', "'", "(", ")", "-", "--", "&", "/", " .", " ,"]


def read_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8", newline="\n") as f:
        return f.read().split("\n")[:-1]


def corrupt(line: str, rng: random.Random) -> str:
    """A hypothesis made from ``line`` by one to three random corruptions."""
    words = line.split()
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(
            [
                "same",
                "drop",
                "repeat",
                "swap",
                "case",
                "punct",
                "unicode",
                "chinese",
                "truncate",
                "empty",
                "blank",
                "shuffle",
                "detach",
            ]
        )
        i = rng.randrange(len(words)) if words else 0
        if kind == "drop" and words:
            del words[i : i + rng.randint(1, 2)]
        elif kind == "repeat" and words:
            words[i:i] = words[i : i + rng.randint(1, 3)] * rng.randint(1, 3)
        elif kind == "swap" and len(words) > 1:
            j = min(i + 1, len(words) - 1)
            words[i], words[j] = words[j], words[i]
        elif kind == "case" and words:
            f = rng.choice([str.upper, str.lower, str.title, str.swapcase, str.capitalize])
            words = [f(w) if rng.random() < 0.5 else w for w in words]
        elif kind == "punct":
            if rng.random() < 0.5:
                words.insert(i, rng.choice(PUNCT))
            if words and rng.random() < 0.5:
                words[-1] = words[-1] + rng.choice(PUNCT).strip()
            words = [w.rstrip(".,") if rng.random() < 0.2 else w for w in words]
        elif kind == "unicode":
            words.insert(i, rng.choice(UNICODE))
        elif kind == "chinese":
            words.insert(i, rng.choice(CHINESE))
        elif kind == "truncate":
            words = words[: rng.randint(0, 4)]
        elif kind == "empty":
            return ""
        elif kind == "blank":
            return rng.choice([" ", "\t", "  \u3000", "\u00a0"])
        elif kind == "shuffle":
            rng.shuffle(words)
        elif kind == "detach":
            words = [w[:-1] + " " + w[-1] if w and w[-1] in ".,!?" else w for w in words]
    sep = " " if rng.random() < 0.9 else rng.choice(["  ", "\t", " \u00a0"])
    text = sep.join(words)
    if rng.random() < 0.1:
        text = (
            rng.choice([" ", "  ", "\t", "\r", " \u3000"])
            + text
            + rng.choice([" ", "\n", "\r", "\u2028"])
        )
    return text


@dataclass(frozen=True)
class Corpus:
    """Hypotheses with one reference stream and a second, partly missing one."""

    name: str
    hypotheses: tuple[str, ...]
    reference: tuple[str, ...]
    second: tuple[str | None, ...]

    def references(self, kind: str) -> list[list]:
        """Reference streams: ``one``, ``two`` (both streams) or ``var`` (some lines have one)."""
        if kind == "one":
            return [list(self.reference)]
        if kind == "two":
            return [list(self.reference), [r if r is not None else "" for r in self.second]]
        if kind == "var":
            return [list(self.reference), list(self.second)]
        raise ValueError(kind)


def _chinese(words: list[str], table: dict[str, str], rng: random.Random) -> str:
    out = [table.get(w.lower().strip(".,"), w) for w in words]
    joiner = "" if rng.random() < 0.8 else " "
    return joiner.join(out) + rng.choice(["。", "", "！", " ."])


@cache
def corpus(name: str) -> Corpus:
    """``en``: Multi30k val (English); ``de``: test2016 (German); ``zh``: Chinese made from
    test2016 English by a fixed word-to-characters table."""
    rng = random.Random(f"attnkit-bleu-{name}")
    if name == "en":
        refs = read_lines(DATA_DIR / "val.en.gz")
    elif name == "de":
        refs = read_lines(DATA_DIR / "test_2016_flickr.de.gz")
    elif name == "zh":
        english = read_lines(DATA_DIR / "test_2016_flickr.en.gz")[:300]
        vocab = sorted({w.lower().strip(".,") for line in english for w in line.split()})
        table = {
            w: "".join(chr(rng.randint(0x4E00, 0x4E00 + 400)) for _ in range(rng.randint(1, 3)))
            for w in vocab
            if not w.isdigit()
        }
        refs, hyps, second = [], [], []
        for line in english:
            words = line.split()
            refs.append(_chinese(words, table, rng))
            hyps.append(_chinese(corrupt(line, rng).split(), table, rng))
            second.append(
                None if rng.random() < 0.3 else _chinese(corrupt(line, rng).split(), table, rng)
            )
        return Corpus(name, tuple(hyps), tuple(refs), tuple(second))
    else:
        raise ValueError(name)
    hyps = [corrupt(r, rng) for r in refs]
    second = [None if rng.random() < 0.3 else corrupt(r, rng) for r in refs]
    return Corpus(name, tuple(hyps), tuple(refs), tuple(second))


CORPORA = ("en", "de", "zh")
