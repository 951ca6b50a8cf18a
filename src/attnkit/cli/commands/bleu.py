"""`attnkit bleu`: corpus or sentence BLEU of a hypothesis file, equal to sacreBLEU 2.x."""

from __future__ import annotations

import argparse
import json
import sys

from attnkit.cli.options import check_input_path, integer, option_error, real

NAME = "bleu"
HELP = "BLEU of a hypothesis file against one or more reference files (= sacreBLEU)"
DESCRIPTION = """\
Score detokenized system output with BLEU, as sacreBLEU 2.x does, and print the score line with
its signature (sacreBLEU's text format; -w 1 gives its default width):

  BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:0.1.0 = 34.12 65.3/40.1/27.0/19.2 (BP = 0.987 ratio = 0.987 hyp_len = 12000 ref_len = 12160)

Files are UTF-8, one segment per line, split on newlines only (a CR before the newline is
dropped, a UTF-8 byte-order mark at the start of a file too); HYP or one REF may be - for
standard input, and gzip files are decompressed. A file that is not UTF-8 is an error naming
its line and byte offset. Lines are scored as they are (BLEU strips their ends); empty files
score 0. Give -r once per reference set (several references per line).

--json prints one object with name, score, signature, verbose_score, counts, totals,
precisions, bp, ratio, sys_len, ref_len and the signature fields; with --ci also "confidence".
--sentence scores every line on its own (effective order on, as in sacreBLEU), one line or
with --json one JSON object per line.

examples:
  attnkit bleu output.detok.en -r newstest.en
  attnkit bleu output.en -r ref1.en -r ref2.en --ci
  cat output.en | attnkit bleu - -r ref.en --tokenize intl --lowercase --json
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "hypothesis", metavar="HYP", help="system output, one segment per line (- for stdin)"
    )
    parser.add_argument(
        "-r",
        "--ref",
        dest="refs",
        metavar="REF",
        action="append",
        required=True,
        help="reference file, one segment per line; repeat for several references",
    )
    parser.add_argument(
        "-tok",
        "--tokenize",
        default="13a",
        metavar="NAME",
        help="tokenizer: none, 13a, intl, char or zh (default: %(default)s)",
    )
    parser.add_argument("-lc", "--lowercase", action="store_true", help="case-insensitive BLEU")
    parser.add_argument(
        "-s",
        "--smooth-method",
        default="exp",
        metavar="METHOD",
        help="smoothing: none, floor, add-k or exp (default: %(default)s)",
    )
    parser.add_argument(
        "-sv",
        "--smooth-value",
        type=real(0),
        default=None,
        metavar="V",
        help="value for floor (default 0.1) or add-k (default 1)",
    )
    parser.add_argument(
        "--ci",
        "--confidence",
        dest="ci",
        action="store_true",
        help="add a 95%% bootstrap confidence interval (sacreBLEU's --confidence)",
    )
    parser.add_argument(
        "--ci-samples",
        "--confidence-n",
        dest="ci_samples",
        type=integer(2),
        default=1000,
        metavar="N",
        help="bootstrap resamples for --ci, >= 2; resamples x lines at most 2**27 (default: %(default)s)",
    )
    parser.add_argument(
        "--seed",
        type=integer(0),
        default=12345,
        help="seed of the bootstrap resampling (default: %(default)s, as sacreBLEU)",
    )
    parser.add_argument("--sentence", action="store_true", help="one score per line")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the text line")
    parser.add_argument(
        "-w",
        "--width",
        type=integer(0, 16),
        default=2,
        metavar="W",
        help="decimals of the score in the text line, 0 to 16 (default: %(default)s; sacreBLEU uses 1)",
    )


def _json_record(score) -> dict:
    d = score.to_dict()
    # sacreBLEU's JSON also spreads the signature into its fields (nrefs, case, tok, ...).
    for field in score.signature.split("|"):
        key, _, value = field.partition(":")
        d[key] = value
    if score.ci is not None:
        d["confidence_mean"] = score.ci.mean
        d["confidence_var"] = score.ci.half_width
    return d


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from attnkit.metrics import (
        SMOOTH_DEFAULTS,
        TOKENIZERS,
        bleu_from_statistics,
        bleu_statistics,
        compute_bleu,
    )
    from attnkit.metrics.bootstrap import with_confidence
    from attnkit.metrics.io import read_corpus
    from attnkit.metrics.signature import bleu_signature

    if args.tokenize not in TOKENIZERS:
        raise ValueError(
            f"--tokenize: unknown tokenizer {args.tokenize!r}; known: {', '.join(TOKENIZERS)}"
        )
    if args.smooth_method not in SMOOTH_DEFAULTS:
        raise ValueError(
            f"--smooth-method: unknown method {args.smooth_method!r}; known: {', '.join(SMOOTH_DEFAULTS)}"
        )
    if args.ci and args.sentence:
        raise ValueError("--ci: confidence intervals are for corpus scores, not with --sentence")
    paths = [("HYP", args.hypothesis), *(("-r", ref) for ref in args.refs)]
    if sum(path == "-" for _, path in paths) > 1:
        raise ValueError("HYP, -r: only one of the files can be - (standard input)")
    for flag, path in paths:
        check_input_path(path, flag)

    hypotheses, references = read_corpus(args.hypothesis, args.refs)
    stats = bleu_statistics(
        hypotheses, references, tokenize=args.tokenize, lowercase=args.lowercase
    )
    smoothing = {"smooth_method": args.smooth_method, "smooth_value": args.smooth_value}
    out = sys.stdout

    if args.sentence:
        # Score each line from its statistics row; effective order as sacreBLEU's CLI does.
        signature = bleu_signature(
            nrefs=stats.nrefs,
            tokenize=args.tokenize,
            lowercase=args.lowercase,
            effective_order=True,
            **smoothing,
        )
        order = stats.max_ngram_order
        for row in stats.segments:
            score = compute_bleu(
                row[2 : 2 + order],
                row[2 + order :],
                row[0],
                row[1],
                effective_order=True,
                **smoothing,
            )
            score = replace(score, signature=signature)
            if args.json:
                out.write(json.dumps(_json_record(score), ensure_ascii=False) + "\n")
            else:
                out.write(score.format(args.width) + "\n")
        return 0

    score = bleu_from_statistics(stats, **smoothing)
    if args.ci:
        try:
            score = with_confidence(
                score, stats, n_samples=args.ci_samples, seed=args.seed, **smoothing
            )
        except ValueError as err:  # the library names its argument; here it is the option
            raise option_error(err, {"n_samples": "--ci-samples"}) from None
    if args.json:
        out.write(json.dumps(_json_record(score), indent=1, ensure_ascii=False) + "\n")
    else:
        out.write(score.format(args.width) + "\n")
    return 0
