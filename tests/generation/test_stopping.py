"""Stop strings found across pieces, the text cut before the first one, nothing held too long."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.generation import StopStrings


def _run(stops, pieces):
    s = StopStrings(stops)
    shown = [s.feed(p) for p in pieces]
    return "".join(shown) + s.flush(), s.stopped, shown


def _reference(stops, text, bounds):
    """Generation stops after the first piece whose text so far contains a stop string; the
    output is that text cut at the earliest stop string in it (recomputed from scratch)."""
    for b in bounds[1:]:
        so_far = text[:b]
        hits = [i for i in (so_far.find(s) for s in stops) if i >= 0]
        if hits:
            return so_far[: min(hits)], True
    return text, False


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet="ab\nc", max_size=30),
    st.lists(st.text(alphabet="ab\nc", min_size=1, max_size=4), min_size=1, max_size=3),
    st.lists(st.integers(0, 30), max_size=8),
)
def test_equals_cutting_the_text_so_far(text, stops, cuts):
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)] or [""]
    assert _run(stops, pieces)[:2] == _reference(stops, text, bounds)


def test_a_stop_that_completes_first_wins():
    # "aba" would start earlier, but "b" is complete first: the text after it never exists
    assert _run(["b", "aba"], ["ab", "a"])[:2] == ("a", True)


def test_holds_back_only_a_possible_start():
    _, stopped, shown = _run(["\n\n", "END"], ["abc\n", "x", "EN", "D tail"])
    assert stopped and shown == ["abc", "\nx", "", ""]
    _, stopped, shown = _run(["END"], ["xE", "Nope"])
    assert not stopped and shown == ["x", "ENope"]


def test_earliest_stop_wins():
    assert _run(["cd", "b"], ["abcd"])[0] == "a"


@pytest.mark.parametrize("bad", [[""], [3], "stop"])
def test_bad_stop_strings(bad):
    with pytest.raises((ValueError, TypeError), match="stop_strings"):
        StopStrings(bad)
