"""Validation loss against training minutes, from a run's ``metrics.jsonl``.

python -m attnkit.training.plot runs/de_en/metrics.jsonl docs/multi30k_val_loss.png
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from pathlib import Path

from attnkit.files import write_file
from attnkit.model_folder import check_output_file
from attnkit.training.metrics_log import read_metrics


def plot_val_loss(
    metrics_path: str | os.PathLike[str],
    out_png: str | os.PathLike[str],
    *,
    title: str | None = None,
) -> Path:
    """Draws ``val_loss`` (y) against ``elapsed_sec / 60`` (x) and writes a PNG, whole or
    not at all (:func:`~attnkit.files.write_file`: temporary file, fsync, rename).

    Args:
        metrics_path: A run's ``metrics.jsonl``.
        out_png: The image to write (its folder is created).
        title: Plot title (default: the run folder's name).

    Returns:
        The PNG path.

    Raises:
        ValueError: If ``out_png`` does not end in ``.png``, is a folder or lies inside a model
            folder attnkit wrote (a run's ``best`` or ``last``: its run could no longer save or
            resume it), or the metrics file is not a metrics.jsonl or has no evaluation records.
    """
    from attnkit.extras import require

    out = Path(out_png)
    if out.suffix.lower() != ".png":
        # matplotlib would add ".png" to a name without a suffix (writing another file than
        # the one named) and write another format for ".jpg" and the like.
        raise ValueError(f"{os.fspath(out_png)!r}: expected a file name ending in .png")
    if out.is_dir():
        raise ValueError(f"{os.fspath(out_png)!r} is a folder, expected a .png file name")
    check_output_file(out, "out_png")  # never into a run's best/, last/ or kept checkpoints

    require("matplotlib", extra="plot", feature="attnkit.training.plot").use("Agg")
    plt = require("matplotlib.pyplot", extra="plot", feature="attnkit.training.plot")

    records = [r for r in read_metrics(metrics_path) if r.get("val_loss") is not None]
    if not records:
        raise ValueError(f"{os.fspath(metrics_path)!r} has no val_loss records to plot")
    minutes = [r["elapsed_sec"] / 60.0 for r in records]
    loss = [r["val_loss"] for r in records]
    best = min(range(len(loss)), key=loss.__getitem__)

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    ax.plot(minutes, loss, marker="o", markersize=3, linewidth=1.5, label="validation loss")
    ax.scatter(
        [minutes[best]],
        [loss[best]],
        color="tab:red",
        zorder=3,
        label=f"best {loss[best]:.3f} (step {records[best]['step']})",
    )
    ax.set_xlabel("training time (minutes, wall clock)")
    ax.set_ylabel("validation cross-entropy (nats / token)")
    ax.set_title(title or Path(metrics_path).resolve().parent.name)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    image = io.BytesIO()  # rendered in memory, then written whole or not at all
    fig.savefig(image, format="png")
    plt.close(fig)
    out.parent.mkdir(parents=True, exist_ok=True)
    return write_file(out, image.getvalue())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Plot validation loss against minutes.")
    parser.add_argument("metrics", help="a run's metrics.jsonl")
    parser.add_argument(
        "out", help="the PNG to write (a name ending in .png; its folder is created)"
    )
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    try:
        print(plot_val_loss(args.metrics, args.out, title=args.title))
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
