/* The arena both C fast paths allocate from (simulator/fast/_fastsim.c and
 * planner/search/swapadvisor/_fastdecode.c): every array of one call, freed together; the list
 * of blocks grows as needed, and a failed allocation marks the arena failed. */
#ifndef SWAPPLAN_ARENA_H
#define SWAPPLAN_ARENA_H

#include <stdint.h>
#include <stdlib.h>

typedef struct { void **block; size_t n, cap; int failed; } Arena;

/* An array of count items from the arena, zeroed if asked (NULL, and the arena marked
 * failed, on failure). */
static void *grab(Arena *a, size_t count, size_t size, int zeroed) {
    if (a->failed) return NULL;
    if (count == 0) count = 1;
    if (size != 0 && count > SIZE_MAX / size) { a->failed = 1; return NULL; }
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 64;
        void **grown = realloc(a->block, cap * sizeof(void *));
        if (grown == NULL) { a->failed = 1; return NULL; }
        a->block = grown;
        a->cap = cap;
    }
    void *p = zeroed ? calloc(count, size) : malloc(count * size);
    if (p == NULL) { a->failed = 1; return NULL; }
    a->block[a->n++] = p;
    return p;
}

/* A zeroed array (counters, flags, pending updates). */
static inline void *take(Arena *a, size_t count, size_t size) { return grab(a, count, size, 1); }

/* An array every entry of which is written before it is read. */
static inline void *take_raw(Arena *a, size_t count, size_t size) { return grab(a, count, size, 0); }

/* Free every array the arena handed out. */
static void release_all(Arena *a) {
    for (size_t i = 0; i < a->n; i++) free(a->block[i]);
    free(a->block);
    a->block = NULL;
    a->n = a->cap = 0;
}

#endif
