/* Walks over a forest of frames that numpy can only do in log(depth) vectorised passes, each done
 * here in one pass: `trainprof.trace.model.nearest_marked` and `enclosing_parents` call these when
 * the module is built and keep their numpy code otherwise; tests/test_forest.py holds the two equal.
 *
 * Arrays come in through the buffer protocol (no numpy headers): int64, bool and float64 vectors,
 * C-contiguous, the output allocated by the caller.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Takes a contiguous 1-D buffer of `itemsize`-byte items in the format `format` (one character,
 * read by struct: q int64, ? bool, d float64). 0, or -1 with ValueError set. */
static int vector(PyObject *object, Py_buffer *view, const char *format, Py_ssize_t itemsize, int writable) {
    if (PyObject_GetBuffer(object, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=' || *f == '<') f++;
    int same = view->ndim == 1 && view->itemsize == itemsize &&
               (strcmp(f, format) == 0 || (format[0] == 'q' && strcmp(f, "l") == 0 && sizeof(long) == 8));
    if (!same) {
        PyErr_Format(PyExc_ValueError, "expected a 1-D contiguous array of format %s", format);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* n int64 slots of scratch when the arrays agree in length (`same`); NULL with an error set. */
static int64_t *scratch(Py_ssize_t n, int same) {
    if (!same) {
        PyErr_SetString(PyExc_ValueError, "the arrays differ in length");
        return NULL;
    }
    int64_t *slots = malloc((n ? n : 1) * sizeof(int64_t));
    if (!slots) PyErr_NoMemory();
    return slots;
}

/* nearest_marked(parents, marked, out): per node, the nearest marked node among itself and its
 * ancestors, or -1 (a negative parent is a root). Nodes in any order: a walk up stops at the first
 * node already answered and answers its whole path, so each node is walked over once. */
static PyObject *nearest_marked(PyObject *self, PyObject *args) {
    PyObject *parents_o, *marked_o, *out_o;
    if (!PyArg_ParseTuple(args, "OOO", &parents_o, &marked_o, &out_o)) return NULL;
    Py_buffer pv, mv, ov;
    if (vector(parents_o, &pv, "q", 8, 0) < 0) return NULL;
    if (vector(marked_o, &mv, "?", 1, 0) < 0) {
        PyBuffer_Release(&pv);
        return NULL;
    }
    if (vector(out_o, &ov, "q", 8, 1) < 0) {
        PyBuffer_Release(&pv);
        PyBuffer_Release(&mv);
        return NULL;
    }
    Py_ssize_t n = pv.len / 8;
    const int64_t *parent = pv.buf;
    const uint8_t *marked = mv.buf;
    int64_t *out = ov.buf;
    PyObject *result = NULL;
    int64_t *path = scratch(n, mv.len == n && ov.len / 8 == n);
    if (!path) goto done;
    const int64_t unknown = -2;
    for (Py_ssize_t i = 0; i < n; i++) out[i] = unknown;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t length = 0;
        int64_t j = i, answer;
        for (;;) {
            if (j < 0) {
                answer = -1;
                break;
            }
            if (j >= n || length >= n) { /* out of range, or a cycle */
                PyErr_SetString(PyExc_IndexError, "parents do not form a forest over the nodes");
                goto done;
            }
            if (out[j] != unknown) {
                answer = out[j];
                break;
            }
            if (marked[j]) {
                answer = j;
                break;
            }
            path[length++] = j;
            j = parent[j];
        }
        for (Py_ssize_t k = 0; k < length; k++) out[path[k]] = answer;
        if (out[i] == unknown) out[i] = answer; /* i itself marked: its walk stopped at once */
    }
    result = Py_NewRef(Py_None);
done:
    free(path);
    PyBuffer_Release(&pv);
    PyBuffer_Release(&mv);
    PyBuffer_Release(&ov);
    return result;
}

/* enclosing_parents(ends, slack, out) -> bool: per range (sorted by start, then longest first), the
 * last earlier range still open at its end (`ends[j] + slack >= ends[i]`), or -1: a stack pass.
 * False, with `out` unspecified, when an end is NaN (the caller's numpy code decides there). */
static PyObject *enclosing_parents(PyObject *self, PyObject *args) {
    PyObject *ends_o, *out_o;
    double slack;
    if (!PyArg_ParseTuple(args, "OdO", &ends_o, &slack, &out_o)) return NULL;
    Py_buffer ev, ov;
    if (vector(ends_o, &ev, "d", 8, 0) < 0) return NULL;
    if (vector(out_o, &ov, "q", 8, 1) < 0) {
        PyBuffer_Release(&ev);
        return NULL;
    }
    Py_ssize_t n = ev.len / 8;
    const double *ends = ev.buf;
    int64_t *out = ov.buf;
    PyObject *result = NULL;
    int64_t *stack = scratch(n, ov.len / 8 == n);
    if (!stack) goto done;
    Py_ssize_t top = 0;
    int numbers = 1;
    for (Py_ssize_t i = 0; i < n && numbers; i++) {
        double end = ends[i];
        if (isnan(end)) numbers = 0;
        while (top > 0 && ends[stack[top - 1]] + slack < end) top--;
        out[i] = top > 0 ? stack[top - 1] : -1;
        stack[top++] = i;
    }
    result = Py_NewRef(numbers ? Py_True : Py_False);
done:
    free(stack);
    PyBuffer_Release(&ev);
    PyBuffer_Release(&ov);
    return result;
}

static PyMethodDef methods[] = {
    {"nearest_marked", nearest_marked, METH_VARARGS, "nearest_marked(parents, marked, out)"},
    {"enclosing_parents", enclosing_parents, METH_VARARGS, "enclosing_parents(ends, slack, out) -> bool"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "trainprof.trace._forest",
                                    "One-pass walks over a forest of frames (trainprof.trace.model).", -1, methods};

PyMODINIT_FUNC PyInit__forest(void) { return PyModule_Create(&module); }
