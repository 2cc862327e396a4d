"""msprobe/format/stats.py against values computed here, independently."""
from __future__ import annotations

import math
import struct

import numpy as np
import pytest

from msprobe.format.stats import crc32_hex, reference_stats, stats_equal, xor64, xor64_hex


def crc32_bitwise(data: bytes) -> int:
    """CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320), one bit at a time."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xEDB88320 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def xor_words(data: bytes) -> int:
    """XOR of little-endian 64-bit words, zero-padded at the end."""
    data = data + b"\0" * (-len(data) % 8)
    acc = 0
    for i in range(0, len(data), 8):
        acc ^= int.from_bytes(data[i:i + 8], "little")
    return acc


BUFFERS = {
    "empty": b"",
    "check-string": b"123456789",
    "one-byte": b"\xff",
    "float32": np.arange(-3, 4, dtype=np.float32).tobytes(),
    "int64": np.array([1, -1, 2**40, 7], dtype=np.int64).tobytes(),
    "float16-odd": np.array([0.5, -2.0, 3.25], dtype=np.float16).tobytes(),
    "bool": np.array([True, False, True], dtype=bool).tobytes(),
    "bytes-13": bytes(range(200, 213)),
}


def test_crc32_check_value():
    assert crc32_bitwise(b"123456789") == 0xCBF43926  # the standard check value
    assert crc32_hex(b"123456789") == "cbf43926"


@pytest.mark.parametrize("name", sorted(BUFFERS), ids=sorted(BUFFERS))
def test_crc32_hex_matches_bitwise(name):
    buf = BUFFERS[name]
    assert crc32_hex(buf) == f"{crc32_bitwise(buf):08x}"
    assert len(crc32_hex(buf)) == 8


@pytest.mark.parametrize("name", sorted(BUFFERS), ids=sorted(BUFFERS))
def test_xor64_matches_words(name):
    buf = BUFFERS[name]
    assert xor64(buf) == xor_words(buf)
    assert xor64_hex(buf) == f"0x{xor_words(buf):016x}"
    assert len(xor64_hex(buf)) == 18


def test_xor64_hand_values():
    assert xor64_hex(b"") == "0x0000000000000000"
    assert xor64_hex(b"\x01") == "0x0000000000000001"
    words = struct.pack("<QQ", 0xF0F0F0F0F0F0F0F0, 0x0FF00FF00FF00FF0)
    assert xor64_hex(words) == "0x%016x" % (0xF0F0F0F0F0F0F0F0 ^ 0x0FF00FF00FF00FF0)


def test_crc32_accepts_numpy_buffers():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert crc32_hex(a) == crc32_hex(a.tobytes()) == f"{crc32_bitwise(a.tobytes()):08x}"


# ---------------------------------------------------------------- statistics rules


def test_float32_hand_computed():
    # [3, 4]: max 4, min 3, mean 3.5, L2 norm 5
    assert reference_stats(np.array([3.0, 4.0], np.float32)) == (4.0, 3.0, 3.5, 5.0)
    mx, mn, mean, norm = reference_stats(np.array([[1.0, -2.0], [2.0, 0.5]], np.float32))
    assert (mx, mn) == (2.0, -2.0)
    assert mean == pytest.approx(0.375, rel=1e-7)
    assert norm == pytest.approx(math.sqrt(1 + 4 + 4 + 0.25), rel=1e-6)


def test_values_are_json_types():
    out = reference_stats(np.array([1.0, 2.0], np.float32))
    assert all(type(v) is float for v in out)
    out = reference_stats(np.array([1, 2], np.int32))
    assert type(out[0]) is int and type(out[1]) is int


def test_empty_is_all_null():
    for dt in (np.float32, np.int64, np.bool_):
        assert reference_stats(np.zeros((0, 3), dt)) == (None, None, None, None)


def test_bool_is_any_all():
    assert reference_stats(np.array([True, False])) == (True, False, None, None)
    assert reference_stats(np.array([True, True])) == (True, True, None, None)
    assert reference_stats(np.array([False, False])) == (False, False, None, None)
    out = reference_stats(np.array([True, False]))
    assert type(out[0]) is bool and type(out[1]) is bool


def test_zero_d_is_the_value_four_times():
    assert reference_stats(np.array(-2.5, np.float32)) == (-2.5, -2.5, -2.5, -2.5)  # Norm may be negative
    assert reference_stats(np.array(7, np.int64)) == (7, 7, 7, 7)


def test_integer_rules_per_dialect():
    a = np.array([1, -3, 7], np.int64)
    assert reference_stats(a, dialect="msprobe-26") == (7, -3, None, None)
    assert reference_stats(a, dialect="msprobe-lake") == (7, -3, None, None)
    mx, mn, mean, norm = reference_stats(a, dialect="msprobe-8")
    assert (mx, mn) == (7.0, -3.0) and type(mx) is float
    assert mean == pytest.approx(5 / 3, rel=1e-6)
    assert norm == pytest.approx(math.sqrt(1 + 9 + 49), rel=1e-6)


def test_mindspore_casts_integers_to_float32():
    mx, mn, mean, norm = reference_stats(np.array([2, 4], np.int32), framework="mindspore")
    assert (mx, mn, mean) == (4.0, 2.0, 3.0)
    assert norm == pytest.approx(math.sqrt(20), rel=1e-6)


def test_float64_rules_per_dialect():
    a = np.array([0.1, 0.2, 0.3], np.float64)
    assert reference_stats(a) == (0.3, 0.1, None, None)
    mx, mn, mean, norm = reference_stats(a, dialect="msprobe-8")
    assert mx == float(np.float32(0.3)) and mn == float(np.float32(0.1))
    assert mean == pytest.approx(0.2, rel=1e-6)
    assert norm == pytest.approx(math.sqrt(0.14), rel=1e-6)


def test_float16_results_are_rounded_to_float16():
    a = np.array([0.1, 0.2, 0.3], np.float16)
    mx, mn, mean, norm = reference_stats(a)
    assert mean == float(np.float16(np.mean(a.astype(np.float64))))
    assert norm == float(np.float16(math.sqrt(float(np.sum(a.astype(np.float64) ** 2)))))
    assert mx == float(np.float16(0.3))


def test_bfloat16_mean_is_rounded_to_bfloat16():
    a = np.array([1.0, 1.0078125, 1.015625], np.float32)  # exact bfloat16 values
    mx, mn, mean, norm = reference_stats(a, logical_dtype="torch.bfloat16")
    assert (mx, mn) == (1.015625, 1.0)
    assert mean == 1.0078125  # 1.0078125 is representable; rounding keeps it
    bits = np.array([norm], np.float32).view(np.uint32)[0]
    assert bits & 0xFFFF == 0  # the norm has only bfloat16 bits


def test_nan_and_inf_propagate():
    mx, mn, mean, norm = reference_stats(np.array([1.0, np.nan, 2.0], np.float32))
    assert math.isnan(mx) and math.isnan(mn) and math.isnan(mean) and math.isnan(norm)
    mx, mn, mean, norm = reference_stats(np.array([1.0, np.inf], np.float32))
    assert mx == math.inf and mn == 1.0 and mean == math.inf and norm == math.inf
    mx, mn, _, _ = reference_stats(np.array([-np.inf, 0.0], np.float32))
    assert mn == -math.inf and mx == 0.0


def test_complex_uses_abs_and_no_norm():
    a = np.array([3 + 4j, 0 + 1j], np.complex64)
    mx, mn, mean, norm = reference_stats(a)
    assert (mx, mn) == (5.0, 1.0) and mean == pytest.approx(3.0) and norm is None
    _, _, _, ms_norm = reference_stats(a, framework="mindspore")
    assert ms_norm == pytest.approx(math.sqrt(26), rel=1e-6)


@pytest.mark.parametrize("a,b,equal", [
    (1.0, 1.0 + 1e-7, True), (1.0, 1.001, False), (None, None, True), (None, 0.0, False),
    (float("nan"), float("nan"), True), (float("nan"), 1.0, False), (float("inf"), float("inf"), True),
    (float("inf"), -float("inf"), False), (True, True, True), (True, 1.0, False), (3, 3.0, True),
], ids=["close", "far", "none", "none-vs-zero", "nan", "nan-vs-1", "inf", "inf-vs-minus-inf", "bool",
        "bool-vs-float", "int-vs-float"])
def test_stats_equal(a, b, equal):
    assert stats_equal(a, b) is equal


def test_checksums_of_empty_and_non_contiguous_arrays():
    empty = np.zeros((0, 3), np.float32)
    assert crc32_hex(empty) == "00000000" == f"{crc32_bitwise(b''):08x}"
    assert xor64_hex(empty) == "0x0000000000000000"
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    view = a[:, ::2]  # not contiguous: the bytes are taken in C order, as a contiguous copy would have
    assert crc32_hex(view) == f"{crc32_bitwise(np.ascontiguousarray(view).tobytes()):08x}"
    assert xor64(view) == xor_words(np.ascontiguousarray(view).tobytes())
