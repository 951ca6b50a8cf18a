"""`attnkit walkthrough`: seed 000's self-attention, step by step."""

from __future__ import annotations

import argparse

from attnkit.cli.options import check_output_path, check_text_argument, integer, real

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
A word that occurs twice ("the cat the dog") keeps one id; the seed's dictionary
{s: i for i, s in enumerate(sorted(words))} gives it the number of its last copy and leaves a
gap ("the": 3, no 2): the ids of the repeated word and of the words sorted after it, and so
their embeddings, differ from the seed's.

--plot FILE.png also draws the whole weight matrix softmax(Q K^T / sqrt(d_k)) as a heatmap
with the words on both axes; the row of the token followed above is outlined:
  attnkit walkthrough --plot walkthrough.png

--rope goes on with rotary position embedding (RoPE), the positions of Llama-family models:
the same queries and keys are turned, pair of dimensions by pair, by the angle
position * theta_i with theta_i = base^(-2i/d_k) (attnkit.tutorial.RotaryEmbedding). It prints
the angle of one pair (--pair) for every token, that pair of each query and key before and
after the rotation, the scores Q K^T without and with RoPE, the followed token's weights both
ways, the output with RoPE, and the scores after moving the whole sentence by --shift
positions, which stay the same: a RoPE score sees only how far apart two tokens are.
With the seed's d_k = 2 there is one pair, theta_0 = 1: token m is turned by m radians.
  attnkit walkthrough --rope
  attnkit walkthrough --rope --d-k 8 --pair 1 --rope-layout interleaved --shift 1000
With --rope, --plot draws the followed pair of every query and key before and after the
rotation instead of the heatmap.
"""


PLOT_FORMATS = (".png", ".svg", ".pdf")
MAX_SHIFT = 1_000_000  # float32 angles lose precision as positions grow; shown, not hidden
ROPE_DEFAULTS = {"rope_base": 10_000.0, "pair": 0, "shift": 100, "rope_layout": "half"}
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
        help="also draw the T x T attention weights as a heatmap image (.png, .svg or .pdf; "
        "replaced if it exists); with --rope, the followed pair of every query and key before "
        "and after the rotation",
    )
    rope = parser.add_argument_group("rotary position embedding (RoPE)")
    rope.add_argument(
        "--rope",
        action="store_true",
        help="go on with RoPE: the queries and keys turned by their positions, the scores "
        "without and with it, and the scores of the sentence moved by --shift positions "
        "(needs an even --d-k)",
    )
    rope.add_argument(
        "--rope-base", type=real(2.0), default=None, metavar="BASE",
        help="base of the angles theta_i = BASE^(-2i/d_k), >= 2 (default 10000; Llama 3 "
        "uses 500000); only with --rope",
    )  # fmt: skip
    rope.add_argument(
        "--pair", type=integer(0), default=None, metavar="I",
        help="0-based pair of query/key dimensions whose angle and values are shown, 0 to "
        "d_k/2 - 1 (default 0, the fastest-turning pair); only with --rope",
    )  # fmt: skip
    rope.add_argument(
        "--shift", type=integer(0, MAX_SHIFT), default=None, metavar="K",
        help=f"also place the sentence at positions K to K + T - 1, 0 to {MAX_SHIFT:,} "
        "(default 100); only with --rope",
    )  # fmt: skip
    rope.add_argument(
        "--rope-layout",
        choices=("half", "interleaved"),
        default=None,
        help="how dimensions pair up: half, pair i = dims (i, i + d_k/2) as in Hugging Face "
        "Llama (default); interleaved, pair i = dims (2i, 2i + 1) as in the RoPE paper and "
        "Meta's Llama code; only with --rope",
    )


def _fmt(t) -> str:
    return str(t).replace("tensor(", "").removesuffix(")").replace("\n       ", "\n")


def _check_rope_options(args: argparse.Namespace) -> None:
    """The RoPE options go with --rope, and --rope with an even --d-k and a pair that exists."""
    for name in ROPE_DEFAULTS:
        given = getattr(args, name) is not None
        if given and not args.rope:
            raise ValueError(f"--{name.replace('_', '-')}: only with --rope")
        if not given:
            setattr(args, name, ROPE_DEFAULTS[name])
    if not args.rope:
        return
    if args.d_k % 2 != 0:
        raise ValueError(
            f"--d-k: --rope turns pairs of query/key dimensions, expected an even --d-k, "
            f"got {args.d_k}"
        )
    if args.pair >= args.d_k // 2:
        raise ValueError(
            f"--pair: expected a pair from 0 to {args.d_k // 2 - 1} (--d-k {args.d_k} has "
            f"{args.d_k // 2}), got {args.pair}"
        )


def run(args: argparse.Namespace) -> int:
    import torch

    from attnkit.model_folder import check_output_file
    from attnkit.walkthrough import rope_walkthrough, walkthrough

    if args.plot is not None:
        if not args.plot.lower().endswith(PLOT_FORMATS):
            raise ValueError(
                f"--plot: expected a file ending in {', '.join(PLOT_FORMATS)}, got {args.plot!r}"
            )
        check_output_path(args.plot, "--plot")
        # Never into a model folder attnkit wrote (a run's best or last: the run could no
        # longer resume or save it), as every output file.
        check_output_file(args.plot, "--plot")
    _check_rope_options(args)
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
        (f"6. Unnormalised scores omega = q K^T ({t} key{'s' if t != 1 else ''})", _fmt(w.scores)),
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
    rope = None
    if args.rope:
        rope = rope_walkthrough(
            w,
            base=args.rope_base,
            pair=args.pair,
            shift=args.shift,
            interleaved=args.rope_layout == "interleaved",
        )
        steps += _rope_steps(rope, w, token=token, precision=args.precision)
    for title, value in steps:
        print(f"{title}\n" if value is None else f"{title}:\n{value}\n")
    if args.plot is not None and rope is not None:
        _plot_rotation(rope, w.tokens, args.plot)
        print(f"Pair {rope.pair} of every query and key drawn to {args.plot}")
    elif args.plot is not None:
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


def _rope_steps(r, w, *, token: int, precision: int) -> list[tuple[str, object]]:
    """The printed steps of ``--rope``: (title, value) pairs as in :func:`run`."""
    import math

    t, d_k = len(w.tokens), r.queries.shape[1]
    base = f"{r.base:g}"
    layout = (
        "interleaved: pair i = dims (2i, 2i + 1)"
        if r.interleaved
        else "half-split: pair i = dims (i, i + d_k/2)"
    )
    width = max(len(repr(word)) for word in w.tokens)
    angles = "\n".join(
        f"   position {m}  {word!r:<{width}}  {float(a):.{precision}f} rad "
        f"({math.degrees(float(a)):.1f} deg)"
        for m, (word, a) in enumerate(zip(w.tokens, r.angles, strict=True))
    )
    dims = list(r.dims)
    shown = f"dims {r.dims}"
    diff = float((r.shifted_scores - r.rope_scores).abs().max())
    name = w.tokens[w.position]
    return [
        (
            f"RoPE: the same queries and keys turned by their positions (base {base}, {layout})",
            None,
        ),
        (
            f"10. theta_i = {base}^(-2i/d_k), one per pair of dimensions, i = 0 to {d_k // 2 - 1}",
            _fmt(r.theta),
        ),
        (
            f"11. Pair {r.pair} = {shown}, theta_{r.pair} = {float(r.theta[r.pair]):.{precision}g}: "
            f"the token at position m is turned by m * theta_{r.pair}",
            angles,
        ),
        (f"12. Queries q = x W_q, {shown}, before RoPE ({t}x2)", _fmt(r.queries[:, dims])),
        (f"    after RoPE ({t}x2)", _fmt(r.rotated_queries[:, dims])),
        (f"13. Keys k = x W_k, {shown}, before RoPE ({t}x2)", _fmt(r.keys[:, dims])),
        (f"    after RoPE ({t}x2)", _fmt(r.rotated_keys[:, dims])),
        (f"14. Scores Q K^T without RoPE ({t}x{t})", _fmt(r.scores)),
        (
            f"15. Scores with RoPE, (R_m q_m) . (R_n k_n) = q_m . R_(n-m) k_n ({t}x{t}; "
            "the diagonal, n = m, is unchanged)",
            _fmt(r.rope_scores),
        ),
        (
            f"16. Token {token} ({name!r}): weights softmax(scores / sqrt(d_k)) without RoPE",
            _fmt(w.weights),
        ),
        ("    with RoPE", _fmt(r.rope_weights[w.position])),
        (
            f"17. SelfAttention output with RoPE (the values are not turned): {t}x"
            f"{r.rope_output.shape[1]}",
            _fmt(r.rope_output),
        ),
        (
            f"18. The whole sentence moved by {r.shift} positions (positions {r.shift} to "
            f"{r.shift + t - 1}): scores with RoPE ({t}x{t})",
            _fmt(r.shifted_scores),
        ),
        (
            f"    largest |difference| from step 15: {diff:.1e} (float32 rounding of the "
            "angles, larger at larger positions): the scores see only how far apart the "
            "tokens are",
            None,
        ),
    ]


def _plot_rotation(r, tokens: list[str], out: str) -> None:
    """Two panels, queries and keys: the followed pair of each token before (dashed, grey)
    and after (solid) its rotation by position * theta. Each line has a ``gid`` naming it."""
    import io
    import os

    from attnkit.extras import require
    from attnkit.files import write_file

    figure = require("matplotlib.figure", extra="plot", feature="attnkit walkthrough --plot")
    from attnkit.viz.plots import fonts_for, render

    image = io.BytesIO()
    with fonts_for(tokens):  # Chinese words drawn from a CJK font, as the heatmap's
        fig = _rotation_figure(figure.Figure(figsize=(11, 5.5), layout="constrained"), r, tokens)
        render(fig, image, os.path.splitext(out)[1][1:].lower())
    write_file(out, image.getvalue())


def _rotation_figure(fig, r, tokens: list[str]):
    """:func:`_plot_rotation`'s two panels drawn into ``fig``."""
    colors = [f"C{i % 10}" for i in range(len(tokens))]
    for ax, kind, plural, before, after in (
        (fig.add_subplot(1, 2, 1), "query", "queries", r.queries, r.rotated_queries),
        (fig.add_subplot(1, 2, 2), "key", "keys", r.keys, r.rotated_keys),
    ):
        a, b = r.dims
        for m, word in enumerate(tokens):
            x0, y0 = float(before[m, a]), float(before[m, b])
            x1, y1 = float(after[m, a]), float(after[m, b])
            style = dict(color=colors[m], marker="o", markevery=[1])
            ax.plot([0, x0], [0, y0], ls="--", lw=1, alpha=0.5, gid=f"{kind} {m} before", **style)
            ax.plot([0, x1], [0, y1], lw=2, gid=f"{kind} {m} after", **style)
            ax.annotate(
                f"{word} ({m})", (x1, y1), xytext=(3, 3), textcoords="offset points",
                fontsize=8, color=colors[m],
            )  # fmt: skip
        ax.axhline(0, color="0.85", lw=0.8)
        ax.axvline(0, color="0.85", lw=0.8)
        ax.set_aspect("equal", adjustable="datalim")
        ax.set_xlabel(f"dim {a}")
        ax.set_ylabel(f"dim {b}")
        ax.set_title(
            rf"{plural}, pair {r.pair}: turned by $m\,\theta_{{{r.pair}}}$, "
            rf"$\theta_{{{r.pair}}} = {float(r.theta[r.pair]):.4g}$"
        )
    fig.suptitle("RoPE: token m turned by m theta; dashed before, solid after the rotation")
    return fig
