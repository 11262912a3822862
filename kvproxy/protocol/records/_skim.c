/* The skim of skim.py in C: a pass over a magic 2 batch's records that reads their headers and
 * skips their keys and values, giving exactly the pure-Python skim_v2's answers. In Python the
 * skim pays off only for large records; here it costs a few nanoseconds per record, so every
 * batch is skimmed and aiokafka's C reader (a record object and a copy of every key and value)
 * runs only when the skim declines a batch. The walk touches no Python object: for a large
 * buffer it runs without the GIL, the buffer held (a bytearray cannot resize while exported). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "../valid_utf8.h"

#define V2_HEADER_SIZE 61
#define WITHOUT_GIL_FROM_BYTES (64 * 1024)

static PyObject *record_scan_type; /* kvproxy.protocol.records.record.RecordScan */

typedef struct {
    const uint8_t *data;
    Py_ssize_t size;
    Py_ssize_t pos;
} Cursor;

typedef struct {
    int64_t low, high, null_keys;
} Scan;

/* A zigzag varint of at most max_bytes bytes; 0 when it does not end within them or within the
 * buffer. One of 5 bytes is Kafka's int: 0 too when its fifth byte holds bits beyond the 32nd,
 * which Kafka's ByteUtils.readVarint drops and aiokafka's reader keeps (the reader decides). */
static inline int
read_varint(Cursor *cur, int max_bytes, int64_t *value)
{
    if (cur->pos < cur->size && !(cur->data[cur->pos] & 0x80)) { /* one byte: most of them */
        uint8_t byte = cur->data[cur->pos++];
        *value = (int64_t)(byte >> 1) ^ -(int64_t)(byte & 1);
        return 1;
    }
    uint64_t raw = 0;
    Py_ssize_t end = cur->size - cur->pos < max_bytes ? cur->size : cur->pos + max_bytes;
    for (int shift = 0; cur->pos < end; shift += 7) {
        uint8_t byte = cur->data[cur->pos++];
        raw |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            if (max_bytes == 5 && (raw >> 32))
                return 0;
            *value = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            return 1;
        }
    }
    return 0;
}

/* The timestamp delta: a zigzag varlong of up to 10 bytes read as Kafka's ByteUtils.readVarlong
 * and aiokafka's reader read it, into 64 bits (a tenth byte gives only its lowest bit), added
 * to first_timestamp as Java adds two longs: wrapping. 0 only when it does not end in time. */
static inline int
read_timestamp(Cursor *cur, int64_t first, int64_t *timestamp)
{
    uint64_t raw = 0;
    Py_ssize_t end = cur->size - cur->pos < 10 ? cur->size : cur->pos + 10;
    for (int shift = 0; cur->pos < end; shift += 7) {
        uint8_t byte = cur->data[cur->pos++];
        raw |= (uint64_t)(byte & 0x7F) << shift; /* shift 63: all but the lowest bit drop */
        if (!(byte & 0x80)) {
            uint64_t delta = (raw >> 1) ^ (0 - (raw & 1)); /* zigzag, as two's complement */
            *timestamp = (int64_t)((uint64_t)first + delta);
            return 1;
        }
    }
    return 0;
}

/* A length-prefixed field within the buffer; *start is where its bytes begin, *null whether
 * it was null (length -1, only when nullable). */
static inline int
skip_field(Cursor *cur, int nullable, int *null, Py_ssize_t *start)
{
    int64_t length;
    if (!read_varint(cur, 5, &length))
        return 0;
    *start = cur->pos;
    *null = 0;
    if (length < 0) {
        *null = 1;
        return length == -1 && nullable;
    }
    if (length > cur->size - cur->pos)
        return 0;
    cur->pos += (Py_ssize_t)length;
    return 1;
}

/* One record at the cursor; 0 when it is not plainly well formed. Its value is the bytes from
 * value[0] to value[1] (null: *null_value). */
static inline __attribute__((always_inline)) int
skim_record(Cursor *cur, int64_t first, int64_t max_timestamp, int log_append,
            int64_t *timestamp, int *null_key, Py_ssize_t value[2], int *null_value)
{
    int64_t length, ignored, headers;
    Py_ssize_t start, field;
    int null;
    if (!read_varint(cur, 5, &length))
        return 0;
    start = cur->pos;
    if (length < 0 || length > cur->size - start)
        return 0;
    if (!read_varint(cur, 1, &ignored)) /* attributes: one byte, read as a varint by aiokafka */
        return 0;
    if (log_append) {
        if (!read_varint(cur, 10, &ignored)) /* the delta, unused: only its end matters */
            return 0;
        *timestamp = max_timestamp;
    }
    else if (!read_timestamp(cur, first, timestamp))
        return 0;
    if (!read_varint(cur, 5, &ignored)) /* offset delta */
        return 0;
    if (!skip_field(cur, 1, null_key, &field) || !skip_field(cur, 1, null_value, &value[0]))
        return 0;
    value[1] = cur->pos;
    if (!read_varint(cur, 5, &headers) || headers < 0)
        return 0;
    for (int64_t h = 0; h < headers; h++) {
        if (!skip_field(cur, 0, &null, &field))
            return 0;
        if (!valid_utf8(cur->data + field, (size_t)(cur->pos - field)))
            return 0;
        if (!skip_field(cur, 1, &null, &field))
            return 0;
    }
    return cur->pos - start == length;
}

static int
skim(const uint8_t *data, Py_ssize_t size, int64_t count, int64_t first, int64_t max_timestamp,
     int log_append, Scan *scan)
{
    Cursor cur = {data, size, V2_HEADER_SIZE}; /* a local: its fields stay in registers */
    int64_t timestamp, low = 0, high = 0, null_keys = 0;
    int null_key, null_value;
    Py_ssize_t value[2];
    for (int64_t index = 0; index < count; index++) {
        if (!skim_record(&cur, first, max_timestamp, log_append, &timestamp, &null_key, value,
                         &null_value))
            return 0;
        null_keys += null_key;
        if (index == 0)
            low = high = timestamp;
        else if (timestamp < low)
            low = timestamp;
        else if (timestamp > high)
            high = timestamp;
    }
    scan->low = low;
    scan->high = high;
    scan->null_keys = null_keys;
    return cur.pos == cur.size;
}

static PyObject *
record_scan(PyObject *count, const Scan *scan)
{
    PyTypeObject *type = (PyTypeObject *)record_scan_type;
    PyObject *result = type->tp_alloc(type, 4);
    if (result == NULL)
        return NULL;
    PyObject *items[4] = {
        Py_NewRef(count),
        PyLong_FromLongLong(scan->low),
        PyLong_FromLongLong(scan->high),
        PyLong_FromLongLong(scan->null_keys),
    };
    for (int i = 0; i < 4; i++)
        PyTuple_SET_ITEM(result, i, items[i]);
    for (int i = 1; i < 4; i++)
        if (items[i] == NULL) {
            Py_DECREF(result);
            return NULL;
        }
    return result;
}

/* The four arguments after the buffer, shared by skim_v2 and values_v2; 0 with an exception. */
static int
read_arguments(PyObject *const *args, long long *count, long long *first,
               long long *max_timestamp, int *log_append)
{
    int overflow;
    *count = PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (*count == -1 && PyErr_Occurred())
        return 0;
    if (overflow) /* more records than any buffer holds, or fewer than none: as Python loops */
        *count = overflow > 0 ? LLONG_MAX : -1;
    *first = PyLong_AsLongLong(args[2]);
    if (*first == -1 && PyErr_Occurred())
        return 0;
    *max_timestamp = PyLong_AsLongLong(args[3]);
    if (*max_timestamp == -1 && PyErr_Occurred())
        return 0;
    *log_append = PyObject_IsTrue(args[4]);
    return *log_append >= 0;
}

PyDoc_STRVAR(skim_v2_doc,
"skim_v2(plain, count, first_timestamp, max_timestamp, log_append_time)\n--\n\n"
"Count, timestamp range and null keys of an uncompressed magic 2 batch (plain: any buffer\n"
"holding its 61-byte header, then the records) as a RecordScan; None when the batch is not\n"
"plainly well formed. The same answers as skim.py's pure-Python skim_v2.");

static PyObject *
skim_v2(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "skim_v2() takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    long long count, first, max_timestamp;
    int log_append;
    if (!read_arguments(args, &count, &first, &max_timestamp, &log_append))
        return NULL;

    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const uint8_t *data = (const uint8_t *)view.buf;
    Scan scan;
    int ok;
    if (view.len > WITHOUT_GIL_FROM_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        ok = skim(data, view.len, count, first, max_timestamp, log_append, &scan);
        Py_END_ALLOW_THREADS
    }
    else
        ok = skim(data, view.len, count, first, max_timestamp, log_append, &scan);
    PyBuffer_Release(&view);
    if (!ok)
        Py_RETURN_NONE;
    return record_scan(args[1], &scan);
}

/* Every record's value as bytes (None for a null one) in a list, walking the records as skim()
 * does; None when the batch is not plainly well formed, NULL with an exception set when memory
 * runs out. */
static PyObject *
values(const uint8_t *data, Py_ssize_t size, int64_t count, int64_t first, int64_t max_timestamp,
       int log_append)
{
    if (count < 0) /* no record read, as skim() reads none */
        count = 0;
    if (count > size) /* every record takes at least one byte */
        return Py_NewRef(Py_None);
    Cursor cur = {data, size, V2_HEADER_SIZE};
    PyObject *list = PyList_New((Py_ssize_t)count);
    if (list == NULL)
        return NULL;
    int64_t timestamp;
    int null_key, null_value;
    Py_ssize_t value[2];
    for (Py_ssize_t index = 0; index < (Py_ssize_t)count; index++) {
        if (!skim_record(&cur, first, max_timestamp, log_append, &timestamp, &null_key, value,
                         &null_value))
            goto declined;
        PyObject *item = null_value ? Py_NewRef(Py_None)
                                    : PyBytes_FromStringAndSize((const char *)data + value[0],
                                                                value[1] - value[0]);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, index, item);
    }
    if (cur.pos == cur.size)
        return list;
declined:
    Py_DECREF(list);
    return Py_NewRef(Py_None);
}

PyDoc_STRVAR(values_v2_doc,
"values_v2(plain, count, first_timestamp, max_timestamp, log_append_time)\n--\n\n"
"Every record's value (bytes, None when null) of an uncompressed magic 2 batch, read as\n"
"skim_v2 walks it; None when the batch is not plainly well formed (skim_v2 says None too).");

static PyObject *
values_v2(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "values_v2() takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    long long count, first, max_timestamp;
    int log_append;
    if (!read_arguments(args, &count, &first, &max_timestamp, &log_append))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result =
        values((const uint8_t *)view.buf, view.len, count, first, max_timestamp, log_append);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef skim_methods[] = {
    {"skim_v2", (PyCFunction)(void (*)(void))skim_v2, METH_FASTCALL, skim_v2_doc},
    {"values_v2", (PyCFunction)(void (*)(void))values_v2, METH_FASTCALL, values_v2_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef skim_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvproxy.protocol.records._skim",
    .m_doc = "The record skim of skim.py, compiled.",
    .m_size = -1,
    .m_methods = skim_methods,
};

PyMODINIT_FUNC
PyInit__skim(void)
{
    PyObject *records = PyImport_ImportModule("kvproxy.protocol.records.record");
    if (records == NULL)
        return NULL;
    record_scan_type = PyObject_GetAttrString(records, "RecordScan");
    Py_DECREF(records);
    if (record_scan_type == NULL)
        return NULL;
    if (!PyType_Check(record_scan_type) ||
        !PyType_IsSubtype((PyTypeObject *)record_scan_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "RecordScan is not a tuple type");
        Py_CLEAR(record_scan_type);
        return NULL;
    }
    return PyModule_Create(&skim_module);
}
