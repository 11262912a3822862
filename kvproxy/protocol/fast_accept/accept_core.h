/* The fast accept of a Produce request in plain C (no Python object): one pass over the request
 * that answers "every partition passes every check its topic asks for" with the counts the
 * metrics need, or "not sure". Shared by the CPython module (_accept.c) and the libFuzzer
 * harness (fuzz/accept_fuzz.c). */

#ifndef KVPROXY_ACCEPT_CORE_H
#define KVPROXY_ACCEPT_CORE_H

#include <stddef.h>
#include <stdint.h>

#define KVA_MAX_TOPICS 64

/* What a topic's chain asks of each of its partitions, beyond the strict shape every partition
 * must have to be accepted here at all (kvproxy.policies.accept_form.AcceptForm). */
typedef struct {
    int64_t max_batch_bytes;     /* the batch, offset and length included; < 0: no limit */
    int64_t max_partition_bytes; /* the partition's records; < 0: no limit */
    int64_t before_max_ms;       /* timestamps within [now - before, now + after]; < 0: none */
    int64_t after_max_ms;
    int keys_required;           /* every record has a key (a compacted topic) */
} kva_form;

/* The request's limits: above any of them the answer is "not sure". */
typedef struct {
    int64_t now_ms;
    int64_t max_partitions;       /* partitions named in the request */
    int64_t max_records;          /* records declared in the request */
    int64_t max_request_records;  /* max_records_per_request; < 0: none */
} kva_limits;

typedef struct {
    const uint8_t *name; /* the topic's name, or its 16-byte id (Produce v13) */
    size_t name_size;
    int is_id;
    int64_t partitions;
    int64_t records;
} kva_topic;

typedef struct {
    int api_version;
    int32_t correlation_id;
    int acks;
    int topic_count;
    kva_topic topics[KVA_MAX_TOPICS];
} kva_result;

/* The form of topic number `index` of the request (its name or id in `topic`), or 0 when the
 * caller is not sure about the topic (no compiled form): then so is the accept. A negative
 * return is an error of the caller's (a Python exception): the accept stops. */
typedef int (*kva_form_of)(void *context, const kva_topic *topic, int index, kva_form *form);

/* 1: accepted, `result` filled; 0: not sure; < 0: the form callback failed. */
int kva_accept(const uint8_t *data, size_t size, const kva_limits *limits, kva_form_of form_of,
               void *context, kva_result *result);

/* 1: a flexible Produce answer (v9-v13) plainly names no broker (no tagged field anywhere, its
 * bytes read to their end); 0: not sure (the Python scan decides). */
int kva_answer_plain(const uint8_t *data, size_t size, int version);

uint32_t kva_crc32c(const uint8_t *data, size_t size);

#endif
