/* The fast accept of a Produce request: a conservative accelerator, never a judge.
 *
 * One pass over a Produce request v3-v13: the header, the topics and partitions, each
 * partition's one magic-2 batch (header, CRC32C, every record walked: lengths, offset deltas,
 * timestamps, keys, header keys). It answers 1 only when the request is plainly well formed and
 * no check its topics' chains ask for (kva_form) can fire; anything else, a refusal as much as a
 * shape, codec, version or size it does not handle, is 0, "not sure", and the Python path decides
 * and words the answer. Stricter than the Python path everywhere, never looser: that is the
 * invariant the property tests hold it to (tests/unit/test_fast_accept_invariant.py).
 *
 * Every read is bounds-checked against the cursor's end; no allocation; no recursion. */

#include "accept_core.h"
#include "../valid_utf8.h"

#define V2_HEADER_SIZE 61
#define ATTRIBUTES_POS 21
#define TRANSACTIONAL_BIT 0x10

typedef struct {
    const uint8_t *data;
    size_t size;
    size_t pos;
} Cursor;

/* ---- big-endian fixed fields ---- */

static inline int
read_u8(Cursor *c, uint8_t *v)
{
    if (c->size - c->pos < 1)
        return 0;
    *v = c->data[c->pos++];
    return 1;
}

static inline int
read_i16(Cursor *c, int16_t *v)
{
    if (c->size - c->pos < 2)
        return 0;
    const uint8_t *p = c->data + c->pos;
    *v = (int16_t)(uint16_t)((p[0] << 8) | p[1]);
    c->pos += 2;
    return 1;
}

static inline int
read_i32(Cursor *c, int32_t *v)
{
    if (c->size - c->pos < 4)
        return 0;
    const uint8_t *p = c->data + c->pos;
    *v = (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
    c->pos += 4;
    return 1;
}

static inline int
read_i64(Cursor *c, int64_t *v)
{
    if (c->size - c->pos < 8)
        return 0;
    const uint8_t *p = c->data + c->pos;
    uint64_t x = 0;
    for (int i = 0; i < 8; i++)
        x = (x << 8) | p[i];
    *v = (int64_t)x;
    c->pos += 8;
    return 1;
}

/* An unsigned varint of at most 5 bytes holding at most 31 bits (the protocol's lengths and
 * counts); 0 otherwise. */
static inline int
read_uvarint(Cursor *c, int64_t *v)
{
    uint64_t raw = 0;
    for (int shift = 0; shift <= 28; shift += 7) {
        uint8_t byte;
        if (!read_u8(c, &byte))
            return 0;
        raw |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            if (raw > 0x7FFFFFFF)
                return 0;
            *v = (int64_t)raw;
            return 1;
        }
    }
    return 0;
}

/* A record's zigzag varint of at most `max_bytes` bytes; a 5-byte one holding bits beyond the
 * 32nd is refused (as the skim refuses it: the readers differ there). */
static inline int
read_varint(Cursor *c, int max_bytes, int64_t *v)
{
    uint64_t raw = 0;
    for (int i = 0, shift = 0; i < max_bytes; i++, shift += 7) {
        uint8_t byte;
        if (!read_u8(c, &byte))
            return 0;
        raw |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            if (max_bytes == 5 && (raw >> 32))
                return 0;
            if (max_bytes == 10 && i == 9 && byte > 1)
                return 0; /* bits beyond the 64th: not plainly a long */
            *v = (int64_t)((raw >> 1) ^ (0 - (raw & 1)));
            return 1;
        }
    }
    return 0;
}

/* ---- the request's own fields ---- */

/* A string of the header or body (compact from v9 on, `flexible`); a null one only when
 * `nullable`. Its bytes in *start / *length (*length -1: null); valid UTF-8 when present. */
static int
read_string(Cursor *c, int flexible, int nullable, const uint8_t **start, int64_t *length)
{
    int64_t n;
    if (flexible) {
        if (!read_uvarint(c, &n))
            return 0;
        n -= 1;
    }
    else {
        int16_t s;
        if (!read_i16(c, &s))
            return 0;
        n = s;
    }
    if (n < 0) {
        *length = -1;
        return n == -1 && nullable;
    }
    if ((uint64_t)n > c->size - c->pos)
        return 0;
    *start = c->data + c->pos;
    *length = n;
    c->pos += (size_t)n;
    return valid_utf8(*start, (size_t)n);
}

/* An array's length (compact from v9 on); a null array is not sure. */
static int
read_count(Cursor *c, int flexible, int64_t *count)
{
    if (flexible) {
        if (!read_uvarint(c, count) || *count == 0)
            return 0;
        *count -= 1;
        return 1;
    }
    int32_t n;
    if (!read_i32(c, &n) || n < 0)
        return 0;
    *count = n;
    return 1;
}

/* Tagged fields: only none is plainly understood. */
static inline int
no_tags(Cursor *c, int flexible)
{
    int64_t n;
    return !flexible || (read_uvarint(c, &n) && n == 0);
}

/* ---- a partition's records ---- */

static inline int
in_window(int64_t ts, const kva_form *form, int64_t now)
{
    if (form->before_max_ms < 0)
        return 1;
    __int128 t = ts, low = (__int128)now - form->before_max_ms;
    __int128 high = (__int128)now + form->after_max_ms;
    return t >= low && t <= high;
}

/* A length-prefixed key, value or header field of a record. */
static inline int
skip_field(Cursor *c, int nullable, int *null, size_t *start)
{
    int64_t length;
    if (!read_varint(c, 5, &length))
        return 0;
    *start = c->pos;
    *null = length < 0;
    if (length < 0)
        return length == -1 && nullable;
    if ((uint64_t)length > c->size - c->pos)
        return 0;
    c->pos += (size_t)length;
    return 1;
}

static int
walk_records(Cursor *c, int64_t count, int64_t first_timestamp, const kva_form *form, int64_t now)
{
    for (int64_t index = 0; index < count; index++) {
        int64_t length, ignored, delta, offset_delta, headers;
        int null;
        size_t start, field;
        if (!read_varint(c, 5, &length) || length < 0 || (uint64_t)length > c->size - c->pos)
            return 0;
        start = c->pos;
        Cursor record = {c->data, start + (size_t)length, start};
        if (!read_varint(&record, 1, &ignored)) /* attributes */
            return 0;
        if (!read_varint(&record, 10, &delta))
            return 0;
        int64_t ts = (int64_t)((uint64_t)first_timestamp + (uint64_t)delta); /* Java's long + */
        if (!in_window(ts, form, now))
            return 0;
        if (!read_varint(&record, 5, &offset_delta) || offset_delta != index)
            return 0;
        if (!skip_field(&record, 1, &null, &field) || (null && form->keys_required))
            return 0;
        if (!skip_field(&record, 1, &null, &field))
            return 0;
        if (!read_varint(&record, 5, &headers) || headers < 0)
            return 0;
        for (int64_t h = 0; h < headers; h++) {
            if (!skip_field(&record, 0, &null, &field))
                return 0;
            if (!valid_utf8(record.data + field, record.pos - field))
                return 0;
            if (!skip_field(&record, 1, &null, &field))
                return 0;
        }
        if (record.pos != record.size)
            return 0;
        c->pos = record.size;
    }
    return c->pos == c->size;
}

/* One partition's records: exactly one plain magic-2 batch the chain's checks all pass. */
static int
accept_batch(const uint8_t *data, size_t size, const kva_form *form, int transactional_id,
             int64_t now, int64_t *records)
{
    if (size < V2_HEADER_SIZE)
        return 0;
    if (form->max_batch_bytes >= 0 && (int64_t)size > form->max_batch_bytes)
        return 0;
    if (form->max_partition_bytes >= 0 && (int64_t)size > form->max_partition_bytes)
        return 0;
    Cursor c = {data, size, 0};
    int64_t base_offset, first_timestamp, max_timestamp, producer_id;
    int32_t length, leader_epoch, crc, last_offset_delta, base_sequence, count;
    int16_t attributes, producer_epoch;
    uint8_t magic;
    read_i64(&c, &base_offset);
    read_i32(&c, &length);
    read_i32(&c, &leader_epoch);
    read_u8(&c, &magic);
    read_i32(&c, &crc);
    read_i16(&c, &attributes);
    read_i32(&c, &last_offset_delta);
    read_i64(&c, &first_timestamp);
    read_i64(&c, &max_timestamp);
    read_i64(&c, &producer_id);
    read_i16(&c, &producer_epoch);
    read_i32(&c, &base_sequence);
    read_i32(&c, &count); /* 61 bytes, all present: checked above */
    if (base_offset != 0 || length < 0 || (size_t)length + 12 != size || magic != 2)
        return 0;
    if (attributes & ~TRANSACTIONAL_BIT) /* a codec, LogAppendTime, control, delete horizon */
        return 0;
    if ((attributes & TRANSACTIONAL_BIT) && !transactional_id)
        return 0;
    if (count <= 0 || (int64_t)last_offset_delta + 1 != count)
        return 0;
    if (producer_id < -1 || (producer_id >= 0 && base_sequence < 0))
        return 0;
    if (kva_crc32c(data + ATTRIBUTES_POS, size - ATTRIBUTES_POS) != (uint32_t)crc)
        return 0;
    if (!walk_records(&c, count, first_timestamp, form, now))
        return 0;
    *records = count;
    return 1;
}

/* ---- the request ---- */

int
kva_accept(const uint8_t *data, size_t size, const kva_limits *limits, kva_form_of form_of,
           void *context, kva_result *result)
{
    Cursor c = {data, size, 0};
    int16_t api_key, version, acks;
    int32_t correlation_id, timeout;
    const uint8_t *text = NULL;
    int64_t text_size, topic_count, partitions = 0, declared = 0;
    if (!read_i16(&c, &api_key) || !read_i16(&c, &version) || !read_i32(&c, &correlation_id))
        return 0;
    if (api_key != 0 || version < 3 || version > 13)
        return 0;
    int flexible = version >= 9;
    if (!read_string(&c, 0, 1, &text, &text_size)) /* client id: never compact */
        return 0;
    if (!no_tags(&c, flexible))
        return 0;
    if (!read_string(&c, flexible, 1, &text, &text_size)) /* transactional id */
        return 0;
    int transactional_id = text_size >= 0;
    if (!read_i16(&c, &acks) || !read_i32(&c, &timeout) || (acks != -1 && acks != 1))
        return 0;
    if (!read_count(&c, flexible, &topic_count) || topic_count == 0 ||
        topic_count > KVA_MAX_TOPICS)
        return 0;
    result->topic_count = 0;
    for (int64_t t = 0; t < topic_count; t++) {
        kva_topic *topic = &result->topics[t];
        if (version >= 13) {
            if (c.size - c.pos < 16)
                return 0;
            topic->name = c.data + c.pos;
            topic->name_size = 16;
            topic->is_id = 1;
            c.pos += 16;
        }
        else {
            if (!read_string(&c, flexible, 0, &text, &text_size) || text_size == 0)
                return 0;
            topic->name = text;
            topic->name_size = (size_t)text_size;
            topic->is_id = 0;
        }
        kva_form form;
        int known = form_of(context, topic, (int)t, &form);
        if (known <= 0)
            return known;
        int64_t partition_count;
        if (!read_count(&c, flexible, &partition_count) || partition_count == 0)
            return 0;
        partitions += partition_count;
        if (partitions > limits->max_partitions)
            return 0;
        topic->partitions = partition_count;
        topic->records = 0;
        for (int64_t p = 0; p < partition_count; p++) {
            int32_t index, records_size;
            int64_t n;
            if (!read_i32(&c, &index) || index < 0)
                return 0;
            if (flexible) {
                if (!read_uvarint(&c, &n) || n == 0)
                    return 0;
                n -= 1;
            }
            else {
                if (!read_i32(&c, &records_size) || records_size < 0)
                    return 0;
                n = records_size;
            }
            if ((uint64_t)n > c.size - c.pos)
                return 0;
            int64_t records;
            if (!accept_batch(c.data + c.pos, (size_t)n, &form, transactional_id, limits->now_ms,
                              &records))
                return 0;
            c.pos += (size_t)n;
            topic->records += records;
            declared += records;
            if (declared > limits->max_records ||
                (limits->max_request_records >= 0 && declared > limits->max_request_records))
                return 0;
            if (!no_tags(&c, flexible))
                return 0;
        }
        if (!no_tags(&c, flexible))
            return 0;
        result->topic_count = (int)t + 1;
    }
    if (!no_tags(&c, flexible) || c.pos != c.size)
        return 0;
    result->api_version = version;
    result->correlation_id = correlation_id;
    result->acks = acks;
    return 1;
}

/* ---- the broker's answer ---- */

static int
skip_compact_string(Cursor *c)
{
    int64_t n;
    if (!read_uvarint(c, &n))
        return 0;
    if (n == 0)
        return 1; /* null */
    if ((uint64_t)(n - 1) > c->size - c->pos)
        return 0;
    c->pos += (size_t)(n - 1);
    return 1;
}

int
kva_answer_plain(const uint8_t *data, size_t size, int version)
{
    Cursor c = {data, size, 4}; /* after the correlation id */
    int64_t topics, partitions, errors;
    if (size < 4 || version < 9 || version > 13 || !no_tags(&c, 1))
        return 0;
    if (!read_count(&c, 1, &topics))
        return 0;
    for (int64_t t = 0; t < topics; t++) {
        if (version >= 13) {
            if (c.size - c.pos < 16)
                return 0;
            c.pos += 16;
        }
        else if (!skip_compact_string(&c))
            return 0;
        if (!read_count(&c, 1, &partitions))
            return 0;
        for (int64_t p = 0; p < partitions; p++) {
            if (c.size - c.pos < 30) /* index, error code, base offset, append time, start */
                return 0;
            c.pos += 30;
            if (!read_count(&c, 1, &errors))
                return 0;
            for (int64_t e = 0; e < errors; e++) {
                if (c.size - c.pos < 4)
                    return 0;
                c.pos += 4;
                if (!skip_compact_string(&c) || !no_tags(&c, 1))
                    return 0;
            }
            if (!skip_compact_string(&c) || !no_tags(&c, 1)) /* message; current_leader */
                return 0;
        }
        if (!no_tags(&c, 1))
            return 0;
    }
    if (c.size - c.pos < 4)
        return 0;
    c.pos += 4; /* throttle time */
    return no_tags(&c, 1) && c.pos == c.size; /* node_endpoints would be a tag here */
}
