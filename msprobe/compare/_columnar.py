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
_TENSOR_TYPES = ("torch.Tensor", "mindspore.Tensor", "torch.nn.parameter.Parameter", "mindspore.Parameter",
                 "numpy.ndarray", "jax.Array")


class _Leaves:
    """Flat columns of the leaves of one side."""

    __slots__ = ("dtype", "shape", "rg", "mx", "mn", "mean", "norm", "md5", "tensor", "leaf")

    def __init__(self) -> None:
        for k in self.__slots__:
            setattr(self, k, [])

    def add(self, leaf: Any) -> int:
        """Append one leaf (a typed JSON entry or None), as :func:`leaf_side` reads it; its index."""
        i = len(self.leaf)
        self.leaf.append(leaf)
        if leaf is not None and leaf.__class__ is dict and "dtype" in leaf and "shape" in leaf:
            g = leaf.get
            self.dtype.append(str(g("dtype")))
            self.shape.append(str(g("shape")))
            rg = g("requires_grad")
            self.rg.append(_NA if rg is None else str(rg))
            self.mx.append(g("Max"))
            self.mn.append(g("Min"))
            self.mean.append(g("Mean"))
            self.norm.append(g("Norm"))
            md5 = g("md5")
            self.md5.append(md5 if md5.__class__ is str else (_NA if md5 is None else str(md5)))
            self.tensor.append(True)
            return i
        s = leaf_side(leaf)
        self.dtype.append(s.dtype)
        self.shape.append(s.shape)
        self.rg.append(s.rg)
        self.mx.append(s.stats[0])
        self.mn.append(s.stats[1])
        self.mean.append(s.stats[2])
        self.norm.append(s.stats[3])
        self.md5.append(s.md5)
        self.tensor.append(s.tensor)
        return i


def _floats(values: list) -> tuple:
    """(float64 array with 0 where a value is not an int/float, mask of float-class values,
    mask of int/float-class values); bools and strings are not numbers here."""
    import numpy as np

    n = len(values)
    types = list(map(type, values))
    isf = np.fromiter((t is float for t in types), bool, n)
    isnum = np.fromiter((t is float or t is int for t in types), bool, n)
    if isnum.all():
        try:
            return np.array(values, dtype=np.float64), isf, isnum
        except OverflowError:
            pass
    out = np.zeros(n, dtype=np.float64)
    for i in np.flatnonzero(isnum).tolist():
        try:
            out[i] = float(values[i])
        except OverflowError:
            isnum[i] = False
    return out, isf, isnum


def _nonfinite_float(values: list) -> Any:
    """Mask of the values that are float NaN/+-inf (the others, whatever they are, are not)."""
    import numpy as np

    arr, isf, _ = _floats(values)
    return isf & ~np.isfinite(arr)


def _inf_or_nan(values: list) -> Any:
    """:func:`msprobe.compare._verdict._inf_or_nan` over a column: float NaN/inf, or the strings."""
    out = _nonfinite_float(values)
    for i, v in enumerate(values):
        if v.__class__ is str and v.strip().lower() in ("inf", "-inf", "nan"):
            out[i] = True
    return out


def _reprs(arr: Any) -> list:
    return list(map(repr, arr.tolist()))


def _diffs(a_vals: list, b_vals: list) -> tuple:
    """([diff strings], [relative error strings], float array of the relative errors with NaN
    where :func:`_diff` gives None, mask of None): :func:`_diff` over two columns."""
    import numpy as np

    n = len(a_vals)
    a, _, a_num = _floats(a_vals)
    b, _, b_num = _floats(b_vals)
    num = a_num & b_num
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
        x, y, f = _diff(a_vals[i], b_vals[i])
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


def _flatten(c: Any, prog: Any) -> _Flat:
    from msprobe.compare._core import bench_counterpart

    data_n, data_b, pairs, rest = c.data_n, c.data_b, c.pairs, c.rest
    src_n = c.src_n
    mapping = c.mapping or {}
    f = _Flat()
    T, B = f.t, f.b
    r_t, r_b, r_name, r_bname, r_stack, r_rec = f.r_t, f.r_b, f.r_name, f.r_bname, f.r_stack, f.r_rec
    cache: dict = {}

    def bench_of(name: str) -> dict:
        got = cache.get(name)
        if got is None:
            got = {}
            for suffix, leaf, _io in record_leaves(name, data_b[name]):
                if suffix not in got:
                    got[suffix] = B.add(leaf)
            cache[name] = got
        return got

    b_epoch, b_epoch_name = -1, None
    for rec_i, (nm, bm) in enumerate(pairs):
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
            ti = T.add(leaf)
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
    for bm in rest:
        g = len(f.g_ign)
        b_epoch, b_epoch_name = b_epoch + 1, bm
        for suffix, leaf, io in record_leaves(bm, data_b[bm]):
            bi = B.add(leaf)
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
    if prog is not None:
        prog.update(len(pairs) % 1000)
    return f


def _replay(fin: Any, events: list, flagged: Any) -> Optional[dict]:
    """Feed the flagged leaves to a side's NaN/Inf tracker with the state the row-by-row order
    gives it (``record()`` of the record last started before each); the first entry it reports."""
    first = None
    epoch = None
    for ev in events:
        li, io, suffix, record, row, rec_i, ep, ep_name = ev
        if not flagged[li]:
            continue
        if ep != epoch:
            epoch = ep
            if ep_name is not None:
                fin.tracker.record(ep_name)
        seen = fin.see(io, suffix, leaf_side(fin.leaves.leaf[li]), record, row, rec_i)
        if first is None and seen is not None:
            first = seen
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


def columnar_pair(c: Any, part: str, keep_rows: bool = False) -> dict:
    """The rows of one rank pair appended to the CSV ``part`` and its summary (the dict of
    :func:`msprobe.compare._core._chunk` over all records, bench-only records included)."""
    import numpy as np

    from msprobe.compare._core import _Firsts

    mode = c.mode
    threshold = c.threshold
    cols = COLUMNS[mode]
    f = _flatten(c, c.progress)
    T, B = f.t, f.b
    R = len(f.r_t)
    r_t = np.array(f.r_t, dtype=np.int64)
    r_b = np.array(f.r_b, dtype=np.int64)
    groups = np.array(f.r_rec, dtype=np.int64)
    n_groups = len(f.g_ign)
    has_t, has_b = r_t >= 0, r_b >= 0
    matched = has_t & has_b
    ti, bi = r_t[has_t], r_b[has_b]

    def gather(side_vals: list, idx: Any, where: Any, fill: Any = _NA) -> Any:
        out = np.full(R, fill, dtype=object)
        if len(side_vals):
            out[where] = np.array(side_vals, dtype=object)[idx]
        return out

    def gather_mask(side_mask: Any, idx: Any, where: Any) -> Any:
        out = np.zeros(R, dtype=bool)
        if len(side_mask):
            out[where] = side_mask[idx]
        return out

    t_dtype, b_dtype = gather(T.dtype, ti, has_t), gather(B.dtype, bi, has_b)
    t_shape, b_shape = gather(T.shape, ti, has_t), gather(B.shape, bi, has_b)
    t_rg, b_rg = gather(T.rg, ti, has_t), gather(B.rg, bi, has_b)
    t_md5, b_md5 = gather(T.md5, ti, has_t), gather(B.md5, bi, has_b)
    t_tensor = gather_mask(np.array(T.tensor, dtype=bool), ti, has_t)
    name = np.array(f.r_name, dtype=object)
    bname = np.array(f.r_bname, dtype=object)
    out_rows = np.fromiter((".output." in s for s in f.r_name), bool, R)
    g_ign = np.array([0 if x is None else (2 if x == "all" else 1) for x in f.g_ign], dtype=np.int8)
    row_ign = g_ign[groups] if R else np.zeros(0, dtype=np.int8)
    judged = (row_ign == 0) | ((row_ign == 1) & out_rows)
    in_ok = row_ign == 0  # the rules that skip input-ignored records
    bits = np.zeros(R, dtype=np.int64)
    midx = np.flatnonzero(matched)
    series = np.full(R, None, dtype=object)
    norm_m = np.full(R, np.nan)  # NormRelativeErr as a fraction (None -> NaN), matched rows
    norm_none = np.ones(R, dtype=bool)
    metric_cols: list = []
    stat_cols: list = []

    if mode == "statistics":
        stat_src = ((T.mx, B.mx), (T.mn, B.mn), (T.mean, B.mean), (T.norm, B.norm))
        diff_cols = [np.full(R, _NA, dtype=object) for _ in range(4)]
        rel_cols = [np.full(R, _NA, dtype=object) for _ in range(4)]
        tm, bm_ = r_t[midx], r_b[midx]
        for k, (tv, bv) in enumerate(stat_src):
            a_vals = [tv[i] for i in tm.tolist()]
            b_vals = [bv[i] for i in bm_.tolist()]
            ds, rs, rel, none = _diffs(a_vals, b_vals)
            diff_cols[k][midx] = ds
            rel_cols[k][midx] = rs
            if k == 3:
                norm_m[midx] = rel
                norm_none[midx] = none
                number, percent = _percent_cells(rel, none, rs)
        metric_cols = diff_cols + rel_cols
        for tv, _ in stat_src:
            stat_cols.append(gather(list(map(str, tv)), ti, has_t))
        for _, bv in stat_src:
            stat_cols.append(gather(list(map(str, bv)), bi, has_b))
        ser_sel = midx[t_tensor[midx]]
        vals = np.full(R, None, dtype=object)
        if len(midx):
            vals[midx] = [None if nn else v for v, nn in zip(norm_m[midx].tolist(), norm_none[midx].tolist())]
        series[ser_sel] = vals[ser_sel]
        # -- the rules (statistics)
        num_in = np.full(R, np.nan)
        pct = np.zeros(R)
        if len(midx):
            num_in[midx] = number
            pct[midx] = percent
        t_bad = gather_mask(_inf_or_nan(T.mx) | _inf_or_nan(T.mn), ti, has_t)
        b_bad = gather_mask(_inf_or_nan(B.mx) | _inf_or_nan(B.mn), bi, has_b)
        bits |= np.where(judged & t_bad & ~b_bad, 1, 0)
        x_in = _group_max(groups, ~out_rows & has_t, num_in, n_groups)
        x_out = _group_max(groups, out_rows, num_in, n_groups)
        rule2 = in_ok & out_rows & (x_in[groups] < NORM_IN_LIMIT) & (np.abs(pct) > NORM_OUT_LIMIT)
        bits |= np.where(rule2, 2, 0)
        rg_diff = matched & (t_rg != "") & (b_rg != "") & (t_rg != b_rg)
        bits |= np.where(judged & rg_diff, 4, 0)
        if len(midx):
            sc = np.zeros(R, dtype=bool)
            t_mx0 = [T.mx[i] for i in tm.tolist()]
            b_mx0 = [B.mx[i] for i in bm_.tolist()]
            sc[midx] = [("class" in dn and "class" in db and sn == "[]" and x != y)
                        for dn, db, sn, x, y in zip(t_dtype[midx].tolist(), b_dtype[midx].tolist(),
                                                    t_shape[midx].tolist(), t_mx0, b_mx0)]
            bits |= np.where(in_ok & ~out_rows & sc, 8, 0)
        fused = np.fromiter(("qkv" in s or "gate_up" in s for s in f.r_bname), bool, R)
        dt = matched & (name != _NA) & ~fused & (t_dtype != "") & (b_dtype != "") & (t_dtype != b_dtype)
        bits |= np.where(judged & dt, 16, 0)
        bits |= np.where(judged & matched & (t_shape != b_shape), 32, 0)
        first_out = _first_output(groups, out_rows, n_groups)
        with np.errstate(all="ignore"):
            fire = np.where(x_in == 0, x_out > NORM_ZERO_IN_OUT, (x_out / np.where(x_in == 0, 1, x_in)) > NORM_RATIO)
        g_ok = (g_ign == 0) & (first_out >= 0) & fire
        bits[first_out[g_ok]] |= 64
    else:  # md5
        metric_cols = [t_md5, b_md5]
        differ = judged & (t_md5 != b_md5)
        blank = np.isin(t_md5, [_NA, "Nan", ""]) | np.isin(b_md5, [_NA, "Nan", ""])
        bits |= np.where(differ & ~blank, 1, 0)
        bits |= np.where(differ & blank, 2, 0)

    # -- Result and Err_message from the rule bits
    msgs = _RULE_MSGS[mode]
    warn_bit = _WARNING_BITS[mode]
    uniq, inv = np.unique(bits, return_inverse=True)
    res_u, err_u = [], []
    for u in uniq.tolist():
        fired = [m for k, m in enumerate(msgs) if u >> k & 1]
        err_u.append(json.dumps(fired))
        res_u.append("pass" if u == 0 else ("warning" if u & ~warn_bit == 0 else "error"))
    result = np.array(res_u, dtype=object)[inv] if R else np.zeros(0, dtype=object)
    err = np.array(err_u, dtype=object)[inv] if R else np.zeros(0, dtype=object)
    rg_cons = np.full(R, _NA, dtype=object)
    if len(midx):
        rg_cons[midx] = [str(a == b) for a, b in zip(t_rg[midx].tolist(), b_rg[midx].tolist())]

    head = [name, bname, t_dtype, b_dtype, t_shape, b_shape, t_rg, b_rg]
    out_cols = head + metric_cols + stat_cols + [rg_cons, result, err, np.array(f.r_stack, dtype=object)]
    out_cols = [col.tolist() for col in out_cols]
    if c.stack is False:
        del out_cols[cols.index("NPU_Stack_Info")]
    write_columns(part, out_cols)

    # -- summary: counts, marks, series, the first divergence, the first NaN/Inf
    counts: dict = {}
    for r, k in zip(*np.unique(result.astype(str), return_counts=True)) if R else ():
        counts[str(r)] = int(k)
    # the row-by-row builder counts in row order: keep its key order (dict order reaches the summary)
    order = {}
    for r in result.tolist():
        if r not in order:
            order[r] = counts[r]
            if len(order) == len(counts):
                break
    counts = order
    marks = PlotMarks()
    flagged_rows = np.flatnonzero((result == "error") | (result == "warning"))
    m_is_float = matched & ~norm_none & (mode == "statistics")
    with np.errstate(invalid="ignore"):
        cand = np.flatnonzero(m_is_float & (norm_m > 0) & (norm_m < np.inf))
    if len(cand) > TOP_N:
        order_c = np.lexsort((-cand, norm_m[cand]))
        cand = np.sort(cand[order_c[-TOP_N:]])
    see_rows = np.union1d(flagged_rows, cand).tolist()
    res_l, name_l = result, name
    for i in see_rows:
        m = float(norm_m[i]) if m_is_float[i] else None
        marks.see(i, res_l[i], name_l[i], m)
    first_div = None
    cand_div = matched & np.array([x is not None for x in f.g_rec_i], dtype=bool)[groups] if R else matched
    if threshold is None:
        cand_div = cand_div & (result != "pass")
    else:
        with np.errstate(invalid="ignore"):
            cand_div = cand_div & m_is_float & (norm_m > threshold)
    hit = np.flatnonzero(cand_div)
    if len(hit):
        i = int(hit[0])
        g = int(groups[i])
        m = float(norm_m[i]) if m_is_float[i] else None
        nm_ = _N_METRICS[mode]
        first_div = {"record": f.g_name[g], "row": name[i], "record_index": f.g_rec_i[g], "row_index": i,
                     "result": result[i], "err_message": err[i],
                     "norm_relative_err": m if m is not None and m == m else None,
                     "metrics": dict(zip(cols[8:8 + nm_], [out_cols[8 + k][i] for k in range(nm_)]))}
    fin_n, fin_b = _Firsts(), _Firsts()
    fin_n.leaves, fin_b.leaves = T, B
    t_flag = (_nonfinite_float(T.mx) | _nonfinite_float(T.mn) | _nonfinite_float(T.mean)
              | _nonfinite_float(T.norm)).tolist() if T.leaf else []
    b_flag = (_nonfinite_float(B.mx) | _nonfinite_float(B.mn) | _nonfinite_float(B.mean)
              | _nonfinite_float(B.norm)).tolist() if B.leaf else []
    first_nan_n = _replay(fin_n, f.t_see, t_flag)
    first_nan_b = _replay(fin_b, f.b_see, b_flag)
    out = {"rows": R, "records": len(c.pairs), "results": counts, "series": series.tolist(),
           "first_divergence": first_div, "first_nan_inf_target": first_nan_n, "first_nan_inf_bench": first_nan_b,
           **fin_n.summary("target"), **fin_b.summary("bench"), "marks": marks,
           "matched_records": sum(1 for _, bm in c.pairs if bm is not None),
           "unmatched_rows": int(R - len(midx)), "row_list": list(zip(*out_cols)) if keep_rows else []}
    return out

