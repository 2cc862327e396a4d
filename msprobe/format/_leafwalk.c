/* The leaves of a dump's records as columns, in C: compare's row plan without a Python step per leaf.
 *
 * msprobe/format/native.py loads it (built at install, or at first use); the Python code in
 * msprobe/compare/_rows.py (record_leaves) and msprobe/compare/_plan.py (the planner, Leaves.finish)
 * is the fallback and the reference: tests/compare/test_leafwalk.py holds the two equal.
 *
 *   leaves(data, tensor_task, tensor_types) -> (names, starts, suffixes, ios, leaves) or None
 *     every record's leaves as record_leaves(name, raw, tensor_task) walks them, one list entry per
 *     leaf; starts[i]:starts[i+1] are record i's (in the order of ``data``).
 *   plan_block(target_data, bench_data, pairs, start, stop, rest, tensor_task, tensor_types) -> tuple or None
 *     the rows of the record pairs start:stop (and of the bench-only records ``rest`` when it is not
 *     None) as compare's planner (_Planner.add_pair / add_bench_only, without a mapping) makes them
 *     (each side a dict of records, or a side already walked: a leaf table's ({record: position},
 *     int64 bytes of each position's first leaf and the end, [suffix], [io]), its leaves their numbers):
 *     (target leaves, target ios, target suffixes, bench leaves, bench ios, bench suffixes,
 *      row_target, row_bench, row_group, row_kind, row_name, row_bench_name,
 *      group_index, group_name, group_bench, group_first_row, group_dup)
 *     row_kind: 0 a target leaf's row, 1 a matched bench record's leaf no target leaf took, 2 a
 *     bench-only record's leaf; group_dup: 1 where the group's bench record holds two leaves of one suffix.
 *   leaf_fields(leaves, md5, tensor, scalar_dtypes, stat_keys, view) -> tuple
 *     Leaves.finish's columns: (is tensor, dtype text, shape text, requires_grad text, the four
 *     statistics as dumped, md5 text or [], data_name text or []); ``view(leaf)`` (_plan._view)
 *     gives what a leaf that is neither a tensor entry, a scalar argument nor null shows.
 *   rests(names, starts, suffixes, ios) -> list or None
 *     each leaf's key in its stand-in record's group (msprobe/compare/_indexed.py _rests, its reference).
 *
 *   stand_ins(names, group_rec, bounds, ios, rests, flat) -> dict or None
 *     compare's stand-in records of a leaf table (msprobe/compare/_indexed.py stand_in_records, its
 *     reference): leaf i a {"type": i}; None where the leaves cannot be laid out that way.
 *
 *   index_rows(...), csv_rows(columns): the index's tensor columns (msprobe/index/rows.py) and compare's
 *     CSV rows (msprobe/compare/_write.py) without a Python step per cell.
 *   arrow_column(values, kind, index) -> (null count, validity, values, data) or None
 *     an Arrow column's buffers (pyarrow's Array.from_buffers) of a list of values: kind 's' str
 *     (int32 offsets, UTF-8 data), 'd' float64 (floats, ints up to 2**53), 'q' int64, 'b' bool (bits), 'l' a
 *     list of int64 (int32 offsets, the int64 values); validity None where no value is null.
 *     ``index``: None, or the bytes of int64s: row i holds values[index[i]], null where it is < 0.
 *     None where a value is of another type (the caller converts through pyarrow).
 *   float_texts(text, values, suffix) -> list or None
 *     repr(x) + suffix of each float64 of ``values`` (a buffer), from ``text``, orjson's writing of
 *     them (its shortest round-trip digits: msprobe/compare/_floattext.py _reprs, the reference):
 *     the one-digit negative exponents and 1e-5 <= |x| < 1e-4 laid out as repr does, NaN/inf and
 *     any cell not of the expected shape by CPython's own repr; None where the cells do not match.
 *   stat_diffs(target, bench, difference, relative, percent, numeric, difference_text, percent_text) -> tuple or None
 *     compare's diff and relative-error cells of one statistic over the matched rows
 *     (msprobe/compare/_kernels.py _diffs, the reference): (diff texts, relative texts, the relative
 *     errors as float64 bytes, the None mask, the percent mask as bool bytes); the rows whose
 *     ``numeric`` is 0 hold None (the caller fills them); the texts from orjson's writing of
 *     ``difference`` and ``percent`` as float_texts reads them; ``lazy`` (a 9th argument, true): the
 *     printed difference and percent cells None instead (the caller writes them from the values:
 *     csv_rows' float columns), the texts not read.
 *   has_long_integer(data), document_marks(data), with_stand_ins(data), restore_nonfinite(obj, values) -> int or None
 *     msprobe/format/fastjson.py's checks and NaN/Infinity stand-ins in one pass each (restore: every
 *     container walked; None where a key is a stand-in).
 *
 * None (never an error) where a document holds what the walk does not take (a key that is not a
 * str, nesting deeper than MAX_DEPTH): the caller then takes the Python code.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <math.h>

#define LEAFWALK_VERSION 17  /* bump with every change: a stale build is then rebuilt */
#define MAX_DEPTH 900

typedef struct {
    PyObject *leaf, *suffix, *io;  /* lists */
} Out;

static PyObject *S_type, *S_dtype, *S_shape, *S_data_name, *S_requires_grad, *S_md5, *S_value, *S_input,
    *S_output, *S_zero, *S_nan, *S_inf, *S_parameters, *S_parameters_grad, *S_debug, *S_kwargs, *S_input_args, *S_input_kwargs,
    *S_is_recompute, *S_NA, *S_empty, *S_dot, *S_true, *S_false, *S_minus1, *S_empty_list_text;

/* -1 error, 0 done, 1 decline (the caller takes the Python code) */
#define DECLINE 1


/* a + "." + b (either may be empty: then no dot when a is empty and dot_if_empty is 0); a new reference */
static PyObject *join_dot(PyObject *a, PyObject *b) {
    Py_ssize_t la = PyUnicode_GET_LENGTH(a), lb = PyUnicode_GET_LENGTH(b);
    Py_UCS4 max = PyUnicode_MAX_CHAR_VALUE(a);
    if (PyUnicode_MAX_CHAR_VALUE(b) > max)
        max = PyUnicode_MAX_CHAR_VALUE(b);
    if (max < 127)
        max = 127;
    PyObject *out = PyUnicode_New(la + 1 + lb, max);
    if (!out)
        return NULL;
    if (PyUnicode_IS_ASCII(a) && PyUnicode_IS_ASCII(b)) {
        char *to = (char *)PyUnicode_DATA(out);
        memcpy(to, PyUnicode_DATA(a), (size_t)la);
        to[la] = '.';
        memcpy(to + la + 1, PyUnicode_DATA(b), (size_t)lb);
        return out;
    }
    if (PyUnicode_CopyCharacters(out, 0, a, 0, la) < 0 || PyUnicode_WriteChar(out, la, '.') < 0 ||
        PyUnicode_CopyCharacters(out, la + 1, b, 0, lb) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* a + "." + str(i) */
static PyObject *join_index(PyObject *a, Py_ssize_t i) {
    char digits[32];
    int n = snprintf(digits, sizeof digits, "%zd", i);
    PyObject *b = PyUnicode_FromStringAndSize(digits, n);
    if (!b)
        return NULL;
    PyObject *out = join_dot(a, b);
    Py_DECREF(b);
    return out;
}

static int out_init(Out *o) {
    o->leaf = PyList_New(0);
    o->suffix = PyList_New(0);
    o->io = PyList_New(0);
    return (o->leaf && o->suffix && o->io) ? 0 : -1;
}

static void out_clear(Out *o) {
    Py_CLEAR(o->leaf);
    Py_CLEAR(o->suffix);
    Py_CLEAR(o->io);
}

static int out_append(Out *o, PyObject *path, PyObject *leaf, PyObject *io) {
    if (PyList_Append(o->leaf, leaf) < 0 || PyList_Append(o->suffix, path) < 0 || PyList_Append(o->io, io) < 0)
        return -1;
    return 0;
}

static int has_key(PyObject *dict, PyObject *key) {
    /* 1, 0, or -1 on error */
    return PyDict_Contains(dict, key);
}

static int walk(PyObject *value, PyObject *path, Out *o, PyObject *io, int depth);

/* walk(item, path, ...) with path a new reference it consumes (NULL: the error that made it) */
static int walk_at(PyObject *item, PyObject *path, Out *o, PyObject *io, int depth) {
    if (!path)
        return -1;
    Py_INCREF(item);
    int rc = walk(item, path, o, io, depth);
    Py_DECREF(item);
    Py_DECREF(path);
    return rc;
}

/* _rows._walk(value, path, out, io) */
static int walk(PyObject *value, PyObject *path, Out *o, PyObject *io, int depth) {
    if (depth > MAX_DEPTH)
        return DECLINE;
    if (value == Py_None)
        return out_append(o, path, Py_None, io);
    if (PyDict_Check(value)) {
        int typed = has_key(value, S_type);
        if (typed < 0)
            return -1;
        if (typed)
            return out_append(o, path, value, io);
        Py_ssize_t pos = 0;
        PyObject *key, *item;
        while (PyDict_Next(value, &pos, &key, &item)) {
            if (!PyUnicode_CheckExact(key))
                return DECLINE;
            int rc = walk_at(item, join_dot(path, key), o, io, depth + 1);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (PyList_Check(value)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(value); i++) {
            int rc = walk_at(PyList_GET_ITEM(value, i), join_index(path, i), o, io, depth + 1);
            if (rc)
                return rc;
        }
    }
    return 0;
}

/* path with its leading dots removed (str.lstrip(".")), or its first character dropped (skip_one) */
static int strip_from(Out *o, Py_ssize_t from, int skip_one) {
    for (Py_ssize_t i = from; i < PyList_GET_SIZE(o->suffix); i++) {
        PyObject *path = PyList_GET_ITEM(o->suffix, i);
        Py_ssize_t size = PyUnicode_GET_LENGTH(path), at = 0;
        if (skip_one)
            at = size ? 1 : 0;
        else
            while (at < size && PyUnicode_READ_CHAR(path, at) == '.')
                at++;
        if (at == 0)
            continue;
        PyObject *cut = PyUnicode_Substring(path, at, size);
        if (!cut)
            return -1;
        PyList_SET_ITEM(o->suffix, i, cut);  /* steals cut */
        Py_DECREF(path);
    }
    return 0;
}

static int ends_with(PyObject *name, const char *tail) {
    PyObject *t = PyUnicode_FromString(tail);
    if (!t)
        return -1;
    Py_ssize_t r = PyUnicode_Tailmatch(name, t, 0, PY_SSIZE_T_MAX, 1);
    Py_DECREF(t);
    return (int)r;
}

static int contains(PyObject *name, const char *part) {
    PyObject *t = PyUnicode_FromString(part);
    if (!t)
        return -1;
    int r = PyUnicode_Contains(name, t);
    Py_DECREF(t);
    return r;
}

static int is_tensor_entry(PyObject *value, PyObject *tensor_types) {
    if (!PyDict_Check(value))
        return 0;
    PyObject *kind = PyDict_GetItemWithError(value, S_type);
    if (!kind)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyUnicode_Check(kind))
        return 0;
    int in = PySequence_Contains(tensor_types, kind);
    if (in != 0)
        return in;
    int a = has_key(value, S_dtype);
    if (a <= 0)
        return a;
    return has_key(value, S_shape);
}

/* each member of a dict walked under prefix.name (input_kwargs: "kwargs" for a dumped kwarg tensor in
 * tensor mode, as its data_name says; parameters); nothing for anything but a dict */
static int walk_members(PyObject *value, PyObject *prefix, PyObject *io, int tensor_task, PyObject *tensor_types,
                        Out *o) {
    if (!PyDict_Check(value))
        return 0;
    Py_ssize_t pos = 0;
    PyObject *name, *item;
    while (PyDict_Next(value, &pos, &name, &item)) {
        if (!PyUnicode_CheckExact(name))
            return DECLINE;
        PyObject *head = prefix;
        if (tensor_task) {
            int tensor = is_tensor_entry(item, tensor_types);
            if (tensor < 0)
                return -1;
            PyObject *data_name = tensor ? PyDict_GetItemWithError(item, S_data_name) : NULL;
            if (!data_name && PyErr_Occurred())
                return -1;
            if (data_name && PyUnicode_Check(data_name))
                head = S_kwargs;
        }
        int rc = walk_at(item, join_dot(head, name), o, io, 1);
        if (rc)
            return rc;
    }
    return 0;
}

/* _rows.record_leaves(name, raw, tensor_task), appended to o */
static int record_leaves(PyObject *name, PyObject *raw, int tensor_task, PyObject *tensor_types, Out *o) {
    Py_ssize_t from = PyList_GET_SIZE(o->suffix);
    int rc;
    if (!PyUnicode_Check(name))
        return DECLINE;
    if (!PyDict_Check(raw)) {
        rc = walk(raw, S_empty, o, S_debug, 0);
        return rc ? rc : strip_from(o, from, 0);
    }
    int grad = contains(name, ".parameters_grad");
    if (grad < 0)
        return -1;
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    if (grad) {
        while (PyDict_Next(raw, &pos, &key, &value)) {
            if (!PyUnicode_CheckExact(key))
                return DECLINE;
            if (PyList_Check(value) && PyList_GET_SIZE(value) == 1)
                value = PyList_GET_ITEM(value, 0);
            rc = walk_at(value, PyUnicode_FromFormat(".%U", key), o, S_parameters_grad, 1);
            if (rc)
                return rc;
        }
        return strip_from(o, from, 1);
    }
    int debug = ends_with(name, ".debug");
    if (debug < 0)
        return -1;
    if (debug) {
        rc = walk(raw, S_empty, o, S_debug, 0);
        return rc ? rc : strip_from(o, from, 0);
    }
    int has_p = has_key(raw, S_parameters), has_o = has_key(raw, S_output);
    if (has_p < 0 || has_o < 0)
        return -1;
    int late_output = has_p && has_o;  /* rows: inputs, parameters, then outputs (as 26.2.0) */
    for (int pass = 0; pass < (late_output ? 2 : 1); pass++) {
        pos = 0;
        while (PyDict_Next(raw, &pos, &key, &value)) {
            if (!PyUnicode_CheckExact(key))
                return DECLINE;
            int is_output = PyUnicode_Compare(key, S_output) == 0;
            if (late_output && (pass == 0) == is_output)
                continue;
            Py_INCREF(value);
            rc = 0;
            if (PyUnicode_Compare(key, S_is_recompute) == 0) {
                /* skipped */
            } else if (PyUnicode_Compare(key, S_input_args) == 0) {
                rc = walk(value, S_input, o, S_input, 1);
            } else if (PyUnicode_Compare(key, S_input_kwargs) == 0) {
                rc = walk_members(value, S_input, S_input, tensor_task, tensor_types, o);
            } else if (PyUnicode_Compare(key, S_input) == 0 || is_output) {
                rc = walk(value, key, o, key, 1);
            } else if (PyUnicode_Compare(key, S_parameters) == 0) {
                rc = walk_members(value, S_parameters, S_parameters, 0, tensor_types, o);
            } else {
                rc = walk(value, key, o, key, 1);
            }
            Py_DECREF(value);
            if (rc)
                return rc;
        }
    }
    return 0;
}

/* a side already walked (a leaf table's columns, compare's _indexed.IndexedSide.walked): a tuple
 * ({record: its position}, int64 bytes of each position's first leaf and the end, [suffix], [io]);
 * its leaves are their numbers. 1 where data is one (its parts in the pointers), 0 where it is not. */
static int walked_parts(PyObject *data, PyObject **positions, const int64_t **starts, Py_ssize_t *records,
                        PyObject **suffixes, PyObject **ios) {
    if (!PyTuple_CheckExact(data) || PyTuple_GET_SIZE(data) != 4)
        return 0;
    *positions = PyTuple_GET_ITEM(data, 0);
    PyObject *bounds = PyTuple_GET_ITEM(data, 1);
    *suffixes = PyTuple_GET_ITEM(data, 2);
    *ios = PyTuple_GET_ITEM(data, 3);
    if (!PyDict_CheckExact(*positions) || !PyBytes_CheckExact(bounds) || !PyList_CheckExact(*suffixes) ||
        !PyList_CheckExact(*ios) || PyList_GET_SIZE(*suffixes) != PyList_GET_SIZE(*ios) ||
        PyBytes_GET_SIZE(bounds) % (Py_ssize_t)sizeof(int64_t) || PyBytes_GET_SIZE(bounds) == 0)
        return 0;
    *starts = (const int64_t *)PyBytes_AS_STRING(bounds);
    *records = PyBytes_GET_SIZE(bounds) / (Py_ssize_t)sizeof(int64_t) - 1;
    return 1;
}

/* a walked side's leaves of record name appended to o (see walked_parts): 0, DECLINE, or -1 */
static int walked_leaves_of(PyObject *data, PyObject *name, Out *o) {
    PyObject *positions, *suffixes, *ios;
    const int64_t *starts;
    Py_ssize_t records;
    if (!walked_parts(data, &positions, &starts, &records, &suffixes, &ios))
        return DECLINE;
    PyObject *at = PyDict_GetItemWithError(positions, name);
    if (!at) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, name);
        return -1;
    }
    Py_ssize_t position = PyLong_AsSsize_t(at);
    if (position == -1 && PyErr_Occurred())
        return -1;
    if (position < 0 || position >= records)
        return DECLINE;
    int64_t from = starts[position], to = starts[position + 1];
    if (from < 0 || to < from || to > PyList_GET_SIZE(suffixes))
        return DECLINE;
    for (int64_t i = from; i < to; i++) {
        PyObject *leaf = PyLong_FromLongLong(i);
        if (!leaf)
            return -1;
        int rc = out_append(o, PyList_GET_ITEM(suffixes, i), leaf, PyList_GET_ITEM(ios, i));
        Py_DECREF(leaf);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* record_leaves of data[name] appended to o: 0, DECLINE, or -1 (a KeyError where data lacks name);
 * data a dict of records, or a side already walked (walked_parts) */
static int leaves_of(PyObject *data, PyObject *name, int tensor_task, PyObject *tensor_types, Out *o) {
    if (!PyDict_Check(data))
        return walked_leaves_of(data, name, o);
    PyObject *raw = PyDict_GetItemWithError(data, name);
    if (!raw) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, name);
        return -1;
    }
    Py_INCREF(raw);
    int rc = record_leaves(name, raw, tensor_task, tensor_types, o);
    Py_DECREF(raw);
    return rc;
}

static PyObject *leaves(PyObject *self, PyObject *args) {
    PyObject *data, *tensor_types;
    int tensor_task;
    if (!PyArg_ParseTuple(args, "O!pO", &PyDict_Type, &data, &tensor_task, &tensor_types))
        return NULL;
    Out o;
    PyObject *names = PyList_New(0), *starts = PyList_New(0), *start = NULL;
    if (!names || !starts || out_init(&o) < 0)
        goto error;
    Py_ssize_t pos = 0;
    PyObject *name, *raw;
    while (PyDict_Next(data, &pos, &name, &raw)) {
        start = PyLong_FromSsize_t(PyList_GET_SIZE(o.suffix));
        if (!start || PyList_Append(starts, start) < 0 || PyList_Append(names, name) < 0)
            goto error;
        Py_CLEAR(start);
        Py_INCREF(raw);
        int rc = record_leaves(name, raw, tensor_task, tensor_types, &o);
        Py_DECREF(raw);
        if (rc < 0)
            goto error;
        if (rc == DECLINE) {
            Py_DECREF(names);
            Py_DECREF(starts);
            out_clear(&o);
            Py_RETURN_NONE;
        }
    }
    start = PyLong_FromSsize_t(PyList_GET_SIZE(o.suffix));
    if (!start || PyList_Append(starts, start) < 0)
        goto error;
    Py_DECREF(start);
    PyObject *result = Py_BuildValue("(NNNNN)", names, starts, o.suffix, o.io, o.leaf);
    return result;
error:
    Py_XDECREF(start);
    Py_XDECREF(names);
    Py_XDECREF(starts);
    out_clear(&o);
    return NULL;
}

/* ------------------------------------------------------------------ the block's plan */

typedef struct {
    int64_t *v;
    Py_ssize_t n, cap;
} I64;

static int i64_push(I64 *a, int64_t value) {
    if (a->n == a->cap) {
        Py_ssize_t cap = a->cap ? 2 * a->cap : 1024;
        int64_t *v = PyMem_Realloc(a->v, (size_t)cap * sizeof(int64_t));
        if (!v) {
            PyErr_NoMemory();
            return -1;
        }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = value;
    return 0;
}

/* the values as the bytes of int64s (native order: numpy.frombuffer reads them); frees them */
static PyObject *i64_bytes(I64 *a) {
    PyObject *out = PyBytes_FromStringAndSize((const char *)a->v, (Py_ssize_t)(a->n * (Py_ssize_t)sizeof(int64_t)));
    PyMem_Free(a->v);
    a->v = NULL;
    a->n = a->cap = 0;
    return out;
}

typedef struct {
    I64 row_target, row_bench, row_group, row_kind, group_first, group_dup;
    PyObject *row_name, *row_bench_name, *group_index, *group_name, *group_bench;
} Rows;

static int append_long(PyObject *list, Py_ssize_t value) {
    PyObject *v = PyLong_FromSsize_t(value);
    if (!v)
        return -1;
    int rc = PyList_Append(list, v);
    Py_DECREF(v);
    return rc;
}

static int add_row(Rows *r, Py_ssize_t target, Py_ssize_t bench, PyObject *name, PyObject *bench_name,
                   Py_ssize_t group, int kind) {
    if (i64_push(&r->row_target, target) < 0 || i64_push(&r->row_bench, bench) < 0 ||
        PyList_Append(r->row_name, name) < 0 || PyList_Append(r->row_bench_name, bench_name) < 0 ||
        i64_push(&r->row_group, group) < 0 || i64_push(&r->row_kind, kind) < 0)
        return -1;
    return 0;
}

/* two record names that are equal str */
static int same_name(PyObject *a, PyObject *b) {
    if (a == b)
        return 1;
    if (!PyUnicode_CheckExact(a) || !PyUnicode_CheckExact(b) || PyUnicode_GET_LENGTH(a) != PyUnicode_GET_LENGTH(b)
        || PyUnicode_KIND(a) != PyUnicode_KIND(b))
        return 0;
    return memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)(PyUnicode_GET_LENGTH(a) * PyUnicode_KIND(a))) == 0;
}

/* f"{record}.{suffix}" if suffix else record (a new reference) */
static PyObject *row_name_of(PyObject *record, PyObject *suffix) {
    if (PyUnicode_GET_LENGTH(suffix) == 0) {
        Py_INCREF(record);
        return record;
    }
    return join_dot(record, suffix);
}

/* the {suffix: bench leaf index} of a bench record, its first leaf of each suffix appended to b
 * (_Planner.bench_leaves_of); a borrowed reference kept in cache, NULL with DECLINE in *declined */
static PyObject *bench_leaves_of(PyObject *name, PyObject *bench_data, PyObject *cache, PyObject *dups, Out *b,
                                 int tensor_task, PyObject *tensor_types, int *declined) {
    PyObject *got = PyDict_GetItemWithError(cache, name);
    if (got || PyErr_Occurred())
        return got;
    Out tmp;
    if (out_init(&tmp) < 0) {
        out_clear(&tmp);
        return NULL;
    }
    int rc = leaves_of(bench_data, name, tensor_task, tensor_types, &tmp);
    if (rc) {
        out_clear(&tmp);
        if (rc == DECLINE)
            *declined = 1;
        return NULL;
    }
    got = PyDict_New();
    if (!got) {
        out_clear(&tmp);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(tmp.suffix); i++) {
        PyObject *suffix = PyList_GET_ITEM(tmp.suffix, i);
        int in = PyDict_Contains(got, suffix);
        if (in < 0 || (in && PyDict_SetItem(dups, name, Py_True) < 0))
            goto fail;
        if (in)
            continue;  /* a later leaf of the same suffix: the first one is the record's */
        PyObject *at = PyLong_FromSsize_t(PyList_GET_SIZE(b->leaf));
        if (!at)
            goto fail;
        int bad = PyDict_SetItem(got, suffix, at) < 0 ||
                  out_append(b, suffix, PyList_GET_ITEM(tmp.leaf, i), PyList_GET_ITEM(tmp.io, i)) < 0;
        Py_DECREF(at);
        if (bad)
            goto fail;
    }
    out_clear(&tmp);
    if (PyDict_SetItem(cache, name, got) < 0) {
        Py_DECREF(got);
        return NULL;
    }
    Py_DECREF(got);  /* the cache holds it */
    return got;
fail:
    out_clear(&tmp);
    Py_DECREF(got);
    return NULL;
}

static PyObject *plan_block(PyObject *self, PyObject *args) {
    PyObject *target_data, *bench_data, *pairs, *rest, *tensor_types;
    Py_ssize_t start, stop;
    int tensor_task;
    if (!PyArg_ParseTuple(args, "OOO!nnOpO", &target_data, &bench_data, &PyList_Type,
                          &pairs, &start, &stop, &rest, &tensor_task, &tensor_types))
        return NULL;
    if (!PyDict_Check(target_data) && !PyTuple_CheckExact(target_data)) {
        PyErr_SetString(PyExc_TypeError, "target_data must be a dict or a walked side");
        return NULL;
    }
    if (!PyDict_Check(bench_data) && !PyTuple_CheckExact(bench_data)) {
        PyErr_SetString(PyExc_TypeError, "bench_data must be a dict or a walked side");
        return NULL;
    }
    if (rest != Py_None && !PyList_Check(rest)) {
        PyErr_SetString(PyExc_TypeError, "rest must be a list or None");
        return NULL;
    }
    if (start < 0 || stop > PyList_GET_SIZE(pairs) || start > stop) {
        PyErr_SetString(PyExc_IndexError, "start:stop out of the pairs");
        return NULL;
    }
    Out t = {0}, b = {0};
    Rows r = {0};
    PyObject *cache = PyDict_New(), *dups = PyDict_New();
    PyObject *left = NULL;
    int declined = 0;
    if (!cache || !dups || out_init(&t) < 0 || out_init(&b) < 0)
        goto error;
    PyObject **lists[] = {&r.row_name, &r.row_bench_name, &r.group_index, &r.group_name, &r.group_bench};
    for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++)
        if (!(*lists[i] = PyList_New(0)))
            goto error;
    Py_ssize_t group = 0;
    for (Py_ssize_t index = start; index < stop; index++, group++) {
        PyObject *pair = PyList_GET_ITEM(pairs, index);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            declined = 1;
            goto decline;
        }
        PyObject *name = PyTuple_GET_ITEM(pair, 0), *bench = PyTuple_GET_ITEM(pair, 1);
        if (!PyUnicode_Check(name) || (bench != Py_None && !PyUnicode_Check(bench))) {
            declined = 1;
            goto decline;
        }
        if (bench != Py_None) {
            PyObject *of = bench_leaves_of(bench, bench_data, cache, dups, &b, tensor_task, tensor_types, &declined);
            if (!of)
                goto decline;
            left = PyDict_Copy(of);
            if (!left)
                goto error;
        }
        Py_ssize_t from = PyList_GET_SIZE(t.leaf);
        int rc = leaves_of(target_data, name, tensor_task, tensor_types, &t);
        if (rc) {  /* DECLINE: the Python planner; -1: the error */
            declined = rc == DECLINE;
            goto decline;
        }
        Py_ssize_t first = -1;
        for (Py_ssize_t i = from; i < PyList_GET_SIZE(t.leaf); i++) {
            PyObject *suffix = PyList_GET_ITEM(t.suffix, i);
            PyObject *row = row_name_of(name, suffix);
            if (!row)
                goto error;
            Py_ssize_t bench_index = -1;
            PyObject *bench_name = S_NA;
            Py_INCREF(bench_name);
            if (left) {
                PyObject *at = PyDict_GetItemWithError(left, suffix);
                if (!at && PyErr_Occurred()) {
                    Py_DECREF(row);
                    Py_DECREF(bench_name);
                    goto error;
                }
                if (at) {
                    bench_index = PyLong_AsSsize_t(at);
                    Py_DECREF(bench_name);
                    if (same_name(bench, name)) {  /* the row's name again: one str for both cells */
                        Py_INCREF(row);
                        bench_name = row;
                    } else {
                        bench_name = row_name_of(bench, suffix);
                    }
                    if (!bench_name || PyDict_DelItem(left, suffix) < 0) {
                        Py_DECREF(row);
                        Py_XDECREF(bench_name);
                        goto error;
                    }
                }
            }
            if (first < 0)
                first = r.row_target.n;
            rc = add_row(&r, i, bench_index, row, bench_name, group, 0);
            Py_DECREF(row);
            Py_DECREF(bench_name);
            if (rc < 0)
                goto error;
        }
        if (left) {
            Py_ssize_t pos = 0;
            PyObject *suffix, *at;
            while (PyDict_Next(left, &pos, &suffix, &at)) {
                PyObject *bench_name = row_name_of(bench, suffix);
                if (!bench_name)
                    goto error;
                rc = add_row(&r, -1, PyLong_AsSsize_t(at), S_NA, bench_name, group, 1);
                Py_DECREF(bench_name);
                if (rc < 0)
                    goto error;
            }
            Py_CLEAR(left);
        }
        if (append_long(r.group_index, index) < 0 || PyList_Append(r.group_name, name) < 0 ||
            PyList_Append(r.group_bench, bench) < 0 || i64_push(&r.group_first, first) < 0)
            goto error;
        int dup = bench == Py_None ? 0 : PyDict_Contains(dups, bench);
        if (dup < 0 || i64_push(&r.group_dup, dup) < 0)
            goto error;
    }
    if (rest != Py_None) {
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(rest); k++, group++) {
            PyObject *bench = PyList_GET_ITEM(rest, k);
            if (!PyUnicode_Check(bench)) {
                declined = 1;
                goto decline;
            }
            Py_ssize_t from = PyList_GET_SIZE(b.leaf);
            int rc = leaves_of(bench_data, bench, tensor_task, tensor_types, &b);
            if (rc) {  /* DECLINE: the Python planner; -1: the error */
                declined = rc == DECLINE;
                goto decline;
            }
            for (Py_ssize_t i = from; i < PyList_GET_SIZE(b.leaf); i++) {
                PyObject *bench_name = row_name_of(bench, PyList_GET_ITEM(b.suffix, i));
                if (!bench_name)
                    goto error;
                rc = add_row(&r, -1, i, S_NA, bench_name, group, 2);
                Py_DECREF(bench_name);
                if (rc < 0)
                    goto error;
            }
            if (PyList_Append(r.group_index, Py_None) < 0 || PyList_Append(r.group_name, bench) < 0 ||
                PyList_Append(r.group_bench, bench) < 0 || i64_push(&r.group_first, -1) < 0 ||
                i64_push(&r.group_dup, 0) < 0)
                goto error;
        }
    }
    Py_DECREF(cache);
    Py_DECREF(dups);
    return Py_BuildValue("(NNNNNNNNNNNNNNNNN)", t.leaf, t.io, t.suffix, b.leaf, b.io, b.suffix,
                         i64_bytes(&r.row_target), i64_bytes(&r.row_bench), i64_bytes(&r.row_group),
                         i64_bytes(&r.row_kind), r.row_name, r.row_bench_name, r.group_index, r.group_name,
                         r.group_bench, i64_bytes(&r.group_first), i64_bytes(&r.group_dup));
decline:
    if (!declined)
        goto error;
error:
    Py_XDECREF(cache);
    Py_XDECREF(dups);
    Py_XDECREF(left);
    out_clear(&t);
    out_clear(&b);
    PyMem_Free(r.row_target.v);
    PyMem_Free(r.row_bench.v);
    PyMem_Free(r.row_group.v);
    PyMem_Free(r.row_kind.v);
    PyMem_Free(r.group_first.v);
    PyMem_Free(r.group_dup.v);
    Py_XDECREF(r.row_name);
    Py_XDECREF(r.row_bench_name);
    Py_XDECREF(r.group_index);
    Py_XDECREF(r.group_name);
    Py_XDECREF(r.group_bench);
    if (declined && !PyErr_Occurred())
        Py_RETURN_NONE;
    return NULL;
}

/* ------------------------------------------------------------------ Leaves.finish */

/* str(shape) of a list of exact ints that fit 64 bits ("[8, 128]"), else PyObject_Str */
static PyObject *shape_text(PyObject *shape) {
    if (!PyList_CheckExact(shape))
        return PyObject_Str(shape);
    Py_ssize_t n = PyList_GET_SIZE(shape);
    if (n == 0) {
        Py_INCREF(S_empty_list_text);
        return S_empty_list_text;
    }
    if (n > 16)
        return PyObject_Str(shape);
    char buffer[16 * 24 + 4];
    size_t at = 0;
    buffer[at++] = '[';
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(shape, i);
        if (!PyLong_CheckExact(item))
            return PyObject_Str(shape);
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return PyObject_Str(shape);
        }
        if (i) {
            buffer[at++] = ',';
            buffer[at++] = ' ';
        }
        at += (size_t)snprintf(buffer + at, sizeof buffer - at, "%lld", v);
    }
    buffer[at++] = ']';
    return PyUnicode_FromStringAndSize(buffer, (Py_ssize_t)at);
}

/* str(value) as a new reference (the object itself for an exact str) */
static PyObject *text_of(PyObject *value) {
    if (PyUnicode_CheckExact(value)) {
        Py_INCREF(value);
        return value;
    }
    return PyObject_Str(value);
}

static int append_new(PyObject *list, PyObject *value) {
    if (!value)
        return -1;
    int rc = PyList_Append(list, value);
    Py_DECREF(value);
    return rc;
}

static PyObject *get_or_none(PyObject *dict, PyObject *key) {
    PyObject *v = PyDict_GetItemWithError(dict, key);
    if (!v && !PyErr_Occurred())
        v = Py_None;
    return v;  /* borrowed */
}

/* compare's crc_text(value): zlib's CRC-32 of str(value) in UTF-8, as 8 hex digits; a new reference */
static uint32_t crc_table[256];

static PyObject *crc_text(PyObject *value) {
    if (!crc_table[1])
        for (uint32_t n = 0; n < 256; n++) {
            uint32_t c = n;
            for (int k = 0; k < 8; k++)
                c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            crc_table[n] = c;
        }
    PyObject *text = PyObject_Str(value);
    if (!text)
        return NULL;
    Py_ssize_t size;
    const char *bytes = PyUnicode_AsUTF8AndSize(text, &size);
    if (!bytes) {
        Py_DECREF(text);
        return NULL;
    }
    uint32_t c = 0xFFFFFFFFu;
    for (Py_ssize_t i = 0; i < size; i++)
        c = crc_table[(c ^ (unsigned char)bytes[i]) & 0xFF] ^ (c >> 8);
    Py_DECREF(text);
    char hex[9];
    snprintf(hex, sizeof hex, "%08x", c ^ 0xFFFFFFFFu);
    return PyUnicode_FromStringAndSize(hex, 8);
}

static PyObject *leaf_fields(PyObject *self, PyObject *args) {
    PyObject *leaves_list, *scalar_dtypes, *stat_keys, *view;
    int md5_mode, tensor_mode;
    if (!PyArg_ParseTuple(args, "O!ppO!O!O", &PyList_Type, &leaves_list, &md5_mode, &tensor_mode, &PyDict_Type,
                          &scalar_dtypes, &PyTuple_Type, &stat_keys, &view))
        return NULL;
    if (PyTuple_GET_SIZE(stat_keys) != 4) {
        PyErr_SetString(PyExc_ValueError, "four statistics");
        return NULL;
    }
    PyObject *tensor = PyList_New(0), *dtype = PyList_New(0), *shape = PyList_New(0), *rg = PyList_New(0),
             *md5 = PyList_New(0), *data_name = PyList_New(0);
    PyObject *stats[4] = {PyList_New(0), PyList_New(0), PyList_New(0), PyList_New(0)};
    PyObject *viewed = NULL;
    if (!tensor || !dtype || !shape || !rg || !md5 || !data_name || !stats[0] || !stats[1] || !stats[2] || !stats[3])
        goto error;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(leaves_list); i++) {
        PyObject *leaf = PyList_GET_ITEM(leaves_list, i);
        PyObject *f_dtype, *f_shape, *f_rg, *f_md5 = Py_None, *f_dn = Py_None, *f_stats[4];
        int is_tensor = 0, scalar = 0;
        if (Py_IS_TYPE(leaf, &PyDict_Type)) {
            int d = PyDict_Contains(leaf, S_dtype), s = d > 0 ? PyDict_Contains(leaf, S_shape) : 0;
            if (d < 0 || s < 0)
                goto error;
            is_tensor = d && s;
        }
        if (is_tensor) {
            if (!(f_dtype = get_or_none(leaf, S_dtype)) || !(f_shape = get_or_none(leaf, S_shape)) ||
                !(f_rg = get_or_none(leaf, S_requires_grad)))
                goto error;
            for (int k = 0; k < 4; k++)
                if (!(f_stats[k] = get_or_none(leaf, PyTuple_GET_ITEM(stat_keys, k))))
                    goto error;
            if (md5_mode && !(f_md5 = get_or_none(leaf, S_md5)))
                goto error;
            if (tensor_mode && !(f_dn = get_or_none(leaf, S_data_name)))
                goto error;
        } else if (leaf == Py_None) {
            f_dtype = f_shape = S_NA;
            f_rg = Py_None;
            f_stats[0] = f_stats[1] = f_stats[2] = f_stats[3] = Py_None;
            f_md5 = S_NA;
        } else {
            PyObject *kind = Py_IS_TYPE(leaf, &PyDict_Type) ? PyDict_GetItemWithError(leaf, S_type) : NULL;
            if (!kind && PyErr_Occurred())
                goto error;
            PyObject *scalar_dtype = NULL;
            if (kind && PyUnicode_CheckExact(kind)) {
                scalar_dtype = PyDict_GetItemWithError(scalar_dtypes, kind);
                if (!scalar_dtype && PyErr_Occurred())
                    goto error;
            }
            if (scalar_dtype) {  /* _plan._view of a scalar argument (its CRC text in md5 mode) */
                scalar = 1;
                PyObject *value = get_or_none(leaf, S_value);
                if (!value)
                    goto error;
                if (md5_mode && !(viewed = crc_text(value)))  /* held until the leaf is done */
                    goto error;
                f_md5 = md5_mode ? viewed : Py_None;
                f_dtype = scalar_dtype;
                f_shape = S_empty_list_text;
                f_rg = Py_None;
                f_stats[0] = f_stats[1] = f_stats[2] = f_stats[3] = value;
            } else {
                viewed = PyObject_CallOneArg(view, leaf);
                if (!viewed)
                    goto error;
                if (!PyTuple_Check(viewed) || PyTuple_GET_SIZE(viewed) != 2 || !PyDict_Check(PyTuple_GET_ITEM(viewed, 0))) {
                    PyErr_SetString(PyExc_TypeError, "view(leaf) must give (dict, bool)");
                    goto error;
                }
                PyObject *shown = PyTuple_GET_ITEM(viewed, 0);
                is_tensor = PyObject_IsTrue(PyTuple_GET_ITEM(viewed, 1));
                if (is_tensor < 0 || !(f_dtype = get_or_none(shown, S_dtype)) || !(f_shape = get_or_none(shown, S_shape))
                    || !(f_rg = get_or_none(shown, S_requires_grad)) || !(f_md5 = get_or_none(shown, S_md5))
                    || !(f_dn = get_or_none(shown, S_data_name)))
                    goto error;
                for (int k = 0; k < 4; k++)
                    if (!(f_stats[k] = get_or_none(shown, PyTuple_GET_ITEM(stat_keys, k))))
                        goto error;
            }
        }
        if (append_new(tensor, PyBool_FromLong(is_tensor)) < 0)
            goto error;
        if (append_new(dtype, text_of(f_dtype)) < 0)
            goto error;
        if (scalar) {
            if (PyList_Append(shape, S_empty_list_text) < 0)
                goto error;
        } else if (append_new(shape, PyUnicode_CheckExact(f_shape) ? text_of(f_shape) : shape_text(f_shape)) < 0)
            goto error;
        PyObject *rg_text = f_rg == Py_None ? S_NA : f_rg == Py_True ? S_true : f_rg == Py_False ? S_false : NULL;
        if (rg_text ? PyList_Append(rg, rg_text) < 0 : append_new(rg, PyObject_Str(f_rg)) < 0)
            goto error;
        for (int k = 0; k < 4; k++)
            if (PyList_Append(stats[k], f_stats[k]) < 0)
                goto error;
        if (md5_mode) {
            int rc = PyUnicode_CheckExact(f_md5) ? PyList_Append(md5, f_md5)
                     : f_md5 == Py_None ? PyList_Append(md5, S_NA) : append_new(md5, PyObject_Str(f_md5));
            if (rc < 0)
                goto error;
        }
        if (tensor_mode) {
            int named = PyUnicode_CheckExact(f_dn) && PyUnicode_GET_LENGTH(f_dn) > 0;
            if (PyList_Append(data_name, named ? f_dn : S_minus1) < 0)
                goto error;
        }
        Py_CLEAR(viewed);
    }
    return Py_BuildValue("(NNNNNNNNNN)", tensor, dtype, shape, rg, stats[0], stats[1], stats[2], stats[3], md5,
                         data_name);
error:
    Py_XDECREF(viewed);
    Py_XDECREF(tensor);
    Py_XDECREF(dtype);
    Py_XDECREF(shape);
    Py_XDECREF(rg);
    Py_XDECREF(md5);
    Py_XDECREF(data_name);
    for (int k = 0; k < 4; k++)
        Py_XDECREF(stats[k]);
    return NULL;
}

/* ------------------------------------------------------------------ fastjson's checks and stand-ins */

/* the bytes a number may follow (fastjson._has_long_integer) */
static const unsigned char NUMBER_START[256] = {[' '] = 1, ['\t'] = 1, ['\n'] = 1, ['\r'] = 1, [':'] = 1, [','] = 1,
                                                ['['] = 1, ['-'] = 1};

/* fastjson._has_long_integer: a run of 19+ digits at the start or after a byte a number may follow,
 * not followed by '.', 'e' or 'E' (one pass: each run of digits knows the byte before it). With
 * ``tokens``: whether the text holds "NaN" or "Infinity" anywhere (as ``b"NaN" in data or
 * b"Infinity" in data``), looked for in the same pass; the scan ends at a long integer. */
static int scan_numbers(const unsigned char *d, Py_ssize_t n, int *tokens) {
    int found = 0;
    int after_start = 1;  /* the text's start counts as a byte a number may follow */
    for (Py_ssize_t i = 0; i < n;) {
        unsigned char c = d[i];
        if (c >= '0' && c <= '9') {
            Py_ssize_t end = i + 1;
            while (end < n && d[end] >= '0' && d[end] <= '9')
                end++;
            if (after_start && end - i >= 19 && !(end < n && (d[end] == '.' || d[end] == 'e' || d[end] == 'E'))) {
                found = 1;
                break;
            }
            after_start = 0;
            i = end;
            continue;
        }
        if (tokens && !*tokens && (c == 'N' || c == 'I')
            && (c == 'N' ? i + 3 <= n && d[i + 1] == 'a' && d[i + 2] == 'N'
                         : i + 8 <= n && memcmp(d + i, "Infinity", 8) == 0))
            *tokens = 1;
        after_start = NUMBER_START[c];
        i++;
    }
    return found;
}

static PyObject *has_long_integer(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    int found;
    Py_BEGIN_ALLOW_THREADS
    found = scan_numbers((const unsigned char *)view.buf, view.len, NULL);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyBool_FromLong(found);
}

/* fastjson's two looks at a document in one pass: 1 where it holds a long integer (has_long_integer;
 * the tokens are then not looked for further), else 2 where it holds "NaN" or "Infinity", else 0 */
static PyObject *document_marks(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    int found, tokens = 0;
    Py_BEGIN_ALLOW_THREADS
    found = scan_numbers((const unsigned char *)view.buf, view.len, &tokens);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromLong(found ? 1 : tokens ? 2 : 0);
}

/* the length of the token at d[i] (an 'N' or an 'I'), or 0 */
static int token_at(const char *d, Py_ssize_t i, Py_ssize_t n) {
    if (d[i] == 'I')
        return i + 8 <= n && memcmp(d + i, "Infinity", 8) == 0 ? 8 : 0;
    return i + 3 <= n && d[i + 1] == 'a' && d[i + 2] == 'N' ? 3 : 0;
}

/* the next byte at or after d[i] that may start a token ('N' or 'I'), or n; next_n / next_i cache
 * memchr's last answer for each byte (memchr skips whole words at a time) */
static Py_ssize_t next_token_start(const char *d, Py_ssize_t i, Py_ssize_t n, Py_ssize_t *next_n, Py_ssize_t *next_i) {
    if (*next_n < i) {
        const char *at = memchr(d + i, 'N', (size_t)(n - i));
        *next_n = at ? at - d : n;
    }
    if (*next_i < i) {
        const char *at = memchr(d + i, 'I', (size_t)(n - i));
        *next_i = at ? at - d : n;
    }
    return *next_n < *next_i ? *next_n : *next_i;
}

/* fastjson._with_stand_ins: each NaN / Infinity / -Infinity token replaced by its stand-in string
 * (the text between tokens copied a span at a time, the tokens found by memchr) */
static PyObject *with_stand_ins(PyObject *self, PyObject *arg) {
    static const char NEG[] = "\"\\u0000-I\"", POS[] = "\"\\u0000I\"", NAN_[] = "\"\\u0000N\"";
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const char *d = (const char *)view.buf;
    Py_ssize_t n = view.len;
    /* each token grows by at most 8 bytes */
    Py_ssize_t tokens = 0, next_n = -1, next_i = -1;
    for (Py_ssize_t i = next_token_start(d, 0, n, &next_n, &next_i); i < n;
         i = next_token_start(d, i + 1, n, &next_n, &next_i))
        if (token_at(d, i, n))
            tokens++;
    PyObject *out = PyBytes_FromStringAndSize(NULL, n + 8 * tokens);
    if (!out) {
        PyBuffer_Release(&view);
        return NULL;
    }
    char *o = PyBytes_AS_STRING(out);
    Py_ssize_t w = 0, span = 0;  /* d[span:i] is yet to be copied */
    next_n = next_i = -1;
    for (Py_ssize_t i = next_token_start(d, 0, n, &next_n, &next_i); i < n;) {
        int size = token_at(d, i, n);
        if (!size) {
            i = next_token_start(d, i + 1, n, &next_n, &next_i);
            continue;
        }
        /* a '-' just before Infinity (never the end of an earlier token) makes -Infinity */
        int negative = size == 8 && i > span && d[i - 1] == '-';
        Py_ssize_t copy = i - span - negative;
        memcpy(o + w, d + span, (size_t)copy);
        w += copy;
        const char *stand_in = size == 3 ? NAN_ : negative ? NEG : POS;
        size_t stand_size = size == 3 ? sizeof NAN_ - 1 : negative ? sizeof NEG - 1 : sizeof POS - 1;
        memcpy(o + w, stand_in, stand_size);
        w += (Py_ssize_t)stand_size;
        span = i + size;
        i = next_token_start(d, span, n, &next_n, &next_i);
    }
    memcpy(o + w, d + span, (size_t)(n - span));
    w += n - span;
    PyBuffer_Release(&view);
    if (_PyBytes_Resize(&out, w) < 0)
        return NULL;
    return out;
}

/* the stand-ins under node put back (values: stand-in -> float); count, or -1 error, -2 a stand-in key
 * (or a string starting with NUL that is none: the caller takes json.loads) */
static Py_ssize_t restore(PyObject *node, PyObject *values, int depth) {
    Py_ssize_t count = 0;
    if (depth > 4000)
        return -2;
    if (Py_IS_TYPE(node, &PyDict_Type)) {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(node, &pos, &key, &value)) {
            if (PyUnicode_Check(key) && PyUnicode_GET_LENGTH(key) && PyUnicode_READ_CHAR(key, 0) == 0)
                return -2;
            if (Py_IS_TYPE(value, &PyUnicode_Type)) {
                if (PyUnicode_GET_LENGTH(value) && PyUnicode_READ_CHAR(value, 0) == 0) {
                    PyObject *number = PyDict_GetItemWithError(values, value);
                    if (!number)
                        return PyErr_Occurred() ? -1 : -2;
                    if (PyDict_SetItem(node, key, number) < 0)  /* an existing key: the dict does not resize */
                        return -1;
                    count++;
                }
            } else if (Py_IS_TYPE(value, &PyDict_Type) || Py_IS_TYPE(value, &PyList_Type)) {
                Py_ssize_t got = restore(value, values, depth + 1);
                if (got < 0)
                    return got;
                count += got;
            }
        }
    } else if (Py_IS_TYPE(node, &PyList_Type)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(node); i++) {
            PyObject *value = PyList_GET_ITEM(node, i);
            if (Py_IS_TYPE(value, &PyUnicode_Type)) {
                if (PyUnicode_GET_LENGTH(value) && PyUnicode_READ_CHAR(value, 0) == 0) {
                    PyObject *number = PyDict_GetItemWithError(values, value);
                    if (!number)
                        return PyErr_Occurred() ? -1 : -2;
                    Py_INCREF(number);
                    PyList_SET_ITEM(node, i, number);
                    Py_DECREF(value);
                    count++;
                }
            } else if (Py_IS_TYPE(value, &PyDict_Type) || Py_IS_TYPE(value, &PyList_Type)) {
                Py_ssize_t got = restore(value, values, depth + 1);
                if (got < 0)
                    return got;
                count += got;
            }
        }
    }
    return count;
}

static PyObject *restore_nonfinite(PyObject *self, PyObject *args) {
    PyObject *obj, *values;
    if (!PyArg_ParseTuple(args, "OO!", &obj, &PyDict_Type, &values))
        return NULL;
    Py_ssize_t got = restore(obj, values, 0);
    if (got == -1)
        return NULL;
    if (got == -2)
        Py_RETURN_NONE;
    return PyLong_FromSsize_t(got);
}

/* ------------------------------------------------------------------ the index's tensor rows */

typedef struct {
    PyObject *io, *path, *entry;  /* lists */
    I64 record;
} Found;

static int walk_entries(PyObject *value, PyObject *path, Found *f, PyObject *io, Py_ssize_t record, int depth,
                        int limit, PyObject *tensor_types);

/* walk_entries(item, path, ...) with path a new reference it consumes (NULL: the error that made it) */
static int entries_at(PyObject *item, PyObject *path, Found *f, PyObject *io, Py_ssize_t record, int depth, int limit,
                      PyObject *tensor_types) {
    if (!path)
        return -1;
    Py_INCREF(item);
    int rc = walk_entries(item, path, f, io, record, depth, limit, tensor_types);
    Py_DECREF(item);
    Py_DECREF(path);
    return rc;
}

/* model._walk_entries(value, path, out, depth, limit): 0, DECLINE (past the depth limit: the Python
 * code raises), -1 */
static int walk_entries(PyObject *value, PyObject *path, Found *f, PyObject *io, Py_ssize_t record, int depth,
                        int limit, PyObject *tensor_types) {
    if (!PyDict_Check(value) && !PyList_Check(value))
        return 0;
    if (depth > limit)
        return DECLINE;
    if (PyDict_Check(value)) {
        PyObject *kind = PyDict_GetItemWithError(value, S_type);
        if (!kind && PyErr_Occurred())
            return -1;
        if (!kind || kind == Py_None) {
            Py_ssize_t pos = 0;
            PyObject *key, *item;
            while (PyDict_Next(value, &pos, &key, &item)) {
                if (!PyDict_Check(item) && !PyList_Check(item))
                    continue;
                if (!PyUnicode_CheckExact(key))
                    return DECLINE;
                PyObject *sub = PyUnicode_GET_LENGTH(path) ? join_dot(path, key) : (Py_INCREF(key), key);
                int rc = entries_at(item, sub, f, io, record, depth + 1, limit, tensor_types);
                if (rc)
                    return rc;
            }
            return 0;
        }
        int tensor = is_tensor_entry(value, tensor_types);
        if (tensor < 0)
            return -1;
        if (tensor && (PyList_Append(f->io, io) < 0 || PyList_Append(f->path, path) < 0 ||
                       PyList_Append(f->entry, value) < 0 || i64_push(&f->record, record) < 0))
            return -1;
        return 0;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(value); i++) {
        PyObject *item = PyList_GET_ITEM(value, i);
        if (!PyDict_Check(item) && !PyList_Check(item))
            continue;
        PyObject *sub = PyUnicode_GET_LENGTH(path) ? join_index(path, i) : PyUnicode_FromFormat("%zd", i);
        int rc = entries_at(item, sub, f, io, record, depth + 1, limit, tensor_types);
        if (rc)
            return rc;
    }
    return 0;
}

/* index.rows._num: a statistic as a float (None where it is none) */
static PyObject *as_number(PyObject *value) {
    if (value == Py_None || PyFloat_CheckExact(value)) {
        Py_INCREF(value);
        return value;
    }
    if (PyBool_Check(value))
        return PyFloat_FromDouble(value == Py_True ? 1.0 : 0.0);
    if (PyLong_Check(value)) {
        double d = PyLong_AsDouble(value);
        if (d == -1.0 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError))
                return NULL;
            PyErr_Clear();
            PyObject *zero = PyLong_FromLong(0);
            int negative = zero ? PyObject_RichCompareBool(value, zero, Py_LT) : -1;
            Py_XDECREF(zero);
            if (negative < 0)
                return NULL;
            return PyFloat_FromDouble(negative ? -Py_HUGE_VAL : Py_HUGE_VAL);
        }
        return PyFloat_FromDouble(d);
    }
    if (PyFloat_Check(value))
        return PyFloat_FromDouble(PyFloat_AS_DOUBLE(value));
    if (PyUnicode_Check(value)) {
        PyObject *got = PyFloat_FromString(value);
        if (!got && PyErr_ExceptionMatches(PyExc_ValueError)) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        return got;
    }
    Py_RETURN_NONE;
}

/* model._numel: the element count of a valid shape (a list of ints >= 0, no bools, product within
 * int64), else None */
static PyObject *numel_of(PyObject *shape) {
    if (!PyList_Check(shape))
        Py_RETURN_NONE;
    unsigned long long count = 1;
    int overflow = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(shape); i++) {
        PyObject *dim = PyList_GET_ITEM(shape, i);
        if (!PyLong_Check(dim) || PyBool_Check(dim))
            Py_RETURN_NONE;
        int over = 0;
        long long v = PyLong_AsLongLongAndOverflow(dim, &over);
        if (v == -1 && PyErr_Occurred())
            return NULL;
        if (over || v < 0)
            Py_RETURN_NONE;
        if (overflow || (v && count > (unsigned long long)INT64_MAX / (unsigned long long)v))
            overflow = v != 0 || overflow;  /* a zero later makes the product 0 again */
        if (v == 0) {
            count = 0;
            overflow = 0;
        } else if (!overflow) {
            count *= (unsigned long long)v;
        }
    }
    if (overflow || count > (unsigned long long)INT64_MAX)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(count);
}

static PyObject *index_rows(PyObject *self, PyObject *args) {
    PyObject *data, *names, *kinds, *tensor_types, *stat_keys, *md5_text;
    int limit, placeholders;
    if (!PyArg_ParseTuple(args, "O!O!O!OiO!pO", &PyDict_Type, &data, &PyList_Type, &names, &PyList_Type, &kinds,
                          &tensor_types, &limit, &PyTuple_Type, &stat_keys, &placeholders, &md5_text))
        return NULL;
    if (PyList_GET_SIZE(names) != PyList_GET_SIZE(kinds) || PyTuple_GET_SIZE(stat_keys) != 4) {
        PyErr_SetString(PyExc_ValueError, "a kind per name, four statistics");
        return NULL;
    }
    Found f = {PyList_New(0), PyList_New(0), PyList_New(0), {NULL, 0, 0}};
    PyObject *grad = PyUnicode_FromString("parameters_grad"), *debug = PyUnicode_FromString("debug");
    PyObject *placeholder = PyDict_New();
    PyObject *cols[13] = {NULL};
    int rc = 0;
    if (!f.io || !f.path || !f.entry || !grad || !debug || !placeholder)
        goto error;
    for (Py_ssize_t r = 0; r < PyList_GET_SIZE(names) && !rc; r++) {
        PyObject *name = PyList_GET_ITEM(names, r), *kind = PyList_GET_ITEM(kinds, r);
        PyObject *raw = PyDict_GetItemWithError(data, name);
        if (!raw) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, name);
            goto error;
        }
        Py_ssize_t before = PyList_GET_SIZE(f.entry);
        Py_INCREF(raw);
        int whole = PyUnicode_Check(kind) && (PyUnicode_Compare(kind, grad) == 0 || PyUnicode_Compare(kind, debug) == 0);
        if (whole || !PyDict_Check(raw)) {
            rc = walk_entries(raw, S_empty, &f, whole ? kind : Py_None, r, 0, limit, tensor_types);
        } else {
            Py_ssize_t pos = 0;
            PyObject *key, *value;
            while (!rc && PyDict_Next(raw, &pos, &key, &value)) {
                if (!PyUnicode_CheckExact(key)) {
                    rc = DECLINE;
                    break;
                }
                Py_INCREF(value);
                rc = walk_entries(value, key, &f, key, r, 0, limit, tensor_types);
                Py_DECREF(value);
            }
        }
        Py_DECREF(raw);
        if (rc < 0)
            goto error;
        if (!rc && placeholders && PyList_GET_SIZE(f.entry) == before &&
            (PyList_Append(f.io, Py_None) < 0 || PyList_Append(f.path, Py_None) < 0 ||
             PyList_Append(f.entry, placeholder) < 0 || i64_push(&f.record, r) < 0))
            goto error;
    }
    if (rc == DECLINE) {
        Py_DECREF(f.io);
        Py_DECREF(f.path);
        Py_DECREF(f.entry);
        PyMem_Free(f.record.v);
        Py_DECREF(grad);
        Py_DECREF(debug);
        Py_DECREF(placeholder);
        Py_RETURN_NONE;
    }
    /* type, dtype, shape, numel, max, min, mean, norm, md5, has_nan, has_inf, requires_grad, data_name */
    for (int c = 0; c < 13; c++)
        if (!(cols[c] = PyList_New(PyList_GET_SIZE(f.entry))))
            goto error;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(f.entry); i++) {
        PyObject *entry = PyList_GET_ITEM(f.entry, i);
        int empty = entry == placeholder;
        PyObject *v;
        if (!(v = get_or_none(entry, S_type)))
            goto error;
        Py_INCREF(v);
        PyList_SET_ITEM(cols[0], i, v);
        if (!(v = get_or_none(entry, S_dtype)))
            goto error;
        v = PyUnicode_Check(v) ? v : Py_None;
        Py_INCREF(v);
        PyList_SET_ITEM(cols[1], i, v);
        PyObject *shape = get_or_none(entry, S_shape);
        if (!shape)
            goto error;
        PyObject *numel = numel_of(shape);
        if (!numel)
            goto error;
        PyList_SET_ITEM(cols[3], i, numel);
        if (numel == Py_None) {
            Py_INCREF(Py_None);
            PyList_SET_ITEM(cols[2], i, Py_None);
        } else {
            PyObject *dims = PyList_New(PyList_GET_SIZE(shape));
            if (!dims)
                goto error;
            PyList_SET_ITEM(cols[2], i, dims);
            for (Py_ssize_t k = 0; k < PyList_GET_SIZE(shape); k++) {
                PyObject *dim = PyList_GET_ITEM(shape, k);
                PyObject *as_int = PyLong_CheckExact(dim) ? (Py_INCREF(dim), dim) : PyNumber_Long(dim);
                if (!as_int)
                    goto error;
                PyList_SET_ITEM(dims, k, as_int);
            }
        }
        int nan = 0, inf = 0;
        for (int k = 0; k < 4; k++) {
            PyObject *raw = get_or_none(entry, PyTuple_GET_ITEM(stat_keys, k));
            PyObject *number = raw ? as_number(raw) : NULL;
            if (!number)
                goto error;
            if (PyFloat_Check(number)) {
                double d = PyFloat_AS_DOUBLE(number);
                nan |= d != d;
                inf |= d == Py_HUGE_VAL || d == -Py_HUGE_VAL;
            }
            PyList_SET_ITEM(cols[4 + k], i, number);
        }
        if (!(v = get_or_none(entry, S_md5)))
            goto error;
        if (v == Py_None || PyUnicode_Check(v)) {
            Py_INCREF(v);
        } else if (!(v = PyObject_CallOneArg(md5_text, v))) {  /* json.dumps of a 0-d tensor's value */
            goto error;
        }
        PyList_SET_ITEM(cols[8], i, v);
        PyObject *flag_nan = empty ? Py_None : nan ? Py_True : Py_False;
        PyObject *flag_inf = empty ? Py_None : inf ? Py_True : Py_False;
        Py_INCREF(flag_nan);
        Py_INCREF(flag_inf);
        PyList_SET_ITEM(cols[9], i, flag_nan);
        PyList_SET_ITEM(cols[10], i, flag_inf);
        if (!(v = get_or_none(entry, S_requires_grad)))
            goto error;
        v = PyBool_Check(v) ? v : Py_None;
        Py_INCREF(v);
        PyList_SET_ITEM(cols[11], i, v);
        if (!(v = get_or_none(entry, S_data_name)))
            goto error;
        v = PyUnicode_Check(v) ? v : Py_None;
        Py_INCREF(v);
        PyList_SET_ITEM(cols[12], i, v);
    }
    Py_DECREF(f.entry);
    Py_DECREF(grad);
    Py_DECREF(debug);
    Py_DECREF(placeholder);
    return Py_BuildValue("(NNNNNNNNNNNNNNNN)", i64_bytes(&f.record), f.io, f.path, cols[0], cols[1], cols[2],
                         cols[3], cols[4], cols[5], cols[6], cols[7], cols[8], cols[9], cols[10], cols[11], cols[12]);
error:
    Py_XDECREF(f.io);
    Py_XDECREF(f.path);
    Py_XDECREF(f.entry);
    PyMem_Free(f.record.v);
    Py_XDECREF(grad);
    Py_XDECREF(debug);
    Py_XDECREF(placeholder);
    for (int c = 0; c < 13; c++)
        Py_XDECREF(cols[c]);
    return NULL;
}

/* ------------------------------------------------------------------ compare's CSV rows */

/* the characters that make a CSV cell quoted */
static const unsigned char QUOTED[256] = {[','] = 1, ['"'] = 1, ['\n'] = 1, ['\r'] = 1};

static int needs_quote(const char *text, Py_ssize_t size) {
    const unsigned char *t = (const unsigned char *)text;
    for (Py_ssize_t i = 0; i < size; i++)
        if (QUOTED[t[i]])
            return 1;
    return 0;
}

/* a str cell's UTF-8 (ASCII read in place) */
static inline const char *cell_text(PyObject *cell, Py_ssize_t *size) {
    if (PyUnicode_IS_COMPACT_ASCII(cell)) {
        *size = PyUnicode_GET_LENGTH(cell);
        return (const char *)(((PyASCIIObject *)cell) + 1);
    }
    return PyUnicode_AsUTF8AndSize(cell, size);
}

static Py_ssize_t repr_cell(const char *cell, Py_ssize_t size, double x, char *buf);
static int next_cell(const char **at, const char *end, const char **cell, Py_ssize_t *size);

/* a column of floats written as text (csv_rows' tuple column): orjson's text of the values, the
 * values, the suffix after each, and per row a str that stands instead (or None) */
typedef struct {
    Py_buffer text, values;
    const char *at, *end, *suffix;
    Py_ssize_t suffix_size;
    PyObject *overrides;
} FloatColumn;

/* the tuple column ``column`` read into *f (its buffers held): 1, 0 where it is not one of
 * ``nrows`` rows (the caller declines), -1 on an error */
static int float_column(PyObject *column, Py_ssize_t nrows, FloatColumn *f) {
    PyObject *text, *values, *suffix, *overrides;
    if (!PyArg_ParseTuple(column, "OOUO!", &text, &values, &suffix, &PyList_Type, &overrides))
        return -1;
    f->suffix = PyUnicode_AsUTF8AndSize(suffix, &f->suffix_size);
    if (!f->suffix)
        return -1;
    if (PyObject_GetBuffer(text, &f->text, PyBUF_SIMPLE) < 0)
        return -1;
    if (PyObject_GetBuffer(values, &f->values, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&f->text);
        return -1;
    }
    f->overrides = overrides;
    const char *t = (const char *)f->text.buf;
    Py_ssize_t size = f->text.len, cells = 1;
    int ok = f->values.len == nrows * (Py_ssize_t)sizeof(double) && PyList_GET_SIZE(overrides) == nrows
             && f->suffix_size <= 8 && size >= 2 && t[0] == '[' && t[size - 1] == ']';
    for (const char *c = t; ok && (c = memchr(c, ',', (size_t)(t + size - c))) != NULL; c++)
        cells++;  /* orjson's cells are numbers or null: a comma is a separator */
    if (!ok || cells != nrows) {
        PyBuffer_Release(&f->text);
        PyBuffer_Release(&f->values);
        return 0;
    }
    f->at = t + 1;
    f->end = t + size - 1;
    return 1;
}

/* csv_rows(columns) -> bytes or None: the rows of ``columns`` as compare/_write.write_columns
 * writes them (UTF-8, a cell quoted RFC 4180-style only where it holds , " CR or LF, "\r\n" after
 * every row). A column is a list of str, or a tuple (orjson's text of n float64s, their buffer,
 * suffix, overrides: a list of n str or None): row r holds overrides[r], or where that is None
 * repr(values[r]) + suffix (as _leafwalk.float_texts writes it). None where a cell is no str or
 * the columns do not line up (the Python code decides). One pass, row by row, into a bytes object
 * that grows as needed. */
static PyObject *csv_rows(PyObject *self, PyObject *arg) {
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "a list of columns");
        return NULL;
    }
    Py_ssize_t ncols = PyList_GET_SIZE(arg), nrows = -1;
    for (Py_ssize_t c = 0; c < ncols; c++) {
        PyObject *column = PyList_GET_ITEM(arg, c);
        Py_ssize_t rows;
        if (PyList_Check(column))
            rows = PyList_GET_SIZE(column);
        else if (PyTuple_Check(column) && PyTuple_GET_SIZE(column) == 4 && PyList_Check(PyTuple_GET_ITEM(column, 3)))
            rows = PyList_GET_SIZE(PyTuple_GET_ITEM(column, 3));
        else
            Py_RETURN_NONE;
        if (nrows < 0)
            nrows = rows;
        else if (rows != nrows)
            Py_RETURN_NONE;  /* zip() stops at the shortest: the Python code decides */
    }
    if (ncols == 0 || nrows <= 0)
        return PyBytes_FromStringAndSize(NULL, 0);
    PyObject **cols = PyMem_Calloc((size_t)ncols, sizeof(PyObject *));
    FloatColumn *floats = PyMem_Calloc((size_t)ncols, sizeof(FloatColumn));
    PyObject *out = NULL;
    Py_ssize_t held = 0;  /* the float columns whose buffers are held: floats[0:held] in column order */
    int declined = 0;
    if (!cols || !floats) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t c = 0; c < ncols; c++) {
        PyObject *column = PyList_GET_ITEM(arg, c);
        if (PyList_Check(column)) {
            cols[c] = column;
            continue;
        }
        int rc = float_column(column, nrows, &floats[c]);
        if (rc <= 0) {
            declined = rc == 0;
            goto error;
        }
        held = c + 1;
    }
    Py_ssize_t capacity = nrows * (ncols * 24 + 2) + 1024, used = 0;
    out = PyBytes_FromStringAndSize(NULL, capacity);
    if (!out)
        goto error;
    char buf[96];
    for (Py_ssize_t r = 0; r < nrows; r++) {
        for (Py_ssize_t c = 0; c < ncols; c++) {
            PyObject *cell;
            const char *text;
            Py_ssize_t size;
            char *owned = NULL;  /* PyOS_double_to_string's text, freed below */
            const char *suffix = "";
            Py_ssize_t suffix_size = 0;
            if (cols[c]) {
                cell = PyList_GET_ITEM(cols[c], r);
            } else {
                FloatColumn *f = &floats[c];
                const char *at;
                Py_ssize_t at_size;
                if (next_cell(&f->at, f->end, &at, &at_size) < 0) {
                    declined = 1;
                    goto error;
                }
                cell = PyList_GET_ITEM(f->overrides, r);
                if (cell == Py_None) {
                    double x = ((const double *)f->values.buf)[r];
                    size = isfinite(x) ? repr_cell(at, at_size, x, buf) : -1;
                    if (size >= 0) {
                        text = buf;
                    } else {
                        owned = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
                        if (!owned)
                            goto error;
                        text = owned;
                        size = (Py_ssize_t)strlen(owned);
                    }
                    suffix = f->suffix;
                    suffix_size = f->suffix_size;
                    cell = NULL;
                }
            }
            int quote = 0;
            if (cell) {
                if (!PyUnicode_Check(cell)) {
                    declined = 1;
                    goto error;
                }
                text = cell_text(cell, &size);
                if (!text)
                    goto error;
                quote = needs_quote(text, size);
            }
            Py_ssize_t need = (quote ? 2 * size + 5 : size + 3) + suffix_size;  /* the cell, its separator, the row's end */
            if (used + need > capacity) {
                capacity = 2 * capacity + need;
                if (_PyBytes_Resize(&out, capacity) < 0) {
                    PyMem_Free(owned);
                    goto error;
                }
            }
            char *o = PyBytes_AS_STRING(out) + used;
            if (quote) {
                *o++ = '"';
                for (Py_ssize_t i = 0; i < size; i++) {
                    if (text[i] == '"')
                        *o++ = '"';
                    *o++ = text[i];
                }
                *o++ = '"';
            } else {
                memcpy(o, text, (size_t)size);
                o += size;
                memcpy(o, suffix, (size_t)suffix_size);
                o += suffix_size;
            }
            PyMem_Free(owned);
            if (c + 1 < ncols) {
                *o++ = ',';
            } else {
                *o++ = '\r';
                *o++ = '\n';
            }
            used = o - PyBytes_AS_STRING(out);
        }
    }
    if (_PyBytes_Resize(&out, used) < 0)
        goto error;
    goto done;
error:
    Py_CLEAR(out);
    if (declined) {
        PyErr_Clear();
        out = Py_None;
        Py_INCREF(out);
    }
done:
    for (Py_ssize_t c = 0; c < held; c++)
        if (!cols[c] && floats[c].text.obj) {
            PyBuffer_Release(&floats[c].text);
            PyBuffer_Release(&floats[c].values);
        }
    PyMem_Free(cols);
    PyMem_Free(floats);
    return out;
}

/* ------------------------------------------------------------------ float texts as repr writes them */

/* repr(x) + suffix through CPython's own float repr; a new reference */
static PyObject *repr_text(double x, const char *suffix, Py_ssize_t suffix_size) {
    char *text = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (!text)
        return NULL;
    size_t size = strlen(text);
    PyObject *out = PyUnicode_New((Py_ssize_t)size + suffix_size, 127);
    if (out) {
        memcpy(PyUnicode_DATA(out), text, size);
        memcpy((char *)PyUnicode_DATA(out) + size, suffix, (size_t)suffix_size);
    }
    PyMem_Free(text);
    return out;
}

/* one cell of orjson's text (cell[0:size], finite x) as repr lays it out, into buf (64 bytes and
 * more); its length, or -1 where the cell is not of a shape this knows (repr decides) */
static Py_ssize_t repr_cell(const char *cell, Py_ssize_t size, double x, char *buf) {
    if (size <= 0 || size > 40)
        return -1;
    double magnitude = fabs(x);
    if (magnitude >= 1e-5 && magnitude < 1e-4) {  /* orjson: 0.0000ddd; repr: d.ddde-05 */
        Py_ssize_t at = 0, n = 0;
        if (cell[0] == '-')
            buf[n++] = '-', at = 1;
        if (size - at < 7 || memcmp(cell + at, "0.0000", 6) != 0 || cell[at + 6] < '1' || cell[at + 6] > '9')
            return -1;
        const char *digits = cell + at + 6;
        Py_ssize_t count = size - at - 6;
        for (Py_ssize_t i = 0; i < count; i++)
            if (digits[i] < '0' || digits[i] > '9')
                return -1;
        buf[n++] = digits[0];
        if (count > 1) {
            buf[n++] = '.';
            memcpy(buf + n, digits + 1, (size_t)(count - 1));
            n += count - 1;
        }
        memcpy(buf + n, "e-05", 4);
        return n + 4;
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        char c = cell[i];
        if (!((c >= '0' && c <= '9') || c == '.' || c == '-' || c == '+' || c == 'e'))
            return -1;
    }
    memcpy(buf, cell, (size_t)size);
    if (size >= 3 && cell[size - 2] == '-' && cell[size - 3] == 'e') {  /* 1e-7: repr writes 1e-07 */
        buf[size - 1] = '0';
        buf[size] = cell[size - 1];
        return size + 1;
    }
    return size;
}

static PyObject *float_texts(PyObject *self, PyObject *args) {
    Py_buffer text, values;
    const char *suffix;
    Py_ssize_t suffix_size;
    if (!PyArg_ParseTuple(args, "y*y*s#", &text, &values, &suffix, &suffix_size))
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t count = values.len / (Py_ssize_t)sizeof(double);
    const double *x = (const double *)values.buf;
    const char *at = (const char *)text.buf, *end = at + text.len;
    if (values.len % (Py_ssize_t)sizeof(double) || suffix_size > 8 || text.len < 2 || at[0] != '[' || end[-1] != ']')
        goto decline;
    out = PyList_New(count);
    if (!out)
        goto done;
    at++;
    end--;
    char buf[96];
    for (Py_ssize_t i = 0; i < count; i++) {
        const char *stop = at;
        while (stop < end && *stop != ',')
            stop++;
        if (stop == end && i + 1 < count)
            goto decline;
        PyObject *cell;
        Py_ssize_t size = -1;
        if (isfinite(x[i]))
            size = repr_cell(at, stop - at, x[i], buf);
        if (size < 0) {
            cell = repr_text(x[i], suffix, suffix_size);
        } else {
            memcpy(buf + size, suffix, (size_t)suffix_size);
            cell = PyUnicode_New(size + suffix_size, 127);
            if (cell)
                memcpy(PyUnicode_DATA(cell), buf, (size_t)(size + suffix_size));
        }
        if (!cell) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, cell);
        at = stop + 1;
    }
    if (at != (count ? end + 1 : end))
        goto decline;
    goto done;
decline:
    Py_XDECREF(out);
    out = Py_None;
    Py_INCREF(out);
done:
    PyBuffer_Release(&text);
    PyBuffer_Release(&values);
    return out;
}

/* the next cell of orjson's text of an array: [*at, stop); 0, or -1 where the text ends early */
static int next_cell(const char **at, const char *end, const char **cell, Py_ssize_t *size) {
    const char *stop = *at;
    if (stop > end)
        return -1;
    while (stop < end && *stop != ',')
        stop++;
    *cell = *at;
    *size = stop - *at;
    *at = stop + 1;
    return 0;
}

/* repr(x) + suffix from orjson's cell of x; a new reference */
static PyObject *cell_repr(const char *cell, Py_ssize_t size, double x, const char *suffix, Py_ssize_t suffix_size) {
    char buf[96];
    Py_ssize_t n = isfinite(x) ? repr_cell(cell, size, x, buf) : -1;
    if (n < 0)
        return repr_text(x, suffix, suffix_size);
    memcpy(buf + n, suffix, (size_t)suffix_size);
    PyObject *out = PyUnicode_New(n + suffix_size, 127);
    if (out)
        memcpy(PyUnicode_DATA(out), buf, (size_t)(n + suffix_size));
    return out;
}

static PyObject *stat_diffs(PyObject *self, PyObject *args) {
    Py_buffer b[8];
    int lazy = 0;
    memset(b, 0, sizeof(b));
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*|p", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5], &b[6], &b[7], &lazy))
        return NULL;
    PyObject *diff_list = NULL, *rel_list = NULL, *rel_out = NULL, *none = NULL, *is_percent = NULL, *result = NULL;
    Py_ssize_t count = b[0].len / (Py_ssize_t)sizeof(double);
    int ok = 1;
    for (int k = 0; k < 5; k++)
        ok &= b[k].len == count * (Py_ssize_t)sizeof(double);
    ok &= b[5].len == count && b[6].len >= 2 && b[7].len >= 2;
    const char *dt = (const char *)b[6].buf, *pt = (const char *)b[7].buf;
    ok = ok && (lazy || (dt[0] == '[' && dt[b[6].len - 1] == ']' && pt[0] == '[' && pt[b[7].len - 1] == ']'));
    if (!ok)
        goto decline;
    const double *target = b[0].buf, *bench = b[1].buf, *difference = b[2].buf, *relative = b[3].buf,
                 *percent = b[4].buf;
    const unsigned char *numeric = b[5].buf;
    diff_list = PyList_New(count);
    rel_list = PyList_New(count);
    rel_out = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(double));
    none = PyBytes_FromStringAndSize(NULL, count);
    is_percent = PyBytes_FromStringAndSize(NULL, count);
    if (!diff_list || !rel_list || !rel_out || !none || !is_percent)
        goto error;
    double *rel = (double *)PyBytes_AS_STRING(rel_out);
    char *none_at = PyBytes_AS_STRING(none), *percent_at = PyBytes_AS_STRING(is_percent);
    const char *d_at = dt + 1, *d_end = dt + b[6].len - 1, *p_at = pt + 1, *p_end = pt + b[7].len - 1;
    for (Py_ssize_t i = 0; i < count; i++) {
        const char *d_cell = NULL, *p_cell = NULL;
        Py_ssize_t d_size = 0, p_size = 0;
        if (!lazy && (next_cell(&d_at, d_end, &d_cell, &d_size) < 0 || next_cell(&p_at, p_end, &p_cell, &p_size) < 0))
            goto decline;
        rel[i] = NAN;
        none_at[i] = 0;
        percent_at[i] = 0;
        PyObject *diff_text, *rel_text;
        if (!numeric[i]) {
            Py_INCREF(Py_None);
            Py_INCREF(Py_None);
            PyList_SET_ITEM(diff_list, i, Py_None);
            PyList_SET_ITEM(rel_list, i, Py_None);
            continue;
        }
        double t = target[i], be = bench[i], d = difference[i];
        int zero = d == 0 || (isnan(d) && ((isnan(t) && isnan(be)) || t == be));
        int nan_ = !zero && isnan(d);
        if (zero) {
            diff_text = Py_NewRef(S_zero);
            rel_text = Py_NewRef(S_zero);
            rel[i] = 0.0;
        } else if (nan_) {
            diff_text = Py_NewRef(S_nan);
            rel_text = Py_NewRef(S_nan);
        } else {
            diff_text = lazy ? Py_NewRef(Py_None) : cell_repr(d_cell, d_size, d, "", 0);
            if (be == 0) {
                rel_text = Py_NewRef(S_inf);
                rel[i] = INFINITY;
            } else if (isinf(be)) {
                rel_text = Py_NewRef(S_NA);
                none_at[i] = 1;
            } else {
                rel_text = lazy ? Py_NewRef(Py_None) : cell_repr(p_cell, p_size, percent[i], "%", 1);
                rel[i] = relative[i];
                percent_at[i] = 1;
            }
        }
        if (!diff_text || !rel_text) {
            Py_XDECREF(diff_text);
            Py_XDECREF(rel_text);
            goto error;
        }
        PyList_SET_ITEM(diff_list, i, diff_text);
        PyList_SET_ITEM(rel_list, i, rel_text);
    }
    if (!lazy && (d_at != (count ? d_end + 1 : d_end) || p_at != (count ? p_end + 1 : p_end)))
        goto decline;
    result = Py_BuildValue("(NNNNN)", diff_list, rel_list, rel_out, none, is_percent);
    diff_list = rel_list = rel_out = none = is_percent = NULL;
    goto done;
decline:
    result = Py_None;
    Py_INCREF(result);
error:
done:
    Py_XDECREF(diff_list);
    Py_XDECREF(rel_list);
    Py_XDECREF(rel_out);
    Py_XDECREF(none);
    Py_XDECREF(is_percent);
    for (int k = 0; k < 8; k++)
        if (b[k].obj)
            PyBuffer_Release(&b[k]);
    return result;
}

/* ------------------------------------------------------------------ a leaf table's stand-in records */

static PyObject *stand_in(Py_ssize_t i) {
    PyObject *leaf = PyDict_New(), *at = PyLong_FromSsize_t(i);
    if (!leaf || !at || PyDict_SetItem(leaf, S_type, at) < 0) {
        Py_XDECREF(leaf);
        Py_XDECREF(at);
        return NULL;
    }
    Py_DECREF(at);
    return leaf;
}

/* {rests[start:stop] -> stand-ins} into group; 1 where a key repeats, -1 on an error */
static int fill_group(PyObject *group, PyObject *rests, Py_ssize_t start, Py_ssize_t stop) {
    for (Py_ssize_t i = start; i < stop; i++) {
        PyObject *key = PyList_GET_ITEM(rests, i);
        if (key == Py_None)
            return 1;
        int in = PyDict_Contains(group, key);
        if (in)
            return in;
        PyObject *leaf = stand_in(i);
        if (!leaf)
            return -1;
        int rc = PyDict_SetItem(group, key, leaf);
        Py_DECREF(leaf);
        if (rc < 0)
            return -1;
    }
    return 0;
}

static PyObject *stand_ins(PyObject *self, PyObject *args) {
    PyObject *names, *group_rec, *bounds, *ios, *rests, *flat;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O", &PyList_Type, &names, &PyList_Type, &group_rec, &PyList_Type, &bounds,
                          &PyList_Type, &ios, &PyList_Type, &rests, &flat))
        return NULL;
    Py_ssize_t groups = PyList_GET_SIZE(group_rec), count = PyList_GET_SIZE(rests);
    if (PyList_GET_SIZE(bounds) != groups + 1 || PyList_GET_SIZE(ios) != count) {
        PyErr_SetString(PyExc_ValueError, "stand_ins: bounds, ios and rests disagree");
        return NULL;
    }
    PyObject *out = PyDict_New();
    if (!out)
        return NULL;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(names); k++) {
        PyObject *empty = PyDict_New();
        int rc = empty ? PyDict_SetItem(out, PyList_GET_ITEM(names, k), empty) : -1;
        Py_XDECREF(empty);
        if (rc < 0)
            goto error;
    }
    for (Py_ssize_t g = 0; g < groups; g++) {
        Py_ssize_t r = PyLong_AsSsize_t(PyList_GET_ITEM(group_rec, g));
        Py_ssize_t start = PyLong_AsSsize_t(PyList_GET_ITEM(bounds, g));
        Py_ssize_t stop = PyLong_AsSsize_t(PyList_GET_ITEM(bounds, g + 1));
        if (PyErr_Occurred())
            goto error;
        if (r < 0 || r >= PyList_GET_SIZE(names) || start < 0 || stop > count || start >= stop) {
            PyErr_SetString(PyExc_ValueError, "stand_ins: a group out of range");
            goto error;
        }
        PyObject *name = PyList_GET_ITEM(names, r);
        PyObject *record = PyDict_GetItemWithError(out, name);  /* borrowed */
        if (!record)
            goto error;
        int is_flat = PySet_Contains(flat, name);
        if (is_flat < 0)
            goto error;
        int bare = PyList_GET_ITEM(rests, start) == Py_None;
        if (!is_flat) {
            PyObject *io = PyList_GET_ITEM(ios, start);
            if (!PyDict_Check(record))
                goto decline;
            int in = PyDict_Contains(record, io);
            if (in < 0)
                goto error;
            if (in)
                goto decline;  /* an io's leaves apart from each other (the walk would join them) */
            PyObject *value = bare ? (stop - start == 1 ? stand_in(start) : NULL) : PyDict_New();
            if (!value) {
                if (PyErr_Occurred())
                    goto error;
                goto decline;
            }
            int rc = PyDict_SetItem(record, io, value);
            Py_DECREF(value);
            if (rc < 0)
                goto error;
            if (!bare) {
                rc = fill_group(value, rests, start, stop);
                if (rc < 0)
                    goto error;
                if (rc)
                    goto decline;
            }
            continue;
        }
        if (bare) {
            if (stop - start != 1 || !PyDict_Check(record) || PyDict_GET_SIZE(record))
                goto decline;
            PyObject *leaf = stand_in(start);
            int rc = leaf ? PyDict_SetItem(out, name, leaf) : -1;
            Py_XDECREF(leaf);
            if (rc < 0)
                goto error;
            continue;
        }
        if (!PyDict_Check(record) || PyDict_GetItemWithError(record, S_type))
            goto decline;
        if (PyErr_Occurred())
            goto error;
        int rc = fill_group(record, rests, start, stop);
        if (rc < 0)
            goto error;
        if (rc)
            goto decline;
    }
    return out;
decline:
    Py_DECREF(out);
    Py_RETURN_NONE;
error:
    Py_DECREF(out);
    return NULL;
}

/* ------------------------------------------------------------------ Arrow column buffers */

typedef struct {
    char *v;
    Py_ssize_t n, cap;
} Buf;

static int buf_put(Buf *b, const void *data, Py_ssize_t size) {
    if (b->n + size > b->cap) {
        Py_ssize_t cap = b->cap ? 2 * b->cap : 4096;
        while (cap < b->n + size)
            cap *= 2;
        char *v = PyMem_Realloc(b->v, (size_t)cap);
        if (!v) {
            PyErr_NoMemory();
            return -1;
        }
        b->v = v;
        b->cap = cap;
    }
    if (size)
        memcpy(b->v + b->n, data, (size_t)size);
    b->n += size;
    return 0;
}

/* the buffer as bytes (at least ``floor`` of them, zeros after what was put); frees it */
static PyObject *buf_bytes(Buf *b, Py_ssize_t floor) {
    PyObject *out = PyBytes_FromStringAndSize(NULL, b->n > floor ? b->n : floor);
    if (out) {
        char *to = PyBytes_AS_STRING(out);
        if (b->n)
            memcpy(to, b->v, (size_t)b->n);
        if (floor > b->n)
            memset(to + b->n, 0, (size_t)(floor - b->n));
    }
    PyMem_Free(b->v);
    b->v = NULL;
    b->n = b->cap = 0;
    return out;
}

#define NULL_VALUE 2

/* value of a column of ``kind`` into its buffers: 0 a value, NULL_VALUE null, DECLINE another type, -1 error */
static int column_value(PyObject *value, char kind, Buf *values, Buf *data, Buf *bits, Py_ssize_t row) {
    if (value == Py_None) {
        if (kind == 's' || kind == 'l') {
            int32_t at = (int32_t)data->n;
            if (kind == 'l')
                at = (int32_t)(data->n / (Py_ssize_t)sizeof(int64_t));
            return buf_put(values, &at, sizeof at) < 0 ? -1 : NULL_VALUE;
        }
        if (kind != 'b') {
            int64_t zero = 0;
            return buf_put(values, &zero, sizeof zero) < 0 ? -1 : NULL_VALUE;
        }
        return NULL_VALUE;
    }
    if (kind == 's') {
        Py_ssize_t size;
        const char *text;
        if (!PyUnicode_Check(value))
            return DECLINE;
        if (!(text = PyUnicode_AsUTF8AndSize(value, &size))) {
            PyErr_Clear();  /* a lone surrogate: pyarrow says what it says of it */
            return DECLINE;
        }
        if (data->n + size > INT32_MAX)
            return DECLINE;
        if (buf_put(data, text, size) < 0)
            return -1;
        int32_t at = (int32_t)data->n;
        return buf_put(values, &at, sizeof at) < 0 ? -1 : 0;
    }
    if (kind == 'd') {
        double d;
        if (PyFloat_CheckExact(value))
            d = PyFloat_AS_DOUBLE(value);
        else if (PyLong_CheckExact(value)) {  /* pyarrow takes the ints a double holds exactly */
            int overflow = 0;
            long long q = PyLong_AsLongLongAndOverflow(value, &overflow);
            if (overflow || (q == -1 && PyErr_Occurred()) || q > (1LL << 53) || q < -(1LL << 53)) {
                PyErr_Clear();
                return DECLINE;
            }
            d = (double)q;
        } else
            return DECLINE;
        return buf_put(values, &d, sizeof d) < 0 ? -1 : 0;
    }
    if (kind == 'q') {
        int overflow = 0;
        if (!PyLong_CheckExact(value))
            return DECLINE;
        long long q = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow || (q == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return DECLINE;
        }
        int64_t v = (int64_t)q;
        return buf_put(values, &v, sizeof v) < 0 ? -1 : 0;
    }
    if (kind == 'b') {
        if (!PyBool_Check(value))
            return DECLINE;
        if (value == Py_True)
            bits->v[row >> 3] |= (char)(1 << (row & 7));
        return 0;
    }
    /* 'l': a list of int64s */
    if (!PyList_CheckExact(value))
        return DECLINE;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(value); k++) {
        int rc = column_value(PyList_GET_ITEM(value, k), 'q', data, NULL, NULL, 0);
        if (rc)
            return rc == NULL_VALUE ? DECLINE : rc;  /* a null dimension: pyarrow's to say */
    }
    if (data->n / (Py_ssize_t)sizeof(int64_t) > INT32_MAX)
        return DECLINE;
    int32_t at = (int32_t)(data->n / (Py_ssize_t)sizeof(int64_t));
    return buf_put(values, &at, sizeof at) < 0 ? -1 : 0;
}

/* arrow_column(values, kind, index) -> (null count, validity, values buffer, data buffer) or None:
 * see the header */
static PyObject *arrow_column(PyObject *self, PyObject *args) {
    PyObject *list, *index;
    int kind;
    if (!PyArg_ParseTuple(args, "O!CO", &PyList_Type, &list, &kind, &index))
        return NULL;
    if (!strchr("sdqbl", kind) || kind == 0) {
        PyErr_SetString(PyExc_ValueError, "kind: one of s, d, q, b, l");
        return NULL;
    }
    Py_buffer view = {0};
    const int64_t *at = NULL;
    Py_ssize_t count = PyList_GET_SIZE(list), size = PyList_GET_SIZE(list);
    if (index != Py_None) {
        if (PyObject_GetBuffer(index, &view, PyBUF_SIMPLE) < 0)
            return NULL;
        at = (const int64_t *)view.buf;
        count = view.len / (Py_ssize_t)sizeof(int64_t);
    }
    Py_ssize_t bitbytes = (count + 7) / 8;
    Buf values = {0}, data = {0}, bits = {0}, valid = {0};
    PyObject *out = NULL;
    Py_ssize_t nulls = 0;
    int rc = 0;
    if (!(valid.v = PyMem_Calloc((size_t)(bitbytes + 1), 1))) {
        PyErr_NoMemory();
        goto done;
    }
    valid.cap = bitbytes + 1;
    valid.n = bitbytes;
    if (kind == 'b') {
        if (!(bits.v = PyMem_Calloc((size_t)(bitbytes + 1), 1))) {
            PyErr_NoMemory();
            goto done;
        }
        bits.cap = bitbytes + 1;
        bits.n = bitbytes;
    }
    if (kind == 's' || kind == 'l') {
        int32_t zero = 0;
        if (buf_put(&values, &zero, sizeof zero) < 0)
            goto done;
    }
    for (Py_ssize_t row = 0; row < count; row++) {
        int64_t from = at ? at[row] : row;
        if (from >= size) {
            PyErr_SetString(PyExc_IndexError, "an index beyond the values");
            goto done;
        }
        rc = column_value(from < 0 ? Py_None : PyList_GET_ITEM(list, from), (char)kind, &values, &data, &bits, row);
        if (rc < 0)
            goto done;
        if (rc == DECLINE)
            break;
        if (rc == NULL_VALUE)
            nulls++;
        else
            valid.v[row >> 3] |= (char)(1 << (row & 7));
        rc = 0;
    }
    if (rc == DECLINE) {
        Py_INCREF(Py_None);
        out = Py_None;
        goto done;
    }
    PyObject *validity = nulls ? buf_bytes(&valid, 0) : (Py_INCREF(Py_None), Py_None);
    PyObject *first = kind == 'b' ? buf_bytes(&bits, 0) : buf_bytes(&values, 0);
    PyObject *second = (kind == 's' || kind == 'l') ? buf_bytes(&data, 0) : (Py_INCREF(Py_None), Py_None);
    if (validity && first && second)
        out = Py_BuildValue("(nNNN)", nulls, validity, first, second);
    else {
        Py_XDECREF(validity);
        Py_XDECREF(first);
        Py_XDECREF(second);
    }
done:
    PyMem_Free(values.v);
    PyMem_Free(data.v);
    PyMem_Free(bits.v);
    PyMem_Free(valid.v);
    if (at)
        PyBuffer_Release(&view);
    return out;
}

/* ------------------------------------------------------------------ the leaf table's rests */

/* whether ``name`` holds ``part`` / ends with ``tail`` (-1 error) */
static int name_has(PyObject *name, const char *part, int at_end) {
    PyObject *p = PyUnicode_FromString(part);
    if (!p)
        return -1;
    Py_ssize_t got = at_end ? PyUnicode_Tailmatch(name, p, 0, PY_SSIZE_T_MAX, 1)
                            : PyUnicode_Find(name, p, 0, PY_SSIZE_T_MAX, 1) >= 0;
    Py_DECREF(p);
    return PyErr_Occurred() ? -1 : (int)got;
}

static PyObject *rests(PyObject *self, PyObject *args) {
    PyObject *names, *starts, *suffixes, *ios;
    if (!PyArg_ParseTuple(args, "O!O!O!O!", &PyList_Type, &names, &PyList_Type, &starts, &PyList_Type, &suffixes,
                          &PyList_Type, &ios))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(suffixes);
    if (PyList_GET_SIZE(starts) != PyList_GET_SIZE(names) + 1 || PyList_GET_SIZE(ios) != count) {
        PyErr_SetString(PyExc_ValueError, "a start per name and one more, an io per suffix");
        return NULL;
    }
    PyObject *out = PyList_New(count);
    if (!out)
        return NULL;
    for (Py_ssize_t r = 0; r < PyList_GET_SIZE(names); r++) {
        PyObject *name = PyList_GET_ITEM(names, r);
        Py_ssize_t start = PyLong_AsSsize_t(PyList_GET_ITEM(starts, r)),
                   stop = PyLong_AsSsize_t(PyList_GET_ITEM(starts, r + 1));
        if (PyErr_Occurred() || !PyUnicode_Check(name) || start < 0 || stop < start || stop > count)
            goto decline;
        int grad = name_has(name, ".parameters_grad", 0), debug = name_has(name, ".debug", 1);
        if (grad < 0 || debug < 0)
            goto error;
        for (Py_ssize_t i = start; i < stop; i++) {
            PyObject *suffix = PyList_GET_ITEM(suffixes, i), *io = PyList_GET_ITEM(ios, i), *rest;
            if (!PyUnicode_Check(suffix))
                goto decline;
            if (grad || debug) {  /* flat: the suffix (None: the debug record's value is the leaf itself) */
                int bare = debug && stop - start == 1 && PyUnicode_GET_LENGTH(suffix) == 0;
                rest = bare ? Py_None : suffix;
                Py_INCREF(rest);
            } else {  /* the suffix less its io (None: the leaf is the io's value itself) */
                if (!PyUnicode_Check(io))
                    goto decline;
                int same = PyUnicode_Compare(suffix, io);
                if (same == -1 && PyErr_Occurred())
                    goto error;
                Py_ssize_t cut = PyUnicode_GET_LENGTH(io) + 1;
                if (same == 0) {
                    rest = Py_None;
                    Py_INCREF(rest);
                } else if (!(rest = PyUnicode_Substring(suffix, cut < PyUnicode_GET_LENGTH(suffix) ? cut
                                                        : PyUnicode_GET_LENGTH(suffix), PY_SSIZE_T_MAX)))
                    goto error;
            }
            PyList_SET_ITEM(out, i, rest);
        }
    }
    for (Py_ssize_t i = 0; i < count; i++)
        if (!PyList_GET_ITEM(out, i))
            goto decline;  /* a leaf of no record */
    return out;
decline:
    PyErr_Clear();
    Py_DECREF(out);
    Py_RETURN_NONE;
error:
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"stand_ins", stand_ins, METH_VARARGS, "compare's stand-in records of a leaf table (or None)"},
    {"leaves", leaves, METH_VARARGS, "every record's leaves as record_leaves walks them (or None)"},
    {"plan_block", plan_block, METH_VARARGS, "compare's rows of some record pairs (or None)"},
    {"leaf_fields", leaf_fields, METH_VARARGS, "Leaves.finish's columns"},
    {"index_rows", index_rows, METH_VARARGS, "the Parquet index's tensor columns of some records (or None)"},
    {"csv_rows", csv_rows, METH_O, "compare's CSV rows of some columns, as UTF-8 (or None)"},
    {"float_texts", float_texts, METH_VARARGS, "repr(x) + suffix of each float64, from orjson's text (or None)"},
    {"stat_diffs", stat_diffs, METH_VARARGS, "compare's diff and relative-error cells of one statistic (or None)"},
    {"has_long_integer", has_long_integer, METH_O, "fastjson._has_long_integer"},
    {"document_marks", document_marks, METH_O, "1: a long integer, else 2: a NaN/Infinity token, else 0"},
    {"with_stand_ins", with_stand_ins, METH_O, "fastjson._with_stand_ins (without the positions)"},
    {"restore_nonfinite", restore_nonfinite, METH_VARARGS, "the stand-ins put back everywhere: their count, or None"},
    {"rests", rests, METH_VARARGS, "the leaf table's rests (or None)"},
    {"arrow_column", arrow_column, METH_VARARGS, "an Arrow column's buffers of a list of values (or None)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_leafwalk", NULL, -1, methods};

#define INTERN(var, text) if (!(var = PyUnicode_InternFromString(text))) return NULL

PyMODINIT_FUNC PyInit__leafwalk(void) {
    INTERN(S_type, "type");
    INTERN(S_dtype, "dtype");
    INTERN(S_shape, "shape");
    INTERN(S_data_name, "data_name");
    INTERN(S_requires_grad, "requires_grad");
    INTERN(S_md5, "md5");
    INTERN(S_value, "value");
    INTERN(S_input, "input");
    INTERN(S_output, "output");
    INTERN(S_parameters, "parameters");
    INTERN(S_parameters_grad, "parameters_grad");
    INTERN(S_debug, "debug");
    INTERN(S_kwargs, "kwargs");
    INTERN(S_input_args, "input_args");
    INTERN(S_input_kwargs, "input_kwargs");
    INTERN(S_is_recompute, "is_recompute");
    INTERN(S_NA, "N/A");
    INTERN(S_zero, "0");
    INTERN(S_nan, "nan");
    INTERN(S_inf, "inf");
    INTERN(S_empty, "");
    INTERN(S_dot, ".");
    INTERN(S_true, "True");
    INTERN(S_false, "False");
    INTERN(S_minus1, "-1");
    INTERN(S_empty_list_text, "[]");
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "VERSION", LEAFWALK_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
