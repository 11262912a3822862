/* CRC32C (Castagnoli), the checksum of a magic-2 record batch, for the fast accept: the SSE 4.2
 * instruction where the CPU has it, else eight tables (slicing by eight). Plain C; its answers are
 * held to the crc32c package's by tests/unit/test_fast_accept_invariant.py and the hardware one to
 * the tables by the fuzz harness (fuzz/accept_fuzz.c). */

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "accept_core.h"

static uint32_t crc_table[8][256];
static int crc_ready;

static void
crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
    crc_ready = 1;
}

static uint32_t
crc_software(uint32_t crc, const uint8_t *p, size_t n)
{
    if (!crc_ready)
        crc_init();
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        word ^= crc; /* little-endian hosts (x86-64, arm64) */
        crc = crc_table[7][word & 0xFF] ^ crc_table[6][(word >> 8) & 0xFF] ^
              crc_table[5][(word >> 16) & 0xFF] ^ crc_table[4][(word >> 24) & 0xFF] ^
              crc_table[3][(word >> 32) & 0xFF] ^ crc_table[2][(word >> 40) & 0xFF] ^
              crc_table[1][(word >> 48) & 0xFF] ^ crc_table[0][word >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>

__attribute__((target("sse4.2"))) static uint32_t
crc_hardware(uint32_t crc, const uint8_t *p, size_t n)
{
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = _mm_crc32_u64(c, word);
        p += 8;
        n -= 8;
    }
    crc = (uint32_t)c;
    while (n--)
        crc = _mm_crc32_u8(crc, *p++);
    return crc;
}

static int
has_hardware_crc(void)
{
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    }
    return known;
}
#endif

uint32_t
kva_crc32c(const uint8_t *data, size_t size)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (has_hardware_crc())
        return ~crc_hardware(0xFFFFFFFFu, data, size);
#endif
    return ~crc_software(0xFFFFFFFFu, data, size);
}

