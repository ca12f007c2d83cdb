/* Where the fields of Kafka v2 records lie, for the Spark source's decode into Arrow
 * (connector/arrow_records.py).
 *
 * A record's start is known only from the record before it (its length prefix), so locating
 * fields is one sequential pass, which costs about 15 ns a record here and 250 in numpy
 * (gathers and temporaries for every field). Everything else of the decode (offsets,
 * timestamps, the Arrow arrays) stays in numpy and pyarrow, over whole columns.
 *
 * Both functions take buffers through the buffer protocol (no numpy headers are needed to
 * build this) and raise ValueError naming what is wrong and where; the caller turns that into a
 * CORRUPT_MESSAGE protocol error. Nothing is read outside a batch's bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { F_TS, F_OFF, F_KSTART, F_KLEN, F_VSTART, F_VLEN, F_HPOS, F_REND, FIELDS };

/* A zigzag varint of at most `most` bytes at b[*p], before `end`: 0, -1 (runs past end) or -2
 * (too long: Kafka reads at most 5 bytes for an int, 10 for a long). */
static int zigzag(const uint8_t *b, Py_ssize_t *p, Py_ssize_t end, int most, int64_t *out)
{
    uint64_t acc = 0;
    Py_ssize_t q = *p;
    for (int k = 0; k < most; k++) {
        if (q >= end)
            return -1;
        uint8_t byte = b[q++];
        acc |= (uint64_t)(byte & 0x7F) << (7 * k);
        if (!(byte & 0x80)) {
            *p = q;
            *out = (int64_t)(acc >> 1) ^ -(int64_t)(acc & 1);
            return 0;
        }
    }
    return -2;
}

static PyObject *corrupt(const char *what, Py_ssize_t at)
{
    PyErr_Format(PyExc_ValueError, "%s (at byte %zd)", what, at);
    return NULL;
}

/* scan(buf, los, his, counts, out): batch j's `counts[j]` records fill buf[los[j]:his[j]]
 * (int64 arrays); `out` is a writable int64 array of FIELDS rows of sum(counts) columns, row f
 * column i the field f of record i: timestamp delta, offset delta, key start and length (-1:
 * null), value start and length, where the header count lies, where the record ends. Returns
 * how many records have headers (a header count other than 0). */
static PyObject *scan(PyObject *self, PyObject *args)
{
    Py_buffer buf, los, his, counts, out;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*", &buf, &los, &his, &counts, &out))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t nb = los.len / 8;
    if (his.len / 8 != nb || counts.len / 8 != nb) {
        PyErr_SetString(PyExc_TypeError, "los, his and counts differ in length");
        goto done;
    }
    const int64_t *lo = los.buf, *hi = his.buf, *cnt = counts.buf;
    int64_t total = 0;
    for (Py_ssize_t j = 0; j < nb; j++) {
        if (cnt[j] < 0 || lo[j] < 0 || hi[j] < lo[j] || hi[j] > buf.len) {
            PyErr_SetString(PyExc_ValueError, "a batch's bounds lie outside the buffer");
            goto done;
        }
        total += cnt[j];
    }
    if (out.len != (Py_ssize_t)(total * FIELDS * 8)) {
        PyErr_SetString(PyExc_TypeError, "out is not FIELDS x records int64");
        goto done;
    }
    const uint8_t *b = buf.buf;
    int64_t *o = out.buf;
    int64_t i = 0, v, with_headers = 0;
    for (Py_ssize_t j = 0; j < nb; j++) {
        Py_ssize_t p = lo[j], end = hi[j];
        for (int64_t k = 0; k < cnt[j]; k++, i++) {
            Py_ssize_t at = p;
            int rc = zigzag(b, &p, end, 5, &v);
            if (rc || v < 0 || v > end - p) {
                result = corrupt(rc == -2 ? "varint too long" : "record length runs past the end of the batch", at);
                goto done;
            }
            Py_ssize_t rend = p + v;
            p++; /* attributes: unused by Kafka since v2 */
            int64_t ts, off, klen, vlen;
            if (p > rend || zigzag(b, &p, rend, 10, &ts) || zigzag(b, &p, rend, 5, &off)
                || zigzag(b, &p, rend, 5, &klen) || (klen > 0 && klen > rend - p)) {
                result = corrupt("record fields run past their record", at);
                goto done;
            }
            o[F_KSTART * total + i] = p;
            if (klen > 0)
                p += klen;
            if (zigzag(b, &p, rend, 5, &vlen) || (vlen > 0 && vlen > rend - p)) {
                result = corrupt("record fields run past their record", at);
                goto done;
            }
            o[F_VSTART * total + i] = p;
            if (vlen > 0)
                p += vlen;
            if (p >= rend) { /* the header count must follow */
                result = corrupt("record fields run past their record", at);
                goto done;
            }
            o[F_TS * total + i] = ts;
            o[F_OFF * total + i] = off;
            o[F_KLEN * total + i] = klen < 0 ? -1 : klen;
            o[F_VLEN * total + i] = vlen < 0 ? -1 : vlen;
            o[F_HPOS * total + i] = p;
            with_headers += b[p] != 0;
            o[F_REND * total + i] = rend;
            p = rend;
        }
        if (p != end) {
            result = corrupt("bytes left over after a batch's records", p);
            goto done;
        }
    }
    result = PyLong_FromLongLong(with_headers);
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&los);
    PyBuffer_Release(&his);
    PyBuffer_Release(&counts);
    PyBuffer_Release(&out);
    return result;
}

/* gather(buf, starts, lengths, offsets, data): the spans buf[starts[i]:starts[i] + lengths[i]]
 * (int64; a negative length is a null, no bytes) copied one after another into `data`, and
 * where each begins into `offsets` (int32, records + 1): an Arrow binary column's buffers. */
static PyObject *gather(PyObject *self, PyObject *args)
{
    Py_buffer buf, starts, lengths, offsets, data;
    if (!PyArg_ParseTuple(args, "y*y*y*w*w*", &buf, &starts, &lengths, &offsets, &data))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = starts.len / 8;
    if (lengths.len / 8 != n || offsets.len / 4 != n + 1) {
        PyErr_SetString(PyExc_TypeError, "starts, lengths and offsets differ in length");
        goto done;
    }
    const int64_t *s = starts.buf, *ln = lengths.buf;
    int32_t *off = offsets.buf;
    uint8_t *d = data.buf;
    const uint8_t *b = buf.buf;
    Py_ssize_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        off[i] = (int32_t)at;
        if (ln[i] <= 0)
            continue;
        if (s[i] < 0 || ln[i] > buf.len - s[i] || ln[i] > data.len - at || ln[i] > INT32_MAX - at) {
            PyErr_SetString(PyExc_ValueError, "a span lies outside the buffer");
            goto done;
        }
        memcpy(d + at, b + s[i], (size_t)ln[i]);
        at += ln[i];
    }
    off[n] = (int32_t)at;
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&data);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Locate the fields of every record of Kafka v2 record batches."},
    {"gather", gather, METH_VARARGS, "Copy spans of a buffer into an Arrow binary column's buffers."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_record_scan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__record_scan(void) { return PyModule_Create(&module); }
