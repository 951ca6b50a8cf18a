"""`attnkit walkthrough`: seed 000's self-attention, step by step."""

from __future__ import annotations

import argparse

from attnkit.cli.options import check_output_path, check_text_argument, integer

NAME = "walkthrough"
HELP = "print seed 000's self-attention computation step by step"
DESCRIPTION = """\
Follow one sentence through self-attention as seed 000 does: vocabulary, token ids,
embedding (torch.manual_seed(SEED); nn.Embedding(50000, D_MODEL)), the projection matrices
W_q, W_k, W_v (torch.manual_seed(SEED); torch.rand), the query, key and value of one token,
its unnormalised scores, the softmax weights scaled by 1/sqrt(d_k), its context vector, and
the whole SelfAttention output.

With the defaults it prints the seed's own numbers:
  attnkit walkthrough "The sun rises in the east" --seed 123

--plot FILE.png also draws the whole weight matrix softmax(Q K^T / sqrt(d_k)) as a heatmap
with the words on both axes; the row of the token followed above is outlined:
  attnkit walkthrough --plot walkthrough.png
"""


PLOT_FORMATS = (".png", ".svg", ".pdf")
MAX_SIZE = 1024  # d_model, d_k, d_v: the 50,000-row embedding table takes 50,000 x d_model floats
MAX_WORDS = 512  # the T x T weights are printed and drawn


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "sentence",
        nargs="?",
        default="The sun rises in the east",
        help=f"words to attend over, split on white space (1 to {MAX_WORDS})",
    )
    parser.add_argument(
        "--seed", type=integer(0, 2**64 - 1), default=123,
        help="random seed, 0 to 2**64 - 1 (default 123)",
    )  # fmt: skip
    size = integer(1, MAX_SIZE)
    parser.add_argument(
        "--d-model", type=size, default=3, help=f"embedding size, 1 to {MAX_SIZE} (default 3)"
    )
    parser.add_argument(
        "--d-k", type=size, default=2, help=f"query/key size, 1 to {MAX_SIZE} (default 2)"
    )
    parser.add_argument(
        "--d-v", type=size, default=4, help=f"value size, 1 to {MAX_SIZE} (default 4)"
    )
    parser.add_argument(
        "--token",
        type=integer(1, what="a 1-based position"),
        default=None,
        help="1-based position of the token followed step by step, 1 to the number of words "
        "(default 3, the seed's third token, or the last one in shorter sentences)",
    )
    parser.add_argument(
        "--precision", type=integer(0, 16), default=4,
        help="decimals printed, 0 to 16 (default 4, as the seed)",
    )  # fmt: skip
    parser.add_argument(
        "--plot",
        metavar="FILE",
        default=None,
        help="also draw the T x T attention weights as a heatmap image (.png, .svg or .pdf)",
    )


def _fmt(t) -> str:
    return str(t).replace("tensor(", "").removesuffix(")").replace("\n       ", "\n")


def run(args: argparse.Namespace) -> int:
    import torch

    from attnkit.walkthrough import walkthrough

    if args.plot is not None:
        if not args.plot.lower().endswith(PLOT_FORMATS):
            raise ValueError(
                f"--plot: expected a file ending in {', '.join(PLOT_FORMATS)}, got {args.plot!r}"
            )
        check_output_path(args.plot, "--plot")
    n_words = len(check_text_argument(args.sentence, "SENTENCE").split())
    if n_words == 0:
        raise ValueError("SENTENCE: expected at least one word, got an empty sentence")
    if n_words > MAX_WORDS:
        raise ValueError(f"SENTENCE: expected at most {MAX_WORDS} words, got {n_words}")
    if args.token is not None and args.token > n_words:
        raise ValueError(
            f"--token: expected a position from 1 to {n_words} (the sentence's words), "
            f"got {args.token}"
        )
    token = args.token if args.token is not None else min(3, n_words)
    w = walkthrough(
        args.sentence,
        seed=args.seed,
        d_model=args.d_model,
        d_k=args.d_k,
        d_v=args.d_v,
        position=token - 1,
    )
    torch.set_printoptions(precision=args.precision, sci_mode=False)
    t, name = len(w.tokens), w.tokens[w.position]
    steps = [
        ("Sentence", args.sentence),
        ("1. Vocabulary (sorted words -> ids)", w.vocab),
        ("2. Token ids", _fmt(w.token_ids)),
        (
            f"3. Embedding {t}x{args.d_model} (torch.manual_seed({args.seed}); "
            f"nn.Embedding(50000, {args.d_model}))",
            _fmt(w.embedded),
        ),
        (
            f"4. W_q {args.d_model}x{args.d_k} (torch.manual_seed({args.seed}); torch.rand, "
            "in the order W_q, W_k, W_v)",
            _fmt(w.w_query),
        ),
        (f"   W_k {args.d_model}x{args.d_k}", _fmt(w.w_key)),
        (f"   W_v {args.d_model}x{args.d_v}", _fmt(w.w_value)),
        (f"5. Token {token} ({name!r}): query q = x W_q", _fmt(w.query)),
        ("   key k = x W_k", _fmt(w.key)),
        ("   value v = x W_v", _fmt(w.value)),
        (f"6. Unnormalised scores omega = q K^T ({t} keys)", _fmt(w.scores)),
        (f"7. Weights softmax(omega / sqrt(d_k)), d_k = {args.d_k}", _fmt(w.weights)),
        (
            f"   highest: {w.weights.max():.{args.precision}f} on token "
            f"{int(w.weights.argmax()) + 1} ({w.tokens[int(w.weights.argmax())]!r})",
            None,
        ),
        (f"8. Context vector = weights @ V ({args.d_v} values)", _fmt(w.context)),
        (
            f"9. SelfAttention({args.d_model}, {args.d_k}, {args.d_v}) on the whole sentence "
            f"(torch.manual_seed({args.seed})): {t}x{args.d_v}",
            _fmt(w.output),
        ),
    ]
    for title, value in steps:
        print(f"{title}\n" if value is None else f"{title}:\n{value}\n")
    if args.plot is not None:
        from attnkit.viz.plots import heatmap

        heatmap(
            w.all_weights,
            w.tokens,
            w.tokens,
            title=rf"seed 000: $\mathrm{{softmax}}(QK^\top/\sqrt{{d_k}})$, $d_k = {args.d_k}$",
            out=args.plot,
            highlight_row=w.position,
        )
        print(f"Weights of every token drawn to {args.plot} (token {token}'s row outlined)")
    return 0
