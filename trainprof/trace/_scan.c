/* One pass over a Kineto trace's JSON text into columns: what trainprof.trace.load reads of the
 * complete events of the kept categories and of the CUDA `[memory]` instants, with no Python object
 * per event (a name is made once, where it first appears).
 *
 * It reads what `load._DOCUMENT` (msgspec, strict) reads and checks what that checks, for a trace
 * written as torch writes them. Anything else gives None and the loader decodes the text with
 * msgspec instead, which raises its errors and takes its lenient path as before: an escape in a
 * key or in a string the analyses read, a string pid or tid, an integer outside int64, a phase
 * msgspec does not know, a value of the wrong type, invalid UTF-8 in a decoded string, a number
 * out of range, nesting deeper than MAX_DEPTH, malformed JSON, no kept event. The contract (which
 * fields, which defaults, which numbering) is in load._scanned; tests/test_native_scan.py holds the
 * two paths equal.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define MAX_DEPTH 256
#define MAX_NUMBER_CHARS 64

/* A growing array of rows, kept in a bytes object from the start: it is returned as it is, shrunk
 * to its length, not copied (a copy of 5 MB of rows faulted its pages in anew: ~3 ms of a 12 MB
 * trace's first analysis on the development machine). */
typedef struct {
    PyObject *bytes; /* NULL until the first row */
    Py_ssize_t len, cap;
} Buf;

/* Appends a row; -1 with a Python error set. */
static int buf_put(Buf *b, const void *value, Py_ssize_t n) {
    if (b->len + n > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap * 2 : 1 << 20;
        while (cap < b->len + n) cap *= 2;
        if (!b->bytes) {
            b->bytes = PyBytes_FromStringAndSize(NULL, cap);
            if (!b->bytes) return -1;
        } else if (_PyBytes_Resize(&b->bytes, cap) < 0) {
            return -1; /* b->bytes is NULL now */
        }
        b->cap = cap;
    }
    memcpy(PyBytes_AS_STRING(b->bytes) + b->len, value, n);
    b->len += n;
    return 0;
}

/* The rows as bytes of their length (the buffer is handed over: b is empty after). */
static PyObject *buf_take(Buf *b) {
    PyObject *bytes = b->bytes;
    b->bytes = NULL;
    if (!bytes) return PyBytes_FromStringAndSize(NULL, 0);
    if (_PyBytes_Resize(&bytes, b->len) < 0) return NULL;
    return bytes;
}

/* A string's bytes as a str; NULL when they are not UTF-8 (no error set: the scanner bails, as
 * msgspec raises there) or on another error (set). */
static PyObject *utf8(const char *s, Py_ssize_t n) {
    PyObject *text = PyUnicode_DecodeUTF8(s, n, "strict");
    if (!text && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) PyErr_Clear();
    return text;
}

/* ---- names: each distinct byte string once, decoded (and so checked as UTF-8) once ---- */

typedef struct {
    const char *at;
    Py_ssize_t len;
    uint64_t hash;
    PyObject *text; /* the decoded str */
    int32_t id;     /* number among the kept events' names, -1 until one uses it */
} Name;

typedef struct {
    Name *slots;
    size_t cap, used;
    PyObject *ids; /* list: str by id */
} Names;

static uint64_t hash_bytes(const char *s, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)n;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t word;
        memcpy(&word, s + i, 8);
        h = (h ^ word) * 0x9E3779B97F4A7C15ULL;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h ^ (h >> 32);
}

static int names_grow(Names *t) {
    size_t cap = t->cap ? t->cap * 2 : 1024;
    Name *slots = calloc(cap, sizeof(Name));
    if (!slots) return -1;
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->slots[i].at) continue;
        size_t j = t->slots[i].hash & (cap - 1);
        while (slots[j].at) j = (j + 1) & (cap - 1);
        slots[j] = t->slots[i];
    }
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
    return 0;
}

/* The entry of a name; NULL when it is not UTF-8 (bail) or on no memory (error set). */
static Name *names_get(Names *t, const char *s, Py_ssize_t n) {
    if ((t->used + 1) * 2 > t->cap && names_grow(t) < 0) {
        PyErr_NoMemory();
        return NULL;
    }
    uint64_t h = hash_bytes(s, n);
    size_t j = h & (t->cap - 1);
    while (t->slots[j].at) {
        Name *e = &t->slots[j];
        if (e->hash == h && e->len == n && memcmp(e->at, s, n) == 0) return e;
        j = (j + 1) & (t->cap - 1);
    }
    PyObject *text = utf8(s, n);
    if (!text) return NULL;
    Name *e = &t->slots[j];
    e->at = s;
    e->len = n;
    e->hash = h;
    e->text = text;
    e->id = -1;
    t->used++;
    return e;
}

static void names_free(Names *t) {
    for (size_t i = 0; i < t->cap; i++) Py_XDECREF(t->slots[i].text);
    free(t->slots);
    Py_XDECREF(t->ids);
}

/* ---- threads: each distinct (pid, tid) of the kept events, numbered as it first appears ---- */

typedef struct {
    int64_t pid, tid;
    int32_t id;
    int used;
} Thread;

typedef struct {
    Thread *slots;
    size_t cap, used;
    PyObject *pairs; /* list: (pid, tid) by id */
} Threads;

/* A (pid, tid)'s first slot in a table of `cap` (a power of two) slots; unsigned arithmetic. */
static size_t thread_slot(int64_t pid, int64_t tid, size_t cap) {
    uint64_t key = (uint64_t)pid * 31u + (uint64_t)tid;
    return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 20) & (cap - 1);
}

/* The number of (pid, tid); -1 with a Python error set. */
static int32_t threads_get(Threads *t, int64_t pid, int64_t tid) {
    if ((t->used + 1) * 2 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        Thread *slots = calloc(cap, sizeof(Thread));
        if (!slots) return PyErr_NoMemory(), -1;
        for (size_t i = 0; i < t->cap; i++) {
            if (!t->slots[i].used) continue;
            size_t j = thread_slot(t->slots[i].pid, t->slots[i].tid, cap);
            while (slots[j].used) j = (j + 1) & (cap - 1);
            slots[j] = t->slots[i];
        }
        free(t->slots);
        t->slots = slots;
        t->cap = cap;
    }
    size_t j = thread_slot(pid, tid, t->cap);
    while (t->slots[j].used) {
        if (t->slots[j].pid == pid && t->slots[j].tid == tid) return t->slots[j].id;
        j = (j + 1) & (t->cap - 1);
    }
    PyObject *pair = Py_BuildValue("(LL)", (long long)pid, (long long)tid);
    if (!pair || PyList_Append(t->pairs, pair) < 0) {
        Py_XDECREF(pair);
        return -1;
    }
    Py_DECREF(pair);
    t->slots[j] = (Thread){pid, tid, (int32_t)t->used, 1};
    return (int32_t)t->used++;
}

/* ---- the scanner ---- */

typedef struct {
    const char *p, *end;
    int error; /* a Python error is set: scan() raises it (a bail sets nothing, and gives None) */
} Cur;

static inline void skip_ws(Cur *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t')) c->p++;
}

/* The code unit of `\\uXXXX` with `p` at its `u`, or -1. */
static int utf16_unit(const char *p, const char *end) {
    if (end - p < 5 || *p != 'u') return -1;
    int unit = 0;
    for (int i = 1; i <= 4; i++) {
        char ch = p[i];
        int digit = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                  : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
        if (digit < 0) return -1;
        unit = unit * 16 + digit;
    }
    return unit;
}

/* At an opening quote: moves past the closing one. Sets `start` and `len` to the raw contents and
 * `escaped` when they hold a backslash. Returns -1 on malformed JSON. */
static int scan_string(Cur *c, const char **start, Py_ssize_t *len, int *escaped) {
    const char *p = c->p + 1, *end = c->end;
    *escaped = 0;
    *start = p;
    for (;;) {
#ifdef __SSE2__
        const __m128i quote = _mm_set1_epi8('"'), slash = _mm_set1_epi8('\\'), ctl = _mm_set1_epi8(0x1F);
        while (p + 16 <= end) {
            __m128i x = _mm_loadu_si128((const __m128i *)p);
            __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, slash)),
                                       _mm_cmpeq_epi8(_mm_max_epu8(x, ctl), ctl));
            int mask = _mm_movemask_epi8(hit);
            if (mask) {
                p += __builtin_ctz((unsigned)mask);
                goto found;
            }
            p += 16;
        }
#endif
        while (p < end && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20) p++;
        if (p >= end) return -1;
#ifdef __SSE2__
    found:
#endif
        if (*p == '"') break;
        if (*p != '\\') return -1; /* a control character */
        *escaped = 1;
        if (++p >= end) return -1;
        if (*p == 'u') {
            /* As msgspec: a high surrogate needs a low one after it, a low one alone is malformed. */
            int unit = utf16_unit(p, end);
            if (unit < 0 || (unit >= 0xDC00 && unit <= 0xDFFF)) return -1;
            p += 5;
            if (unit >= 0xD800 && unit <= 0xDBFF) {
                int low = end - p >= 1 && *p == '\\' ? utf16_unit(p + 1, end) : -1;
                if (low < 0xDC00 || low > 0xDFFF) return -1;
                p += 6;
            }
        } else if (strchr("\"\\/bfnrt", *p) && *p) {
            p++;
        } else {
            return -1;
        }
    }
    *len = p - *start;
    c->p = p + 1;
    return 0;
}

/* A JSON number at c->p, read in the same pass that checks its grammar. */
typedef struct {
    const char *start;
    uint64_t digits; /* all of them, integer and fraction, as one integer (while `count` <= 19) */
    int count;       /* significant digits */
    int scale;       /* the power of ten to apply: exponent less the fraction's digits */
    int negative, is_int;
} Number;

static inline int is_digit(char ch) { return (unsigned char)(ch - '0') <= 9; }

/* The digits at p (moves past them) into *digits (wrapping past 19) and *count (significant ones:
 * leading zeros do not count while *count is 0). In locals, not through `Number`: the compiler
 * keeps them in registers. */
static inline const char *read_digits(const char *p, const char *end, uint64_t *digits, int *count, int *seen) {
    uint64_t d = *digits;
    int k = *count, all = 0;
    for (; p < end && is_digit(*p); p++, all++) {
        k += k || *p != '0';
        d = d * 10 + (uint64_t)(*p - '0');
    }
    *digits = d;
    *count = k;
    *seen = all;
    return p;
}

static int read_number(Cur *c, Number *n) {
    const char *p = c->p, *end = c->end;
    int seen;
    n->start = p;
    n->digits = 0;
    n->count = n->scale = 0;
    n->is_int = 1;
    n->negative = p < end && *p == '-';
    if (n->negative) p++;
    if (p >= end || !is_digit(*p) || (*p == '0' && p + 1 < end && is_digit(p[1])))
        return -1; /* no digit, or a leading zero */
    p = read_digits(p, end, &n->digits, &n->count, &seen);
    if (p < end && *p == '.') {
        n->is_int = 0;
        p = read_digits(p + 1, end, &n->digits, &n->count, &seen);
        if (!seen) return -1;
        n->scale = -seen;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        n->is_int = 0;
        p++;
        int minus = p < end && *p == '-';
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || !is_digit(*p)) return -1;
        int e = 0;
        for (; p < end && is_digit(*p); p++)
            if (e < 100000) e = e * 10 + (*p - '0');
        n->scale += minus ? -e : e;
    }
    c->p = p;
    return 0;
}

/* A number no field reads (most of a cpu_op's `args`: ids, strides, dims): its grammar checked as
 * read_number checks it, nothing computed. */
static int skip_number(Cur *c) {
    const char *p = c->p, *end = c->end;
    if (p < end && *p == '-') p++;
    if (p >= end || !is_digit(*p) || (*p == '0' && p + 1 < end && is_digit(p[1]))) return -1;
    while (p < end && is_digit(*p)) p++;
    if (p < end && *p == '.') {
        if (++p >= end || !is_digit(*p)) return -1;
        while (p < end && is_digit(*p)) p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        if (++p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || !is_digit(*p)) return -1;
        while (p < end && is_digit(*p)) p++;
    }
    c->p = p;
    return 0;
}

static int skip_value(Cur *c, int depth);

/* Containers, read in three steps:
 *     int more = open_container(c, '{');          1: a first item follows, 0: empty, -1: malformed
 *     while (more > 0) { member_key(...); <the value>; more = next_item(c, '}'); }
 *     return more;                                 0: read to its close, -1: malformed */
static inline int open_container(Cur *c, char open) {
    if (c->p >= c->end || *c->p != open) return -1;
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == (open == '{' ? '}' : ']')) {
        c->p++;
        return 0;
    }
    return 1;
}

/* A member's key and its colon. A key with an escape bails unless `escapes_allowed` (a key the
 * scanner reads could be spelt with one; a skipped object's keys are only checked). */
static inline int member_key(Cur *c, const char **k, Py_ssize_t *kn, int escapes_allowed) {
    int escaped;
    if (c->p >= c->end || *c->p != '"' || scan_string(c, k, kn, &escaped) < 0) return -1;
    if (escaped && !escapes_allowed) return -1;
    skip_ws(c);
    if (c->p >= c->end || *c->p != ':') return -1;
    c->p++;
    skip_ws(c);
    return 0;
}

/* After an item: 1 when another follows (past its comma), 0 at the close (past it), -1 otherwise. */
static inline int next_item(Cur *c, char close) {
    skip_ws(c);
    if (c->p >= c->end) return -1;
    if (*c->p == ',') {
        c->p++;
        skip_ws(c);
        return 1;
    }
    if (*c->p != close) return -1;
    c->p++;
    return 0;
}

static int skip_container(Cur *c, int depth, char close) {
    if (depth > MAX_DEPTH) return -1;
    int more = open_container(c, close == '}' ? '{' : '[');
    while (more > 0) {
        const char *k;
        Py_ssize_t kn;
        if (close == '}' && member_key(c, &k, &kn, 1) < 0) return -1;
        if (skip_value(c, depth + 1) < 0) return -1;
        more = next_item(c, close);
    }
    return more;
}

/* Any JSON value at c->p (no whitespace before it): moves past it. */
static int skip_value(Cur *c, int depth) {
    if (c->p >= c->end) return -1;
    switch (*c->p) {
    case '"': {
        const char *s;
        Py_ssize_t n;
        int escaped;
        return scan_string(c, &s, &n, &escaped);
    }
    case '{':
        return skip_container(c, depth, '}');
    case '[':
        return skip_container(c, depth, ']');
    case 't':
        if (c->end - c->p >= 4 && memcmp(c->p, "true", 4) == 0) return c->p += 4, 0;
        return -1;
    case 'f':
        if (c->end - c->p >= 5 && memcmp(c->p, "false", 5) == 0) return c->p += 5, 0;
        return -1;
    case 'n':
        if (c->end - c->p >= 4 && memcmp(c->p, "null", 4) == 0) return c->p += 4, 0;
        return -1;
    default:
        return skip_number(c);
    }
}

static inline int is_null(Cur *c) {
    if (c->end - c->p >= 4 && memcmp(c->p, "null", 4) == 0) {
        c->p += 4;
        return 1;
    }
    return 0;
}

/* An int field (msgspec `int`): an integer literal within int64; -1 otherwise (bail). */
static int read_int(Cur *c, int64_t *out) {
    Number n;
    if (read_number(c, &n) < 0 || !n.is_int || n.count > 19) return -1;
    if (n.negative ? n.digits > (uint64_t)INT64_MAX + 1 : n.digits > (uint64_t)INT64_MAX) return -1;
    *out = n.negative ? (int64_t)(0 - n.digits) : (int64_t)n.digits;
    return 0;
}

/* A float field (msgspec `float`): any number. An integer literal as msgspec takes one (an int, then
 * a float: "-0" is 0.0); one of more than 18 digits, or a number out of range, bails. */
static int read_float(Cur *c, double *out) {
    static const double powers[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    Number n;
    if (read_number(c, &n) < 0) return -1;
    if (n.is_int) {
        if (n.count > 18) return -1;
        *out = n.negative ? (double)(0 - (int64_t)n.digits) : (double)(int64_t)n.digits;
        return 0;
    }
    /* Clinger's fast path: digits d (at most 2**53) and a power of ten p (|p| <= 22) are exact
     * doubles, so d * 10**p or d / 10**-p is one correctly rounded operation, as the full
     * conversion below (and msgspec's) gives. Kineto's times (4445388225761.141) fit. */
    if (n.count <= 17 && n.digits <= (1ULL << 53) && n.scale >= -22 && n.scale <= 22) {
        double v = n.scale < 0 ? (double)n.digits / powers[-n.scale] : (double)n.digits * powers[n.scale];
        *out = n.negative ? -v : v;
        return 0;
    }
    Py_ssize_t length = c->p - n.start;
    char text[MAX_NUMBER_CHARS + 1];
    if (length > MAX_NUMBER_CHARS) return -1;
    memcpy(text, n.start, length);
    text[length] = 0;
    double v = PyOS_string_to_double(text, NULL, NULL);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    if (isinf(v)) return -1; /* msgspec: "Number out of range" */
    *out = v;
    return 0;
}

/* A string field the analyses read: no escape (bail), else its raw bytes. */
static int read_plain_string(Cur *c, const char **s, Py_ssize_t *n) {
    int escaped;
    if (c->p >= c->end || *c->p != '"' || scan_string(c, s, n, &escaped) < 0 || escaped) return -1;
    return 0;
}

/* A pid or tid (msgspec `int | str`): an int within int64, or a string (*is_text set; its value is
 * not kept, so an event of a kept kind with one bails). */
static int read_id(Cur *c, int64_t *out, int *is_text) {
    *is_text = 0;
    if (c->p >= c->end || *c->p != '"') return read_int(c, out);
    const char *s;
    Py_ssize_t n;
    if (read_plain_string(c, &s, &n) < 0) return -1;
    PyObject *checked = utf8(s, n);
    if (!checked) return c->error = PyErr_Occurred() != NULL, -1;
    Py_DECREF(checked);
    *is_text = 1;
    return 0;
}

/* Whether a key's bytes are the string literal `name` (its length known when compiled). */
#define key_is(s, n, name) ((n) == (Py_ssize_t)sizeof(name) - 1 && memcmp((s), (name), sizeof(name) - 1) == 0)

/* ---- one event ---- */

typedef struct {
    int64_t correlation, sequence, fwd_thread, in_nelems, out_nelems, group_size, device_type;
    double bytes, flops, total_allocated, total_reserved, alloc_bytes, addr;
    int64_t dims[2], types[2], concrete[2];
    int32_t collective, dtype;
} Args;

/* One kept complete event, and one `[memory]` instant: a row each, read by numpy as a structured
 * array (the module's X_FIELDS and MEMORY_FIELDS give the layout). */
typedef struct {
    int64_t correlation, sequence, fwd_thread, in_nelems, out_nelems, group_size;
    int64_t dims[2], types[2]; /* the Input Dims and Input type JSON texts' spans, -1 when absent */
    int64_t concrete[2];       /* the Concrete Inputs JSON text's span, -1 when absent */
    double ts, dur, bytes, flops;
    int32_t thread, name, collective, dtype; /* collective and dtype: numbers in `strings`, -1: None */
    uint8_t cat;
} XRow;

typedef struct {
    int64_t device_type;
    double ts, total_allocated, total_reserved, alloc_bytes, addr;
    int32_t thread;
} MemoryRow;

typedef struct {
    const char *base; /* the text's first byte: spans are offsets from it */
    Names names;
    Threads threads;
    PyObject *strings;     /* list: collective and dtype values by number */
    PyObject *string_ids;  /* dict: str -> number */
    const char **cats;     /* the kept categories' names */
    Py_ssize_t *cat_lens;
    uint8_t *cat_codes;
    Py_ssize_t ncats;
    Buf x, mem;
} State;

static const double NAN_ = NAN;

static void args_defaults(Args *a) {
    a->correlation = a->sequence = a->fwd_thread = a->in_nelems = a->out_nelems = a->group_size = -1;
    a->device_type = 1;
    a->bytes = a->flops = a->total_allocated = a->total_reserved = a->alloc_bytes = a->addr = NAN_;
    a->dims[0] = a->dims[1] = a->types[0] = a->types[1] = a->concrete[0] = a->concrete[1] = -1;
    a->collective = a->dtype = -1;
}

/* A str|None arg: its number in state->strings, -1 for null. */
static int read_optional_string(State *st, Cur *c, int32_t *out) {
    if (is_null(c)) {
        *out = -1;
        return 0;
    }
    const char *s;
    Py_ssize_t n;
    if (read_plain_string(c, &s, &n) < 0) return -1;
    PyObject *text = utf8(s, n);
    if (!text) return c->error = PyErr_Occurred() != NULL, -1;
    PyObject *id = PyDict_GetItemWithError(st->string_ids, text);
    if (id) {
        *out = (int32_t)PyLong_AsLong(id);
        Py_DECREF(text);
        return 0;
    }
    if (PyErr_Occurred()) goto error;
    Py_ssize_t number = PyList_GET_SIZE(st->strings);
    PyObject *key = PyLong_FromSsize_t(number);
    if (!key || PyDict_SetItem(st->string_ids, text, key) < 0 || PyList_Append(st->strings, text) < 0) {
        Py_XDECREF(key);
        goto error;
    }
    Py_DECREF(key);
    Py_DECREF(text);
    *out = (int32_t)number;
    return 0;
error:
    Py_DECREF(text);
    c->error = 1;
    return -1;
}

/* A nullable float arg (`float | None`): NaN for null. */
static int read_optional_float(Cur *c, double *out) {
    if (is_null(c)) {
        *out = NAN_;
        return 0;
    }
    return read_float(c, out);
}

/* The `args` object of a complete (instant: !complete) event, fields as load._CompleteArgs
 * (_InstantArgs) has them; null leaves the defaults. */
static int read_args(State *st, Cur *c, int complete, Args *a) {
    args_defaults(a);
    if (is_null(c)) return 0;
    int more = open_container(c, '{');
    while (more > 0) {
        const char *k;
        Py_ssize_t kn;
        if (member_key(c, &k, &kn, 0) < 0) return -1;
        int r = 1; /* 1: not a field of this kind, skipped */
        if (complete) {
            if (key_is(k, kn, "correlation")) r = read_int(c, &a->correlation);
            else if (key_is(k, kn, "bytes")) r = read_float(c, &a->bytes);
            else if (key_is(k, kn, "Sequence number")) r = read_int(c, &a->sequence);
            else if (key_is(k, kn, "Fwd thread id")) r = read_int(c, &a->fwd_thread);
            else if (key_is(k, kn, "Collective name")) r = read_optional_string(st, c, &a->collective);
            else if (key_is(k, kn, "In msg nelems")) r = read_int(c, &a->in_nelems);
            else if (key_is(k, kn, "Out msg nelems")) r = read_int(c, &a->out_nelems);
            else if (key_is(k, kn, "dtype")) r = read_optional_string(st, c, &a->dtype);
            else if (key_is(k, kn, "Group size")) r = read_int(c, &a->group_size);
            else if (key_is(k, kn, "flops")) r = read_float(c, &a->flops);
            else if (key_is(k, kn, "Input Dims") || key_is(k, kn, "Input type") ||
                     key_is(k, kn, "Concrete Inputs")) {
                int64_t *span = k[0] == 'C' ? a->concrete : k[6] == 'D' ? a->dims : a->types;
                span[0] = c->p - st->base;
                r = skip_value(c, 2);
                span[1] = c->p - st->base;
            }
        } else {
            if (key_is(k, kn, "Total Allocated")) r = read_optional_float(c, &a->total_allocated);
            else if (key_is(k, kn, "Total Reserved")) r = read_optional_float(c, &a->total_reserved);
            else if (key_is(k, kn, "Device Type")) r = read_int(c, &a->device_type);
            else if (key_is(k, kn, "Bytes")) r = read_optional_float(c, &a->alloc_bytes);
            else if (key_is(k, kn, "Addr")) r = read_optional_float(c, &a->addr);
        }
        if (r == 1) r = skip_value(c, 2);
        if (r < 0) return -1;
        more = next_item(c, '}');
    }
    return more;
}

/* The phases msgspec's tagged decoding knows besides X and i (load._OTHER_PHASES). */
static int other_phase(const char *s, Py_ssize_t n) {
    return n == 1 && *s && strchr("BEICbneSTpFstfPNODMVvRc()", *s) != NULL;
}

/* One event object at c->p. */
static int read_event(State *st, Cur *c) {
    const char *ph = NULL, *cat = NULL, *name = NULL, *args_at = NULL;
    Py_ssize_t ph_n = 0, cat_n = 0, name_n = 0;
    const char *pid_at = NULL, *tid_at = NULL, *ts_at = NULL, *dur_at = NULL;
    int ph_count = 0, name_ok = 0, name_escaped = 0;
    Args args;
    int args_read = 0;

    int more = open_container(c, '{');
    if (more == 0) return -1; /* {}: no phase, msgspec's tagged decoding fails */
    while (more > 0) {
        const char *k;
        Py_ssize_t kn;
        if (member_key(c, &k, &kn, 0) < 0) return -1;
        const char *value = c->p, **later = key_is(k, kn, "pid") ? &pid_at : key_is(k, kn, "tid") ? &tid_at
                                           : key_is(k, kn, "ts")  ? &ts_at : key_is(k, kn, "dur") ? &dur_at
                                                                           : NULL;
        int r = 0;
        if (key_is(k, kn, "ph")) {
            ph_count++;
            r = read_plain_string(c, &ph, &ph_n);
        } else if (key_is(k, kn, "cat")) {
            r = read_plain_string(c, &cat, &cat_n);
        } else if (key_is(k, kn, "name")) {
            /* Checked below, once the phase says whether msgspec reads it. */
            name_ok = c->p < c->end && *c->p == '"';
            r = name_ok ? scan_string(c, &name, &name_n, &name_escaped) : skip_value(c, 1);
            if (!name_ok) name = value;
        } else if (later) { /* read below, once the phase says how */
            *later = value;
            r = skip_value(c, 1);
        } else if (key_is(k, kn, "args")) {
            /* Read in place when the phase is already known (torch writes "ph" first). */
            int complete = ph && ph_n == 1 && (*ph == 'X' || *ph == 'i') ? *ph == 'X' : -1;
            if (complete >= 0) {
                r = read_args(st, c, complete, &args);
                args_read = 1;
                args_at = NULL;
            } else {
                args_at = value;
                args_read = 0;
                r = skip_value(c, 1);
            }
        } else {
            r = skip_value(c, 1);
        }
        if (r < 0) return -1;
        more = next_item(c, '}');
    }
    if (more < 0 || !ph || ph_count != 1 || ph_n != 1) return -1;
    int complete = *ph == 'X', instant = *ph == 'i';
    if (!complete && !instant) return other_phase(ph, ph_n) ? 0 : -1; /* only `cat` is read, checked */

    /* X and i: every field is typed, whether or not the event is kept. */
    Name *entry = NULL;
    if (name) { /* msgspec reads it: a string, with no escape here */
        if (!name_ok || name_escaped) return -1;
        entry = names_get(&st->names, name, name_n);
        if (!entry) return c->error = PyErr_Occurred() != NULL, -1;
    }
    Py_ssize_t kept = st->ncats; /* the category's index among the kept ones, ncats if not kept */
    for (Py_ssize_t i = 0; cat && i < st->ncats; i++)
        if (st->cat_lens[i] == cat_n && memcmp(st->cats[i], cat, cat_n) == 0) kept = i;
    if (cat && kept == st->ncats) { /* msgspec decodes it: it must be UTF-8 (kept ones are ASCII) */
        PyObject *checked = utf8(cat, cat_n);
        if (!checked) return c->error = PyErr_Occurred() != NULL, -1;
        Py_DECREF(checked);
    }
    int64_t pid = 0, tid = 0;
    int pid_text = 0, tid_text = 0;
    double ts = NAN_, dur = 0.0;
    Cur at = {NULL, c->end, 0}; /* the values left for now, read where they are */
    if ((pid_at && (at.p = pid_at, read_id(&at, &pid, &pid_text) < 0)) ||
        (tid_at && (at.p = tid_at, read_id(&at, &tid, &tid_text) < 0)) ||
        (ts_at && (at.p = ts_at, read_float(&at, &ts) < 0)) ||
        (complete && dur_at && (at.p = dur_at, read_float(&at, &dur) < 0)) ||
        (args_at && (at.p = args_at, read_args(st, &at, complete, &args) < 0)))
        return c->error = at.error, -1;
    if (!args_at && !args_read) args_defaults(&args);

    if (instant) {
        if (!(name && name_n == 8 && memcmp(name, "[memory]", 8) == 0)) return 0;
        if (pid_text || tid_text) return -1;
        int32_t thread = threads_get(&st->threads, pid, tid);
        if (thread < 0) return c->error = 1, -1;
        MemoryRow row = {args.device_type, ts, args.total_allocated, args.total_reserved, args.alloc_bytes, args.addr,
                         thread};
        if (buf_put(&st->mem, &row, sizeof(row)) < 0) return c->error = 1, -1;
        return 0;
    }
    if (!cat) return 0; /* "" is not a kept category */
    if (kept == st->ncats) return 0;
    if (pid_text || tid_text) return -1;
    if (!entry) {
        entry = names_get(&st->names, "", 0); /* msgspec's default name */
        if (!entry) return c->error = PyErr_Occurred() != NULL, -1;
    }
    if (entry->id < 0) {
        entry->id = (int32_t)PyList_GET_SIZE(st->names.ids);
        if (PyList_Append(st->names.ids, entry->text) < 0) return c->error = 1, -1;
    }
    int32_t thread = threads_get(&st->threads, pid, tid);
    if (thread < 0) return c->error = 1, -1;
    XRow row = {args.correlation, args.sequence, args.fwd_thread, args.in_nelems, args.out_nelems,
                args.group_size, {args.dims[0], args.dims[1]}, {args.types[0], args.types[1]},
                {args.concrete[0], args.concrete[1]}, ts, dur,
                args.bytes, args.flops, thread, entry->id, args.collective, args.dtype, st->cat_codes[kept]};
    if (buf_put(&st->x, &row, sizeof(row)) < 0) return c->error = 1, -1;
    return 0;
}

static int read_events(State *st, Cur *c) {
    int more = open_container(c, '[');
    while (more > 0) {
        if (read_event(st, c) < 0) return -1;
        more = next_item(c, ']');
    }
    return more;
}

static const char *METADATA[] = {"deviceProperties", "distributedInfo", "schemaVersion", "traceName",
                                 "trainprof", "with_stack", "profile_memory", "record_shapes"};
#define N_METADATA 8

static int is_metadata(const char *k, Py_ssize_t kn, int m) {
    return (Py_ssize_t)strlen(METADATA[m]) == kn && memcmp(k, METADATA[m], kn) == 0;
}

/* The top level: a document with exactly one `traceEvents` list (its metadata fields' spans into
 * `metadata`), or the event list alone. */
static int read_document(State *st, Cur *c, PyObject *metadata) {
    skip_ws(c);
    if (c->p < c->end && *c->p == '[') return read_events(st, c);
    int events_seen = 0;
    int more = open_container(c, '{');
    while (more > 0) {
        const char *k;
        Py_ssize_t kn;
        if (member_key(c, &k, &kn, 0) < 0) return -1;
        if (key_is(k, kn, "traceEvents")) {
            if (events_seen++ || read_events(st, c) < 0) return -1;
        } else {
            const char *start = c->p;
            if (skip_value(c, 1) < 0) return -1;
            for (int m = 0; m < N_METADATA; m++) {
                if (!is_metadata(k, kn, m)) continue;
                PyObject *span = Py_BuildValue("(nn)", (Py_ssize_t)(start - st->base), (Py_ssize_t)(c->p - st->base));
                int stored = span ? PyDict_SetItemString(metadata, METADATA[m], span) : -1;
                Py_XDECREF(span);
                if (stored < 0) return c->error = 1, -1;
            }
        }
        more = next_item(c, '}');
    }
    return more == 0 && events_seen == 1 ? 0 : -1;
}


/* scan(text, categories, codes) -> None, or (names, threads, x rows, strings, memory rows, metadata). */
static PyObject *scan(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    PyObject *categories, *codes;
    if (!PyArg_ParseTuple(args, "y*O!O!", &view, &PyTuple_Type, &categories, &PyTuple_Type, &codes)) return NULL;
    State st;
    memset(&st, 0, sizeof(st));
    PyObject *result = NULL, *metadata = NULL;
    st.base = view.buf;
    st.ncats = PyTuple_GET_SIZE(categories);
    if (PyTuple_GET_SIZE(codes) != st.ncats) {
        PyErr_SetString(PyExc_ValueError, "categories and codes differ in length");
        goto done;
    }
    st.cats = PyMem_Calloc(st.ncats + 1, sizeof(char *));
    st.cat_lens = PyMem_Calloc(st.ncats + 1, sizeof(Py_ssize_t));
    st.cat_codes = PyMem_Calloc(st.ncats + 1, 1);
    st.names.ids = PyList_New(0);
    st.threads.pairs = PyList_New(0);
    st.strings = PyList_New(0);
    st.string_ids = PyDict_New();
    metadata = PyDict_New();
    if (!st.cats || !st.cat_lens || !st.cat_codes || !st.names.ids || !st.threads.pairs || !st.strings || !st.string_ids || !metadata)
        goto done;
    for (Py_ssize_t i = 0; i < st.ncats; i++) {
        PyObject *cat = PyTuple_GET_ITEM(categories, i);
        if (!PyBytes_Check(cat)) {
            PyErr_SetString(PyExc_TypeError, "categories must be bytes");
            goto done;
        }
        st.cats[i] = PyBytes_AS_STRING(cat);
        st.cat_lens[i] = PyBytes_GET_SIZE(cat);
        st.cat_codes[i] = (uint8_t)PyLong_AsLong(PyTuple_GET_ITEM(codes, i));
    }
    if (PyErr_Occurred()) goto done;

    Cur c = {view.buf, (const char *)view.buf + view.len, 0};
    int ok = read_document(&st, &c, metadata) == 0;
    if (c.error) goto done;
    skip_ws(&c);
    if (!ok || c.p != c.end || st.x.len == 0) {
        if (PyErr_Occurred()) goto done;
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    {
        PyObject *x = buf_take(&st.x), *mem = buf_take(&st.mem);
        if (x && mem)
            result = Py_BuildValue("(OOOOOO)", st.names.ids, st.threads.pairs, x, st.strings, mem, metadata);
        Py_XDECREF(x);
        Py_XDECREF(mem);
    }
done:
    Py_XDECREF(st.x.bytes);
    Py_XDECREF(st.mem.bytes);
    names_free(&st.names);
    free(st.threads.slots);
    Py_XDECREF(st.threads.pairs);
    Py_XDECREF(st.strings);
    Py_XDECREF(st.string_ids);
    Py_XDECREF(metadata);
    PyMem_Free(st.cats);
    PyMem_Free(st.cat_lens);
    PyMem_Free(st.cat_codes);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(text, categories, codes): a trace's kept events as columns, or None (see the module's C "
     "source for when)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "trainprof.trace._scan",
                                    "Kineto trace JSON into columns (trainprof.trace.load).", -1, methods};

#define FIELD(type, field, format) Py_BuildValue("(ssn)", #field, format, (Py_ssize_t)offsetof(type, field))

PyMODINIT_FUNC PyInit__scan(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    PyObject *x = Py_BuildValue(
        "(NNNNNNNNNNNNNNNNNN)", FIELD(XRow, correlation, "i8"), FIELD(XRow, sequence, "i8"),
        FIELD(XRow, fwd_thread, "i8"), FIELD(XRow, in_nelems, "i8"), FIELD(XRow, out_nelems, "i8"),
        FIELD(XRow, group_size, "i8"), FIELD(XRow, dims, "2i8"), FIELD(XRow, types, "2i8"),
        FIELD(XRow, concrete, "2i8"), FIELD(XRow, ts, "f8"),
        FIELD(XRow, dur, "f8"), FIELD(XRow, bytes, "f8"), FIELD(XRow, flops, "f8"), FIELD(XRow, thread, "i4"),
        FIELD(XRow, name, "i4"), FIELD(XRow, collective, "i4"), FIELD(XRow, dtype, "i4"), FIELD(XRow, cat, "u1"));
    PyObject *mem = Py_BuildValue(
        "(NNNNNNN)", FIELD(MemoryRow, device_type, "i8"), FIELD(MemoryRow, ts, "f8"),
        FIELD(MemoryRow, total_allocated, "f8"), FIELD(MemoryRow, total_reserved, "f8"),
        FIELD(MemoryRow, alloc_bytes, "f8"), FIELD(MemoryRow, addr, "f8"), FIELD(MemoryRow, thread, "i4"));
    int added = x && mem && PyModule_AddObjectRef(m, "X_FIELDS", x) == 0 &&
                PyModule_AddObjectRef(m, "MEMORY_FIELDS", mem) == 0 &&
                PyModule_AddIntConstant(m, "X_SIZE", sizeof(XRow)) == 0 &&
                PyModule_AddIntConstant(m, "MEMORY_SIZE", sizeof(MemoryRow)) == 0;
    Py_XDECREF(x);
    Py_XDECREF(mem);
    if (!added) Py_CLEAR(m);
    return m;
}
