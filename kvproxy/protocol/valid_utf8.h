/* The UTF-8 check of the compiled readers (records/_skim.c, fast_accept/accept_core.c): what
 * Python's strict utf-8 decoder accepts, so that a string a compiled pass lets through is one the
 * Python path decodes. Plain C, no Python object. */

#ifndef KVPROXY_VALID_UTF8_H
#define KVPROXY_VALID_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* What Python's strict utf-8 decoder accepts: no overlong form, no surrogate, <= U+10FFFF. */
static inline int
valid_utf8(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int more;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            more = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            more = 2;
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F;
        }
        else if (c >= 0xF0 && c <= 0xF4) {
            more = 3;
            if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
        }
        else
            return 0;
        if (n - i <= (size_t)more)
            return 0;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return 0;
        for (int k = 2; k <= more; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
        i += (size_t)more + 1;
    }
    return 1;
}

#endif
