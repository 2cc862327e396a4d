/* compare's leaf columns of a dump.json straight from its bytes, in C: no Python object per JSON value.
 *
 * msprobe/format/native.py loads it (built at install, or at first use); msprobe/compare/_scanned.py
 * turns its answer into the side compare's engine reads (a walked side and leaf columns, as of a leaf
 * table: msprobe/compare/_indexed.py), and tests/compare/test_docscan.py holds it equal to the parsed path.
 *
 *   scan(data) -> tuple or None
 *     (task, names, spans, bounds, suffixes, ios, tensor, dtype, shape, requires_grad, (max, min, mean,
 *      norm), numbers, codes, md5, data_name, odd, header, nonfinite)
 *     names: the records in document order; spans: int64 bytes (start, end) of each record's value;
 *     the leaves as compare's walk (_rows.record_leaves) meets them, numbered in that order: bounds
 *     (int64 bytes: each record's first leaf, then the end), each leaf's suffix and io (the planner
 *     takes them as a walked side, _leafwalk.plan_block); per leaf i: tensor (bytes, 0/1), dtype /
 *     shape / requires_grad texts as Leaves.finish makes them, the four statistics as json.loads gives
 *     them, ``numbers`` (4 float64 buffers) and ``codes`` (4 int8 buffers: 0 float, 1 int, 2 anything
 *     else, 3 str) as _floattext.number_columns reads them, md5 text (md5 mode's; None for a scalar
 *     argument: its CRC text, crc_text(value), is the caller's), data_name (str or None); odd: [(i,
 *     start, end)] of the leaves left to the Python code (a leaf of another shape: the caller fills
 *     their cells from json.loads of their bytes); header: [(key, start, end)] of each top-level
 *     member but "data" (its value's bytes); nonfinite: whether a NaN or +-Infinity token is anywhere
 *     in the bytes taken.
 *
 * None (never an error) wherever the bytes are not what the scanner fully understands: malformed
 * JSON, a string with an escape where its text is used, a duplicate key, an integer beyond 18
 * digits, nesting deeper than MAX_DEPTH, a path longer than PATH_BYTES, a document without "data"... The caller then parses the
 * document as before, which gives the same answers (and the same typed errors for bad input).
 * Every allocation is bounded by the input's size (the lists grow by what the bytes hold).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define DOCSCAN_VERSION 1  /* bump with every change: a stale build is then rebuilt */
#define MAX_DEPTH 200
#define DECLINE 1
#define KEY 2  /* next_key: a member's key read */
#define PATH_BYTES 4096  /* a leaf's path longer than this: declined */

typedef struct {
    char *data;
    Py_ssize_t size, cap;
} Buf;

static int buf_put(Buf *b, const void *v, Py_ssize_t n) {
    if (b->size + n > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap : 4096;
        while (cap < b->size + n)
            cap *= 2;
        char *d = PyMem_Realloc(b->data, (size_t)cap);
        if (!d) {
            PyErr_NoMemory();
            return -1;
        }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->size, v, (size_t)n);
    b->size += n;
    return 0;
}

static PyObject *buf_bytes(Buf *b) {
    return PyBytes_FromStringAndSize(b->data ? b->data : "", b->size);
}

/* a small cache of texts by their bytes: the few dtypes, shapes, keys a document repeats */
#define CACHE_SLOTS 256
typedef struct {
    PyObject *text[CACHE_SLOTS];
    char *bytes[CACHE_SLOTS];
    Py_ssize_t size[CACHE_SLOTS];
} Cache;

static void cache_clear(Cache *c) {
    for (int i = 0; i < CACHE_SLOTS; i++) {
        Py_CLEAR(c->text[i]);
        PyMem_Free(c->bytes[i]);
        c->bytes[i] = NULL;
    }
}

/* the str of UTF-8 bytes (a new reference; NULL with UnicodeDecodeError cleared: the caller declines) */
static PyObject *cached_text(Cache *c, const char *s, Py_ssize_t n) {
    uint32_t h = 2166136261u;
    for (Py_ssize_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 16777619u;
    int slot = (int)(h % CACHE_SLOTS);
    if (c->text[slot] && c->size[slot] == n && memcmp(c->bytes[slot], s, (size_t)n) == 0) {
        Py_INCREF(c->text[slot]);
        return c->text[slot];
    }
    PyObject *t = PyUnicode_DecodeUTF8(s, n, NULL);
    if (!t)
        return NULL;
    if (n <= 256) {
        char *copy = PyMem_Malloc((size_t)n + 1);
        if (copy) {
            memcpy(copy, s, (size_t)n);
            Py_XDECREF(c->text[slot]);
            PyMem_Free(c->bytes[slot]);
            c->text[slot] = t;
            Py_INCREF(t);
            c->bytes[slot] = copy;
            c->size[slot] = n;
        }
    }
    return t;
}

static PyObject *S_type, *S_NA, *S_true, *S_false, *S_none_text, *S_empty_list;
static PyObject *S_scalar[4];  /* "<class 'int'>", float, bool, str */
static const char *SCALAR_NAMES[4] = {"int", "float", "bool", "str"};

typedef struct {
    const unsigned char *base, *p, *end;
    Cache keys, texts;
    Py_ssize_t leaves;
    int nonfinite;  /* a NaN or +-Infinity token seen */
    int x87;        /* fast_double may be used (x87_precise) */
    /* columns */
    Buf tensor, numbers[4], codes[4];
    PyObject *dtype, *shape, *rg, *stats[4], *md5, *data_name, *odd;
    /* the walk: the current leaf path's bytes (strip: 0 as it is, 1 its first byte dropped, 2 its
     * leading dots), the current io (borrowed), each leaf's suffix and io in walk order */
    char path[PATH_BYTES];
    Py_ssize_t path_len;
    int strip;
    PyObject *io, *io_held, *suffixes, *ios;
    Cache suffix_texts;
} Scan;

static inline void ws(Scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t'))
        s->p++;
}

/* one UTF-8 sequence at p (its first byte >= 0x80) as Python's strict decoder takes it: its length, 0 if invalid */
static int utf8_seq(const unsigned char *p, const unsigned char *end) {
    unsigned char c = p[0];
    if (c >= 0xC2 && c <= 0xDF)
        return end - p >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (end - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80)
            return 0;
        if (c == 0xE0 && p[1] < 0xA0)
            return 0;  /* overlong */
        if (c == 0xED && p[1] >= 0xA0)
            return 0;  /* a surrogate */
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (end - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80)
            return 0;
        if (c == 0xF0 && p[1] < 0x90)
            return 0;
        if (c == 0xF4 && p[1] >= 0x90)
            return 0;
        return 4;
    }
    return 0;
}

static inline int hexdigit(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* a string at p ('"'): its content's bytes [*start, *start + *n), whether it holds an escape; 0 or DECLINE */
static int string_at(Scan *s, const unsigned char **start, Py_ssize_t *n, int *escaped) {
    const unsigned char *p = s->p + 1, *end = s->end;
    *escaped = 0;
    *start = p;
    while (p < end) {
        unsigned char c = *p;
        if (c == '"') {
            *n = p - *start;
            s->p = p + 1;
            return 0;
        }
        if (c < 0x20)
            return DECLINE;  /* json.loads refuses control characters in strings */
        if (c == '\\') {
            *escaped = 1;
            if (p + 1 >= end)
                return DECLINE;
            unsigned char e = p[1];
            if (e == 'u') {
                if (end - p < 6 || !hexdigit(p[2]) || !hexdigit(p[3]) || !hexdigit(p[4]) || !hexdigit(p[5]))
                    return DECLINE;
                p += 6;
            } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
                p += 2;
            } else {
                return DECLINE;
            }
            continue;
        }
        if (c >= 0x80) {
            int k = utf8_seq(p, end);
            if (!k)
                return DECLINE;
            p += k;
            continue;
        }
        p++;
    }
    return DECLINE;
}

/* a string's text without escapes (a new reference via the cache; NULL+no error: DECLINE) */
static PyObject *text_at(Scan *s, Cache *c) {
    const unsigned char *start;
    Py_ssize_t n;
    int escaped;
    if (string_at(s, &start, &n, &escaped) || escaped)
        return NULL;
    PyObject *t = cached_text(c, (const char *)start, n);
    if (!t)
        PyErr_Clear();  /* (validated above: does not happen) */
    return t;
}

enum { V_NONE, V_FLOAT, V_INT, V_TRUE, V_FALSE, V_STR, V_OTHER };

/* float(text) of a number already checked by JSON's grammar, where it can be had exactly without
 * _Py_dg_strtod: at most 19 significant digits and a power of ten up to 27, divided or multiplied in
 * x87's 64-bit long double (both exact but the one operation, rounded once), then rounded to a double
 * unless the long double lies within one of its units of a double's halfway point (where that second
 * rounding could differ from rounding the exact value once): 1 when *out is float(text), 0 otherwise */
#include <float.h>
static const long double POW10[28] = {1e0L, 1e1L, 1e2L, 1e3L, 1e4L, 1e5L, 1e6L, 1e7L, 1e8L, 1e9L, 1e10L, 1e11L,
                                      1e12L, 1e13L, 1e14L, 1e15L, 1e16L, 1e17L, 1e18L, 1e19L, 1e20L, 1e21L, 1e22L,
                                      1e23L, 1e24L, 1e25L, 1e26L, 1e27L};

#if LDBL_MANT_DIG == 64 && (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define FAST_DOUBLE 1
/* whether x87 rounds its results to 64 bits (or to 53: one rounding, then exact): its precision
 * control; single precision (24 bits) would not do */
static int x87_precise(void) {
    unsigned short word;
    __asm__ volatile("fnstcw %0" : "=m"(word));
    return ((word >> 8) & 3) >= 2;
}
#else
#define FAST_DOUBLE 0
static int x87_precise(void) {
    return 0;
}
#endif

static int fast_double(const unsigned char *p, const unsigned char *end, double *out) {
#if FAST_DOUBLE
    int neg = 0;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    uint64_t w = 0;
    int digits = 0, scale = 0;  /* value = w * 10**scale */
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
        if (w || *p != '0') {
            if (++digits > 19)
                return 0;
            w = w * 10 + (uint64_t)(*p - '0');
        }
    }
    if (p < end && *p == '.') {
        for (p++; p < end && *p >= '0' && *p <= '9'; p++) {
            scale--;
            if (w || *p != '0') {
                if (++digits > 19)
                    return 0;
                w = w * 10 + (uint64_t)(*p - '0');
            }
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int eneg = 0, e = 0;
        if (*p == '+' || *p == '-')
            eneg = *p++ == '-';
        for (; p < end && *p >= '0' && *p <= '9'; p++) {
            if (e > 1000)
                return 0;
            e = e * 10 + (*p - '0');
        }
        scale += eneg ? -e : e;
    }
    if (w == 0) {
        *out = neg ? -0.0 : 0.0;
        return 1;
    }
    if (scale < -27 || scale > 27)
        return 0;
    long double x = (long double)w;  /* exact: w < 2**64 */
    x = scale < 0 ? x / POW10[-scale] : x * POW10[scale];  /* 10**k exact for k <= 27 */
    uint64_t bits;  /* the 64-bit significand: x87's extended format stores it whole, first */
    memcpy(&bits, &x, sizeof bits);
    if ((uint32_t)((bits & 0x7FF) - 0x3FF) <= 2u)
        return 0;  /* at (or one unit beside) a halfway point of doubles */
    double r = (double)x;
    *out = neg ? -r : r;
    return 1;
#else
    (void)p;
    (void)end;
    (void)out;
    return 0;
#endif
}

/* a number at p, by JSON's grammar: *kind V_INT (|value| < 10**18) or V_FLOAT; DECLINE for anything else */
static int number_at(Scan *s, int *kind, double *d, long long *i) {
    const unsigned char *p = s->p, *end = s->end, *start = p;
    int neg = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end)
        return DECLINE;
    const unsigned char *digits = p;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    } else {
        return DECLINE;
    }
    Py_ssize_t int_digits = p - digits;
    int is_float = 0;
    if (p < end && *p == '.') {
        is_float = 1;
        p++;
        const unsigned char *f = p;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
        if (p == f)
            return DECLINE;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        is_float = 1;
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        const unsigned char *x = p;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
        if (p == x)
            return DECLINE;
    }
    if (!is_float) {
        if (int_digits > 18)
            return DECLINE;  /* a long integer: the parsed path (exact ints beyond int64) */
        if (neg && int_digits == 1 && digits[0] == '0')
            return DECLINE;  /* -0: an int 0, left to the parsed path */
        long long v = 0;
        for (const unsigned char *q = digits; q < p; q++)
            v = v * 10 + (*q - '0');
        *i = neg ? -v : v;
        *kind = V_INT;
        s->p = p;
        return 0;
    }
    double fast;
    if (s->x87 && fast_double(start, p, &fast)) {
        *d = fast;
        *kind = V_FLOAT;
        s->p = p;
        return 0;
    }
    Py_ssize_t n = p - start;
    char local[72];
    if (n >= (Py_ssize_t)sizeof local)
        return DECLINE;
    memcpy(local, start, (size_t)n);
    local[n] = 0;
    char *stop = NULL;
    double v = PyOS_string_to_double(local, &stop, NULL);  /* float(text): correctly rounded, as json.loads */
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return DECLINE;
    }
    if (stop != local + n)
        return DECLINE;
    *d = v;
    *kind = V_FLOAT;
    s->p = p;
    return 0;
}

static int literal(Scan *s, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0)
        return 0;
    s->p += n;
    return 1;
}

#define MORE 3  /* member_end: a ',' read, another member follows */

/* a member's key at p (whitespace first): its bytes and whether it holds an escape, p past its ':';
 * 0 or DECLINE */
static int raw_key(Scan *s, const unsigned char **key, Py_ssize_t *n, int *escaped) {
    ws(s);
    if (s->p >= s->end || *s->p != '"' || string_at(s, key, n, escaped))
        return DECLINE;
    ws(s);
    if (s->p >= s->end || *s->p != ':')
        return DECLINE;
    s->p++;
    return 0;
}

/* after a member's value: MORE (a ',' read), 0 (``close`` read: the object or array ends), DECLINE */
static int member_end(Scan *s, unsigned char close) {
    ws(s);
    if (s->p < s->end && *s->p == ',') {
        s->p++;
        return MORE;
    }
    if (s->p < s->end && *s->p == close) {
        s->p++;
        return 0;
    }
    return DECLINE;
}

/* any JSON value skipped, checked as json.loads would (its nesting bounded) */
/* the first byte of a value at p (whitespace first) in *c, its nesting ``depth`` within MAX_DEPTH: 0 or DECLINE */
static int value_start(Scan *s, int depth, unsigned char *c) {
    if (depth > MAX_DEPTH)
        return DECLINE;
    ws(s);
    if (s->p >= s->end)
        return DECLINE;
    *c = *s->p;
    return 0;
}

static int skip_value(Scan *s, int depth) {
    unsigned char c;
    if (value_start(s, depth, &c))
        return DECLINE;
    if (c == '"') {
        const unsigned char *start;
        Py_ssize_t n;
        int escaped;
        return string_at(s, &start, &n, &escaped);
    }
    if (c == '{' || c == '[') {
        unsigned char close = c == '{' ? '}' : ']';
        s->p++;
        ws(s);
        if (s->p < s->end && *s->p == close) {
            s->p++;
            return 0;
        }
        int rc;
        do {
            const unsigned char *key;
            Py_ssize_t n;
            int escaped;
            if ((c == '{' && raw_key(s, &key, &n, &escaped)) || skip_value(s, depth + 1))
                return DECLINE;
        } while ((rc = member_end(s, close)) == MORE);
        return rc;
    }
    if (literal(s, "true") || literal(s, "false") || literal(s, "null"))
        return 0;
    if (literal(s, "NaN") || literal(s, "Infinity") || literal(s, "-Infinity")) {
        s->nonfinite = 1;
        return 0;
    }
    int kind;
    double d;
    long long i;
    return number_at(s, &kind, &d, &i);
}

/* ------------------------------------------------------------------ one leaf */

typedef struct {
    int kind;
    double d;
    long long i;
    PyObject *text;  /* V_STR */
} Value;

/* a scalar at p as a Value (V_OTHER: an object or array, skipped) */
static int value_at(Scan *s, Value *v, int depth) {
    ws(s);
    if (s->p >= s->end)
        return DECLINE;
    unsigned char c = *s->p;
    v->text = NULL;
    if (c == '"') {
        v->text = text_at(s, &s->texts);
        if (!v->text)
            return PyErr_Occurred() ? -1 : DECLINE;
        v->kind = V_STR;
        return 0;
    }
    if (c == '{' || c == '[') {
        v->kind = V_OTHER;
        return skip_value(s, depth);
    }
    if (literal(s, "null")) {
        v->kind = V_NONE;
        return 0;
    }
    if (literal(s, "true")) {
        v->kind = V_TRUE;
        return 0;
    }
    if (literal(s, "false")) {
        v->kind = V_FALSE;
        return 0;
    }
    if (literal(s, "NaN")) {
        v->kind = V_FLOAT;
        v->d = Py_NAN;
        s->nonfinite = 1;
        return 0;
    }
    if (literal(s, "Infinity")) {
        v->kind = V_FLOAT;
        v->d = Py_HUGE_VAL;
        s->nonfinite = 1;
        return 0;
    }
    if (literal(s, "-Infinity")) {
        v->kind = V_FLOAT;
        v->d = -Py_HUGE_VAL;
        s->nonfinite = 1;
        return 0;
    }
    return number_at(s, &v->kind, &v->d, &v->i);
}

static PyObject *value_object(Value *v) {
    switch (v->kind) {
    case V_NONE: Py_RETURN_NONE;
    case V_TRUE: Py_RETURN_TRUE;
    case V_FALSE: Py_RETURN_FALSE;
    case V_FLOAT: return PyFloat_FromDouble(v->d);
    case V_INT: return PyLong_FromLongLong(v->i);
    case V_STR: Py_INCREF(v->text); return v->text;
    }
    return NULL;
}

/* a shape array at p ('[') of at most 16 integers as str() writes the list; NULL+no error: not such a shape */
static PyObject *shape_at(Scan *s) {
    const unsigned char *save = s->p;
    char text[16 * 24 + 4];
    size_t at = 0;
    text[at++] = '[';
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == ']') {
        s->p++;
        Py_INCREF(S_empty_list);
        return S_empty_list;
    }
    for (int k = 0;; k++) {
        ws(s);
        int kind;
        double d;
        long long i;
        const unsigned char *digits_at = s->p;
        if (k >= 16 || number_at(s, &kind, &d, &i) || kind != V_INT) {
            s->p = save;
            return NULL;
        }
        if (k) {
            text[at++] = ',';
            text[at++] = ' ';
        }
        /* the digits as written: str() of the int (no leading zeros, no -0: number_at took neither) */
        memcpy(text + at, digits_at, (size_t)(s->p - digits_at));
        at += (size_t)(s->p - digits_at);
        ws(s);
        if (s->p < s->end && *s->p == ',') {
            s->p++;
            continue;
        }
        if (s->p < s->end && *s->p == ']') {
            s->p++;
            text[at++] = ']';
            return cached_text(&s->texts, text, (Py_ssize_t)at);
        }
        s->p = save;
        return NULL;
    }
}

/* which of the keys a leaf's cells read */
enum { K_TYPE, K_DTYPE, K_SHAPE, K_RG, K_MAX, K_MIN, K_MEAN, K_NORM, K_MD5, K_DATA_NAME, K_VALUE, K_COUNT };
static const char *LEAF_KEYS[K_COUNT] = {"type", "dtype", "shape", "requires_grad", "Max", "Min", "Mean", "Norm",
                                         "md5", "data_name", "value"};

static int leaf_key(const unsigned char *k, Py_ssize_t n) {
    for (int j = 0; j < K_COUNT; j++)
        if ((size_t)n == strlen(LEAF_KEYS[j]) && memcmp(k, LEAF_KEYS[j], (size_t)n) == 0)
            return j;
    return -1;
}

static int put_code(Scan *s, int k, Value *v) {
    double d = 0.0;
    signed char code = 2;
    if (v->kind == V_FLOAT) {
        d = v->d;
        code = 0;
    } else if (v->kind == V_INT) {
        d = (double)v->i;
        code = 1;
    } else if (v->kind == V_STR) {
        code = 3;
    }
    if (buf_put(&s->numbers[k], &d, sizeof d) < 0 || buf_put(&s->codes[k], &code, 1) < 0)
        return -1;
    return 0;
}

static int append_new(PyObject *list, PyObject *value) {
    if (!value)
        return -1;
    int rc = PyList_Append(list, value);
    Py_DECREF(value);
    return rc;
}

/* a leaf's cells with placeholder values (a null leaf's), for a leaf the Python code fills */
static int put_null_leaf(Scan *s) {
    unsigned char zero = 0;
    Value none = {V_NONE, 0, 0, NULL};
    if (buf_put(&s->tensor, &zero, 1) < 0 || PyList_Append(s->dtype, S_NA) < 0 || PyList_Append(s->shape, S_NA) < 0
        || PyList_Append(s->rg, S_NA) < 0 || PyList_Append(s->md5, S_NA) < 0 || PyList_Append(s->data_name, Py_None) < 0)
        return -1;
    for (int k = 0; k < 4; k++)
        if (PyList_Append(s->stats[k], Py_None) < 0 || put_code(s, k, &none) < 0)
            return -1;
    return 0;
}

static PyObject *S_input, *S_output, *S_parameters, *S_parameters_grad, *S_debug;

/* the next leaf's suffix (its path as the walk strips it) and io appended */
static int emit(Scan *s) {
    const char *path = s->path;
    Py_ssize_t n = s->path_len;
    if (s->strip == 1 && n) {
        path++;
        n--;
    } else if (s->strip == 2) {
        while (n && *path == '.') {
            path++;
            n--;
        }
    }
    PyObject *suffix = cached_text(&s->suffix_texts, path, n);
    if (!suffix)
        return -1;
    int rc = PyList_Append(s->suffixes, suffix) < 0 || PyList_Append(s->ios, s->io) < 0 ? -1 : 0;
    Py_DECREF(suffix);
    return rc;
}

/* the path extended by "." and ``n`` bytes of ``part`` (*saved: its length before); 0 or DECLINE */
static int push(Scan *s, const char *part, Py_ssize_t n, Py_ssize_t *saved) {
    *saved = s->path_len;
    if (s->path_len + 1 + n > PATH_BYTES)
        return DECLINE;
    s->path[s->path_len++] = '.';
    memcpy(s->path + s->path_len, part, (size_t)n);
    s->path_len += n;
    return 0;
}

/* the path set to ``text`` (no dot before it) */
static int set_path(Scan *s, const char *text, Py_ssize_t n) {
    if (n > PATH_BYTES)
        return DECLINE;
    memcpy(s->path, text, (size_t)n);
    s->path_len = n;
    return 0;
}

static void clear_values(Value *f, int *seen) {
    for (int j = 0; j < K_COUNT; j++)
        if (seen[j] && f[j].kind == V_STR)
            Py_CLEAR(f[j].text);
}

/* a leaf object at p ('{', a dict holding "type"): its cells, suffix and io appended */
static int leaf_at(Scan *s, int depth) {
    const unsigned char *start = s->p;
    Value f[K_COUNT];
    int seen[K_COUNT] = {0};
    int odd = 0, rc;
    PyObject *shape_text = NULL;
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == '}')
        return DECLINE;  /* (a leaf holds "type") */
    for (;;) {
        const unsigned char *key;
        Py_ssize_t n;
        int escaped;
        if ((rc = raw_key(s, &key, &n, &escaped)))
            goto done;
        int j = escaped ? -1 : leaf_key(key, n);
        if (escaped)
            odd = 1;  /* a key that might read as one of ours */
        if (j >= 0 && seen[j])
            odd = 1;  /* a duplicate: json.loads keeps the last */
        if (j == K_SHAPE && !seen[j]) {
            ws(s);
            if (s->p < s->end && *s->p == '[') {
                shape_text = shape_at(s);
                if (!shape_text && PyErr_Occurred()) {
                    rc = -1;
                    goto done;
                }
                if (shape_text) {
                    seen[j] = 1;
                    f[j].kind = V_OTHER;
                    f[j].text = NULL;
                    goto next;
                }
            }
        }
        if (j >= 0 && !seen[j]) {
            rc = value_at(s, &f[j], depth + 1);
            if (rc) {
                if (rc == DECLINE)
                    rc = DECLINE;
                goto done;
            }
            seen[j] = 1;
        } else if ((rc = skip_value(s, depth + 1))) {
            goto done;
        }
    next:
        if ((rc = member_end(s, '}')) == MORE)
            continue;
        if (rc)
            goto done;
        break;
    }
    Py_ssize_t i = s->leaves++;
    int is_tensor = seen[K_DTYPE] && seen[K_SHAPE];
    int scalar = -1;
    if (!is_tensor && seen[K_TYPE] && f[K_TYPE].kind == V_STR) {
        for (int k = 0; k < 4; k++)
            if (PyUnicode_CompareWithASCIIString(f[K_TYPE].text, SCALAR_NAMES[k]) == 0)
                scalar = k;
    }
    if (!odd && is_tensor) {
        /* dtype: str() of it (a str itself; null "None"); shape: str or a list of ints; requires_grad:
         * true/false/null or absent; the statistics: scalars; md5: str or null/absent */
        Value *dt = &f[K_DTYPE], *rg = seen[K_RG] ? &f[K_RG] : NULL, *md = seen[K_MD5] ? &f[K_MD5] : NULL;
        if (!(dt->kind == V_STR || dt->kind == V_NONE))
            odd = 1;
        if (!shape_text && !(f[K_SHAPE].kind == V_STR))
            odd = 1;
        if (rg && !(rg->kind == V_TRUE || rg->kind == V_FALSE || rg->kind == V_NONE))
            odd = 1;
        if (md && !(md->kind == V_STR || md->kind == V_NONE))
            odd = 1;
        for (int k = 0; k < 4; k++)
            if (seen[K_MAX + k] && f[K_MAX + k].kind == V_OTHER)
                odd = 1;
    } else if (!odd && scalar >= 0) {
        if (seen[K_VALUE] && f[K_VALUE].kind == V_OTHER)
            odd = 1;
    } else {
        odd = 1;
    }
    if (odd) {
        PyObject *span = Py_BuildValue("(nnn)", i, (Py_ssize_t)(start - s->base), (Py_ssize_t)(s->p - s->base));
        if (!span || append_new(s->odd, span) < 0 || put_null_leaf(s) < 0) {
            rc = -1;
            goto done;
        }
    } else {
        unsigned char flag = (unsigned char)is_tensor;
        if (buf_put(&s->tensor, &flag, 1) < 0) {
            rc = -1;
            goto done;
        }
        PyObject *data_name = seen[K_DATA_NAME] && f[K_DATA_NAME].kind == V_STR ? f[K_DATA_NAME].text : Py_None;
        if (PyList_Append(s->data_name, data_name) < 0) {
            rc = -1;
            goto done;
        }
        if (is_tensor) {
            Value *dt = &f[K_DTYPE], *rg = seen[K_RG] ? &f[K_RG] : NULL, *md = seen[K_MD5] ? &f[K_MD5] : NULL;
            PyObject *rg_text = !rg || rg->kind == V_NONE ? S_NA : rg->kind == V_TRUE ? S_true : S_false;
            PyObject *md_text = md && md->kind == V_STR ? md->text : S_NA;
            if (PyList_Append(s->dtype, dt->kind == V_STR ? dt->text : S_none_text) < 0
                || PyList_Append(s->shape, shape_text ? shape_text : f[K_SHAPE].text) < 0
                || PyList_Append(s->rg, rg_text) < 0 || PyList_Append(s->md5, md_text) < 0) {
                rc = -1;
                goto done;
            }
            for (int k = 0; k < 4; k++) {
                Value none = {V_NONE, 0, 0, NULL};
                Value *v = seen[K_MAX + k] ? &f[K_MAX + k] : &none;
                if (append_new(s->stats[k], value_object(v)) < 0 || put_code(s, k, v) < 0) {
                    rc = -1;
                    goto done;
                }
            }
        } else {  /* a scalar argument as _plan._view shows it: its value as each statistic */
            Value none = {V_NONE, 0, 0, NULL};
            Value *v = seen[K_VALUE] ? &f[K_VALUE] : &none;
            PyObject *value = value_object(v);
            if (!value) {
                rc = -1;
                goto done;
            }
            /* md5: None, for the caller's crc_text(value) (only md5 mode reads it) */
            int bad = PyList_Append(s->dtype, S_scalar[scalar]) < 0 || PyList_Append(s->shape, S_empty_list) < 0
                      || PyList_Append(s->rg, S_NA) < 0 || PyList_Append(s->md5, Py_None) < 0;
            for (int k = 0; k < 4 && !bad; k++)
                bad = PyList_Append(s->stats[k], value) < 0 || put_code(s, k, v) < 0;
            Py_DECREF(value);
            if (bad) {
                rc = -1;
                goto done;
            }
        }
    }
    rc = emit(s);
done:
    Py_XDECREF(shape_text);
    clear_values(f, seen);
    return rc;
}

/* whether the object at p ('{') holds the key "type" (its keys looked at, p left where it was) */
static int holds_type(Scan *s, int depth, int *holds) {
    const unsigned char *save = s->p;
    *holds = 0;
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == '}') {
        s->p = save;
        return 0;
    }
    int rc;
    do {
        const unsigned char *key;
        Py_ssize_t n;
        int escaped;
        if (raw_key(s, &key, &n, &escaped) || escaped)
            return DECLINE;  /* (an escaped key might read as "type") */
        if (n == 4 && memcmp(key, "type", 4) == 0) {
            *holds = 1;
            break;
        }
        if (skip_value(s, depth + 1))
            return DECLINE;
    } while ((rc = member_end(s, '}')) == MORE);
    if (!*holds && rc)
        return DECLINE;
    s->p = save;
    return 0;
}

/* the key of an object's next member (the object's '{' read; *started: a member read before):
 * KEY with *key (a new reference; p at its value), 0 at the object's end ('}' read), DECLINE, -1 */
static int next_key(Scan *s, int *started, PyObject **key) {
    ws(s);
    if (*started) {
        if (s->p < s->end && *s->p == ',') {
            s->p++;
            ws(s);
        } else if (s->p < s->end && *s->p == '}') {
            s->p++;
            return 0;
        } else {
            return DECLINE;
        }
    } else if (s->p < s->end && *s->p == '}') {
        s->p++;
        return 0;
    }
    *started = 1;
    if (s->p >= s->end || *s->p != '"')
        return DECLINE;
    *key = text_at(s, &s->keys);
    if (!*key)
        return PyErr_Occurred() ? -1 : DECLINE;
    ws(s);
    if (s->p >= s->end || *s->p != ':') {
        Py_CLEAR(*key);
        return DECLINE;
    }
    s->p++;
    ws(s);
    return KEY;
}

/* the members of an object, one key at a time (its keys kept to refuse a duplicate: json.loads would
 * keep one of them) */
typedef struct {
    const unsigned char *keys[64];
    Py_ssize_t sizes[64];
    int count;
} Members;

/* the next member's key of the object at p ('{' on the first call, m->count 0): KEY (its bytes in
 * *key, *n; p at its value), 0 at the object's end ('}' read), DECLINE (an escaped or duplicate key,
 * more than 64 keys, malformed) */
static int next_member(Scan *s, Members *m, const unsigned char **key, Py_ssize_t *n) {
    if (!m->count) {
        s->p++;
        ws(s);
        if (s->p < s->end && *s->p == '}') {
            s->p++;
            return 0;
        }
    } else {
        int rc = member_end(s, '}');
        if (rc != MORE)
            return rc;
    }
    int escaped;
    if (raw_key(s, key, n, &escaped) || escaped || m->count == 64)
        return DECLINE;
    for (int k = 0; k < m->count; k++)
        if (m->sizes[k] == *n && memcmp(m->keys[k], *key, (size_t)*n) == 0)
            return DECLINE;
    m->keys[m->count] = *key;
    m->sizes[m->count++] = *n;
    return KEY;
}

static int walk_value(Scan *s, int depth);

/* the members of the object at p ('{') walked, each under path.key (DECLINE on a duplicate or escaped
 * key: json.loads would keep one of them) */
static int walk_members(Scan *s, int depth) {
    Members m = {.count = 0};
    const unsigned char *key;
    Py_ssize_t n, saved;
    int rc;
    while ((rc = next_member(s, &m, &key, &n)) == KEY) {
        if (push(s, (const char *)key, n, &saved))
            return DECLINE;
        rc = walk_value(s, depth + 1);
        s->path_len = saved;
        if (rc)
            return rc;
    }
    return rc;
}

/* _rows._walk over a value at p under the current path: null and objects holding "type" are leaves,
 * other objects and arrays are walked (path.key, path.position), anything else holds no leaf */
static int walk_value(Scan *s, int depth) {
    unsigned char c;
    if (value_start(s, depth, &c))
        return DECLINE;
    if (c == '{') {
        int holds, rc;
        if ((rc = holds_type(s, depth, &holds)))
            return rc;
        return holds ? leaf_at(s, depth) : walk_members(s, depth);
    }
    if (c == '[') {
        s->p++;
        ws(s);
        if (s->p < s->end && *s->p == ']') {
            s->p++;
            return 0;
        }
        int rc;
        Py_ssize_t position = 0;
        do {
            char digits[24];
            int n = snprintf(digits, sizeof digits, "%zd", position++);
            Py_ssize_t saved;
            if (push(s, digits, n, &saved))
                return DECLINE;
            rc = walk_value(s, depth + 1);
            s->path_len = saved;
            if (rc)
                return rc;
        } while ((rc = member_end(s, ']')) == MORE);
        return rc;
    }
    if (literal(s, "null")) {
        s->leaves++;
        return put_null_leaf(s) < 0 || emit(s) < 0 ? -1 : 0;
    }
    return skip_value(s, depth);
}

/* the value at p walked as a parameters_grad record's member: a list of one item as that item */
static int grad_member(Scan *s, int depth) {
    ws(s);
    if (s->p < s->end && *s->p == '[') {
        const unsigned char *save = s->p;
        s->p++;
        ws(s);
        if (!(s->p < s->end && *s->p == ']')) {
            const unsigned char *item = s->p;
            if (skip_value(s, depth + 1))
                return DECLINE;
            ws(s);
            if (s->p < s->end && *s->p == ']') {  /* one item */
                s->p = item;
                int rc = walk_value(s, depth + 1);
                if (rc)
                    return rc;
                ws(s);
                s->p++;  /* its ']' */
                return 0;
            }
        }
        s->p = save;
    }
    return walk_value(s, depth);
}

static int key_is(const unsigned char *key, Py_ssize_t n, const char *word) {
    return (size_t)n == strlen(word) && memcmp(key, word, (size_t)n) == 0;
}

/* rotate each column's leaves [from, to) left by ``by`` (a record's outputs, walked last) */
static int rotate_list(PyObject *list, Py_ssize_t from, Py_ssize_t mid, Py_ssize_t to) {
    PyObject *a = PyList_GetSlice(list, from, mid), *b = PyList_GetSlice(list, mid, to), *both = NULL;
    int rc = -1;
    if (a && b && (both = PySequence_Concat(b, a)))
        rc = PyList_SetSlice(list, from, to, both);
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_XDECREF(both);
    return rc;
}

static int rotate_buf(Buf *b, Py_ssize_t width, Py_ssize_t from, Py_ssize_t mid, Py_ssize_t to) {
    Py_ssize_t head = (mid - from) * width;
    char *tmp = PyMem_Malloc((size_t)head + 1);
    if (!tmp) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(tmp, b->data + from * width, (size_t)head);
    memmove(b->data + from * width, b->data + mid * width, (size_t)((to - mid) * width));
    memcpy(b->data + (to - (mid - from)) * width, tmp, (size_t)head);
    PyMem_Free(tmp);
    return 0;
}

/* the leaves [from, to) put in the order [mid, to) then [from, mid) in every column (and the odd
 * leaves' numbers with them) */
static int rotate(Scan *s, Py_ssize_t from, Py_ssize_t mid, Py_ssize_t to) {
    if (mid == from || mid == to)
        return 0;
    PyObject *lists[] = {s->dtype, s->shape, s->rg, s->stats[0], s->stats[1], s->stats[2], s->stats[3], s->md5,
                         s->data_name, s->suffixes, s->ios};
    for (size_t k = 0; k < sizeof lists / sizeof lists[0]; k++)
        if (rotate_list(lists[k], from, mid, to) < 0)
            return -1;
    if (rotate_buf(&s->tensor, 1, from, mid, to) < 0)
        return -1;
    for (int k = 0; k < 4; k++)
        if (rotate_buf(&s->numbers[k], (Py_ssize_t)sizeof(double), from, mid, to) < 0
            || rotate_buf(&s->codes[k], 1, from, mid, to) < 0)
            return -1;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(s->odd); k++) {
        PyObject *entry = PyList_GET_ITEM(s->odd, k);
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 0));
        if (i < from || i >= to)
            continue;
        i = i < mid ? i + (to - mid) : i - (mid - from);
        PyObject *moved = Py_BuildValue("(nOO)", i, PyTuple_GET_ITEM(entry, 1), PyTuple_GET_ITEM(entry, 2));
        if (!moved)
            return -1;
        PyList_SetItem(s->odd, k, moved);  /* steals moved */
    }
    return 0;
}

/* an api or module record at p ('{') as record_leaves walks it: is_recompute skipped, input_args under
 * "input", input_kwargs and parameters by member ("input.<kwarg>", "parameters.<name>"; a non-object:
 * nothing), any other key under itself; its output walked last where it also holds parameters */
static int api_record(Scan *s) {
    Members m = {.count = 0};
    const unsigned char *key;
    Py_ssize_t n;
    int rc, has_parameters = 0;
    Py_ssize_t output_from = -1, output_to = -1;
    s->strip = 0;
    while ((rc = next_member(s, &m, &key, &n)) == KEY) {
        ws(s);
        int kwargs = key_is(key, n, "input_kwargs"), parameters = key_is(key, n, "parameters");
        has_parameters |= parameters;  /* (whatever its value: record_leaves looks at the key) */
        if (key_is(key, n, "is_recompute") || ((kwargs || parameters) && (s->p >= s->end || *s->p != '{'))) {
            rc = skip_value(s, 2);
        } else if (kwargs || parameters) {
            s->io = kwargs ? S_input : S_parameters;
            if ((rc = set_path(s, kwargs ? "input" : "parameters", kwargs ? 5 : 10)) == 0)
                rc = walk_members(s, 1);
        } else {
            if (key_is(key, n, "input_args") || key_is(key, n, "input")) {
                s->io = S_input;
            } else if (key_is(key, n, "output")) {
                s->io = S_output;
            } else {  /* the key itself (held until the next such key: each of its leaves' lists holds it too) */
                PyObject *io = cached_text(&s->keys, (const char *)key, n);
                if (!io)
                    return -1;
                Py_XSETREF(s->io_held, io);
                s->io = io;
            }
            int output = s->io == S_output;
            if (output)
                output_from = s->leaves;
            if (key_is(key, n, "input_args"))
                rc = set_path(s, "input", 5);
            else
                rc = set_path(s, (const char *)key, n);
            if (!rc)
                rc = walk_value(s, 2);
            if (output)
                output_to = s->leaves;
        }
        if (rc)
            return rc;
    }
    if (!rc && has_parameters && output_from >= 0)  /* rows: inputs, parameters, then outputs (as 26.2.0) */
        rc = rotate(s, output_from, output_to, s->leaves);
    return rc;
}

/* a record (its value at p) as record_leaves walks it */
static int record_at(Scan *s, PyObject *name) {
    ws(s);
    if (s->p >= s->end)
        return DECLINE;
    if (*s->p != '{') {  /* not a dict: walked whole, its suffixes' leading dots stripped */
        s->strip = 2;
        s->io = S_debug;
        s->path_len = 0;
        return walk_value(s, 1);
    }
    PyObject *grad_part = PyUnicode_FromString(".parameters_grad");
    if (!grad_part)
        return -1;
    int grad = PyUnicode_Contains(name, grad_part);
    Py_DECREF(grad_part);
    if (grad < 0)
        return -1;
    if (grad) {  /* each member walked under ".<key>", then its first byte dropped */
        Members m = {.count = 0};
        const unsigned char *key;
        Py_ssize_t n, saved;
        int rc;
        s->strip = 1;
        s->io = S_parameters_grad;
        while ((rc = next_member(s, &m, &key, &n)) == KEY) {
            s->path_len = 0;
            if (push(s, (const char *)key, n, &saved) || (rc = grad_member(s, 1)))
                return rc ? rc : DECLINE;
        }
        return rc;
    }
    PyObject *tail = PyUnicode_FromString(".debug");
    if (!tail)
        return -1;
    Py_ssize_t debug = PyUnicode_Tailmatch(name, tail, 0, PY_SSIZE_T_MAX, 1);
    Py_DECREF(tail);
    if (debug < 0)
        return -1;
    if (debug) {
        s->strip = 2;
        s->io = S_debug;
        s->path_len = 0;
        return walk_value(s, 1);
    }
    return api_record(s);
}

/* the "data" object at p: the records' names, spans and first leaves */
static int data_at(Scan *s, PyObject *names, Buf *spans, Buf *bounds) {
    PyObject *name = NULL;
    s->p++;
    int started = 0, rc;
    while ((rc = next_key(s, &started, &name)) == KEY) {
        long long span[2] = {s->p - s->base, 0};
        int64_t first = s->leaves;
        rc = record_at(s, name);
        if (!rc) {
            span[1] = s->p - s->base;
            rc = PyList_Append(names, name) < 0 || buf_put(spans, span, sizeof span) < 0
                 || buf_put(bounds, &first, sizeof first) < 0 ? -1 : 0;
        }
        Py_DECREF(name);
        if (rc)
            return rc;
    }
    if (!rc) {
        int64_t end = s->leaves;
        rc = buf_put(bounds, &end, sizeof end);
    }
    return rc;
}

static const char *HEADER[5] = {"task", "level", "framework", "dump_data_dir", "data"};

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view))
        return NULL;
    Scan s;
    memset(&s, 0, sizeof s);
    s.base = s.p = (const unsigned char *)view.buf;
    s.x87 = x87_precise();
    s.end = s.base + view.len;
    PyObject *names = PyList_New(0), *task = NULL, *result = NULL, *header_spans = PyList_New(0);
    Buf spans = {0}, bounds = {0};
    s.dtype = PyList_New(0);
    s.shape = PyList_New(0);
    s.rg = PyList_New(0);
    s.md5 = PyList_New(0);
    s.data_name = PyList_New(0);
    s.odd = PyList_New(0);
    s.suffixes = PyList_New(0);
    s.ios = PyList_New(0);
    for (int k = 0; k < 4; k++)
        s.stats[k] = PyList_New(0);
    int rc = DECLINE;
    if (!names || !header_spans || !s.dtype || !s.shape || !s.rg || !s.md5 || !s.data_name || !s.odd || !s.suffixes
        || !s.ios || !s.stats[0]
        || !s.stats[1] || !s.stats[2] || !s.stats[3]) {
        rc = -1;
        goto out;
    }
    if (s.end - s.p >= 3 && memcmp(s.p, "\xef\xbb\xbf", 3) == 0)
        s.p += 3;
    ws(&s);
    if (s.p >= s.end || *s.p != '{')
        goto out;
    s.p++;
    int header = 0, have_data = 0, have_task = 0;
    ws(&s);
    if (s.p < s.end && *s.p == '}')
        goto out;  /* no "data" */
    int more;
    do {
        const unsigned char *key;
        Py_ssize_t n;
        int escaped;
        if (raw_key(&s, &key, &n, &escaped) || escaped)
            goto out;
        ws(&s);
        for (int h = 0; h < 5; h++)
            if ((size_t)n == strlen(HEADER[h]) && memcmp(key, HEADER[h], (size_t)n) == 0)
                header = 1;
        Py_ssize_t value_start = s.p - s.base;
        if (n == 4 && memcmp(key, "data", 4) == 0) {
            if (have_data || s.p >= s.end || *s.p != '{')
                goto out;
            have_data = 1;
            if ((rc = data_at(&s, names, &spans, &bounds)))
                goto out;
            rc = DECLINE;
        } else if (n == 4 && memcmp(key, "task", 4) == 0) {
            if (have_task)
                goto out;
            have_task = 1;
            if (literal(&s, "null")) {
                task = Py_None;
                Py_INCREF(task);
            } else {
                if (s.p >= s.end || *s.p != '"')
                    goto out;
                task = text_at(&s, &s.texts);
                if (!task) {
                    rc = PyErr_Occurred() ? -1 : DECLINE;
                    goto out;
                }
            }
        } else if (skip_value(&s, 1)) {
            goto out;
        }
        if (!(n == 4 && memcmp(key, "data", 4) == 0)) {  /* a header member: its key and the span of its value */
            PyObject *member = Py_BuildValue("(s#nn)", (const char *)key, n, value_start, (Py_ssize_t)(s.p - s.base));
            if (!member) {
                PyErr_Clear();  /* (its key not UTF-8: string_at checked it) */
                goto out;
            }
            if (append_new(header_spans, member) < 0) {
                rc = -1;
                goto out;
            }
        }
    } while ((more = member_end(&s, '}')) == MORE);
    ws(&s);
    if (more || s.p != s.end || !header || !have_data)
        goto out;
    if (!task) {
        task = Py_None;  /* (no "task": raw.get("task")) */
        Py_INCREF(task);
    }
    rc = 0;
    /* (task, names, spans, bounds, suffixes, ios, tensor, dtype, shape, rg, stats, numbers, codes, md5,
     *  data_name, odd, header members, whether a NaN/Infinity token was seen) */
    result = Py_BuildValue("(OONNOONOOO(OOOO)(NNNN)(NNNN)OOOON)", task, names, buf_bytes(&spans), buf_bytes(&bounds),
                           s.suffixes, s.ios, buf_bytes(&s.tensor), s.dtype, s.shape, s.rg, s.stats[0], s.stats[1],
                           s.stats[2], s.stats[3], buf_bytes(&s.numbers[0]), buf_bytes(&s.numbers[1]),
                           buf_bytes(&s.numbers[2]), buf_bytes(&s.numbers[3]), buf_bytes(&s.codes[0]),
                           buf_bytes(&s.codes[1]), buf_bytes(&s.codes[2]), buf_bytes(&s.codes[3]), s.md5,
                           s.data_name, s.odd, header_spans, PyBool_FromLong(s.nonfinite));
out:
    PyBuffer_Release(&view);
    cache_clear(&s.keys);
    cache_clear(&s.texts);
    PyMem_Free(spans.data);
    PyMem_Free(bounds.data);
    cache_clear(&s.suffix_texts);
    PyMem_Free(s.tensor.data);
    for (int k = 0; k < 4; k++) {
        PyMem_Free(s.numbers[k].data);
        PyMem_Free(s.codes[k].data);
        Py_XDECREF(s.stats[k]);
    }
    Py_XDECREF(names);
    Py_XDECREF(task);
    Py_XDECREF(s.dtype);
    Py_XDECREF(s.shape);
    Py_XDECREF(s.rg);
    Py_XDECREF(s.md5);
    Py_XDECREF(s.data_name);
    Py_XDECREF(s.odd);
    Py_XDECREF(s.suffixes);
    Py_XDECREF(s.ios);
    Py_XDECREF(s.io_held);
    Py_XDECREF(header_spans);
    if (rc < 0) {
        Py_XDECREF(result);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_SystemError, "docscan: an error without an exception");
        return NULL;
    }
    if (rc == DECLINE || !result) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "compare's leaf columns of a dump.json's bytes (or None)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_docscan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__docscan(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    S_type = PyUnicode_InternFromString("type");
    S_NA = PyUnicode_InternFromString("N/A");
    S_true = PyUnicode_InternFromString("True");
    S_false = PyUnicode_InternFromString("False");
    S_none_text = PyUnicode_InternFromString("None");
    S_empty_list = PyUnicode_InternFromString("[]");
    S_input = PyUnicode_InternFromString("input");
    S_output = PyUnicode_InternFromString("output");
    S_parameters = PyUnicode_InternFromString("parameters");
    S_parameters_grad = PyUnicode_InternFromString("parameters_grad");
    S_debug = PyUnicode_InternFromString("debug");
    for (int k = 0; k < 4; k++) {
        S_scalar[k] = PyUnicode_FromFormat("<class '%s'>", SCALAR_NAMES[k]);
        if (!S_scalar[k])
            return NULL;
    }
    if (!S_type || !S_NA || !S_true || !S_false || !S_none_text || !S_empty_list || !S_input || !S_output
        || !S_parameters || !S_parameters_grad || !S_debug
        || PyModule_AddIntConstant(m, "VERSION", DOCSCAN_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
