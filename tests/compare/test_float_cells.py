"""compare's float cells through orjson's writer print what ``repr`` prints
(msprobe.compare._floattext._reprs), the one-digit negative exponents and 1e-5 <= |x| < 1e-4
included; and NaN/Infinity tokens through the fast JSON path stay json.loads' objects."""
from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from msprobe.compare._floattext import _reprs, number_columns
from msprobe.format.fastjson import _with_stand_ins, loads_json_bytes


def test_reprs_match_repr_over_every_magnitude():
    rng = np.random.default_rng(30)
    for _ in range(40):
        values = rng.standard_normal(1000) * 10.0 ** rng.integers(-330, 308, 1000)
        values[rng.integers(0, 1000, 30)] = np.nan
        values[rng.integers(0, 1000, 5)] = np.inf
        values[rng.integers(0, 1000, 5)] = -np.inf
        values[rng.integers(0, 1000, 5)] = -0.0
        assert _reprs(values) == list(map(repr, values.tolist()))


def test_reprs_match_repr_near_the_scientific_bounds():
    rng = np.random.default_rng(31)
    small = rng.standard_normal(20000) * 10.0 ** rng.integers(-11, -2, 20000)
    edges = [1e-5, -1e-5, 1e-4, -1e-4, 1e-9, 1e-10, 9.999999999999999e-10, 5e-324, -5e-324]
    edges += [float(np.nextafter(x, 0)) for x in (1e-5, 1e-4, -1e-5, 1e-9)]
    edges += [float(np.nextafter(x, 1)) for x in (1e-5, 1e-4, 1e-9)]
    values = np.concatenate([small, np.array(edges)])
    assert _reprs(values) == list(map(repr, values.tolist()))
    assert _reprs(np.array([])) == []


def test_float_only_column_is_numbers_like_the_mixed_path():
    floats = [0.5, -1.0, float("nan"), 1e300]
    got = number_columns(floats)
    mixed = number_columns(floats + [1])
    assert got[0].tolist()[:2] == [0.5, -1.0] and math.isnan(got[0][2])
    assert got[1].tolist() == mixed[1].tolist()[:4] and got[2].tolist() == mixed[2].tolist()[:4]
    assert got[3].tolist() == [False] * 4


@pytest.mark.parametrize("text", [
    b'[-Infinity]', b'[Infinity,-Infinity,NaN]', b'{"a":-Infinity,"b":[NaN,NaN],"c":Infinity}',
    b'[NaN, -Infinity , Infinity]', b'{"x": [1, -Infinity, 2, Infinity, 3]}',
])
def test_tokens_beside_each_other_parse_as_json_does(text):
    got, want = loads_json_bytes(text), json.loads(text)
    assert json.dumps(got) == json.dumps(want)
    assert b"Infinity" not in _with_stand_ins(text) and b"NaN" not in _with_stand_ins(text)


def test_shape_and_requires_grad_cells_are_str_of_the_values():
    """The shape column through one orjson text of the lists and requires_grad by lookup print
    what str() prints, whatever a (hostile) dump holds there."""
    from msprobe.compare._plan import _requires_grad_texts, _shape_texts

    rng = random.Random(11)
    odd = [True, False, None, 1.5, 1e16, "x", [1], [], {"a": 1}, 2 ** 63 - 1, -2 ** 63, 2 ** 64, 2 ** 70, -1, 0]

    def shape():
        if rng.random() < 0.8:
            return [rng.choice(odd) if rng.random() < 0.1 else rng.randrange(0, 70000) for _ in range(rng.randrange(0, 5))]
        return rng.choice([None, "[]", "N/A", "(3,)", 5, 1.5, [[1, 2]], [1, [2], 3], {}, True])

    for _ in range(3000):
        values = [shape() for _ in range(rng.randrange(1, 8))]
        assert _shape_texts(list(values)) == list(map(str, values)), values
    assert _shape_texts([[8, 128, 256], [], [1]]) == ["[8, 128, 256]", "[]", "[1]"]
    for values in ([True, False, None], [1, 0, None], [1.0, True], ["True", None], [[1]], [None], []):
        assert _requires_grad_texts(list(values)) == ["N/A" if value is None else str(value) for value in values]


def _every_kind_of_float() -> np.ndarray:
    rng = np.random.default_rng(32)
    parts = [rng.standard_normal(20000) * 10.0 ** rng.integers(-330, 308, 20000),
             rng.standard_normal(20000) * 10.0 ** rng.integers(-11, -2, 20000),
             np.frombuffer(rng.bytes(8 * 20000), dtype=np.float64),  # every bit pattern: subnormals, NaN payloads
             np.array([0.0, -0.0, 1e-5, -1e-5, 1e-4, 9.999999999999999e-05, 1.5e-5, 1e16, 1e15, 9999999999999998.0,
                       5e-324, -5e-324, 1.7976931348623157e308, np.nan, np.inf, -np.inf, 1e-7, -1e-9, 2.5e-100])]
    return np.concatenate(parts)


def test_native_float_texts_are_repr_with_the_suffix():
    """``_leafwalk.float_texts`` (the C pass over orjson's text) prints repr and the suffix, the
    Python pass over orjson's cells too; malformed texts are declined, not misread."""
    import orjson

    from msprobe.compare._floattext import _float_writer, _python_reprs
    from msprobe.format.native import leafwalk

    walker = leafwalk()
    assert walker is not None, "msprobe.format._leafwalk could not be built (a C compiler and Python's headers)"
    values = _every_kind_of_float()
    want = list(map(repr, values.tolist()))
    text = orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY)
    assert walker.float_texts(text, values, "") == want
    assert walker.float_texts(text, values, "%") == [cell + "%" for cell in want]
    assert _python_reprs(values, _float_writer()) == want
    assert _reprs(values, "%") == [cell + "%" for cell in want]
    assert walker.float_texts(b"[]", np.zeros(0), "") == []
    assert walker.float_texts(b"[1.0]", np.zeros(2), "") is None  # fewer cells than values
    assert walker.float_texts(b"[1.0,2.0]", np.zeros(1), "") is None  # more
    assert walker.float_texts(b"1.0", np.zeros(1), "") is None
    # a cell of no known shape takes repr: the value decides, not the text
    assert walker.float_texts(b"[garbage]", np.array([0.25]), "") == ["0.25"]


def test_native_statistic_diffs_equal_the_numpy_cells():
    """``_leafwalk.stat_diffs`` (one C pass) gives the numpy path's diff and relative-error cells,
    relative errors, None and percent masks: zero and NaN differences, a zero or infinite bench,
    NaN/inf on either side, rows that are no numbers (left None for the caller)."""
    from msprobe.compare._kernels import _native_diffs, _numpy_diffs

    rng = np.random.default_rng(33)
    count = 20000
    target = rng.standard_normal(count) * 10.0 ** rng.integers(-12, 12, count)
    bench = target * (1 + rng.standard_normal(count) * 10.0 ** rng.integers(-9, 0, count))
    picks = rng.integers(0, count, (10, 600))
    bench[picks[0]] = target[picks[0]]
    bench[picks[1]] = 0.0
    bench[picks[2]] = np.inf
    bench[picks[3]] = -np.inf
    target[picks[4]] = np.nan
    bench[picks[5]] = np.nan
    target[picks[6]] = bench[picks[6]] = np.nan
    target[picks[7]] = np.inf
    target[picks[8]] = bench[picks[8]] = np.inf
    bench[picks[9]] = 1e-300
    numeric = rng.random(count) > 0.05
    with np.errstate(all="ignore"):
        difference = target - bench
        relative = np.abs(difference) / np.abs(bench)
        percent = relative * 100
    got = _native_diffs(target, bench, difference, relative, percent, numeric)
    want = _numpy_diffs(target, bench, difference, relative, percent, numeric)
    assert got is not None, "msprobe.format._leafwalk could not be built (a C compiler and Python's headers)"
    rows = np.flatnonzero(numeric)
    assert [got[0][k] for k in rows] == want[0][rows].tolist()
    assert [got[1][k] for k in rows] == want[1][rows].tolist()
    assert all(got[0][k] is None and got[1][k] is None for k in np.flatnonzero(~numeric))
    assert np.array_equal(got[2], want[2], equal_nan=True)
    assert got[3].tolist() == want[3].tolist() and got[4].tolist() == want[4].tolist()
    assert {"0", "nan", "inf", "N/A"} <= set(got[1]) and any(text.endswith("%") for text in got[1] if text)
