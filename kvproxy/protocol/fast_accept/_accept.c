/* kvproxy.protocol.fast_accept._accept: the CPython face of accept_core.c.
 *
 * accept_produce(frame, form_of, now_ms, max_partitions, max_records, max_request_records)
 *   -> None ("not sure") or (api_version, correlation_id, acks, ((topic, partitions, records), ...))
 *
 * form_of(name_or_id) is asked once per topic of the request (a str, or the 16 bytes of a v13
 * topic id) and answers None (no compiled form: not sure) or (topic name, (max_batch_bytes,
 * max_partition_bytes, before_max_ms, after_max_ms, keys_required)), each -1 where it sets no
 * limit. An exception it raises is raised here. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "accept_core.h"

typedef struct {
    PyObject *form_of;
    PyObject *names[KVA_MAX_TOPICS];
} Context;

static int
python_form_of(void *opaque, const kva_topic *topic, int index, kva_form *form)
{
    Context *context = opaque;
    PyObject *key = topic->is_id
                        ? PyBytes_FromStringAndSize((const char *)topic->name, 16)
                        : PyUnicode_DecodeUTF8((const char *)topic->name,
                                               (Py_ssize_t)topic->name_size, "strict");
    if (key == NULL)
        return -1;
    PyObject *answer = PyObject_CallOneArg(context->form_of, key);
    Py_DECREF(key);
    if (answer == NULL)
        return -1;
    if (answer == Py_None) {
        Py_DECREF(answer);
        return 0;
    }
    PyObject *name, *fields;
    long long v[5];
    if (!PyArg_ParseTuple(answer, "UO!;form_of answers (name, form)", &name, &PyTuple_Type,
                          &fields) ||
        !PyArg_ParseTuple(fields, "LLLLL;a form is five ints", &v[0], &v[1], &v[2], &v[3],
                          &v[4])) {
        Py_DECREF(answer);
        return -1;
    }
    Py_INCREF(name);
    context->names[index] = name;
    Py_DECREF(answer);
    form->max_batch_bytes = v[0];
    form->max_partition_bytes = v[1];
    form->before_max_ms = v[2];
    form->after_max_ms = v[3];
    form->keys_required = v[4] != 0;
    if (form->before_max_ms >= 0 && form->after_max_ms < 0) {
        PyErr_SetString(PyExc_ValueError, "a timestamp window needs both bounds");
        return -1;
    }
    return 1;
}

static PyObject *
accept_produce(PyObject *module, PyObject *args)
{
    Py_buffer frame;
    PyObject *form_of;
    kva_limits limits;
    long long now_ms, max_partitions, max_records, max_request_records;
    if (!PyArg_ParseTuple(args, "y*OLLLL", &frame, &form_of, &now_ms, &max_partitions,
                          &max_records, &max_request_records))
        return NULL;
    limits.now_ms = now_ms;
    limits.max_partitions = max_partitions;
    limits.max_records = max_records;
    limits.max_request_records = max_request_records;
    Context context;
    context.form_of = form_of;
    memset(context.names, 0, sizeof(context.names));
    kva_result result;
    int accepted = kva_accept(frame.buf, (size_t)frame.len, &limits, python_form_of, &context,
                              &result);
    PyBuffer_Release(&frame);
    PyObject *answer = NULL;
    if (accepted > 0) {
        PyObject *topics = PyTuple_New(result.topic_count);
        if (topics != NULL) {
            for (int t = 0; t < result.topic_count; t++) {
                PyObject *entry = Py_BuildValue("(OLL)", context.names[t],
                                                (long long)result.topics[t].partitions,
                                                (long long)result.topics[t].records);
                if (entry == NULL) {
                    Py_CLEAR(topics);
                    break;
                }
                PyTuple_SET_ITEM(topics, t, entry);
            }
        }
        if (topics != NULL) {
            answer = Py_BuildValue("(iiiN)", result.api_version, (int)result.correlation_id,
                                   result.acks, topics);
        }
    }
    else if (accepted == 0) {
        answer = Py_NewRef(Py_None);
    }
    for (int t = 0; t < KVA_MAX_TOPICS; t++)
        Py_XDECREF(context.names[t]);
    return answer;
}

static PyObject *
crc32c(PyObject *module, PyObject *args)
{
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data))
        return NULL;
    uint32_t crc = kva_crc32c(data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

static PyObject *
answer_plain(PyObject *module, PyObject *args)
{
    Py_buffer frame;
    int version;
    if (!PyArg_ParseTuple(args, "y*i", &frame, &version))
        return NULL;
    int plain = kva_answer_plain(frame.buf, (size_t)frame.len, version);
    PyBuffer_Release(&frame);
    return PyBool_FromLong(plain);
}

static PyMethodDef methods[] = {
    {"accept_produce", accept_produce, METH_VARARGS,
     "A Produce request every check of its topics passes: its counts; else None."},
    {"crc32c", crc32c, METH_VARARGS, "The CRC32C of the bytes (the accept's own)."},
    {"answer_plain", answer_plain, METH_VARARGS,
     "True when a flexible Produce answer plainly names no broker; False: not sure."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kvproxy.protocol.fast_accept._accept",
    "The compiled fast accept of Produce requests (accept_core.c).", -1, methods,
};

PyMODINIT_FUNC
PyInit__accept(void)
{
    return PyModule_Create(&module);
}
