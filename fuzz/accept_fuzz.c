/* libFuzzer + AddressSanitizer harness of the compiled fast accept (accept_core.c), the C that
 * reads bytes a client controls. Built and run on the committed corpus (fuzz/corpus/accept) by
 * tests/unit/test_fuzz_accept.py in `make test` for a bounded time, longer by `make fuzz`:
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined fuzz/accept_fuzz.c -o accept_fuzz
 *   (the harness includes accept_core.c and crc32c.c: their static functions are compared)
 *   ./accept_fuzz -max_total_time=60 NEW_INPUTS_DIR fuzz/corpus/accept
 *
 * Each input is one Produce request (the frame without its size), and is also read as a broker's
 * Produce answer (kva_answer_plain). The forms vary with the
 * topic's name, so that every condition (sizes, timestamp window, keys, a topic without a form)
 * is met by some input. Besides ASan's and UBSan's reports, the harness aborts when an accepted
 * request's counts do not add up, or when the hardware CRC32C and the table one disagree. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kvproxy/protocol/fast_accept/accept_core.c"
#include "../kvproxy/protocol/fast_accept/crc32c.c"

static int
form_of(void *context, const kva_topic *topic, int index, kva_form *form)
{
    (void)context;
    (void)index;
    uint8_t h = topic->name_size ? topic->name[topic->name_size - 1] : 0;
    form->max_batch_bytes = (h & 1) ? 200 : -1;
    form->max_partition_bytes = (h & 2) ? 300 : -1;
    form->before_max_ms = (h & 4) ? 1000 : (h & 0x40) ? INT64_MAX : -1;
    form->after_max_ms = (h & 4) ? 500 : (h & 0x40) ? INT64_MAX : -1;
    form->keys_required = (h & 8) != 0;
    return (h & 0x30) == 0x30 ? 0 : 1; /* some topics have no form */
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1); /* exactly the input: a read past it is reported */
    memcpy(copy, data, size);
    kva_limits limits = {1790000000000LL, 100, 10000, (size & 1) ? 3 : -1};
    kva_result result;
    int accepted = kva_accept(copy, size, &limits, form_of, NULL, &result);
    if (accepted == 1) {
        int64_t partitions = 0, records = 0;
        if (result.topic_count < 1 || result.topic_count > KVA_MAX_TOPICS)
            abort();
        for (int t = 0; t < result.topic_count; t++) {
            const kva_topic *topic = &result.topics[t];
            if (topic->name < copy || topic->name + topic->name_size > copy + size)
                abort();
            if (topic->partitions < 1 || topic->records < topic->partitions)
                abort();
            partitions += topic->partitions;
            records += topic->records;
        }
        if (partitions > limits.max_partitions || records > limits.max_records)
            abort();
        if (result.acks != -1 && result.acks != 1)
            abort();
    }
    else if (accepted != 0)
        abort(); /* only a Python callback fails */
    (void)kva_answer_plain(copy, size, 9 + (int)(size % 5)); /* the same bytes as an answer */
#if defined(__x86_64__)
    if (has_hardware_crc() &&
        crc_hardware(0xFFFFFFFFu, copy, size) != crc_software(0xFFFFFFFFu, copy, size))
        abort();
#endif
    free(copy);
    return 0;
}
