"""The columnar compare of one rank pair (statistics and md5 modes): the same rows, bytes and
summary as the row-by-row builder of :mod:`msprobe.compare._core`, at column speed.

1. **Flatten** (one Python pass over the record pairs): every target leaf and every bench leaf
   it meets becomes an entry of flat columns (names, dtype, shape, requires_grad, the four
   statistics as dumped, md5), and each output row is a pair of indices into them (``-1``: the
   other side has no leaf). Bench leaves are flattened once per bench record.
2. **Metrics** (numpy, over all matched rows at once): the four diffs and relative errors of
   :func:`msprobe.compare._rows._diff`, with the same IEEE operations in the same order, so the
   printed ``repr`` of each value is the same; the few rows whose values are not numbers
   (``None``, bools, strings) take the scalar function.
3. **Verdict** (numpy, grouped by record): 26.2.0's rules of :mod:`msprobe.compare._verdict`
   as masks and per-record maxima; a row's Err_message is the JSON list of the rules that fired.
4. **NaN/Inf and marks**: only the leaves whose statistics are not finite go through
   :class:`msprobe.format.nonfinite.NonFiniteTracker`, replayed with the tracker state the
   row-by-row order would have given it.
5. **Write**: column by column (quoting only the columns that need it), then joined in rows.

The row-by-row builder stays the reference (``engine="rows"``) and serves tensor mode, whose
cost is loading the tensors; ``tests/compare/test_compare_columnar.py`` holds the two to the
same bytes.
"""
from __future__ import annotations

import json
import operator
from itertools import repeat
from typing import Any, Optional

from msprobe.compare._plot import TOP_N, PlotMarks
from msprobe.compare._rows import COLUMNS, _diff, leaf_side, record_leaves
from msprobe.compare._verdict import (
    ALL_IGNORE,
    INPUT_IGNORE,
    MSG_CRC,
    MSG_CRC_UNMATCHED,
    MSG_DTYPE,
    MSG_INF_NAN,
    MSG_NORM_10X,
    MSG_NORM_OUT,
    MSG_REQ_GRAD,
    MSG_SCALAR,
    MSG_SHAPE,
    NORM_IN_LIMIT,
    NORM_OUT_LIMIT,
    NORM_RATIO,
    NORM_ZERO_IN_OUT,
)

__all__ = ["columnar_pair", "MODES"]

#: the modes the columnar path builds (tensor mode loads tensors row by row)
MODES = ("statistics", "md5")
_NA = "N/A"
_N_METRICS = {"statistics": 8, "md5": 2}
#: rule bits, in 26.2.0's order (Err_message lists the messages in this order)
_RULE_MSGS = {"statistics": [MSG_INF_NAN, MSG_NORM_OUT, MSG_REQ_GRAD, MSG_SCALAR, MSG_DTYPE, MSG_SHAPE,
                             MSG_NORM_10X],
              "md5": [MSG_CRC, MSG_CRC_UNMATCHED]}
_WARNING_BITS = {"statistics": 1 << 6, "md5": 1 << 1}


class _Leaves:
    """Flat columns of the leaves of one side: ``leaf`` is filled by the flattening pass, the
    columns by :meth:`finish` (what :func:`leaf_side` reads, a whole column at a time)."""

    __slots__ = ("dtype", "shape", "rg", "mx", "mn", "mean", "norm", "md5", "tensor", "leaf", "floats")

    def __init__(self) -> None:
        self.leaf: list = []
        self.floats: dict = {}  # id of a statistics column -> its _floats

    def finish(self, with_md5: bool) -> None:
        from itertools import repeat

        leaves = self.leaf
        tensor = [leaf.__class__ is dict and "dtype" in leaf and "shape" in leaf for leaf in leaves]
        views = leaves
        if not all(tensor):  # the other leaves (scalars, None, tensors without dtype/shape) as leaf_side reads them
            views = list(leaves)
            for i in [i for i, t in enumerate(tensor) if not t]:
                sd = leaf_side(leaves[i])
                views[i] = {"dtype": sd.dtype, "shape": sd.shape, "requires_grad": None if sd.rg == _NA else sd.rg,
                            "Max": sd.stats[0], "Min": sd.stats[1], "Mean": sd.stats[2], "Norm": sd.stats[3],
                            "md5": sd.md5}
                tensor[i] = sd.tensor
        get = dict.get
        self.tensor = tensor
        self.dtype = list(map(str, map(get, views, repeat("dtype"))))
        self.shape = list(map(str, map(get, views, repeat("shape"))))
        self.rg = [_NA if v is None else str(v) for v in map(get, views, repeat("requires_grad"))]
        self.mx = list(map(get, views, repeat("Max")))
        self.mn = list(map(get, views, repeat("Min")))
        self.mean = list(map(get, views, repeat("Mean")))
        self.norm = list(map(get, views, repeat("Norm")))
        self.md5 = ([v if v.__class__ is str else (_NA if v is None else str(v)) for v in map(get, views, repeat("md5"))]
                    if with_md5 else [])


#: type codes of :func:`_floats`: 0 float, 1 int, 3 str, 2 anything else (bool, None...)
_CODES = {float: 0, int: 1, str: 3}


def _floats(values: list) -> tuple:
    """(float64 array with 0 where a value is not an int/float, mask of float-class values,
    mask of int/float-class values, mask of strings); bools and strings are not numbers here."""
    from itertools import repeat

    import numpy as np

    n = len(values)
    codes = np.fromiter(map(_CODES.get, map(type, values), repeat(2)), np.int8, n)
    isf = codes == 0
    isnum = codes < 2
    isstr = codes == 3
    vals = values if isnum.all() else [v if c < 2 else 0.0 for v, c in zip(values, codes.tolist())]
    try:
        return np.array(vals, dtype=np.float64), isf, isnum, isstr
    except OverflowError:  # an int beyond a float's range: that one is no number here (the scalar diff reads it)
        pass
    out = np.zeros(n, dtype=np.float64)
    for i in np.flatnonzero(isnum).tolist():
        try:
            out[i] = float(values[i])
        except OverflowError:
            isnum[i] = False
    return out, isf, isnum, isstr


def _nonfinite_float(fl: tuple) -> Any:
    """Mask of the values that are float NaN/+-inf (the others, whatever they are, are not),
    from their :func:`_floats`."""
    import numpy as np

    return fl[1] & ~np.isfinite(fl[0])


def _inf_or_nan(values: list, fl: tuple) -> Any:
    """:func:`msprobe.compare._verdict._inf_or_nan` over a column: float NaN/inf, or the strings."""
    import numpy as np

    out = _nonfinite_float(fl)
    for i in np.flatnonzero(fl[3]).tolist():
        if values[i].strip().lower() in ("inf", "-inf", "nan"):
            out[i] = True
    return out


def _floats_of(L: "_Leaves", values: list) -> tuple:
    """:func:`_floats` of one of ``L``'s statistics columns, computed once."""
    got = L.floats.get(id(values))
    if got is None:
        got = L.floats[id(values)] = _floats(values)
    return got


def _reprs(arr: Any) -> list:
    return list(map(repr, arr.tolist()))


def _diffs(a_vals: list, b_vals: list, ai: Any, bi: Any, af: tuple, bf: tuple) -> tuple:
    """([diff strings], [relative error strings], float array of the relative errors with NaN
    where :func:`_diff` gives None, mask of None): :func:`_diff` of ``a_vals[ai]`` and
    ``b_vals[bi]`` (their :func:`_floats` ``af``, ``bf``)."""
    import numpy as np

    n = len(ai)
    a, b = af[0][ai], bf[0][bi]
    num = af[2][ai] & bf[2][bi]
    with np.errstate(all="ignore"):
        d = a - b
        rel = np.abs(d) / np.abs(b)
        pct = rel * 100
    ds = np.empty(n, dtype=object)
    rs = np.empty(n, dtype=object)
    rel_out = np.full(n, np.nan)
    none = np.zeros(n, dtype=bool)
    zero = num & ((d == 0) | (np.isnan(d) & ((np.isnan(a) & np.isnan(b)) | (a == b))))
    nan = num & np.isnan(d) & ~zero
    bz = num & ~zero & ~nan & (b == 0)
    binf = num & ~zero & ~nan & ~bz & np.isinf(b)
    reg = num & ~zero & ~nan & ~bz & ~binf
    ds[zero] = "0"
    rs[zero] = "0"
    rel_out[zero] = 0.0
    ds[nan] = "nan"
    rs[nan] = "nan"
    sel = bz | binf | reg
    ds[sel] = _reprs(d[sel])
    rs[bz] = "inf"
    rel_out[bz] = np.inf
    rs[binf] = _NA
    none[binf] = True
    rs[reg] = [f"{p}%" for p in pct[reg].tolist()]
    rel_out[reg] = rel[reg]
    for i in np.flatnonzero(~num).tolist():
        x, y, f = _diff(a_vals[ai[i]], b_vals[bi[i]])
        ds[i], rs[i] = x, y
        if f is None:
            none[i] = True
        else:
            rel_out[i] = f
    return ds, rs, rel_out, none


def _percent_cells(rel: Any, none: Any, rs: Any) -> tuple:
    """(the value :func:`_verdict._number` reads of a relative-error cell, NaN where it takes no
    part; the value :func:`_verdict.percent` reads): cells ``"<x>%"`` read as x/100."""
    import numpy as np

    with np.errstate(all="ignore"):
        back = (rel * 100) / 100  # float("<rel*100>") / 100, as the verdict reads the printed cell
    is_pct = np.fromiter((s.__class__ is str and s.endswith("%") for s in rs.tolist()), bool, len(rs))
    number = np.where(is_pct, back, np.nan)
    inf_cell = np.fromiter((s == "inf" for s in rs.tolist()), bool, len(rs))
    percent = np.where(is_pct, back, np.where(inf_cell, np.inf, np.where(rs == "nan", np.nan, 0.0)))
    return number, percent


def _needs_quote(s: str) -> bool:
    return "," in s or '"' in s or "\n" in s or "\r" in s


def _quoted(col: list) -> list:
    """A CSV column, RFC 4180 quoting only where needed (as :func:`_core._write_rows`)."""
    probe = "\x00".join(col)
    if not ("," in probe or '"' in probe or "\n" in probe or "\r" in probe):
        return col
    return [('"' + f.replace('"', '""') + '"') if _needs_quote(f) else f for f in col]


def write_columns(path: str, cols: list) -> None:
    """Append the rows of ``cols`` (lists of strings, one per CSV column) to the CSV ``path``."""
    if not cols or not cols[0]:
        return
    qc = [_quoted(c) for c in cols]
    with open(path, "a", newline="", encoding="utf-8") as fh:
        step = 50000
        for lo in range(0, len(qc[0]), step):
            fh.write("\r\n".join(map(",".join, zip(*[c[lo:lo + step] for c in qc]))) + "\r\n")


class _Flat:
    """The output rows of one rank pair as index columns, built in one pass over the pairs."""

    def __init__(self) -> None:
        self.t = _Leaves()
        self.b = _Leaves()
        self.r_t: list = []        # target leaf index per row, -1 for bench-only rows
        self.r_b: list = []        # bench leaf index per row, -1 for unmatched target rows
        self.r_name: list = []     # NPU Name
        self.r_bname: list = []    # Bench Name
        self.r_stack: list = []    # NPU_Stack_Info
        self.r_rec: list = []      # record group (one per judged record) per row
        self.g_ign: list = []      # per group: None / "all" / "input"
        self.g_rec_i: list = []    # per group: target record index or None
        self.g_name: list = []     # per group: the record's name
        # NaN/Inf replay: (side, leaf index, io, suffix, record, row name, rec_i, tracker epoch, epoch record)
        self.t_see: list = []
        self.b_see: list = []


def _ignore(name: str) -> Optional[str]:
    parts = name.split(".")
    if len(parts) < 2:
        return None
    return "all" if parts[1] in ALL_IGNORE else ("input" if parts[1] in INPUT_IGNORE else None)


def _flatten(c: Any, prog: Any, lo: int, hi: int, with_rest: bool, state: dict) -> _Flat:
    """The rows of the record pairs ``lo:hi`` (and of the bench-only records when ``with_rest``);
    ``state`` carries the bench tracker's epoch from block to block."""
    from msprobe.compare._core import bench_counterpart

    data_n, data_b, pairs, rest = c.data_n, c.data_b, c.pairs, c.rest
    src_n = c.src_n
    mapping = c.mapping or {}
    f = _Flat()
    T, B = f.t, f.b
    tl, bl = T.leaf, B.leaf
    r_t, r_b, r_name, r_bname, r_stack, r_rec = f.r_t, f.r_b, f.r_name, f.r_bname, f.r_stack, f.r_rec
    cache: dict = {}

    def bench_of(name: str) -> dict:
        got = cache.get(name)
        if got is None:
            got = {}
            for suffix, leaf, _io in record_leaves(name, data_b[name]):
                if suffix not in got:
                    got[suffix] = len(bl)
                    bl.append(leaf)
            cache[name] = got
        return got

    b_epoch, b_epoch_name = state["b_epoch"]
    for rec_i in range(lo, hi):
        nm, bm = pairs[rec_i]
        if prog is not None and rec_i % 1000 == 999:
            prog.update(1000)
        g = len(f.g_ign)
        bench_left: dict = {}
        if bm is not None:
            bench_left = dict(bench_of(bm))
            b_epoch, b_epoch_name = b_epoch + 1, bm
        frames = src_n.frames_of(nm) if not nm.endswith(("backward", "debug")) else None
        stack = str(frames) if frames else _NA
        ign_name = None
        for suffix, leaf, io in record_leaves(nm, data_n[nm]):
            ti = len(tl)
            tl.append(leaf)
            row_name = f"{nm}.{suffix}" if suffix else nm
            if ign_name is None and ".output." not in row_name:
                ign_name = row_name
            f.t_see.append((ti, io, suffix, nm, row_name, rec_i, rec_i, nm))
            bname, bi = bench_counterpart(row_name, suffix, mapping, data_b, bench_of, bm, bench_left)
            if bname is None:
                bname, bi = _NA, -1
            else:
                f.b_see.append((bi, io, suffix, bm, bname, rec_i, b_epoch, b_epoch_name))
            r_t.append(ti)
            r_b.append(bi)
            r_name.append(row_name)
            r_bname.append(bname)
            r_stack.append(stack)
            stack = _NA
            r_rec.append(g)
        for suffix, bi in bench_left.items():
            if ign_name is None:
                ign_name = _NA
            r_t.append(-1)
            r_b.append(bi)
            r_name.append(_NA)
            r_bname.append(f"{bm}.{suffix}" if suffix else bm)
            r_stack.append(_NA)
            r_rec.append(g)
        f.g_ign.append(_ignore(ign_name) if ign_name is not None else None)
        f.g_rec_i.append(rec_i)
        f.g_name.append(nm)
    for bm in (rest if with_rest else ()):
        g = len(f.g_ign)
        b_epoch, b_epoch_name = b_epoch + 1, bm
        for suffix, leaf, io in record_leaves(bm, data_b[bm]):
            bi = len(bl)
            bl.append(leaf)
            bname = f"{bm}.{suffix}" if suffix else bm
            f.b_see.append((bi, io, suffix, bm, bname, None, b_epoch, bm))
            r_t.append(-1)
            r_b.append(bi)
            r_name.append(_NA)
            r_bname.append(bname)
            r_stack.append(_NA)
            r_rec.append(g)
        f.g_ign.append(None)
        f.g_rec_i.append(None)
        f.g_name.append(bm)
    if prog is not None and with_rest:
        prog.update(len(pairs) % 1000)
    state["b_epoch"] = (b_epoch, b_epoch_name)
    return f


def _replay(fin: Any, leaves: _Leaves, events: list, flagged: list, state: dict, key: str) -> Optional[dict]:
    """Feed the flagged leaves to a side's NaN/Inf tracker with the state the row-by-row order
    gives it (``record()`` of the record last started before each; ``state[key]``: the epoch
    last replayed, carried across blocks); the first entry it reports."""
    first = None
    epoch = state.get(key)
    for ev in events:
        li, io, suffix, record, row, rec_i, ep, ep_name = ev
        if not flagged[li]:
            continue
        if ep != epoch:
            epoch = ep
            if ep_name is not None:
                fin.tracker.record(ep_name)
        seen = fin.see(io, suffix, leaf_side(leaves.leaf[li]), record, row, rec_i)
        if first is None and seen is not None:
            first = seen
    state[key] = epoch
    return first


def _group_max(groups: Any, sel: Any, values: Any, n_groups: int) -> Any:
    """Per group, the largest of ``values`` where ``sel`` (0 where none; NaN values take no part)."""
    import numpy as np

    out = np.zeros(n_groups)
    m = sel & ~np.isnan(values)
    np.maximum.at(out, groups[m], values[m])
    return out


def _first_output(groups: Any, out_rows: Any, n_groups: int) -> Any:
    """Per group, the index of its first output row (-1 where none)."""
    import numpy as np

    first = np.full(n_groups, -1, dtype=np.int64)
    idx = np.flatnonzero(out_rows)
    g = groups[idx]
    # rows are in group order: the first occurrence of each group among the output rows
    uniq, pos = np.unique(g, return_index=True)
    first[uniq] = idx[pos]
    return first


def _objs(n: int, fill: Any = _NA) -> Any:
    """An object array of ``n`` times ``fill`` (np.full is 5x slower for objects)."""
    import numpy as np

    return np.array([fill] * n, dtype=object)


class _Frame:
    """The index columns of one rank pair's rows and what every mode's builder reads of them."""

    def __init__(self, f: _Flat) -> None:
        import numpy as np

        self.f = f
        self.R = R = len(f.r_t)
        self.r_t = np.array(f.r_t, dtype=np.int64)
        self.r_b = np.array(f.r_b, dtype=np.int64)
        self.groups = np.array(f.r_rec, dtype=np.int64)
        self.n_groups = len(f.g_ign)
        self.has_t, self.has_b = self.r_t >= 0, self.r_b >= 0
        self.matched = self.has_t & self.has_b
        self.midx = np.flatnonzero(self.matched)
        self.name = np.array(f.r_name, dtype=object)
        self.bname = np.array(f.r_bname, dtype=object)
        self.out_rows = np.fromiter(map(operator.contains, f.r_name, repeat(".output.")), bool, R)
        self.g_ign = np.array([0 if x is None else (2 if x == "all" else 1) for x in f.g_ign], dtype=np.int8)
        row_ign = self.g_ign[self.groups] if R else np.zeros(0, dtype=np.int8)
        self.judged = (row_ign == 0) | ((row_ign == 1) & self.out_rows)
        self.in_ok = row_ign == 0  # for the rules that skip input-ignored records
        self.bits = np.zeros(R, dtype=np.int64)
        self.norm = np.full(R, np.nan)  # NormRelativeErr as a fraction, NaN where None or unmatched
        self.norm_none = np.ones(R, dtype=bool)

    def col(self, side: str, values: list, fill: Any = _NA) -> Any:
        """A side's leaf column over the rows (``fill`` where the side has no leaf)."""
        import numpy as np

        return np.array(values + [fill], dtype=object)[self.r_t if side == "t" else self.r_b]

    def mask(self, side: str, values: Any) -> Any:
        """A side's boolean leaf column over the rows (False where the side has no leaf)."""
        import numpy as np

        return np.append(np.asarray(values, dtype=bool), False)[self.r_t if side == "t" else self.r_b]

    def fire(self, bit: int, where: Any) -> None:
        self.bits[where] |= bit


def _stats_rows(fr: _Frame) -> tuple:
    """Statistics mode: ([8 metric columns], [8 statistics columns], series); the rules' bits set."""
    import numpy as np

    T, B, R, midx = fr.f.t, fr.f.b, fr.R, fr.midx
    tm, bm = fr.r_t[midx].tolist(), fr.r_b[midx].tolist()
    metric = [_objs(R) for _ in range(8)]
    number = percent = np.zeros(0)
    for k, (tv, bv) in enumerate(((T.mx, B.mx), (T.mn, B.mn), (T.mean, B.mean), (T.norm, B.norm))):
        ds, rs, rel, none = _diffs(tv, bv, fr.r_t[midx], fr.r_b[midx], _floats_of(T, tv), _floats_of(B, bv))
        metric[k][midx] = ds
        metric[4 + k][midx] = rs
        if k == 3:
            fr.norm[midx] = rel
            fr.norm_none[midx] = none
            number, percent = _percent_cells(rel, none, rs)
    stat_cols = [fr.col("t", list(map(str, v))) for v in (T.mx, T.mn, T.mean, T.norm)]
    stat_cols += [fr.col("b", list(map(str, v))) for v in (B.mx, B.mn, B.mean, B.norm)]
    series = _objs(R, None)
    ser = midx[fr.mask("t", T.tensor)[midx]]
    if len(ser):
        series[ser] = [None if nn else v for v, nn in zip(fr.norm[ser].tolist(), fr.norm_none[ser].tolist())]
    # -- 26.2.0's rules, in their order (bit k: the k-th message of _RULE_MSGS)
    matched, judged, in_ok, out_rows, groups = fr.matched, fr.judged, fr.in_ok, fr.out_rows, fr.groups
    num_in = np.full(R, np.nan)
    pct = np.zeros(R)
    num_in[midx] = number
    pct[midx] = percent
    t_bad = fr.mask("t", _inf_or_nan(T.mx, _floats_of(T, T.mx)) | _inf_or_nan(T.mn, _floats_of(T, T.mn)))
    b_bad = fr.mask("b", _inf_or_nan(B.mx, _floats_of(B, B.mx)) | _inf_or_nan(B.mn, _floats_of(B, B.mn)))
    fr.fire(1, judged & t_bad & ~b_bad)
    x_in = _group_max(groups, ~out_rows & fr.has_t, num_in, fr.n_groups)
    x_out = _group_max(groups, out_rows, num_in, fr.n_groups)
    fr.fire(2, in_ok & out_rows & (x_in[groups] < NORM_IN_LIMIT) & (np.abs(pct) > NORM_OUT_LIMIT))
    t_rg, b_rg = fr.col("t", T.rg), fr.col("b", B.rg)
    fr.fire(4, judged & matched & (t_rg != "") & (b_rg != "") & (t_rg != b_rg))
    t_dtype, b_dtype = fr.col("t", T.dtype), fr.col("b", B.dtype)
    t_shape, b_shape = fr.col("t", T.shape), fr.col("b", B.shape)
    if len(midx):
        sc = np.zeros(R, dtype=bool)
        sc[midx] = [("class" in dn and "class" in db and sn == "[]" and x != y)
                    for dn, db, sn, x, y in zip(t_dtype[midx].tolist(), b_dtype[midx].tolist(),
                                                t_shape[midx].tolist(), map(T.mx.__getitem__, tm),
                                                map(B.mx.__getitem__, bm))]
        fr.fire(8, in_ok & ~out_rows & sc)
    fused = (np.fromiter(map(operator.contains, fr.f.r_bname, repeat("qkv")), bool, R)
             | np.fromiter(map(operator.contains, fr.f.r_bname, repeat("gate_up")), bool, R))
    fr.fire(16, judged & matched & (fr.name != _NA) & ~fused & (t_dtype != "") & (b_dtype != "")
            & (t_dtype != b_dtype))
    fr.fire(32, judged & matched & (t_shape != b_shape))
    first_out = _first_output(groups, out_rows, fr.n_groups)
    with np.errstate(all="ignore"):
        big = np.where(x_in == 0, x_out > NORM_ZERO_IN_OUT, (x_out / np.where(x_in == 0, 1, x_in)) > NORM_RATIO)
    fr.fire(64, first_out[(fr.g_ign == 0) & (first_out >= 0) & big])
    return metric, stat_cols, series


def _md5_rows(fr: _Frame) -> tuple:
    """md5 mode: ([NPU MD5, BENCH MD5], [], series); the CRC rule's bits set."""
    import numpy as np

    t_md5, b_md5 = fr.col("t", fr.f.t.md5), fr.col("b", fr.f.b.md5)
    differ = fr.judged & (t_md5 != b_md5)
    blank = np.isin(t_md5, [_NA, "Nan", ""]) | np.isin(b_md5, [_NA, "Nan", ""])
    fr.fire(1, differ & ~blank)
    fr.fire(2, differ & blank)
    return [t_md5, b_md5], [], _objs(fr.R, None)


#: one row builder per mode
_BUILDERS = {"statistics": _stats_rows, "md5": _md5_rows}


def _verdicts(fr: _Frame, mode: str) -> tuple:
    """(Result column, Err_message column) from the rule bits."""
    import numpy as np

    msgs, warn_bit = _RULE_MSGS[mode], _WARNING_BITS[mode]
    uniq, inv = np.unique(fr.bits, return_inverse=True)
    res_u, err_u = [], []
    for u in uniq.tolist():
        err_u.append(json.dumps([m for k, m in enumerate(msgs) if u >> k & 1]))
        res_u.append("pass" if u == 0 else ("warning" if u & ~warn_bit == 0 else "error"))
    if not fr.R:
        return _objs(0), _objs(0)
    return np.array(res_u, dtype=object)[inv.ravel()], np.array(err_u, dtype=object)[inv.ravel()]


def _counts(result: list) -> dict:
    """Rows per Result, keyed in the order the results first occur (as the row builder counts)."""
    counts: dict = {}
    for r in result:
        counts[r] = counts.get(r, 0) + 1
    return counts


def _marks(marks: PlotMarks, fr: _Frame, result: Any, statistics: bool, offset: int) -> None:
    """Add a block's rows to the plot's marks: every error/warning row and the TOP_N worst rows
    by NormRelativeErr (only those go through PlotMarks.see: the others would not change it)."""
    import numpy as np

    flagged = np.flatnonzero((result == "error") | (result == "warning"))
    is_float = fr.matched & ~fr.norm_none & statistics
    with np.errstate(invalid="ignore"):
        cand = np.flatnonzero(is_float & (fr.norm > 0) & (fr.norm < np.inf))
    if len(cand) > TOP_N:
        cand = np.sort(cand[np.lexsort((-cand, fr.norm[cand]))[-TOP_N:]])
    for i in np.union1d(flagged, cand).tolist():
        marks.see(offset + i, result[i], fr.name[i], float(fr.norm[i]) if is_float[i] else None)


def _first_divergence(fr: _Frame, result: Any, err: Any, out_cols: list, mode: str,
                      threshold: Optional[float]) -> Optional[dict]:
    import numpy as np

    f = fr.f
    in_target = np.array([x is not None for x in f.g_rec_i], dtype=bool)[fr.groups] if fr.R else fr.matched
    cand = fr.matched & in_target
    is_float = fr.matched & ~fr.norm_none & (mode == "statistics")
    if threshold is None:
        cand &= result != "pass"
    else:
        with np.errstate(invalid="ignore"):
            cand &= is_float & (fr.norm > threshold)
    hit = np.flatnonzero(cand)
    if not len(hit):
        return None
    i = int(hit[0])
    g = int(fr.groups[i])
    m = float(fr.norm[i]) if is_float[i] else None
    n = _N_METRICS[mode]
    cols = COLUMNS[mode]
    return {"record": f.g_name[g], "row": fr.name[i], "record_index": f.g_rec_i[g], "row_index": i,
            "result": result[i], "err_message": err[i], "norm_relative_err": m if m is not None and m == m else None,
            "metrics": dict(zip(cols[8:8 + n], [out_cols[8 + k][i] for k in range(n)]))}


def _nonfinite_leaves(L: _Leaves) -> list:
    if not L.leaf:
        return []
    return (_nonfinite_float(_floats_of(L, L.mx)) | _nonfinite_float(_floats_of(L, L.mn))
            | _nonfinite_float(_floats_of(L, L.mean)) | _nonfinite_float(_floats_of(L, L.norm))).tolist()


#: records per block: a block's columns are built, written and dropped before the next one's
#: (bounds the memory of a 100,000-record pair)
BLOCK_RECORDS = 2000


def _block(c: Any, f: _Flat, part: str, keep: Optional[list]) -> tuple:
    """Build, write (and keep, for the xlsx) one block's rows: (frame, Result, Err_message, columns)."""
    mode = c.mode
    f.t.finish(mode == "md5")
    f.b.finish(mode == "md5")
    fr = _Frame(f)
    metric_cols, stat_cols, series = _BUILDERS[mode](fr)
    result, err = _verdicts(fr, mode)
    rg_cons = _objs(fr.R)
    if len(fr.midx):
        t_rg, b_rg = fr.col("t", f.t.rg)[fr.midx].tolist(), fr.col("b", f.b.rg)[fr.midx].tolist()
        rg_cons[fr.midx] = [str(a == b) for a, b in zip(t_rg, b_rg)]
    head = [fr.name, fr.bname] + [fr.col(side, vals) for kind in ("dtype", "shape", "rg")
                                  for side, vals in (("t", getattr(f.t, kind)), ("b", getattr(f.b, kind)))]
    out_cols = [col.tolist() for col in head + metric_cols + stat_cols + [rg_cons, result, err]] + [f.r_stack]
    if c.stack is False:
        del out_cols[COLUMNS[mode].index("NPU_Stack_Info")]
    write_columns(part, out_cols)
    if keep is not None:
        keep.extend(zip(*out_cols))
    return fr, result, err, out_cols, series


def columnar_pair(c: Any, part: str, keep_rows: bool = False, *, lo: int = 0, hi: Optional[int] = None,
                  with_rest: bool = True) -> dict:
    """The rows of the record pairs ``lo:hi`` of one rank pair (and of the bench-only records
    when ``with_rest``) appended to the CSV ``part``, and their summary (the dict of
    :func:`msprobe.compare._core._chunk`; a forked chunk of compare -n runs one range).

    Block by block (:data:`BLOCK_RECORDS` records, bench-only records in the last): plans (the
    flat index columns of every row), builds the mode's columns, writes them, then folds the
    block into the summary."""
    from msprobe.compare._core import _Firsts

    mode = c.mode
    n = len(c.pairs) if hi is None else hi
    start = lo
    fin_n, fin_b = _Firsts(), _Firsts()
    state: dict = {"b_epoch": (-1, None)}
    keep: Optional[list] = [] if keep_rows else None
    counts: dict = {}
    series: list = []
    marks = PlotMarks()
    first_div = first_nan_n = first_nan_b = None
    rows = unmatched = 0
    while True:
        hi = min(n, lo + BLOCK_RECORDS)
        f = _flatten(c, c.progress, lo, hi, with_rest and hi == n, state)
        fr, result, err, out_cols, ser = _block(c, f, part, keep)
        for k, v in _counts(out_cols[COLUMNS[mode].index("Result")]).items():
            counts[k] = counts.get(k, 0) + v
        series.extend(ser.tolist())
        _marks(marks, fr, result, mode == "statistics", rows)
        if first_div is None:
            first_div = _first_divergence(fr, result, err, out_cols, mode, c.threshold)
            if first_div is not None:
                first_div["row_index"] += rows
        got = _replay(fin_n, f.t, f.t_see, _nonfinite_leaves(f.t), state, "t")
        first_nan_n = got if first_nan_n is None else first_nan_n
        got = _replay(fin_b, f.b, f.b_see, _nonfinite_leaves(f.b), state, "b")
        first_nan_b = got if first_nan_b is None else first_nan_b
        rows += fr.R
        unmatched += int(fr.R - len(fr.midx))
        if hi == n:
            break
        lo = hi
    return {"rows": rows, "records": n - start, "results": counts, "series": series, "first_divergence": first_div,
            "first_nan_inf_target": first_nan_n, "first_nan_inf_bench": first_nan_b,
            **fin_n.summary("target"), **fin_b.summary("bench"), "marks": marks,
            "matched_records": sum(1 for _, bm in c.pairs[start:n] if bm is not None), "unmatched_rows": unmatched,
            "row_list": keep if keep is not None else []}
