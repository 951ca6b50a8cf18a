"""`attnkit bleu`: the score line, JSON, intervals, sentence scores and errors, against sacreBLEU."""

from __future__ import annotations

import gzip
import io
import json
import random
import sys

import pytest
from sacrebleu.metrics import BLEU

from attnkit.cli import main
from tests.helpers.corpora import DATA_DIR


def _without_version(line: str) -> str:
    head, _, rest = line.partition("|version:")
    return head + "|version:" + rest.split(" ", 1)[1] if rest else line


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """200 Multi30k val references, a second reference set and corrupted hypotheses."""
    tmp = tmp_path_factory.mktemp("bleu")
    with gzip.open(DATA_DIR / "val.en.gz", "rt", encoding="utf-8") as f:
        refs = f.read().split("\n")[:200]
    rng = random.Random(0)
    hyps, refs2 = [], []
    for ref in refs:
        words = ref.split()
        if words and rng.random() < 0.5:
            del words[rng.randrange(len(words))]
        if len(words) > 2 and rng.random() < 0.5:
            words[0], words[1] = words[1], words[0]
        hyps.append(" ".join(words) if rng.random() < 0.9 else "")
        refs2.append(ref.lower().replace(" a ", " one "))
    paths = {"hyp": tmp / "hyp.txt", "ref": tmp / "ref.txt", "ref2": tmp / "ref2.txt"}
    for key, lines in (("hyp", hyps), ("ref", refs), ("ref2", refs2)):
        paths[key].write_text("\n".join(lines) + "\n", encoding="utf-8")
    paths["lines"] = {"hyp": hyps, "ref": refs, "ref2": refs2}
    return paths


def run(capsys, *argv):
    code = main(["bleu", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "options, kwargs",
    [
        ([], {}),
        (["--tokenize", "intl", "--lowercase"], {"tokenize": "intl", "lowercase": True}),
        (
            ["-tok", "char", "-s", "floor", "-sv", "0.3"],
            {"tokenize": "char", "smooth_method": "floor", "smooth_value": 0.3},
        ),
        (["--smooth-method", "add-k"], {"smooth_method": "add-k"}),
        (
            ["--tokenize", "none", "--smooth-method", "none"],
            {"tokenize": "none", "smooth_method": "none"},
        ),
    ],
)
@pytest.mark.parametrize("width", [1, 2])
def test_score_line_equals_sacrebleus(capsys, files, options, kwargs, width):
    code, out, _ = run(capsys, files["hyp"], "-r", files["ref"], "-w", width, *options)
    assert code == 0
    metric = BLEU(**kwargs)
    theirs = metric.corpus_score(files["lines"]["hyp"], [files["lines"]["ref"]])
    expected = theirs.format(width, signature=metric.get_signature().format())
    assert _without_version(out.strip()) == _without_version(expected)


def test_default_line_looks_like_sacrebleus(capsys, files):
    _, out, _ = run(capsys, files["hyp"], "-r", files["ref"])
    assert out.startswith("BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert " = " in out and "(BP = " in out and out.count("\n") == 1


def test_multiple_references_and_stdin(capsys, files, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(files["hyp"].read_bytes())))
    code, out, _ = run(capsys, "-", "-r", files["ref"], "-r", files["ref2"])
    assert code == 0
    metric = BLEU()
    theirs = metric.corpus_score(
        files["lines"]["hyp"], [files["lines"]["ref"], files["lines"]["ref2"]]
    )
    assert _without_version(out.strip()) == _without_version(
        theirs.format(2, signature=metric.get_signature().format())
    )


def test_json(capsys, files):
    code, out, _ = run(capsys, files["hyp"], "-r", files["ref"], "--json")
    assert code == 0
    d = json.loads(out)
    theirs = BLEU().corpus_score(files["lines"]["hyp"], [files["lines"]["ref"]])
    for key in (
        "name",
        "score",
        "signature",
        "verbose_score",
        "counts",
        "totals",
        "precisions",
        "bp",
        "sys_len",
        "ref_len",
    ):
        assert key in d
    assert d["name"] == "BLEU" and d["verbose_score"] == theirs._verbose
    assert d["score"] == pytest.approx(theirs.score, abs=1e-9, rel=0)
    assert d["precisions"] == pytest.approx(theirs.precisions, abs=1e-9, rel=0)
    assert (d["counts"], d["totals"], d["sys_len"], d["ref_len"]) == (
        theirs.counts,
        theirs.totals,
        theirs.sys_len,
        theirs.ref_len,
    )
    assert d["bp"] == pytest.approx(theirs.bp, abs=1e-9, rel=0)
    assert (d["nrefs"], d["tok"], d["case"]) == ("1", "13a", "mixed")


def test_confidence_interval(capsys, files, monkeypatch):
    monkeypatch.delenv("SACREBLEU_SEED", raising=False)
    code, out, _ = run(capsys, files["hyp"], "-r", files["ref"], "--ci", "-w", 1)
    assert code == 0
    metric = BLEU()
    theirs = metric.corpus_score(files["lines"]["hyp"], [files["lines"]["ref"]], n_bootstrap=1000)
    expected = theirs.format(1, signature=metric.get_signature().format())
    assert "bs:1000|seed:12345" in out and "μ = " in out
    assert _without_version(out.strip()) == _without_version(expected)
    code, out, _ = run(capsys, files["hyp"], "-r", files["ref"], "--ci", "--json")
    d = json.loads(out)
    assert d["confidence"]["mean"] == pytest.approx(theirs._mean, abs=1e-9, rel=0)
    assert d["confidence"]["half_width"] == pytest.approx(theirs._ci, abs=1e-9, rel=0)
    assert d["confidence"]["lower"] <= d["score"] <= d["confidence"]["upper"]


def test_sentence_scores(capsys, files):
    code, out, _ = run(capsys, files["hyp"], "-r", files["ref"], "--sentence", "-w", 1)
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 200
    metric = BLEU(effective_order=True)
    for line, hyp, ref in zip(lines, files["lines"]["hyp"], files["lines"]["ref"], strict=True):
        theirs = metric.sentence_score(hyp, [ref])
        assert _without_version(line) == _without_version(
            theirs.format(1, signature=metric.get_signature().format())
        )
    code, out, _ = run(capsys, files["hyp"], "-r", files["ref"], "--sentence", "--json")
    records = [json.loads(line) for line in out.splitlines()]
    assert len(records) == 200 and records[0]["eff"] == "yes"
    theirs = metric.sentence_score(files["lines"]["hyp"][5], [files["lines"]["ref"][5]])
    assert records[5]["score"] == pytest.approx(theirs.score, abs=1e-9, rel=0)


def test_empty_files_score_zero(capsys, tmp_path):
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("")
    ref.write_text("")
    code, out, _ = run(capsys, hyp, "-r", ref)
    assert code == 0
    assert " = 0.00 0.0/0.0/0.0/0.0 (BP = 1.000 ratio = 0.000 hyp_len = 0 ref_len = 0)" in out


def test_mismatched_line_counts(capsys, files, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("one line\n")
    code, _, err = run(capsys, files["hyp"], "-r", files["ref"], "-r", short)
    assert code == 2
    assert err.count("\n") == 1
    assert "hyp.txt" in err and "200 lines" in err and "short.txt" in err and "1 lines" in err


def test_non_utf8_file(capsys, files, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\n" * 6 + b"caf\xe9\n" + b"ok\n" * 193)
    code, _, err = run(capsys, bad, "-r", files["ref"])
    assert code == 2
    assert "bad.txt" in err and "line 7" in err and "UTF-8" in err


def test_unknown_tokenizer_lists_known(capsys, files):
    code, _, err = run(capsys, files["hyp"], "-r", files["ref"], "--tokenize", "moses")
    assert code == 2
    assert "'moses'" in err and all(name in err for name in ("none", "13a", "intl", "char", "zh"))


def test_bad_options(capsys, files):
    code, _, err = run(capsys, files["hyp"], "-r", files["ref"], "--smooth-method", "add-one")
    assert code == 2 and "floor" in err
    code, _, err = run(capsys, files["hyp"], "-r", files["ref"], "--ci", "--sentence")
    assert code == 2 and "--ci" in err
    code, _, err = run(capsys, files["hyp"], "-r", "missing.txt")
    assert code == 2 and "missing.txt" in err
