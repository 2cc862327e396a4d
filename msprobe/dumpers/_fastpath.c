/* One-pass statistics and CRC-32 over the memory of a contiguous CPU buffer.
 *
 * The dumpers' fast path (msprobe/dumpers/fastpath.py loads it; the pure-torch / numpy code is
 * the fallback and the reference). Values follow msprobe/format/stats.py:
 *
 *   stats(addr, n, code) -> (Max, Min, Mean, Norm)
 *     floating point: Max/Min in the dtype, Mean and Norm accumulated in float64 and rounded to
 *       the dtype (float16: double -> half, as numpy does; bfloat16: double -> float32 -> bfloat16,
 *       round to nearest even); float64 gives Mean = Norm = None. A NaN anywhere makes all four NaN.
 *     integers: (int Max, int Min, None, None); bool: (any, all, None, None).
 *   crc32(addr, nbytes, crc=0) -> int: zlib's CRC-32 (the gzip polynomial), continuing from crc.
 *   crc32_combine(crc1, crc2, len2) -> int: the CRC-32 of two blocks from theirs (zlib's crc32_combine).
 *   record_json(obj, dumps) -> str or None: json.dumps(obj, separators=(", ", ": ")) byte for byte,
 *     made from dumps(obj) (orjson's compact UTF-8 text, its shortest float digits) respaced, with
 *     non-ASCII and DEL escaped and floats spelt as Python's repr; None (the caller then takes json)
 *     when obj holds anything but exact dict (str keys) / list / tuple / str / int (64-bit) / finite
 *     float / bool / None, nests deeper than 64, or dumps fails.
 *
 *   tensor_entry(t, ctx) -> dict or None: the record entry of a CPU tensor in statistics (or md5) mode,
 *     made as msprobe/dumpers/pytorch/_encode.py's Encoder.tensor makes it (the same keys in the same
 *     order, the same values, the statistics cache of the encoder read and filled the same way); None
 *     (nothing changed: the caller then takes the Python path) for anything else: another device, a
 *     subclass, an empty or negated tensor, a layout without unit-stride runs (md5 mode: any
 *     non-contiguous one), a dtype the kernels do not know, a
 *     cached handle not computed yet, any error while reading the tensor. ctx: the tuple
 *     _encode.entry_context builds (TENSOR_CTX_* below).
 *
 *   capture_stack(skip, prefixes) -> ((filename, lineno, name), ...): msprobe/dumpers/stacks.py's
 *     capture_stack: the frames of the calling thread from the caller's frame's skip-th caller
 *     outwards (sys._getframe(skip) in the Python caller), those whose file name starts with one of
 *     prefixes (or is "<string>") left out, innermost first.
 *
 * The caller guarantees that [addr, addr + n * itemsize) is readable for the duration of the call
 * (a live, contiguous CPU tensor or array) and that n > 0 for stats. The GIL is released for
 * large buffers so that the dumper's writer threads run meanwhile.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <float.h>

#define FASTPATH_VERSION 8  /* bump with every change: a stale build is then rebuilt */

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define MULTI __attribute__((target_clones("avx2", "default")))
#else
#define MULTI
#endif

#define LANES 8
#define NOGIL_BYTES (1 << 16)

enum { C_F32 = 0, C_F64 = 1, C_F16 = 2, C_BF16 = 3, C_I8 = 4, C_U8 = 5, C_I16 = 6, C_I32 = 7, C_I64 = 8,
       C_BOOL = 9 };

static inline float bits_to_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t float_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* IEEE half -> float without a branch: shift the exponent/mantissa into place, rescale the
 * exponent with one multiply (which also normalises subnormals), force Inf/NaN back to an all-ones
 * exponent, then put the sign back. */
static inline float load_f16(uint16_t h) {
    uint32_t u = ((uint32_t)h & 0x7fffu) << 13;
    float f = bits_to_float(u) * bits_to_float((uint32_t)(254 - 15) << 23);
    uint32_t r = float_to_bits(f);
    r |= (f >= bits_to_float((uint32_t)(127 + 16) << 23)) ? (255u << 23) : 0u;
    return bits_to_float(r | (((uint32_t)h & 0x8000u) << 16));
}

static inline float load_bf16(uint16_t h) { return bits_to_float((uint32_t)h << 16); }

#define LOAD_F32(x) ((double)(x))
#define LOAD_F64(x) (x)
#define LOAD_F16(x) ((double)load_f16(x))
#define LOAD_BF16(x) ((double)load_bf16(x))

/* out = {max, min, sum, sum of squares}; eight independent lanes so that the compiler can keep
 * them in vector registers (max/min written as the selects maxpd/minpd implement). */
#define FLOAT_KERNEL(NAME, T, LOAD)                                                        \
    MULTI static void NAME(const T *p, Py_ssize_t n, double *out) {                        \
        double mx[LANES], mn[LANES], s[LANES], q[LANES];                                   \
        double first = LOAD(p[0]);                                                         \
        for (int j = 0; j < LANES; j++) { mx[j] = mn[j] = first; s[j] = q[j] = 0.0; }      \
        Py_ssize_t i = 0;                                                                  \
        for (; i + LANES <= n; i += LANES) {                                               \
            for (int j = 0; j < LANES; j++) {                                              \
                double v = LOAD(p[i + j]);                                                 \
                mx[j] = v > mx[j] ? v : mx[j];                                             \
                mn[j] = v < mn[j] ? v : mn[j];                                             \
                s[j] += v;                                                                 \
                q[j] += v * v;                                                             \
            }                                                                              \
        }                                                                                  \
        for (; i < n; i++) {                                                               \
            double v = LOAD(p[i]);                                                         \
            mx[0] = v > mx[0] ? v : mx[0];                                                 \
            mn[0] = v < mn[0] ? v : mn[0];                                                 \
            s[0] += v;                                                                     \
            q[0] += v * v;                                                                 \
        }                                                                                  \
        double M = mx[0], m = mn[0], S = 0.0, Q = 0.0;                                     \
        for (int j = 0; j < LANES; j++) {                                                  \
            M = mx[j] > M ? mx[j] : M;                                                     \
            m = mn[j] < m ? mn[j] : m;                                                     \
            S += s[j];                                                                     \
            Q += q[j];                                                                     \
        }                                                                                  \
        out[0] = M; out[1] = m; out[2] = S; out[3] = Q;                                    \
    }

FLOAT_KERNEL(k_f32, float, LOAD_F32)
FLOAT_KERNEL(k_f64, double, LOAD_F64)
FLOAT_KERNEL(k_f16, uint16_t, LOAD_F16)
FLOAT_KERNEL(k_bf16, uint16_t, LOAD_BF16)

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_X86_CODE 1
#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))

/* The same four reductions with AVX2: 16 elements a round, Max/Min in the element type (exact for
 * float32 and narrower), Sum and sum of squares in float64 over eight independent accumulators.
 * _mm256_max_ps(x, m) keeps m when x is NaN (as the scalar select above); NaN is detected from the
 * sum of squares afterwards. */
#define AVX2_F32_KERNEL(NAME, T, LOAD8)                                                    \
    AVX2_TARGET static void NAME(const T *p, Py_ssize_t n, double *out) {                  \
        __m256 mx0 = _mm256_set1_ps((float)LOAD_##T##_1(p[0])), mx1 = mx0, mn0 = mx0, mn1 = mx0; \
        __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;                       \
        __m256d q0 = s0, q1 = s0, q2 = s0, q3 = s0;                                        \
        Py_ssize_t i = 0;                                                                  \
        for (; i + 16 <= n; i += 16) {                                                     \
            __m256 x = LOAD8(p + i), y = LOAD8(p + i + 8);                                 \
            mx0 = _mm256_max_ps(x, mx0); mn0 = _mm256_min_ps(x, mn0);                      \
            mx1 = _mm256_max_ps(y, mx1); mn1 = _mm256_min_ps(y, mn1);                      \
            __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(x));                        \
            __m256d b = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));                      \
            __m256d c = _mm256_cvtps_pd(_mm256_castps256_ps128(y));                        \
            __m256d d = _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1));                      \
            s0 = _mm256_add_pd(s0, a); q0 = _mm256_fmadd_pd(a, a, q0);                     \
            s1 = _mm256_add_pd(s1, b); q1 = _mm256_fmadd_pd(b, b, q1);                     \
            s2 = _mm256_add_pd(s2, c); q2 = _mm256_fmadd_pd(c, c, q2);                     \
            s3 = _mm256_add_pd(s3, d); q3 = _mm256_fmadd_pd(d, d, q3);                     \
        }                                                                                  \
        float fm[16], fn[16];                                                              \
        double ds[4], dq[4];                                                               \
        _mm256_storeu_ps(fm, mx0); _mm256_storeu_ps(fm + 8, mx1);                          \
        _mm256_storeu_ps(fn, mn0); _mm256_storeu_ps(fn + 8, mn1);                          \
        _mm256_storeu_pd(ds, _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3))); \
        _mm256_storeu_pd(dq, _mm256_add_pd(_mm256_add_pd(q0, q1), _mm256_add_pd(q2, q3))); \
        double M = fm[0], m = fn[0], S = 0.0, Q = 0.0;                                     \
        for (int j = 0; j < 16; j++) {                                                     \
            M = fm[j] > M ? fm[j] : M;                                                     \
            m = fn[j] < m ? fn[j] : m;                                                     \
        }                                                                                  \
        for (int j = 0; j < 4; j++) { S += ds[j]; Q += dq[j]; }                            \
        for (; i < n; i++) {                                                               \
            double v = LOAD_##T##_1(p[i]);                                                 \
            M = v > M ? v : M;                                                             \
            m = v < m ? v : m;                                                             \
            S += v;                                                                        \
            Q += v * v;                                                                    \
        }                                                                                  \
        out[0] = M; out[1] = m; out[2] = S; out[3] = Q;                                    \
    }

#define LOAD_float_1(x) ((double)(x))
#define LOAD_f16_t_1(x) ((double)load_f16(x))
#define LOAD_bf16_t_1(x) ((double)load_bf16(x))
typedef uint16_t f16_t;
typedef uint16_t bf16_t;
#define L8_F32(q) _mm256_loadu_ps(q)
#define L8_F16(q) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(q)))
#define L8_BF16(q) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(q))), 16))

AVX2_F32_KERNEL(a_f32, float, L8_F32)
AVX2_F32_KERNEL(a_f16, f16_t, L8_F16)
AVX2_F32_KERNEL(a_bf16, bf16_t, L8_BF16)

AVX2_TARGET static void a_f64(const double *p, Py_ssize_t n, double *out) {
    __m256d mx0 = _mm256_set1_pd(p[0]), mx1 = mx0, mn0 = mx0, mn1 = mx0;
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, q0 = s0, q1 = s0;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256d a = _mm256_loadu_pd(p + i), b = _mm256_loadu_pd(p + i + 4);
        mx0 = _mm256_max_pd(a, mx0); mn0 = _mm256_min_pd(a, mn0);
        mx1 = _mm256_max_pd(b, mx1); mn1 = _mm256_min_pd(b, mn1);
        s0 = _mm256_add_pd(s0, a); q0 = _mm256_fmadd_pd(a, a, q0);
        s1 = _mm256_add_pd(s1, b); q1 = _mm256_fmadd_pd(b, b, q1);
    }
    double fm[8], fn[8], ds[4], dq[4];
    _mm256_storeu_pd(fm, mx0); _mm256_storeu_pd(fm + 4, mx1);
    _mm256_storeu_pd(fn, mn0); _mm256_storeu_pd(fn + 4, mn1);
    _mm256_storeu_pd(ds, _mm256_add_pd(s0, s1));
    _mm256_storeu_pd(dq, _mm256_add_pd(q0, q1));
    double M = fm[0], m = fn[0], S = 0.0, Q = 0.0;
    for (int j = 0; j < 8; j++) {
        M = fm[j] > M ? fm[j] : M;
        m = fn[j] < m ? fn[j] : m;
    }
    for (int j = 0; j < 4; j++) { S += ds[j]; Q += dq[j]; }
    for (; i < n; i++) {
        double v = p[i];
        M = v > M ? v : M;
        m = v < m ? v : m;
        S += v;
        Q += v * v;
    }
    out[0] = M; out[1] = m; out[2] = S; out[3] = Q;
}
#endif

/* 1 when the AVX2 kernels may run (the CPU has AVX2, FMA and F16C, and simd is not switched off) */
static int use_avx2 = 0;

#define INT_KERNEL(NAME, T)                                                                \
    MULTI static void NAME(const T *p, Py_ssize_t n, int64_t *out) {                       \
        T M = p[0], m = p[0];                                                              \
        for (Py_ssize_t i = 1; i < n; i++) {                                               \
            T v = p[i];                                                                    \
            M = v > M ? v : M;                                                             \
            m = v < m ? v : m;                                                             \
        }                                                                                  \
        out[0] = (int64_t)M; out[1] = (int64_t)m;                                          \
    }

INT_KERNEL(k_i8, int8_t)
INT_KERNEL(k_u8, uint8_t)
INT_KERNEL(k_i16, int16_t)
INT_KERNEL(k_i32, int32_t)
INT_KERNEL(k_i64, int64_t)

/* bool: any = some byte non-zero, all = no byte zero */
MULTI static void k_bool(const uint8_t *p, Py_ssize_t n, int64_t *out) {
    uint8_t any = 0, all = 1;
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        any |= (uint8_t)(p[i] != 0);
        all &= (uint8_t)(p[i] != 0);
    }
    out[0] = any; out[1] = all;
}

static const Py_ssize_t ITEMSIZE[] = {4, 8, 2, 2, 1, 1, 2, 4, 8, 1};

/* double -> bfloat16 as the format defines it: through float32, then round to nearest even */
static double round_bf16(double x) {
    float f = (float)x;
    if (f != f) return (double)f;
    uint32_t u = float_to_bits(f);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return (double)bits_to_float(u);
}

static PyObject *round_to(double x, int code) {
    if (code == C_F32) return PyFloat_FromDouble((double)(float)x);
    if (code == C_BF16) return PyFloat_FromDouble(round_bf16(x));
    /* float16: double -> half directly (round to nearest even, overflow to Inf), as numpy does */
    unsigned char buf[2];
    if (isnan(x)) return PyFloat_FromDouble(x);
    if (fabs(x) >= 65520.0) return PyFloat_FromDouble(copysign(INFINITY, x));
#if PY_VERSION_HEX >= 0x030B0000
    if (PyFloat_Pack2(x, (char *)buf, 1) < 0) return NULL;
    return PyFloat_FromDouble(PyFloat_Unpack2((const char *)buf, 1));
#else
    if (_PyFloat_Pack2(x, buf, 1) < 0) return NULL;
    return PyFloat_FromDouble(_PyFloat_Unpack2(buf, 1));
#endif
}

/* one contiguous run of n > 0 elements: d = {max, min, sum, sum of squares} (floats), iv = {max, min} */
static void run_kernel(long code, const void *addr, Py_ssize_t n, double *d, int64_t *iv) {
    switch (code) {
#ifdef HAVE_X86_CODE
    case C_F32: (use_avx2 ? a_f32 : k_f32)((const float *)addr, n, d); break;
    case C_F64: (use_avx2 ? a_f64 : k_f64)((const double *)addr, n, d); break;
    case C_F16: (use_avx2 ? a_f16 : k_f16)((const uint16_t *)addr, n, d); break;
    case C_BF16: (use_avx2 ? a_bf16 : k_bf16)((const uint16_t *)addr, n, d); break;
#else
    case C_F32: k_f32((const float *)addr, n, d); break;
    case C_F64: k_f64((const double *)addr, n, d); break;
    case C_F16: k_f16((const uint16_t *)addr, n, d); break;
    case C_BF16: k_bf16((const uint16_t *)addr, n, d); break;
#endif
    case C_I8: k_i8((const int8_t *)addr, n, iv); break;
    case C_U8: k_u8((const uint8_t *)addr, n, iv); break;
    case C_I16: k_i16((const int16_t *)addr, n, iv); break;
    case C_I32: k_i32((const int32_t *)addr, n, iv); break;
    case C_I64: k_i64((const int64_t *)addr, n, iv); break;
    default: k_bool((const uint8_t *)addr, n, iv); break;
    }
}

/* fold the results of a later run into the first's */
static void combine(long code, double *d, int64_t *iv, const double *d2, const int64_t *iv2) {
    if (code == C_BOOL) {
        iv[0] |= iv2[0];
        iv[1] &= iv2[1];
    } else if (code >= C_I8) {
        iv[0] = iv2[0] > iv[0] ? iv2[0] : iv[0];
        iv[1] = iv2[1] < iv[1] ? iv2[1] : iv[1];
    } else {
        d[0] = d2[0] > d[0] ? d2[0] : d[0];
        d[1] = d2[1] < d[1] ? d2[1] : d[1];
        d[2] += d2[2];
        d[3] += d2[3];
    }
}

static PyObject *finish(long code, Py_ssize_t n, double *d, const int64_t *iv) {
    if (code == C_BOOL)
        return Py_BuildValue("(OOOO)", iv[0] ? Py_True : Py_False, iv[1] ? Py_True : Py_False, Py_None, Py_None);
    if (code >= C_I8)
        return Py_BuildValue("(LLOO)", (long long)iv[0], (long long)iv[1], Py_None, Py_None);
    if (isnan(d[3])) d[0] = d[1] = d[3];  /* a NaN element (x*x is NaN only for NaN, never Inf - Inf) */
    if (code == C_F64) return Py_BuildValue("(ddOO)", d[0], d[1], Py_None, Py_None);
    PyObject *mean = round_to(d[2] / (double)n, (int)code);
    PyObject *norm = mean ? round_to(sqrt(d[3]), (int)code) : NULL;
    if (!norm) {
        Py_XDECREF(mean);
        return NULL;
    }
    return Py_BuildValue("(ddNN)", d[0], d[1], mean, norm);
}

static PyObject *fp_stats(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "stats(addr, n, code)");
        return NULL;
    }
    void *addr = PyLong_AsVoidPtr(args[0]);
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    long code = PyLong_AsLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    if (addr == NULL || n <= 0 || code < 0 || code > C_BOOL) {
        PyErr_SetString(PyExc_ValueError, "stats: a null address, no elements or an unknown dtype code");
        return NULL;
    }
    double d[4];
    int64_t iv[2];
    int big = n * ITEMSIZE[code] >= NOGIL_BYTES;
    PyThreadState *ts = big ? PyEval_SaveThread() : NULL;
    run_kernel(code, addr, n, d, iv);
    if (ts) PyEval_RestoreThread(ts);
    return finish(code, n, d, iv);
}

#define MAX_OUTER 16

/* stats_runs(addr, code, run, sizes, strides): the same statistics over a strided layout made of
 * contiguous runs of `run` elements, the runs at the offsets (in elements) spanned by the outer
 * `sizes` x `strides` (tuples, outermost first, at most 16). */
/* the statistics over the runs of `run` contiguous elements at addr + the odometer's offsets (in elements)
   of k outer dimensions, outermost first */
static void runs_kernel(long code, const char *addr, Py_ssize_t run, Py_ssize_t k, const Py_ssize_t *size,
                        const Py_ssize_t *stride, double *d, int64_t *iv) {
    Py_ssize_t item = ITEMSIZE[code], idx[MAX_OUTER] = {0};
    double d2[4];
    int64_t iv2[2];
    Py_ssize_t off = 0;  /* in elements */
    int first = 1;
    for (;;) {
        if (first) {
            run_kernel(code, addr + off * item, run, d, iv);
            first = 0;
        } else {
            run_kernel(code, addr + off * item, run, d2, iv2);
            combine(code, d, iv, d2, iv2);
        }
        Py_ssize_t j = k - 1;  /* the odometer over the outer dimensions, innermost first */
        while (j >= 0) {
            off += stride[j];
            if (++idx[j] < size[j]) break;
            off -= stride[j] * size[j];
            idx[j] = 0;
            j--;
        }
        if (j < 0) break;
    }
}

static PyObject *fp_stats_runs(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5 || !PyTuple_Check(args[3]) || !PyTuple_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "stats_runs(addr, code, run, sizes: tuple, strides: tuple)");
        return NULL;
    }
    char *addr = (char *)PyLong_AsVoidPtr(args[0]);
    long code = PyLong_AsLong(args[1]);
    Py_ssize_t run = PyLong_AsSsize_t(args[2]);
    Py_ssize_t k = PyTuple_GET_SIZE(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (addr == NULL || run <= 0 || code < 0 || code > C_BOOL || k < 1 || k > MAX_OUTER ||
        PyTuple_GET_SIZE(args[4]) != k) {
        PyErr_SetString(PyExc_ValueError, "stats_runs: a null address, an empty run, an unknown dtype code "
                                          "or 1 to 16 outer sizes and strides expected");
        return NULL;
    }
    Py_ssize_t size[MAX_OUTER], stride[MAX_OUTER], n = run;
    for (Py_ssize_t j = 0; j < k; j++) {
        size[j] = PyLong_AsSsize_t(PyTuple_GET_ITEM(args[3], j));
        stride[j] = PyLong_AsSsize_t(PyTuple_GET_ITEM(args[4], j));
        if (PyErr_Occurred()) return NULL;
        if (size[j] <= 0) {
            PyErr_SetString(PyExc_ValueError, "stats_runs: outer sizes must be positive");
            return NULL;
        }
        n *= size[j];
    }
    double d[4];
    int64_t iv[2];
    int big = n * ITEMSIZE[code] >= NOGIL_BYTES;
    PyThreadState *ts = big ? PyEval_SaveThread() : NULL;
    runs_kernel(code, addr, run, k, size, stride, d, iv);
    if (ts) PyEval_RestoreThread(ts);
    return finish(code, n, d, iv);
}

/* ---- CRC-32 (reflected, polynomial 0xEDB88320: zlib's) ---- */

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

/* on the inverted register, as the folding code below */
static uint32_t crc_bytes(uint32_t c, const uint8_t *p, size_t n) {
    while (n--) c = crc_table[(c ^ *p++) & 0xff] ^ (c >> 8);
    return c;
}

#ifdef HAVE_X86_CODE
#define HAVE_CLMUL_CODE 1

/* Carry-less multiplication folding (the method of Intel's "Fast CRC Computation for Generic
 * Polynomials Using PCLMULQDQ"): four 128-bit accumulators fold 64 bytes per round, then they are
 * folded into one, reduced to 64 and to 32 bits with a Barrett reduction. Constants are powers of x
 * modulo the bit-reflected polynomial. Requires n >= 64; returns the register for the first
 * n & ~15 bytes and sets *used. */
__attribute__((target("pclmul,sse4.1")))
static uint32_t crc_clmul(uint32_t crc, const uint8_t *p, size_t n, size_t *used) {
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    const __m128i mask32 = _mm_setr_epi32(-1, 0, -1, 0);
    size_t len = n & ~(size_t)15, left = len;
    __m128i x1 = _mm_loadu_si128((const __m128i *)(p + 0x00));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 0x10));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 0x20));
    __m128i x4 = _mm_loadu_si128((const __m128i *)(p + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    p += 64;
    left -= 64;
    while (left >= 64) {
        __m128i a1 = _mm_clmulepi64_si128(x1, k1k2, 0x00), b1 = _mm_clmulepi64_si128(x1, k1k2, 0x11);
        __m128i a2 = _mm_clmulepi64_si128(x2, k1k2, 0x00), b2 = _mm_clmulepi64_si128(x2, k1k2, 0x11);
        __m128i a3 = _mm_clmulepi64_si128(x3, k1k2, 0x00), b3 = _mm_clmulepi64_si128(x3, k1k2, 0x11);
        __m128i a4 = _mm_clmulepi64_si128(x4, k1k2, 0x00), b4 = _mm_clmulepi64_si128(x4, k1k2, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(a1, b1), _mm_loadu_si128((const __m128i *)(p + 0x00)));
        x2 = _mm_xor_si128(_mm_xor_si128(a2, b2), _mm_loadu_si128((const __m128i *)(p + 0x10)));
        x3 = _mm_xor_si128(_mm_xor_si128(a3, b3), _mm_loadu_si128((const __m128i *)(p + 0x20)));
        x4 = _mm_xor_si128(_mm_xor_si128(a4, b4), _mm_loadu_si128((const __m128i *)(p + 0x30)));
        p += 64;
        left -= 64;
    }
#define FOLD1(acc, next)                                                                   \
    do {                                                                                   \
        __m128i lo_ = _mm_clmulepi64_si128(acc, k3k4, 0x00);                               \
        __m128i hi_ = _mm_clmulepi64_si128(acc, k3k4, 0x11);                               \
        acc = _mm_xor_si128(_mm_xor_si128(lo_, hi_), next);                                \
    } while (0)
    FOLD1(x1, x2);
    FOLD1(x1, x3);
    FOLD1(x1, x4);
    while (left >= 16) {
        FOLD1(x1, _mm_loadu_si128((const __m128i *)p));
        p += 16;
        left -= 16;
    }
#undef FOLD1
    /* 128 -> 64 bits */
    __m128i t = _mm_clmulepi64_si128(x1, k3k4, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), t);
    t = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, mask32);
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(x1, k5, 0x00), t);
    /* Barrett reduction to 32 bits */
    t = _mm_and_si128(x1, mask32);
    t = _mm_clmulepi64_si128(t, poly, 0x10);
    t = _mm_and_si128(t, mask32);
    t = _mm_clmulepi64_si128(t, poly, 0x00);
    x1 = _mm_xor_si128(x1, t);
    *used = len;
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

static int have_clmul = 0;

static uint32_t crc32_any(uint32_t crc, const uint8_t *p, size_t n) {
    uint32_t c = ~crc;
#ifdef HAVE_CLMUL_CODE
    if (have_clmul && n >= 64) {
        size_t used = 0;
        c = crc_clmul(c, p, n, &used);
        p += used;
        n -= used;
    }
#endif
    return ~crc_bytes(c, p, n);
}

static PyObject *fp_crc32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "crc32(addr, nbytes, crc=0)");
        return NULL;
    }
    void *addr = PyLong_AsVoidPtr(args[0]);
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    unsigned long crc = nargs == 3 ? PyLong_AsUnsignedLongMask(args[2]) : 0;
    if (PyErr_Occurred()) return NULL;
    if (n < 0 || (n > 0 && addr == NULL)) {
        PyErr_SetString(PyExc_ValueError, "crc32: a null address or a negative size");
        return NULL;
    }
    uint32_t r;
    if (n >= NOGIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        r = crc32_any((uint32_t)crc, (const uint8_t *)addr, (size_t)n);
        Py_END_ALLOW_THREADS
    } else {
        r = crc32_any((uint32_t)crc, (const uint8_t *)addr, (size_t)n);
    }
    return PyLong_FromUnsignedLong(r);
}

/* crc32_combine(crc1, crc2, len2): the CRC-32 of A followed by B from crc1 = CRC(A), crc2 = CRC(B) and
   len2 = len(B), without reading B again (zlib's method: the operator of len2 zero bytes by squaring) */
static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    while (vec) {
        if (vec & 1) sum ^= *mat;
        vec >>= 1;
        mat++;
    }
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat) {
    for (int n = 0; n < 32; n++) square[n] = gf2_times(mat, mat[n]);
}

static uint32_t crc32_combine_(uint32_t crc1, uint32_t crc2, unsigned long long len2) {
    uint32_t even[32], odd[32];
    if (len2 == 0) return crc1;
    odd[0] = 0xedb88320u;  /* the operator of one zero bit */
    uint32_t row = 1;
    for (int n = 1; n < 32; n++) {
        odd[n] = row;
        row <<= 1;
    }
    gf2_square(even, odd);  /* two zero bits */
    gf2_square(odd, even);  /* four */
    do {
        gf2_square(even, odd);
        if (len2 & 1) crc1 = gf2_times(even, crc1);
        len2 >>= 1;
        if (len2 == 0) break;
        gf2_square(odd, even);
        if (len2 & 1) crc1 = gf2_times(odd, crc1);
        len2 >>= 1;
    } while (len2 != 0);
    return crc1 ^ crc2;
}

static PyObject *fp_crc32_combine(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "crc32_combine(crc1, crc2, len2)");
        return NULL;
    }
    unsigned long c1 = PyLong_AsUnsignedLongMask(args[0]);
    unsigned long c2 = PyLong_AsUnsignedLongMask(args[1]);
    long long n = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "crc32_combine: a negative length");
        return NULL;
    }
    return PyLong_FromUnsignedLong(crc32_combine_((uint32_t)c1, (uint32_t)c2, (unsigned long long)n));
}

/* ---- record_json: see the header comment ---------------------------------------------------- */

static int json_plain(PyObject *o, int depth) {
    if (o == Py_None || PyBool_Check(o) || PyUnicode_CheckExact(o)) return 1;
    if (PyFloat_CheckExact(o)) return isfinite(PyFloat_AS_DOUBLE(o)) ? 1 : 0;
    if (PyLong_CheckExact(o)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        return overflow == 0;
    }
    if (depth >= 64) return 0;
    if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
        PyObject **items = PySequence_Fast_ITEMS(o);
        for (Py_ssize_t i = 0; i < n; i++)
            if (!json_plain(items[i], depth + 1)) return 0;
        return 1;
    }
    if (PyDict_CheckExact(o)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(o, &pos, &k, &v))
            if (!PyUnicode_CheckExact(k) || !json_plain(v, depth + 1)) return 0;
        return 1;
    }
    return 0;
}

static const char HEX[] = "0123456789abcdef";

static Py_ssize_t put_u(unsigned char *out, unsigned cp) {
    out[0] = '\\';
    out[1] = 'u';
    out[2] = HEX[(cp >> 12) & 15];
    out[3] = HEX[(cp >> 8) & 15];
    out[4] = HEX[(cp >> 4) & 15];
    out[5] = HEX[cp & 15];
    return 6;
}

/* one number token of orjson's text, as Python's repr spells it: an exponent of at least two
 * digits with its sign, scientific below 1e-4 (orjson writes 0.00001 and 1e-7) */
static Py_ssize_t put_number(const unsigned char *t, Py_ssize_t len, unsigned char *out) {
    Py_ssize_t e = -1, o = 0;
    for (Py_ssize_t i = 0; i < len; i++)
        if (t[i] == 'e' || t[i] == 'E') {
            e = i;
            break;
        }
    if (e >= 0) {
        memcpy(out, t, (size_t)e);
        o = e;
        out[o++] = 'e';
        Py_ssize_t k = e + 1;
        if (k < len && (t[k] == '+' || t[k] == '-')) out[o++] = t[k++];
        else out[o++] = '+';
        if (len - k == 1) out[o++] = '0';
        memcpy(out + o, t + k, (size_t)(len - k));
        return o + (len - k);
    }
    Py_ssize_t p = (len && t[0] == '-') ? 1 : 0;
    if (len - p > 6 && t[p] == '0' && t[p + 1] == '.') {
        Py_ssize_t z = 0;
        while (p + 2 + z < len && t[p + 2 + z] == '0') z++;
        Py_ssize_t d = p + 2 + z;  /* the first significant digit */
        if (z >= 4 && d < len) {
            if (p) out[o++] = '-';
            out[o++] = t[d];
            if (len - d > 1) {
                out[o++] = '.';
                memcpy(out + o, t + d + 1, (size_t)(len - d - 1));
                o += len - d - 1;
            }
            unsigned ex = (unsigned)(z + 1);
            out[o++] = 'e';
            out[o++] = '-';
            char buf[8];
            int nd = snprintf(buf, sizeof buf, "%02u", ex);
            memcpy(out + o, buf, (size_t)nd);
            return o + nd;
        }
    }
    memcpy(out, t, (size_t)len);
    return len;
}

/* orjson's compact UTF-8 text -> json.dumps(separators=(", ", ": "), ensure_ascii=True)'s; NULL with
 * no exception set when the text is not what orjson writes (the caller falls back) */
static PyObject *respace(const unsigned char *s, Py_ssize_t n) {
    unsigned char *out = (unsigned char *)PyMem_Malloc((size_t)n * 6 + 64);
    if (out == NULL) return PyErr_NoMemory();
    Py_ssize_t i = 0, o = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c == '"') {
            out[o++] = c;
            i++;
            for (;;) {
                if (i >= n) goto bad;
                c = s[i];
                if (c == '"') {
                    out[o++] = c;
                    i++;
                    break;
                }
                if (c == '\\') {
                    if (i + 1 >= n) goto bad;
                    if (s[i + 1] == 'u') {
                        if (i + 6 > n) goto bad;
                        out[o++] = '\\';
                        out[o++] = 'u';
                        for (int k = 2; k < 6; k++) {
                            unsigned char h = s[i + k];
                            out[o++] = (h >= 'A' && h <= 'F') ? (unsigned char)(h + 32) : h;
                        }
                        i += 6;
                    } else {
                        out[o++] = c;
                        out[o++] = s[i + 1];
                        i += 2;
                    }
                    continue;
                }
                if (c < 0x80) {
                    if (c == 0x7f) o += put_u(out + o, c);
                    else out[o++] = c;
                    i++;
                    continue;
                }
                unsigned cp;
                int more;
                if ((c & 0xE0) == 0xC0) { cp = c & 0x1F; more = 1; }
                else if ((c & 0xF0) == 0xE0) { cp = c & 0x0F; more = 2; }
                else if ((c & 0xF8) == 0xF0) { cp = c & 0x07; more = 3; }
                else goto bad;
                if (i + more >= n) goto bad;
                for (int k = 1; k <= more; k++) {
                    unsigned char b = s[i + k];
                    if ((b & 0xC0) != 0x80) goto bad;
                    cp = (cp << 6) | (b & 0x3F);
                }
                i += more + 1;
                if (cp >= 0x10000) {
                    cp -= 0x10000;
                    o += put_u(out + o, 0xD800 | (cp >> 10));
                    o += put_u(out + o, 0xDC00 | (cp & 0x3FF));
                } else {
                    o += put_u(out + o, cp);
                }
            }
        } else if (c == ',' || c == ':') {
            out[o++] = c;
            out[o++] = ' ';
            i++;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            Py_ssize_t j = i + 1;
            while (j < n && ((s[j] >= '0' && s[j] <= '9') || s[j] == '.' || s[j] == 'e' || s[j] == 'E' ||
                             s[j] == '+' || s[j] == '-'))
                j++;
            o += put_number(s + i, j - i, out + o);
            i = j;
        } else {
            out[o++] = c;
            i++;
        }
    }
    {
        PyObject *r = PyUnicode_New(o, 127);
        if (r != NULL) memcpy(PyUnicode_1BYTE_DATA(r), out, (size_t)o);
        PyMem_Free(out);
        return r;
    }
bad:
    PyMem_Free(out);
    return NULL;
}

static PyObject *fp_record_json(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "record_json(obj, dumps)");
        return NULL;
    }
    if (!json_plain(args[0], 0)) Py_RETURN_NONE;
    PyObject *b = PyObject_CallOneArg(args[1], args[0]);
    if (b == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (!PyBytes_Check(b)) {
        Py_DECREF(b);
        Py_RETURN_NONE;
    }
    PyObject *r = respace((const unsigned char *)PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b));
    Py_DECREF(b);
    if (r == NULL && !PyErr_Occurred()) Py_RETURN_NONE;
    return r;
}

/* ------------------------------------------------------------------ tensor_entry */

/* the fields of tensor_entry's ctx tuple (msprobe/dumpers/pytorch/_encode.py's entry_context) */
enum { TC_ENTRIES, TC_LIMIT, TC_NAMES, TC_CODES, TC_HANDLE, TC_DONE, TC_KEYS, TC_MD5, TC_CPU, TC_TENSOR,
       TC_PARAM, TC_ANY_SIZE, TC_SCALAR_MAX, TC_F32, TC_STRIDE, TC_SIZE };

static PyObject *S_dtype, *S_shape, *S_requires_grad, *S_is_cpu, *S_base, *S_is_contiguous, *S_storage_offset,
    *S_version, *S_is_neg, *S_data_ptr, *S_untyped_storage, *S_nbytes, *S_type, *S_torch_tensor, *S_md5,
    *S_type_bool, *S_type_int, *S_type_float, *S_type_str, *S_value;

static int entry_strings(void) {
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return -1
    INTERN(S_dtype, "dtype"); INTERN(S_shape, "shape"); INTERN(S_requires_grad, "requires_grad");
    INTERN(S_is_cpu, "is_cpu"); INTERN(S_base, "_base"); INTERN(S_is_contiguous, "is_contiguous");
    INTERN(S_storage_offset, "storage_offset"); INTERN(S_version, "_version"); INTERN(S_is_neg, "is_neg");
    INTERN(S_data_ptr, "data_ptr"); INTERN(S_untyped_storage, "untyped_storage"); INTERN(S_nbytes, "nbytes");
    INTERN(S_type, "type"); INTERN(S_torch_tensor, "torch.Tensor"); INTERN(S_md5, "md5");
    INTERN(S_type_bool, "bool"); INTERN(S_type_int, "int"); INTERN(S_type_float, "float"); INTERN(S_type_str, "str");
    INTERN(S_value, "value");
#undef INTERN
    return 0;
}

/* whether the weak reference ref refers to obj (-1 with an error set) */
static int weak_is(PyObject *ref, PyObject *obj) {
    if (!PyWeakref_Check(ref)) return 0;
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *target;
    if (PyWeakref_GetRef(ref, &target) < 0) return -1;
    int same = target == obj;
    Py_XDECREF(target);
    return same;
#else
    PyObject *target = PyWeakref_GetObject(ref);
    return target == NULL ? -1 : target == obj;
#endif
}

/* a method's result as a C integer (-1 with an error set) */
static long long call_int(PyObject *t, PyObject *name) {
    PyObject *r = PyObject_CallMethodNoArgs(t, name);
    if (r == NULL) return -1;
    long long v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return v;
}

/* a method's or attribute's truth (-1 with an error set) */
static int truth_of(PyObject *t, PyObject *name, int call) {
    PyObject *r = call ? PyObject_CallMethodNoArgs(t, name) : PyObject_GetAttr(t, name);
    if (r == NULL) return -1;
    int v = PyObject_IsTrue(r);
    Py_DECREF(r);
    return v;
}

#define MAX_DIMS 24

/* what tensor_entry knows of a tensor's layout: its element count, dimensions and, not contiguous, its
   sizes and strides (in elements) */
typedef struct {
    Py_ssize_t n;
    int dim, contiguous;
    Py_ssize_t size[MAX_DIMS], stride[MAX_DIMS];
} layout_t;

/* _encode._runs: the tensor's memory as `run` contiguous elements at the offsets of k outer dimensions
   (those continuing the run merged into it); 0 when its smallest stride is not 1 or the runs would be
   shorter than 8 elements */
static int layout_runs(const layout_t *l, Py_ssize_t *run, Py_ssize_t *k, Py_ssize_t *size, Py_ssize_t *stride) {
    Py_ssize_t st[MAX_DIMS], sz[MAX_DIMS];
    int m = 0;
    for (int i = 0; i < l->dim; i++) {
        if (l->size[i] == 1) continue;
        /* insertion into (stride, size) descending order, as sorted(..., reverse=True) */
        int j = m++;
        while (j > 0 && (st[j - 1] < l->stride[i] || (st[j - 1] == l->stride[i] && sz[j - 1] < l->size[i]))) {
            st[j] = st[j - 1];
            sz[j] = sz[j - 1];
            j--;
        }
        st[j] = l->stride[i];
        sz[j] = l->size[i];
    }
    if (m == 0 || st[m - 1] != 1) return 0;
    Py_ssize_t r = sz[m - 1];
    int index = m - 2;
    while (index >= 0 && st[index] == r) {
        r *= sz[index];
        index--;
    }
    if (r < 8 || index >= MAX_OUTER) return 0;
    *run = r;
    *k = index + 1;
    for (int i = 0; i <= index; i++) {
        size[i] = sz[i];
        stride[i] = st[i];
    }
    return 1;
}

/* a 0-d tensor's value as its statistics give it (_encode's scalar handle: Max = Min = Mean = Norm = the
   value; bool: any = all = the value, no Mean/Norm) */
static PyObject *scalar_stats(long code, const void *addr) {
    PyObject *v;
    switch (code) {
    case C_F32: v = PyFloat_FromDouble((double)*(const float *)addr); break;
    case C_F64: v = PyFloat_FromDouble(*(const double *)addr); break;
    case C_F16: v = PyFloat_FromDouble((double)load_f16(*(const uint16_t *)addr)); break;
    case C_BF16: v = PyFloat_FromDouble((double)load_bf16(*(const uint16_t *)addr)); break;
    case C_I8: v = PyLong_FromLong(*(const int8_t *)addr); break;
    case C_U8: v = PyLong_FromLong(*(const uint8_t *)addr); break;
    case C_I16: v = PyLong_FromLong(*(const int16_t *)addr); break;
    case C_I32: v = PyLong_FromLong(*(const int32_t *)addr); break;
    case C_I64: v = PyLong_FromLongLong(*(const int64_t *)addr); break;
    default: {
        PyObject *b = *(const uint8_t *)addr ? Py_True : Py_False;
        return Py_BuildValue("(OOOO)", b, b, Py_None, Py_None);
    }
    }
    if (v == NULL) return NULL;
    return Py_BuildValue("(OOON)", v, v, v, v);
}

/* the statistics of a CPU tensor as _encode's _stat_handle gives them on its C path (a dict in the
   table's order), md5 mode its CRC-32; NULL with an error set, or NULL without one: not this path's */
static PyObject *entry_stats(PyObject *t, PyObject *ctx, PyObject *dtype, long code, const layout_t *l,
                             long long offset, PyObject **md5) {
    Py_ssize_t n = l->n;
    long long nbytes_needed = (offset + 1) * (long long)ITEMSIZE[code];
    PyObject *storage = PyObject_CallMethodNoArgs(t, S_untyped_storage);
    if (storage == NULL) return NULL;
    long long have = call_int(storage, S_nbytes);
    Py_DECREF(storage);
    if (have < 0 && PyErr_Occurred()) return NULL;
    if (have < nbytes_needed) return NULL;  /* no memory behind it (a freed storage): null stats, Python's */
    int neg = truth_of(t, S_is_neg, 1);
    if (neg != 0) return NULL;
    if (l->dim && !PyObject_IsTrue(PyTuple_GET_ITEM(ctx, TC_ANY_SIZE)) &&
        (long long)n > PyLong_AsLongLong(PyTuple_GET_ITEM(ctx, TC_SCALAR_MAX)))
        return NULL;
    Py_ssize_t run = n, k = 0, size[MAX_OUTER], stride[MAX_OUTER];
    if (!l->contiguous && !layout_runs(l, &run, &k, size, stride)) return NULL;  /* torch's reductions */
    PyObject *ptr = PyObject_CallMethodNoArgs(t, S_data_ptr);
    if (ptr == NULL) return NULL;
    void *addr = PyLong_AsVoidPtr(ptr);
    Py_DECREF(ptr);
    if (addr == NULL) return NULL;
    double d[4];
    int64_t iv[2];
    Py_ssize_t bytes = n * ITEMSIZE[code];
    int want_md5 = PyTuple_GET_ITEM(ctx, TC_MD5) == Py_True;  /* (then contiguous: tensor_entry_) */
    uint32_t crc = 0;
    PyObject *vals;
    if (l->dim == 0) {
        if (want_md5) crc = crc32_any(0, (const uint8_t *)addr, (size_t)bytes);
        vals = scalar_stats(code, addr);
    } else {
        PyThreadState *ts = bytes >= NOGIL_BYTES ? PyEval_SaveThread() : NULL;
        if (k == 0)
            run_kernel(code, addr, n, d, iv);
        else
            runs_kernel(code, (const char *)addr, run, k, size, stride, d, iv);
        if (want_md5) crc = crc32_any(0, (const uint8_t *)addr, (size_t)bytes);
        if (ts) PyEval_RestoreThread(ts);
        vals = finish(code, n, d, iv);
        PyObject *mean = vals ? PyTuple_GET_ITEM(vals, 2) : NULL;
        if (mean && dtype == PyTuple_GET_ITEM(ctx, TC_F32) && PyFloat_Check(mean) &&
            fabs(PyFloat_AS_DOUBLE(mean)) * (double)n > (double)FLT_MAX) {
            /* torch's float32 sum overflows there (26.2.0: -inf) */
            PyObject *inf = PyFloat_FromDouble(copysign(INFINITY, PyFloat_AS_DOUBLE(mean)));
            if (inf == NULL) Py_CLEAR(vals);
            else {
                PyTuple_SET_ITEM(vals, 2, inf);
                Py_DECREF(mean);
            }
        }
    }
    if (vals == NULL) return NULL;
    PyObject *keys = PyTuple_GET_ITEM(ctx, TC_KEYS);
    PyObject *stats = PyDict_New();
    for (Py_ssize_t i = 0; stats != NULL && i < 4; i++) {
        if (PyDict_SetItem(stats, PyTuple_GET_ITEM(keys, i), PyTuple_GET_ITEM(vals, i)) < 0) Py_CLEAR(stats);
    }
    Py_DECREF(vals);
    if (stats != NULL && want_md5) {
        *md5 = PyUnicode_FromFormat("%08x", (unsigned int)crc);
        if (*md5 == NULL) Py_CLEAR(stats);
    }
    return stats;
}

/* StatCache.memory_key's layout: (numel, is 0-d) contiguous, else the sorted (size, stride) pairs */
static PyObject *layout_key(const layout_t *l) {
    if (l->contiguous) return Py_BuildValue("(nO)", l->n, l->dim == 0 ? Py_True : Py_False);
    Py_ssize_t sz[MAX_DIMS], st[MAX_DIMS];
    for (int i = 0; i < l->dim; i++) {  /* insertion into (size, stride) ascending order, as sorted(zip(...)) */
        int j = i;
        while (j > 0 && (sz[j - 1] > l->size[i] || (sz[j - 1] == l->size[i] && st[j - 1] > l->stride[i]))) {
            sz[j] = sz[j - 1];
            st[j] = st[j - 1];
            j--;
        }
        sz[j] = l->size[i];
        st[j] = l->stride[i];
    }
    PyObject *key = PyTuple_New(l->dim);
    for (int i = 0; key != NULL && i < l->dim; i++) {
        PyObject *pair = Py_BuildValue("(nn)", sz[i], st[i]);
        if (pair == NULL) Py_CLEAR(key);
        else PyTuple_SET_ITEM(key, i, pair);
    }
    return key;
}

/* the cached (or new, then cached) done handle; 0: found or made, 1: not for this path, -1: an error */
static int entry_handle(PyObject *t, PyObject *ctx, PyObject *dtype, long code, const layout_t *l,
                        PyObject **handle_out) {
    PyObject *base = PyObject_GetAttr(t, S_base);
    if (base == NULL) return -1;
    if (base == Py_None) {
        Py_DECREF(base);
        base = Py_NewRef(t);
    }
    int rc = -1;
    PyObject *key = NULL, *version = NULL, *stats = NULL, *md5 = NULL, *extra = NULL, *handle = NULL;
    long long offset = call_int(t, S_storage_offset);
    if (offset < 0) goto done;
    version = PyObject_GetAttr(t, S_version);
    if (version == NULL) goto done;
    key = Py_BuildValue("(NLNOO)", PyLong_FromVoidPtr(base), offset, layout_key(l), dtype,
                        PyTuple_GET_ITEM(ctx, TC_CPU));
    if (key == NULL) goto done;
    PyObject *entries = PyTuple_GET_ITEM(ctx, TC_ENTRIES);
    PyObject *e = PyDict_GetItemWithError(entries, key);  /* borrowed */
    if (e == NULL && PyErr_Occurred()) goto done;
    if (e != NULL && PyTuple_Check(e) && PyTuple_GET_SIZE(e) == 3 && weak_is(PyTuple_GET_ITEM(e, 0), base) == 1) {
        int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(e, 1), version, Py_EQ);
        if (same < 0) goto done;
        if (same) {
            *handle_out = Py_NewRef(PyTuple_GET_ITEM(e, 2));
            rc = 0;
            goto done;
        }
    }
    stats = entry_stats(t, ctx, dtype, code, l, offset, &md5);
    if (stats == NULL) {
        rc = PyErr_Occurred() ? -1 : 1;
        goto done;
    }
    if (md5 != NULL) {
        extra = PyDict_New();
        if (extra == NULL || PyDict_SetItem(extra, S_md5, md5) < 0) goto done;
    }
    handle = PyObject_CallFunction(PyTuple_GET_ITEM(ctx, TC_HANDLE), "OOiOO", PyTuple_GET_ITEM(ctx, TC_DONE), stats,
                                   0, Py_None, extra ? extra : Py_None);
    if (handle == NULL) goto done;
    if (PyDict_GET_SIZE(entries) >= PyLong_AsSsize_t(PyTuple_GET_ITEM(ctx, TC_LIMIT))) PyDict_Clear(entries);
    PyObject *ref = PyWeakref_NewRef(base, NULL);
    if (ref == NULL) {
        PyErr_Clear();  /* (as StatCache.store: not cached) */
    } else {
        PyObject *value = PyTuple_Pack(3, ref, version, handle);
        Py_DECREF(ref);
        if (value == NULL || PyDict_SetItem(entries, key, value) < 0) {
            Py_XDECREF(value);
            goto done;
        }
        /* the cache's key (ints, the dtype, the device, a tuple of ints), its value (a weak reference, an
           int, the handle) and the handle (ints, dicts of atomic values) hold no reference cycle: left
           out of the collector's walks, as it leaves such tuples out itself once it has seen them */
        PyObject_GC_UnTrack(key);
        PyObject_GC_UnTrack(value);
        if (PyTuple_CheckExact(PyTuple_GET_ITEM(key, 2))) PyObject_GC_UnTrack(PyTuple_GET_ITEM(key, 2));
        if (extra == NULL) PyObject_GC_UnTrack(handle);
        Py_DECREF(value);
    }
    *handle_out = Py_NewRef(handle);
    rc = 0;
done:
    Py_DECREF(base);
    Py_XDECREF(key);
    Py_XDECREF(version);
    Py_XDECREF(stats);
    Py_XDECREF(md5);
    Py_XDECREF(extra);
    Py_XDECREF(handle);
    return rc;
}

/* the entry from a done handle: type, dtype, shape, the statistics, requires_grad, md5 last; NULL
   without an error: not a handle this path fills */
static PyObject *entry_from(PyObject *ctx, PyObject *handle, PyObject *name, PyObject *shape, int requires_grad) {
    if (Py_TYPE(handle) != (PyTypeObject *)PyTuple_GET_ITEM(ctx, TC_HANDLE) || PyTuple_GET_SIZE(handle) != 5)
        return NULL;
    PyObject *kind = PyTuple_GET_ITEM(handle, 0), *stats = PyTuple_GET_ITEM(handle, 1);
    PyObject *extra = PyTuple_GET_ITEM(handle, 4), *md5 = NULL;
    int done = PyObject_RichCompareBool(kind, PyTuple_GET_ITEM(ctx, TC_DONE), Py_EQ);
    if (done != 1 || !PyDict_CheckExact(stats) || PyDict_GET_SIZE(stats) != 4) {
        if (done < 0) PyErr_Clear();
        return NULL;
    }
    if (extra != Py_None) {
        if (!PyDict_CheckExact(extra)) return NULL;
        md5 = PyDict_GetItemWithError(extra, S_md5);
        if (md5 == NULL && PyErr_Occurred()) return NULL;
        if (md5 != NULL && !PyUnicode_CheckExact(md5)) return NULL;  /* a device copy read at the fetch */
    }
    if (md5 == NULL) {
        int has = PyDict_Contains(stats, S_md5);
        if (has != 0) return NULL;
    }
    PyObject *list = PySequence_List(shape);
    if (list == NULL) return NULL;
    /* a list of ints holds no reference cycle: untracked (the records of a step live until its end, and
       the collector walked each shape at every collection of their generations) */
    PyObject_GC_UnTrack(list);
    PyObject *entry = PyDict_New();
    if (entry == NULL || PyDict_SetItem(entry, S_type, S_torch_tensor) < 0 || PyDict_SetItem(entry, S_dtype, name) < 0 ||
        PyDict_SetItem(entry, S_shape, list) < 0 || PyDict_Update(entry, stats) < 0 ||
        PyDict_SetItem(entry, S_requires_grad, requires_grad ? Py_True : Py_False) < 0 ||
        (md5 != NULL && PyDict_SetItem(entry, S_md5, md5) < 0)) {
        Py_XDECREF(entry);
        entry = NULL;
    }
    Py_DECREF(list);
    return entry;
}

static PyObject *tensor_entry_(PyObject *t, PyObject *ctx) {
    PyTypeObject *type = Py_TYPE(t);
    if (type != (PyTypeObject *)PyTuple_GET_ITEM(ctx, TC_TENSOR) && type != (PyTypeObject *)PyTuple_GET_ITEM(ctx, TC_PARAM))
        return NULL;
    int cpu = truth_of(t, S_is_cpu, 0);
    if (cpu != 1) return NULL;
    PyObject *dtype = PyObject_GetAttr(t, S_dtype);
    if (dtype == NULL) return NULL;
    PyObject *name = PyDict_GetItemWithError(PyTuple_GET_ITEM(ctx, TC_NAMES), dtype);  /* borrowed */
    PyObject *code_obj = name ? PyDict_GetItemWithError(PyTuple_GET_ITEM(ctx, TC_CODES), dtype) : NULL;
    PyObject *shape = NULL, *handle = NULL, *entry = NULL;
    if (code_obj == NULL) goto out;
    long code = PyLong_AsLong(code_obj);
    if (code < 0 || code > C_BOOL) goto out;
    shape = PyObject_GetAttr(t, S_shape);
    if (shape == NULL || !PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) > MAX_DIMS) goto out;
    layout_t l;
    l.dim = (int)PyTuple_GET_SIZE(shape);
    l.n = 1;
    for (int i = 0; i < l.dim; i++) {
        Py_ssize_t size = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
        if (size <= 0 || l.n > PY_SSIZE_T_MAX / size) goto out;  /* (empty, or an error) */
        l.n *= size;
        l.size[i] = size;
    }
    int requires_grad = truth_of(t, S_requires_grad, 0);
    l.contiguous = truth_of(t, S_is_contiguous, 1);
    if (requires_grad < 0 || l.contiguous < 0) goto out;
    if (!l.contiguous) {  /* (md5 mode: the bytes of a contiguous copy, Python's) */
        if (PyTuple_GET_ITEM(ctx, TC_MD5) == Py_True) goto out;
        /* torch._C.TensorBase.stride: not torch.Tensor.stride, which the API wrappers replace (a call of the
           dumper's own would go through a Python wrapper to the same method) */
        PyObject *strides = PyObject_CallOneArg(PyTuple_GET_ITEM(ctx, TC_STRIDE), t);
        int ok = strides != NULL && PyTuple_Check(strides) && PyTuple_GET_SIZE(strides) == l.dim;
        for (int i = 0; ok && i < l.dim; i++) {
            l.stride[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(strides, i));
            ok = !(l.stride[i] == -1 && PyErr_Occurred());
        }
        Py_XDECREF(strides);
        if (!ok) goto out;
    }
    if (entry_handle(t, ctx, dtype, code, &l, &handle) != 0) goto out;
    entry = entry_from(ctx, handle, name, shape, requires_grad);
out:
    Py_DECREF(dtype);
    Py_XDECREF(shape);
    Py_XDECREF(handle);
    return entry;
}

/* the call has `want` arguments and its second is _encode.entry_context's tuple; else a TypeError naming `usage` */
static int entry_call_ok(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, const char *usage) {
    if (nargs == want && PyTuple_Check(args[1]) && PyTuple_GET_SIZE(args[1]) == TC_SIZE &&
        PyDict_CheckExact(PyTuple_GET_ITEM(args[1], TC_ENTRIES)))
        return 1;
    PyErr_Format(PyExc_TypeError, "%s: ctx is _encode.entry_context's tuple", usage);
    return 0;
}

static PyObject *fp_tensor_entry(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (!entry_call_ok(args, nargs, 2, "tensor_entry(tensor, ctx)")) return NULL;
    PyObject *entry = tensor_entry_(args[0], args[1]);
    if (entry != NULL) return entry;
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) return NULL;  /* (KeyboardInterrupt, ...) */
        PyErr_Clear();  /* the Python path takes it, and meets the error as it would have */
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ encode_values, untrack, journal_line */

/* a dict, list or tuple whose content holds no reference cycle (atomic values, and containers already
   out of the collector's walks) leaves them too: 1 when obj is now untracked or no container */
static int untrack_(PyObject *obj, int depth) {
    if (!PyObject_IS_GC(obj) || !PyObject_GC_IsTracked(obj)) return 1;
    if (depth > 64) return 0;
    if (PyDict_CheckExact(obj)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(obj, &pos, &k, &v))
            if (!untrack_(k, depth + 1) || !untrack_(v, depth + 1)) return 0;
    } else if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
        PyObject **items = PySequence_Fast_ITEMS(obj);
        for (Py_ssize_t i = 0; i < n; i++)
            if (!untrack_(items[i], depth + 1)) return 0;
    } else {
        return 0;
    }
    PyObject_GC_UnTrack(obj);
    return 1;
}

static PyObject *fp_untrack(PyObject *self, PyObject *obj) {
    (void)self;
    return PyBool_FromLong(untrack_(obj, 0));
}

static PyObject *typed_entry(PyObject *type, PyObject *v) {
    PyObject *d = PyDict_New();  /* (atomic values only: the dict stays untracked) */
    if (d != NULL && (PyDict_SetItem(d, S_type, type) < 0 || PyDict_SetItem(d, S_value, v) < 0)) Py_CLEAR(d);
    return d;
}

/* ValueEncoder.encode's entry of v for the values this path takes (a tensor tensor_entry makes, None, an
   exact bool / int / float / str, an exact list or tuple of them); NULL without an error: not this
   path's (the caller encodes the whole top-level value in Python) */
static PyObject *value_entry(PyObject *v, PyObject *ctx, int depth) {
    if (v == Py_None) return Py_NewRef(Py_None);
    PyTypeObject *tp = Py_TYPE(v);
    if (tp == (PyTypeObject *)PyTuple_GET_ITEM(ctx, TC_TENSOR) || tp == (PyTypeObject *)PyTuple_GET_ITEM(ctx, TC_PARAM)) {
        PyObject *entry = tensor_entry_(v, ctx);
        if (entry == NULL && PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_Exception))
            PyErr_Clear();  /* the Python path takes it, and meets the error as it would have */
        if (entry != NULL) PyObject_GC_UnTrack(entry);  /* (its values are atomic, its shape list untracked) */
        return entry;
    }
    if (tp == &PyBool_Type) return typed_entry(S_type_bool, v);
    if (tp == &PyLong_Type) return typed_entry(S_type_int, v);
    if (tp == &PyFloat_Type) return typed_entry(S_type_float, v);
    if (tp == &PyUnicode_Type) return typed_entry(S_type_str, v);
    if ((tp == &PyList_Type || tp == &PyTuple_Type) && depth < 8) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
        PyObject *list = PyList_New(n);
        if (list == NULL) return NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = value_entry(PySequence_Fast_ITEMS(v)[i], ctx, depth + 1);
            if (item == NULL) {
                Py_DECREF(list);
                return NULL;
            }
            PyList_SET_ITEM(list, i, item);
            if (PySequence_Fast_GET_SIZE(v) != n) {  /* (changed by a tensor's attribute read: Python's) */
                Py_DECREF(list);
                return NULL;
            }
        }
        untrack_(list, 0);
        return list;
    }
    return NULL;
}

/* one top-level value's entry: this path's, else fallback(value, prefix, key) */
static PyObject *top_entry(PyObject *v, PyObject *ctx, PyObject *fallback, PyObject *prefix, PyObject *key) {
    PyObject *entry = value_entry(v, ctx, 0);
    if (entry != NULL || PyErr_Occurred()) return entry;
    PyObject *call_args[3] = {v, prefix, key};
    return PyObject_Vectorcall(fallback, call_args, 3, NULL);
}

static PyObject *fp_encode_values(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (!entry_call_ok(args, nargs, 4, "encode_values(values, ctx, fallback, prefix)")) return NULL;
    PyObject *values = args[0], *ctx = args[1], *fallback = args[2], *prefix = args[3];
    if (PyDict_Check(values)) {
        PyObject *out = PyDict_New();
        PyObject *items = out ? PyDict_Items(values) : NULL;  /* (a copy: the fallback may run any code) */
        if (items == NULL) {
            Py_XDECREF(out);
            return NULL;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
            PyObject *pair = PyList_GET_ITEM(items, i);
            PyObject *entry = top_entry(PyTuple_GET_ITEM(pair, 1), ctx, fallback, prefix, PyTuple_GET_ITEM(pair, 0));
            if (entry == NULL || PyDict_SetItem(out, PyTuple_GET_ITEM(pair, 0), entry) < 0) {
                Py_XDECREF(entry);
                Py_DECREF(items);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(entry);
        }
        Py_DECREF(items);
        untrack_(out, 0);
        return out;
    }
    PyObject *seq = PySequence_Tuple(values);  /* (a copy, as the fallback may run any code) */
    if (seq == NULL) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *index = PyLong_FromSsize_t(i);
        PyObject *entry = index ? top_entry(PyTuple_GET_ITEM(seq, i), ctx, fallback, prefix, index) : NULL;
        Py_XDECREF(index);
        if (entry == NULL) Py_CLEAR(out);
        else PyList_SET_ITEM(out, i, entry);
    }
    Py_DECREF(seq);
    if (out != NULL) untrack_(out, 0);
    return out;
}

/* a name's JSON string as json.dumps writes it (ensure_ascii) when it needs no escape: NULL without an
   error otherwise */
static int plain_ascii(PyObject *s) {
    if (!PyUnicode_CheckExact(s) || !PyUnicode_IS_ASCII(s)) return 0;
    const unsigned char *p = PyUnicode_1BYTE_DATA(s);
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i] < 0x20 || p[i] == '"' || p[i] == '\\' || p[i] == 0x7f) return 0;
    return 1;
}

/* journal_line(record, dumps, name, parent, with_parent, stack_id) -> (text, line) or None: the record's
   JSON text as record_json makes it and its journal line as format.journal.encode_record_text makes it
   around that text (parent written when with_parent; stack_id when not None); None where either would
   take the Python path (a record record_json declines, a name or parent needing escapes, a stack id not
   an int) */
static PyObject *fp_journal_line(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "journal_line(record, dumps, name, parent, with_parent, stack_id)");
        return NULL;
    }
    PyObject *name = args[2], *parent = args[3], *stack_id = args[5];
    int with_parent = PyObject_IsTrue(args[4]);
    if (with_parent < 0) return NULL;
    if (!plain_ascii(name) || (with_parent && parent != Py_None && !plain_ascii(parent)) ||
        (stack_id != Py_None && !PyLong_CheckExact(stack_id)))
        Py_RETURN_NONE;
    PyObject *text = fp_record_json(self, args, 2);
    if (text == NULL || text == Py_None) return text;
    PyObject *sid = stack_id != Py_None ? PyObject_Str(stack_id) : NULL;
    if (stack_id != Py_None && sid == NULL) {
        Py_DECREF(text);
        return NULL;
    }
    Py_ssize_t nn = PyUnicode_GET_LENGTH(name), nt = PyUnicode_GET_LENGTH(text);
    Py_ssize_t np = !with_parent ? 0 : parent == Py_None ? 4 : PyUnicode_GET_LENGTH(parent) + 2;
    Py_ssize_t ns = sid ? PyUnicode_GET_LENGTH(sid) : 0;
    Py_ssize_t size = 10 + nn + 13 + nt + (with_parent ? 12 + np : 0) + (sid ? 14 + ns : 0) + 1;
    PyObject *line = PyBytes_FromStringAndSize(NULL, size);
    if (line == NULL) {
        Py_DECREF(text);
        Py_XDECREF(sid);
        return NULL;
    }
    char *o = PyBytes_AS_STRING(line);
#define PUT(src, len) do { memcpy(o, (src), (size_t)(len)); o += (len); } while (0)
    PUT("{\"name\": \"", 10);
    PUT(PyUnicode_1BYTE_DATA(name), nn);
    PUT("\", \"record\": ", 13);
    PUT(PyUnicode_1BYTE_DATA(text), nt);
    if (with_parent) {
        PUT(", \"parent\": ", 12);
        if (parent == Py_None) PUT("null", 4);
        else {
            *o++ = '"';
            PUT(PyUnicode_1BYTE_DATA(parent), np - 2);
            *o++ = '"';
        }
    }
    if (sid) {
        PUT(", \"stack_id\": ", 14);
        PUT(PyUnicode_1BYTE_DATA(sid), ns);
    }
    *o++ = '}';
#undef PUT
    Py_XDECREF(sid);
    if (o - PyBytes_AS_STRING(line) != size) {  /* (cannot happen: the sizes above) */
        Py_DECREF(text);
        Py_DECREF(line);
        PyErr_SetString(PyExc_SystemError, "journal_line: size");
        return NULL;
    }
    return Py_BuildValue("(NN)", text, line);
}

/* ------------------------------------------------------------------ capture_stack */

static PyObject *S_string_file;  /* "<string>" */
/* (id(code), its last instruction) -> (code, (filename, lineno, name)): a call site's frame tuple, its line
   number computed once (the line table is scanned from the code's start: microseconds in a long function).
   The code object is held, so no other code object takes its id while the entry lives. */
static PyObject *frame_items;
#define FRAME_ITEMS_MAX 65536

static int frame_lasti(PyFrameObject *frame) {
#if PY_VERSION_HEX >= 0x030B0000
    return PyFrame_GetLasti(frame);
#else
    return frame->f_lasti;
#endif
}

/* the (filename, lineno, name) of a frame, as the Python walk makes it (f_lineno: None when negative) */
static PyObject *frame_item(PyFrameObject *frame, PyCodeObject *code) {
    int lineno = PyFrame_GetLineNumber(frame);
    PyObject *line = lineno < 0 ? Py_NewRef(Py_None) : PyLong_FromLong(lineno);
    PyObject *item = line ? PyTuple_Pack(3, code->co_filename, line, code->co_name) : NULL;
    Py_XDECREF(line);
    return item;
}

/* frame_item, from the call sites seen before when no trace function runs (one may set f_lineno) */
static PyObject *cached_frame_item(PyFrameObject *frame, PyCodeObject *code) {
    PyThreadState *ts = PyThreadState_Get();
    if (ts->c_tracefunc != NULL || frame_items == NULL) return frame_item(frame, code);
    PyObject *key = Py_BuildValue("(Ni)", PyLong_FromVoidPtr(code), frame_lasti(frame));
    if (key == NULL) return NULL;
    PyObject *hit = PyDict_GetItemWithError(frame_items, key);  /* borrowed */
    if (hit != NULL && PyTuple_GET_ITEM(hit, 0) == (PyObject *)code) {
        Py_DECREF(key);
        return Py_NewRef(PyTuple_GET_ITEM(hit, 1));
    }
    PyObject *item = PyErr_Occurred() ? NULL : frame_item(frame, code);
    if (item != NULL) {
        if (PyDict_GET_SIZE(frame_items) >= FRAME_ITEMS_MAX) PyDict_Clear(frame_items);
        PyObject *value = PyTuple_Pack(2, (PyObject *)code, item);
        if (value == NULL || PyDict_SetItem(frame_items, key, value) < 0) Py_CLEAR(item);
        Py_XDECREF(value);
    }
    Py_DECREF(key);
    return item;
}

/* whether a frame of the file `filename` is left out of a stack (-1 with an error set) */
static int left_out(PyObject *filename, PyObject *prefixes) {
    if (!PyUnicode_Check(filename)) return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(prefixes); i++) {
        Py_ssize_t r = PyUnicode_Tailmatch(filename, PyTuple_GET_ITEM(prefixes, i), 0, PY_SSIZE_T_MAX, -1);
        if (r != 0) return (int)r;
    }
    int same = PyUnicode_Compare(filename, S_string_file);
    if (same == -1 && PyErr_Occurred()) return -1;
    return same == 0;
}

static PyObject *fp_capture_stack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "capture_stack(skip, prefixes): prefixes is a tuple of str");
        return NULL;
    }
    long skip = PyLong_AsLong(args[0]);
    if (skip == -1 && PyErr_Occurred()) return NULL;
    PyObject *prefixes = args[1];
    PyFrameObject *frame = PyEval_GetFrame();  /* borrowed: the Python caller's frame */
    Py_XINCREF(frame);
    for (; skip > 0 && frame != NULL; skip--) {
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    PyObject *frames = PyList_New(0);
    while (frames != NULL && frame != NULL) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        int out = left_out(code->co_filename, prefixes);
        if (out < 0) {
            Py_CLEAR(frames);
        } else if (!out) {
            PyObject *item = cached_frame_item(frame, code);
            if (item == NULL || PyList_Append(frames, item) < 0) Py_CLEAR(frames);
            Py_XDECREF(item);
        }
        Py_DECREF(code);
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    Py_XDECREF(frame);
    if (frames == NULL) return NULL;
    PyObject *stack = PyList_AsTuple(frames);
    Py_DECREF(frames);
    return stack;
}

/* set_simd(on) -> the previous setting: off runs the portable kernels (the tests cover both) */
static PyObject *fp_set_simd(PyObject *self, PyObject *arg) {
    (void)self;
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    int before = use_avx2 || have_clmul;
#ifdef HAVE_X86_CODE
    __builtin_cpu_init();
    use_avx2 = on && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    have_clmul = on && __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
    return PyBool_FromLong(before);
}

static PyMethodDef methods[] = {
    {"set_simd", fp_set_simd, METH_O, "set_simd(on) -> previous: use the AVX2/PCLMUL kernels when the CPU has them"},
    {"stats", (PyCFunction)(void (*)(void))fp_stats, METH_FASTCALL,
     "stats(addr, n, code) -> (Max, Min, Mean, Norm) of n contiguous elements at addr"},
    {"stats_runs", (PyCFunction)(void (*)(void))fp_stats_runs, METH_FASTCALL,
     "stats_runs(addr, code, run, sizes, strides) -> (Max, Min, Mean, Norm) over contiguous runs"},
    {"crc32", (PyCFunction)(void (*)(void))fp_crc32, METH_FASTCALL,
     "crc32(addr, nbytes, crc=0) -> zlib's CRC-32 of nbytes at addr"},
    {"crc32_combine", (PyCFunction)(void (*)(void))fp_crc32_combine, METH_FASTCALL,
     "crc32_combine(crc1, crc2, len2) -> the CRC-32 of A + B from CRC(A), CRC(B) and len(B)"},
    {"record_json", (PyCFunction)(void (*)(void))fp_record_json, METH_FASTCALL,
     "record_json(obj, dumps) -> json.dumps(obj, separators=(', ', ': ')) from dumps(obj), or None"},
    {"tensor_entry", (PyCFunction)(void (*)(void))fp_tensor_entry, METH_FASTCALL,
     "tensor_entry(tensor, ctx) -> a CPU tensor's record entry (statistics, md5), or None: the Python path"},
    {"encode_values", (PyCFunction)(void (*)(void))fp_encode_values, METH_FASTCALL,
     "encode_values(values, ctx, fallback, prefix) -> the entries of a list/tuple (a list) or a dict of values"},
    {"untrack", fp_untrack, METH_O,
     "untrack(obj) -> whether obj (dicts, lists, tuples of atomic values) is now out of the collector's walks"},
    {"journal_line", (PyCFunction)(void (*)(void))fp_journal_line, METH_FASTCALL,
     "journal_line(record, dumps, name, parent, with_parent, stack_id) -> (text, line) or None"},
    {"capture_stack", (PyCFunction)(void (*)(void))fp_capture_stack, METH_FASTCALL,
     "capture_stack(skip, prefixes) -> the (filename, lineno, name) of the frames outside prefixes, innermost first"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_fastpath", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastpath(void) {
    crc_init();
    if (entry_strings() < 0) return NULL;
    if ((S_string_file = PyUnicode_InternFromString("<string>")) == NULL || (frame_items = PyDict_New()) == NULL)
        return NULL;
#ifdef HAVE_CLMUL_CODE
    __builtin_cpu_init();
    have_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    use_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#endif
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "VERSION", FASTPATH_VERSION) < 0 ||
        PyModule_AddIntConstant(m, "HAVE_CLMUL", have_clmul) < 0 ||
        PyModule_AddIntConstant(m, "SIMD", use_avx2) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
