"""attnkit.walkthrough's own checks (its values are tested through ``attnkit walkthrough`` in
tests/cli/test_walkthrough_cli.py, against the seed's printed numbers and RoPE computed there)."""

import pytest

from attnkit.walkthrough import rope_walkthrough, walkthrough


@pytest.mark.parametrize(
    "d_k, kwargs, message",
    [
        (3, {}, "d_k: RoPE turns pairs of dimensions, expected an even d_k, got 3"),
        (2, {"pair": 1}, r"pair: expected 0 <= pair < 1 \(d_k / 2\), got 1"),
        (4, {"pair": -1}, r"pair: expected 0 <= pair < 2 \(d_k / 2\), got -1"),
        (2, {"shift": -1}, "shift: expected a number of positions >= 0, got -1"),
        (2, {"base": 1.0}, "base: expected a number > 1, got 1.0"),
    ],
)
def test_rope_walkthrough_bad_arguments_are_clear_errors(d_k, kwargs, message):
    w = walkthrough("The sun rises in the east", d_k=d_k)
    with pytest.raises(ValueError, match=message):
        rope_walkthrough(w, **kwargs)


def test_rope_walkthrough_names_the_dimensions_of_the_pair():
    w = walkthrough("The sun rises in the east", d_k=8)
    assert rope_walkthrough(w, pair=3).dims == (3, 7)
    assert rope_walkthrough(w, pair=3, interleaved=True).dims == (6, 7)
