/*
 * The swapadvisor decoder in C (planner/swap_recompute/swapadvisor/decode.py, ABI 2).
 *
 * One call, `_fastdecode.decode(problem, persistent_bytes, budget, order, weight, remakable)`,
 * does for one chromosome what Decoder.reference does in Python (Layout, _evict,
 * _keep_inputs, _hoist, _actions), step for step, with the same int64 arithmetic and the
 * same double-precision eviction keys, so that its plan is identical:
 *
 *   problem: the tuple Problem.arrays (every entry a 1-d C-contiguous buffer)
 *     0 bytes int64[m]       1 persistent bool[m]    2 producer int64[m] (op or -1)
 *     3 workspace int64[n]   4 time_us float64[n]
 *     5 touch_off int64[n+1], 6 touch_t int64[]: the tensors each op touches (CSR)
 *     7 idle int64[]: persistent tensors no op touches (bytes > 0)
 *     8 upd_off int64[m+1], 9 upd_op int64[]: the ops updating each tensor in place (CSR)
 *     10 rin_off int64[m+1], 11 rin_t int64[]: a recomputable tensor's producer's inputs (CSR)
 *   order: int64[n], op indices in run order (a permutation)
 *   weight: float64[m], 2 ** (SPREAD * (gene0 - 0.5)) per tensor, computed by numpy;
 *   remakable: bool[m], remake_us < copy_us * 2 ** (SPREAD * (gene1 - 0.5)), by numpy
 *     (the genes enter already transformed, so that no libm function has to agree with numpy's).
 *
 * The result: (kinds, tensors, afters, befores, initial, identity, swaps, recomputes,
 * over_bytes). kinds: bytes in the simulator's action codes (0 offload, 1 prefetch,
 * 2 drop, 3 recompute: simulator/fast/_fastsim.c); tensors, afters and befores (op index or
 * -1) and initial (tensors that start in host memory): bytes of int32; identity: whether
 * the order is the profile's.
 *
 * `_fastdecode.recomputable(problem)`: bytes, one per tensor, 1 where R15 lets it be
 * recomputed (`recomputable_flags`, the twin of simulator/model/recompute.py's
 * recompute_problem, which decode.py asks; tests/test_recompute_twin.py holds them equal).
 *
 * Robustness: every length and index of the inputs is checked (ValueError), every buffer
 * is sized from them, and an allocation that fails raises MemoryError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_arena.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ABI 2
enum { K_OFFLOAD = 0, K_PREFETCH = 1, K_DROP = 2, K_RECOMPUTE = 3 };   /* simulator action codes */
enum { P_DROP = 0, P_OFFLOAD = 1, P_PREFETCH = 2, P_RECOMPUTE = 3 };   /* issue-order phases (lowering) */
enum { NPROBLEM = 12 };

/* ================================================================== inputs (arrays from _arena.h) */

typedef struct {
    int64_t n, m, n_touch, n_idle, n_upd, n_rin;
    const int64_t *bytes, *producer, *workspace, *touch_off, *touch_t, *idle;
    const int64_t *upd_off, *upd_op, *rin_off, *rin_t, *order;
    const uint8_t *persistent, *remakable;
    const double *time_us, *weight;
    int64_t persistent_bytes, budget;
    uint8_t *recomputable;         /* R15, per tensor (recomputable_flags) */
} In;

/* R15, the twin of simulator/model/recompute.py's recompute_problem: tensor t may be
 * recomputed when it is not persistent, an op makes it, nothing updates it in place and
 * its producer updates nothing in place. One flag per tensor; NULL when out of memory. */
static uint8_t *recomputable_flags(const In *in, Arena *a) {
    uint8_t *updates = take(a, (size_t)in->n + 1, 1), *flags = take(a, (size_t)in->m + 1, 1);
    if (updates == NULL || flags == NULL) return NULL;
    for (int64_t i = 0; i < in->upd_off[in->m]; i++) updates[in->upd_op[i]] = 1;
    for (int64_t t = 0; t < in->m; t++) {
        int64_t p = in->producer[t];
        flags[t] = !in->persistent[t] && p >= 0 && in->upd_off[t] == in->upd_off[t + 1] && !updates[p];
    }
    return flags;
}

/* ================================================================== layout (decode.py Layout) */

typedef struct {
    int64_t *pos;                  /* op -> position */
    int64_t *tp_off, *tp;          /* each tensor's touch positions, ascending (CSR) */
    int64_t *last;                 /* last touch position, -1: none */
    int64_t *base;                 /* the no-swap memory estimate per position */
    double *start;                 /* ideal start per position, then the end */
    int64_t ng, *gt, *ga, *gb, *gtail, *gsize;   /* the idle gaps */
    int64_t *gof_off, *gof;        /* each tensor's gaps, in gap order (CSR) */
    int identity;
} Lay;

/* Group the touch positions by tensor: walking the schedule keeps each list ascending. */
static void touch_positions(const In *in, Lay *L, int64_t *fill) {
    for (int64_t i = 0; i < in->n_touch; i++) L->tp_off[in->touch_t[i] + 1] += 1;
    for (int64_t t = 0; t < in->m; t++) L->tp_off[t + 1] += L->tp_off[t];
    memcpy(fill, L->tp_off, (size_t)in->m * sizeof(int64_t));
    for (int64_t k = 0; k < in->n; k++) {
        int64_t op = in->order[k];
        for (int64_t i = in->touch_off[op]; i < in->touch_off[op + 1]; i++) L->tp[fill[in->touch_t[i]]++] = k;
    }
}

/* The memory estimate without swaps and the ideal start times, per position. */
static void estimate(const In *in, Lay *L, int64_t *diff) {
    int64_t n = in->n, run = 0;
    for (int64_t t = 0; t < in->m; t++) {
        int64_t lo = L->tp_off[t], hi = L->tp_off[t + 1];
        L->last[t] = hi > lo ? L->tp[hi - 1] : -1;
        if (hi > lo && !in->persistent[t]) {
            diff[L->tp[lo]] += in->bytes[t];
            diff[L->tp[hi - 1] + 1] -= in->bytes[t];
        }
    }
    for (int64_t k = 0; k < n; k++) {
        run += diff[k];
        L->base[k] = in->persistent_bytes + run + in->workspace[in->order[k]];
    }
    L->start[0] = 0.0;   /* numpy's cumsum starts at the first time, then adds in order */
    if (n > 0) L->start[1] = in->time_us[in->order[0]];
    for (int64_t k = 1; k < n; k++) L->start[k + 1] = L->start[k] + in->time_us[in->order[k]];
}

/* Append gap (t, a, b, tail). */
static void add_gap(Lay *L, const In *in, int64_t t, int64_t a, int64_t b, int64_t tail) {
    int64_t g = L->ng++;
    L->gt[g] = t; L->ga[g] = a; L->gb[g] = b; L->gtail[g] = tail; L->gsize[g] = in->bytes[t];
}

/* The gaps in decode.py's order: inner gaps by (tensor, position), front gaps of touched
 * persistent tensors, then the idle persistent tensors; and each tensor's gaps. */
static void find_gaps(const In *in, Lay *L) {
    int64_t n = in->n;
    for (int64_t t = 0; t < in->m; t++) {
        if (in->bytes[t] <= 0) continue;
        for (int64_t j = L->tp_off[t]; j + 1 < L->tp_off[t + 1]; j++)
            if (L->tp[j + 1] - L->tp[j] >= 2) add_gap(L, in, t, L->tp[j], L->tp[j + 1], n);
    }
    for (int64_t t = 0; t < in->m; t++) {
        int64_t lo = L->tp_off[t], hi = L->tp_off[t + 1];
        if (hi > lo && in->persistent[t] && L->tp[lo] >= 1 && in->bytes[t] > 0)
            add_gap(L, in, t, -1, L->tp[lo], L->tp[hi - 1] + 1);
    }
    for (int64_t i = 0; i < in->n_idle; i++) add_gap(L, in, in->idle[i], -1, n, n);
    for (int64_t g = 0; g < L->ng; g++) L->gof_off[L->gt[g] + 1] += 1;
    for (int64_t t = 0; t < in->m; t++) L->gof_off[t + 1] += L->gof_off[t];
}

/* What the schedule fixes (decode.py Layout); 0 when out of memory. */
static int build_layout(const In *in, Lay *L, Arena *a) {
    int64_t n = in->n, m = in->m, cap = in->n_touch + m + in->n_idle;
    L->pos = take_raw(a, (size_t)n, sizeof(int64_t));
    L->tp_off = take(a, (size_t)m + 1, sizeof(int64_t));
    L->tp = take_raw(a, (size_t)in->n_touch, sizeof(int64_t));
    L->last = take_raw(a, (size_t)m, sizeof(int64_t));
    L->base = take_raw(a, (size_t)n, sizeof(int64_t));
    L->start = take_raw(a, (size_t)n + 1, sizeof(double));
    L->gt = take_raw(a, (size_t)cap, sizeof(int64_t));
    L->ga = take_raw(a, (size_t)cap, sizeof(int64_t));
    L->gb = take_raw(a, (size_t)cap, sizeof(int64_t));
    L->gtail = take_raw(a, (size_t)cap, sizeof(int64_t));
    L->gsize = take_raw(a, (size_t)cap, sizeof(int64_t));
    L->gof_off = take(a, (size_t)m + 1, sizeof(int64_t));
    L->gof = take_raw(a, (size_t)cap, sizeof(int64_t));
    int64_t *scratch = take(a, (size_t)(n > m ? n : m) + 1, sizeof(int64_t));
    if (a->failed) return 0;
    L->identity = 1;
    for (int64_t k = 0; k < n; k++) {
        L->pos[in->order[k]] = k;
        L->identity &= in->order[k] == k;
    }
    touch_positions(in, L, scratch);
    memset(scratch, 0, ((size_t)(n > m ? n : m) + 1) * sizeof(int64_t));
    estimate(in, L, scratch);
    L->ng = 0;
    find_gaps(in, L);
    memcpy(scratch, L->gof_off, (size_t)m * sizeof(int64_t));
    for (int64_t g = 0; g < L->ng; g++) L->gof[scratch[L->gt[g]]++] = g;
    return 1;
}

/* ================================================================== state (decode.py _State) */

typedef struct {
    int64_t *mem, *delta;          /* the estimate; pending range updates of it */
    uint8_t *free, *remade;        /* neither evicted nor pinned; evicted and recomputed */
    int64_t *end;                  /* evicted gap -> back by this position; -1: not evicted */
    int64_t *issue;                /* swapped gap -> its prefetch's after position */
    int64_t over_bytes;
    int64_t *pins, *pulls;         /* _keep_inputs' scratch */
} St;

/* A fresh state for a layout; 0 when out of memory. */
static int new_state(const In *in, const Lay *L, St *S, Arena *a) {
    S->mem = take_raw(a, (size_t)in->n, sizeof(int64_t));
    S->delta = take(a, (size_t)in->n + 1, sizeof(int64_t));
    S->free = take_raw(a, (size_t)L->ng, 1);
    S->remade = take(a, (size_t)L->ng, 1);
    S->end = take_raw(a, (size_t)L->ng, sizeof(int64_t));
    S->issue = take_raw(a, (size_t)L->ng, sizeof(int64_t));
    S->pins = take_raw(a, (size_t)L->ng, sizeof(int64_t));
    S->pulls = take_raw(a, (size_t)L->ng, sizeof(int64_t));
    if (a->failed) return 0;
    memcpy(S->mem, L->base, (size_t)in->n * sizeof(int64_t));
    memset(S->free, 1, (size_t)L->ng);
    for (int64_t g = 0; g < L->ng; g++) S->end[g] = -1;
    S->over_bytes = 0;
    return 1;
}

/* ================================================================== eviction (decode.py _evict) */

/* Can gap g end in a recompute? Its producer's inputs must be resident at the gap's end
 * and not updated in place since the producer ran (R15); those swapped out around it
 * come back by then, the others around it are pinned. */
static int keep_inputs(const In *in, const Lay *L, St *S, int64_t g) {
    int64_t b = L->gb[g], npins = 0, npulls = 0, t = L->gt[g], made = L->pos[in->producer[t]];
    for (int64_t i = in->rin_off[t]; i < in->rin_off[t + 1]; i++) {
        int64_t x = in->rin_t[i];
        if (L->last[x] < b && !in->persistent[x]) return 0;
        for (int64_t j = in->upd_off[x]; j < in->upd_off[x + 1]; j++) {
            int64_t u = L->pos[in->upd_op[j]];
            if (made < u && u < b) return 0;
        }
        for (int64_t j = L->gof_off[x]; j < L->gof_off[x + 1]; j++) {
            int64_t h = L->gof[j];
            int tail_covers = L->gtail[h] <= b, evicted = S->end[h] >= 0;
            if (tail_covers && evicted) return 0;
            if ((L->ga[h] < b && b < L->gb[h]) || tail_covers) {
                if (S->remade[h]) return 0;
                if (evicted) S->pulls[npulls++] = h;
                else S->pins[npins++] = h;
            }
        }
    }
    for (int64_t i = 0; i < npins; i++) S->free[S->pins[i]] = 0;
    for (int64_t i = 0; i < npulls; i++) {
        int64_t h = S->pulls[i];
        if (S->end[h] > b) {                       /* back by b: resident over [b, end) */
            S->delta[b] += L->gsize[h];
            S->delta[S->end[h]] -= L->gsize[h];
            S->end[h] = b;
        }
    }
    return 1;
}

/* A candidate as one unsigned 128-bit number whose ascending order is numpy's stable
 * argsort of -key: the key mapped so that a larger key is smaller (-0.0 as 0.0, NaN
 * last), then the gap index for ties. */
typedef unsigned __int128 Cand;

/* The candidate (key, g). */
static inline Cand candidate(double key, int64_t g) {
    uint64_t u;
    if (isnan(key)) {
        u = UINT64_MAX;
    } else {
        uint64_t bits;
        if (key == 0.0) key = 0.0;                   /* -0.0 ties with 0.0 */
        memcpy(&bits, &key, sizeof(bits));
        uint64_t ascending = (bits >> 63) ? ~bits : bits | ((uint64_t)1 << 63);
        u = ~ascending;
    }
    return ((Cand)u << 64) | (uint64_t)g;
}

#define CAND_LAST (~(Cand)0)   /* after every candidate: the empty slots of the tree */

/* A winner tree over one op's candidates: tree[size + i] the i-th candidate (CAND_LAST
 * past the last), tree[j] the first in order of tree[2j] and tree[2j + 1], so tree[1]
 * is the first of all. Building it takes one pass with no branch on the data, and taking
 * the first out replays one leaf-to-root path: cheaper than a heap when, as here, most
 * ops take a few of hundreds of candidates. */
typedef struct { Cand *tree; int64_t *leaf_of; } Tourney;

/* The one of x and y that comes first. */
static inline Cand first_of(Cand x, Cand y) { return x < y ? x : y; }

/* The tree over the candidates at position k: gaps[0..nc), keyed by their next use's
 * distance scaled by the tensor's weight, (start[b] - start[k]) * weight (decode.py). */
static void tourney_build(Tourney *w, const In *in, const Lay *L, const int64_t *gaps, int64_t nc, int64_t k) {
    int64_t size = 1;
    while (size < nc) size *= 2;
    for (int64_t i = 0; i < nc; i++) {
        int64_t g = gaps[i];
        w->tree[size + i] = candidate((L->start[L->gb[g]] - L->start[k]) * in->weight[L->gt[g]], g);
        w->leaf_of[g] = size + i;
    }
    for (int64_t i = nc; i < size; i++) w->tree[size + i] = CAND_LAST;
    for (int64_t j = size - 1; j >= 1; j--) w->tree[j] = first_of(w->tree[2 * j], w->tree[2 * j + 1]);
}

/* The first candidate in order, taken out; -1 when none is left. */
static int64_t tourney_pop(Tourney *w) {
    Cand top = w->tree[1];
    if (top == CAND_LAST) return -1;
    int64_t g = (int64_t)(uint64_t)top, j = w->leaf_of[g];
    w->tree[j] = CAND_LAST;
    for (j /= 2; j >= 1; j /= 2) w->tree[j] = first_of(w->tree[2 * j], w->tree[2 * j + 1]);
    return g;
}

/* Evict gap g: away over (a, b) and [tail, n); maybe recomputed. */
static void evict_gap(const In *in, const Lay *L, St *S, int64_t g) {
    int64_t size = L->gsize[g];
    S->free[g] = 0;
    S->end[g] = L->gb[g];
    S->delta[L->ga[g] + 1] -= size;
    S->delta[L->gb[g]] += size;
    S->delta[L->gtail[g]] -= size;
    int64_t t = L->gt[g];
    if (L->ga[g] >= 0 && in->remakable[t] && in->recomputable[t] && keep_inputs(in, L, S, g)) S->remade[g] = 1;
}

/* Apply the pending range updates to the estimate. */
static void apply_delta(int64_t n, St *S) {
    int64_t run = 0;
    for (int64_t j = 0; j < n; j++) {
        run += S->delta[j];
        S->mem[j] += run;
    }
    memset(S->delta, 0, ((size_t)n + 1) * sizeof(int64_t));
}

/* Belady, op by op: where the estimate is over the budget, evict the gaps that cover the
 * op, furthest next use (scaled by the gene) first, until it fits. The gaps that cover a
 * position are kept in an active list as the walk moves forward. */
static int evict(const In *in, const Lay *L, St *S, Arena *a) {
    int64_t n = in->n, budget = in->budget, ng = L->ng;
    int64_t *by_a_off = take(a, (size_t)n + 2, sizeof(int64_t)), *by_a = take_raw(a, (size_t)ng, sizeof(int64_t));
    int64_t *fill = take(a, (size_t)n + 1, sizeof(int64_t)), *active = take_raw(a, (size_t)ng, sizeof(int64_t));
    int64_t size = 1;
    while (size < ng) size *= 2;
    Tourney first = {take_raw(a, (size_t)size * 2, sizeof(Cand)), take_raw(a, (size_t)ng, sizeof(int64_t))};
    if (a->failed) return 0;
    for (int64_t g = 0; g < ng; g++) by_a_off[L->ga[g] + 2] += 1;   /* bucket a + 1: the first k it covers */
    for (int64_t k = 0; k <= n; k++) by_a_off[k + 1] += by_a_off[k];
    memcpy(fill, by_a_off, ((size_t)n + 1) * sizeof(int64_t));
    for (int64_t g = 0; g < ng; g++) by_a[fill[L->ga[g] + 1]++] = g;
    int64_t nactive = 0, added = 0;                 /* gaps with a < added are in the list */
    for (int64_t k = 0; k < n; k++) {
        if (S->mem[k] <= budget) continue;
        for (; added <= k; added++)
            for (int64_t i = by_a_off[added]; i < by_a_off[added + 1]; i++) active[nactive++] = by_a[i];
        int64_t kept = 0;
        for (int64_t i = 0; i < nactive; i++) {
            int64_t g = active[i];
            if (S->free[g] && L->gb[g] > k) active[kept++] = g;   /* else never a candidate again */
        }
        nactive = kept;
        int64_t need = S->mem[k] - budget;
        if (nactive) {
            tourney_build(&first, in, L, active, nactive, k);
            for (int64_t g = tourney_pop(&first); g >= 0; g = tourney_pop(&first)) {
                if (!S->free[g]) continue;           /* pinned by a recompute taken just now */
                evict_gap(in, L, S, g);
                need -= L->gsize[g];
                if (need <= 0) break;
            }
            apply_delta(n, S);
        }
        if (S->mem[k] - budget > S->over_bytes) S->over_bytes = S->mem[k] - budget;
    }
    return 1;
}

/* ================================================================== prefetches (decode.py _hoist) */

/* The estimate in blocks, for the hoist's range queries and additions: the value at j is
 * v[j] + badd[j / BLOCK]; bmax[b] is the largest v[j] of block b (without badd[b]). */
enum { BLOCK = 32 };
typedef struct { int64_t *v, *bmax, *badd, n; } Blocks;

/* Blocks over the estimate v[0..n); 0 when out of memory. */
static int blocks_init(Blocks *r, int64_t *v, int64_t n, Arena *a) {
    int64_t nb = n / BLOCK + 1;
    r->v = v;
    r->n = n;
    r->bmax = take_raw(a, (size_t)nb, sizeof(int64_t));
    r->badd = take(a, (size_t)nb, sizeof(int64_t));
    if (a->failed) return 0;
    for (int64_t b = 0; b < nb; b++) r->bmax[b] = INT64_MIN;
    for (int64_t j = 0; j < n; j++)
        if (v[j] > r->bmax[j / BLOCK]) r->bmax[j / BLOCK] = v[j];
    return 1;
}

/* Add x to v[lo, hi) of one block (x >= 0: the block's largest value can only grow). */
static void add_within(Blocks *r, int64_t lo, int64_t hi, int64_t x) {
    int64_t b = lo / BLOCK, top = r->bmax[b];
    for (int64_t j = lo; j < hi; j++) {
        r->v[j] += x;
        if (r->v[j] > top) top = r->v[j];
    }
    r->bmax[b] = top;
}

/* Add x >= 0 to the estimate over [lo, hi). */
static void blocks_add(Blocks *r, int64_t lo, int64_t hi, int64_t x) {
    if (lo >= hi) return;
    int64_t bl = lo / BLOCK, bh = (hi - 1) / BLOCK;
    if (bl == bh) {
        add_within(r, lo, hi, x);
        return;
    }
    add_within(r, lo, (bl + 1) * BLOCK, x);
    for (int64_t b = bl + 1; b < bh; b++) r->badd[b] += x;
    add_within(r, bh * BLOCK, hi, x);
}

/* The last position in [lo, hi) where the estimate is above room; -1: none. */
static int64_t blocks_last_above(const Blocks *r, int64_t lo, int64_t hi, int64_t room) {
    for (int64_t j = hi - 1; j >= lo;) {
        int64_t b = j / BLOCK, first = b * BLOCK, add = r->badd[b];
        if (r->bmax[b] + add > room)
            for (; j >= lo && j >= first; j--)
                if (r->v[j] + add > room) return j;
        j = first - 1;
    }
    return -1;
}

/* In order of need, undo the evictions memory never needed, and issue each prefetch as
 * early as the estimate leaves room (never before an earlier-needed one). */
static int hoist(const In *in, const Lay *L, St *S, Arena *a) {
    int64_t n = in->n, budget = in->budget, latest = -1;
    int64_t *off = take(a, (size_t)n + 1, sizeof(int64_t)), *fill = take(a, (size_t)n, sizeof(int64_t));
    int64_t *evicted = take_raw(a, (size_t)L->ng, sizeof(int64_t));
    Blocks mem;
    if (a->failed || !blocks_init(&mem, S->mem, n, a)) return 0;
    for (int64_t g = 0; g < L->ng; g++)             /* by (end, gap); an end of n or more never comes back */
        if (S->end[g] >= 0 && S->end[g] < n) off[S->end[g] + 1] += 1;
    for (int64_t e = 0; e < n; e++) off[e + 1] += off[e];
    memcpy(fill, off, (size_t)n * sizeof(int64_t));
    for (int64_t g = 0; g < L->ng; g++)
        if (S->end[g] >= 0 && S->end[g] < n) evicted[fill[S->end[g]]++] = g;
    for (int64_t i = 0; i < off[n]; i++) {
        int64_t g = evicted[i], e = S->end[g];
        int64_t ga = L->ga[g], tail = L->gtail[g], size = L->gsize[g], room = budget - size;
        int64_t blocked = blocks_last_above(&mem, ga + 1, e, room);
        if (blocked < 0 && blocks_last_above(&mem, tail, n, room) < 0) {   /* memory never needed it gone */
            S->end[g] = -1;
            S->remade[g] = 0;
            blocks_add(&mem, ga + 1, e, size);
            blocks_add(&mem, tail, n, size);
            continue;
        }
        if (S->remade[g]) continue;
        int64_t at = blocked >= 0 ? blocked : ga;
        if (at < latest) at = latest;                /* the FIFO: not before an earlier-needed one */
        blocks_add(&mem, at + 1, e, size);
        S->issue[g] = latest = at;
    }
    return 1;
}

/* ================================================================== actions (decode.py _actions) */

/* An action with its issue-order key (at, phase, third, f4a, f4b). */
typedef struct { int32_t at, phase, third, f4a, f4b, kind, tensor, after, before; } Item;

/* lowering.issue_order: by op, drops, offloads, prefetches by need, recomputes by producer. */
static int cmp_items(const void *x, const void *y) {
    const Item *p = x, *q = y;
    if (p->at != q->at) return p->at < q->at ? -1 : 1;
    if (p->phase != q->phase) return p->phase < q->phase ? -1 : 1;
    if (p->third != q->third) return p->third < q->third ? -1 : 1;
    if (p->f4a != q->f4a) return p->f4a < q->f4a ? -1 : 1;
    return (p->f4b > q->f4b) - (p->f4b < q->f4b);
}

typedef struct { Item *item; int64_t n; int64_t *initial; int64_t ninitial; } Out;

/* Sort a few items in place (insertion sort; qsort for a long run). */
static void sort_run(Item *item, int64_t count) {
    if (count > 24) {
        qsort(item, (size_t)count, sizeof(Item), cmp_items);
        return;
    }
    for (int64_t i = 1; i < count; i++) {
        Item x = item[i];
        int64_t j = i;
        for (; j > 0 && cmp_items(&item[j - 1], &x) > 0; j--) item[j] = item[j - 1];
        item[j] = x;
    }
}

/* Sort the items by their issue-order key: by position (counting sort; -1 to n - 1),
 * then each position's few items by the rest of the key. 0 when out of memory. */
static int sort_items(Out *o, int64_t n, Arena *a) {
    int64_t *off = take(a, (size_t)n + 2, sizeof(int64_t)), *fill = take(a, (size_t)n + 1, sizeof(int64_t));
    Item *sorted = take_raw(a, (size_t)o->n, sizeof(Item));
    if (a->failed) return 0;
    for (int64_t i = 0; i < o->n; i++) off[o->item[i].at + 2] += 1;
    for (int64_t x = 0; x <= n; x++) off[x + 1] += off[x];
    memcpy(fill, off, ((size_t)n + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < o->n; i++) sorted[fill[o->item[i].at + 1]++] = o->item[i];
    for (int64_t x = 0; x <= n; x++) sort_run(sorted + off[x], off[x + 1] - off[x]);
    o->item = sorted;
    return 1;
}

/* Append one action: kind, tensor, and after / before positions (-1: none). */
static void emit(Out *o, const In *in, int64_t at, int phase, int64_t third, int64_t f4a, int64_t f4b, int kind,
                 int64_t t, int64_t after, int64_t before) {
    Item *it = &o->item[o->n++];
    it->at = (int32_t)at; it->phase = phase; it->third = (int32_t)third; it->f4a = (int32_t)f4a;
    it->f4b = (int32_t)f4b; it->kind = kind; it->tensor = (int32_t)t;
    it->after = after >= 0 ? (int32_t)in->order[after] : -1;
    it->before = before >= 0 ? (int32_t)in->order[before] : -1;
}

/* Is the host copy made at position `made` still valid at `at` (no in-place update of t
 * between: the same count of updates up to each, as bisect_right compares)? */
static int copy_valid(const In *in, const Lay *L, int64_t t, int64_t made, int64_t at) {
    int64_t upto_at = 0, upto_made = 0;
    for (int64_t i = in->upd_off[t]; i < in->upd_off[t + 1]; i++) {
        int64_t p = L->pos[in->upd_op[i]];
        upto_at += p <= at;
        upto_made += p <= made;
    }
    return in->upd_off[t] == in->upd_off[t + 1] || upto_at == upto_made;
}

/* A swapped gap's prefetch and the offloads or drops that take the tensor away. */
static void swap_actions(const In *in, const Lay *L, const St *S, Out *o, int64_t g, int last_gap,
                         int *initial, int64_t *copy_at) {
    int64_t t = L->gt[g], a = L->ga[g], e = S->end[g], leaving[2], nleaving = 0;
    if (e < in->n) emit(o, in, S->issue[g], P_PREFETCH, e, t, 0, K_PREFETCH, t, S->issue[g], e);
    if (a < 0) {
        *initial = 1;
        o->initial[o->ninitial++] = t;
        *copy_at = -1;
    } else {
        leaving[nleaving++] = a;
    }
    if (last_gap && *initial && L->last[t] >= 0) leaving[nleaving++] = L->last[t];   /* R20 */
    for (int64_t i = 0; i < nleaving; i++) {
        int64_t at = leaving[i];
        int drop = *copy_at != INT64_MIN && copy_valid(in, L, t, *copy_at, at);
        if (!drop) *copy_at = at;
        emit(o, in, at, drop ? P_DROP : P_OFFLOAD, at, t, 0, drop ? K_DROP : K_OFFLOAD, t, at, -1);
    }
}

/* One tensor's actions, its gaps in (tensor, start) order: the gap from the iteration
 * start (at most one) is the last of its gaps in gap order and the first by start. */
static void tensor_actions(const In *in, const Lay *L, const St *S, Out *o, int64_t t, int64_t *list,
                           const int64_t *read_until) {
    int64_t k = 0, lo = L->gof_off[t], hi = L->gof_off[t + 1];
    if (hi > lo && L->ga[L->gof[hi - 1]] < 0 && S->end[L->gof[hi - 1]] >= 0) list[k++] = L->gof[hi - 1];
    for (int64_t j = lo; j < hi; j++) {
        int64_t g = L->gof[j];
        if (L->ga[g] >= 0 && S->end[g] >= 0) list[k++] = g;
    }
    int initial = 0;
    int64_t copy_at = INT64_MIN;                     /* INT64_MIN: no host copy yet */
    if (k && L->ga[list[0]] >= 0 && !S->remade[list[0]] && in->persistent[t] && in->remakable[t]
        && copy_valid(in, L, t, -1, L->ga[list[0]]) && read_until[t] <= L->last[t]) {
        /* first evicted after a use, with its starting value: it starts in host memory instead
         * (decode.py host_start; for a persistent tensor `remakable` carries that flag) */
        int64_t first = L->tp[L->tp_off[t]];
        initial = 1;
        o->initial[o->ninitial++] = t;
        copy_at = -1;
        emit(o, in, -1, P_PREFETCH, first, t, 0, K_PREFETCH, t, -1, first);
    }
    for (int64_t i = 0; i < k; i++) {
        int64_t g = list[i], a = L->ga[g], e = S->end[g];
        if (S->remade[g]) {
            emit(o, in, a, P_DROP, a, t, 0, K_DROP, t, a, -1);
            emit(o, in, e - 1, P_RECOMPUTE, e, L->pos[in->producer[t]], t, K_RECOMPUTE, t, -1, e);
            continue;
        }
        swap_actions(in, L, S, o, g, i + 1 == k, &initial, &copy_at);
    }
}

/* Every action of the plan, in issue order; 0 when out of memory. */
static int actions(const In *in, const Lay *L, const St *S, Out *o, Arena *a) {
    o->item = take_raw(a, (size_t)L->ng * 3 + (size_t)in->m, sizeof(Item));
    o->initial = take_raw(a, (size_t)in->m, sizeof(int64_t));
    int64_t *list = take_raw(a, (size_t)L->ng, sizeof(int64_t));
    int64_t *read_until = take_raw(a, (size_t)in->m + 1, sizeof(int64_t));   /* the latest recompute reading each */
    if (a->failed) return 0;
    for (int64_t t = 0; t < in->m; t++) read_until[t] = -1;
    for (int64_t g = 0; g < L->ng; g++) {
        if (!S->remade[g]) continue;
        int64_t t = L->gt[g];
        for (int64_t i = in->rin_off[t]; i < in->rin_off[t + 1]; i++)
            if (read_until[in->rin_t[i]] < S->end[g]) read_until[in->rin_t[i]] = S->end[g];
    }
    o->n = o->ninitial = 0;
    for (int64_t t = 0; t < in->m; t++)
        if (L->gof_off[t + 1] > L->gof_off[t]) tensor_actions(in, L, S, o, t, list, read_until);
    return sort_items(o, in->n, a);
}

/* ================================================================== Python glue */

typedef struct { Py_buffer view; int held; } Buf;

/* A 1-d buffer of `kind` ('i' int64, 'f' float64, 'b' bool / uint8) items. */
static int get_buf(PyObject *obj, Buf *b, char kind, const char *name) {
    if (PyObject_GetBuffer(obj, &b->view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return 0;
    b->held = 1;
    const char *f = b->view.format ? b->view.format : "B";
    if (*f == '@' || *f == '=') f++;
    int ok = b->view.ndim <= 1 && f[0] != '\0' && f[1] == '\0';
    if (ok && kind == 'i') ok = b->view.itemsize == 8 && strchr("ql", f[0]) != NULL;
    else if (ok && kind == 'f') ok = b->view.itemsize == 8 && f[0] == 'd';
    else if (ok) ok = b->view.itemsize == 1 && strchr("?Bb", f[0]) != NULL;
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "_fastdecode: %s must be a 1-d array of %s", name,
                     kind == 'i' ? "int64" : kind == 'f' ? "float64" : "bool");
        return 0;
    }
    return 1;
}

/* The number of items in a buffer. */
static Py_ssize_t buf_len(const Buf *b) { return b->view.len / b->view.itemsize; }

/* A ValueError naming the entry; 0. */
static int bad(const char *name, Py_ssize_t i, const char *what) {
    PyErr_Format(PyExc_ValueError, "_fastdecode: %s[%zd] %s", name, i, what);
    return 0;
}

/* Every value in [lo, hi). */
static int all_in(const int64_t *v, Py_ssize_t n, int64_t lo, int64_t hi, const char *name) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (v[i] < lo || v[i] >= hi) return bad(name, i, "is out of range");
    return 1;
}

/* CSR offsets: count + 1 of them, from 0 up to len values, never decreasing; values in [0, hi). */
static int csr_ok(const Buf *off, const Buf *val, Py_ssize_t count, int64_t hi, const char *name) {
    const int64_t *o = off->view.buf;
    if (buf_len(off) != count + 1) return bad(name, 0, "has the wrong length");
    if (o[0] != 0 || o[count] != buf_len(val)) return bad(name, 0, "does not span its values");
    for (Py_ssize_t i = 0; i < count; i++)
        if (o[i] > o[i + 1]) return bad(name, i, "decreases");
    return all_in(val->view.buf, buf_len(val), 0, hi, name);
}

/* Point `in` at the buffers and check their lengths, ranges and the permutation. */
static int check_inputs(In *in, Buf *pb, Buf *cb, Arena *a) {
    static const char *names[NPROBLEM] = {"bytes", "persistent", "producer", "workspace", "time_us", "touch_off",
                                          "touch_t", "idle", "upd_off", "upd_op", "rin_off", "rin_t"};
    Py_ssize_t m = buf_len(&pb[0]), n = buf_len(&pb[3]);
    in->m = m; in->n = n;
    in->bytes = pb[0].view.buf; in->persistent = pb[1].view.buf; in->producer = pb[2].view.buf;
    in->workspace = pb[3].view.buf; in->time_us = pb[4].view.buf; in->touch_off = pb[5].view.buf;
    in->touch_t = pb[6].view.buf; in->idle = pb[7].view.buf; in->upd_off = pb[8].view.buf;
    in->upd_op = pb[9].view.buf; in->rin_off = pb[10].view.buf; in->rin_t = pb[11].view.buf;
    in->order = cb[0].view.buf; in->weight = cb[1].view.buf; in->remakable = cb[2].view.buf;
    in->n_touch = buf_len(&pb[6]); in->n_idle = buf_len(&pb[7]);
    if (buf_len(&pb[1]) != m || buf_len(&pb[2]) != m || buf_len(&pb[4]) != n || buf_len(&cb[0]) != n
        || buf_len(&cb[1]) != m || buf_len(&cb[2]) != m || m > INT32_MAX || n > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "_fastdecode: the arrays' lengths disagree");
        return 0;
    }
    if (!(all_in(in->bytes, m, 0, INT64_MAX / 4, names[0]) && all_in(in->producer, m, -1, n, names[2])
          && all_in(in->workspace, n, 0, INT64_MAX / 4, names[3]) && csr_ok(&pb[5], &pb[6], n, m, names[5])
          && all_in(in->idle, in->n_idle, 0, m, names[7]) && csr_ok(&pb[8], &pb[9], m, n, names[8])
          && csr_ok(&pb[10], &pb[11], m, m, names[10]) && all_in(in->order, n, 0, n, "order")))
        return 0;
    for (Py_ssize_t t = 0; t < m; t++)
        if (in->rin_off[t + 1] > in->rin_off[t] && in->producer[t] < 0) return bad(names[10], t, "has no producer");
    uint8_t *seen = take(a, (size_t)n, 1);
    in->recomputable = recomputable_flags(in, a);
    if (seen == NULL || in->recomputable == NULL) { PyErr_NoMemory(); return 0; }
    for (Py_ssize_t k = 0; k < n; k++) {
        if (seen[in->order[k]]) return bad("order", k, "repeats an op");
        seen[in->order[k]] = 1;
    }
    return 1;
}

/* A bytes object of the int32 values of one item field. */
static PyObject *int32_column(const Out *o, int field) {
    PyObject *col = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)o->n * 4);
    if (col == NULL) return NULL;
    int32_t *dst = (int32_t *)PyBytes_AS_STRING(col);
    for (int64_t i = 0; i < o->n; i++) {
        const Item *it = &o->item[i];
        dst[i] = (int32_t)(field == 0 ? it->tensor : field == 1 ? it->after : it->before);
    }
    return col;
}

/* The result tuple (see the top of this file). */
static PyObject *build_result(const Lay *L, const St *S, const Out *o) {
    int64_t swaps = 0, recomputes = 0;
    for (int64_t g = 0; g < L->ng; g++) {
        swaps += S->end[g] >= 0 && !S->remade[g];
        recomputes += S->end[g] >= 0 && S->remade[g];
    }
    PyObject *kinds = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)o->n);
    PyObject *initial = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)o->ninitial * 4);
    PyObject *tensors = int32_column(o, 0), *afters = int32_column(o, 1), *befores = int32_column(o, 2);
    if (!kinds || !initial || !tensors || !afters || !befores) {
        Py_XDECREF(kinds); Py_XDECREF(initial); Py_XDECREF(tensors); Py_XDECREF(afters); Py_XDECREF(befores);
        return NULL;
    }
    for (int64_t i = 0; i < o->n; i++) PyBytes_AS_STRING(kinds)[i] = (char)o->item[i].kind;
    int32_t *init = (int32_t *)PyBytes_AS_STRING(initial);
    for (int64_t i = 0; i < o->ninitial; i++) init[i] = (int32_t)o->initial[i];
    return Py_BuildValue("(NNNNNNLLL)", kinds, tensors, afters, befores, initial, PyBool_FromLong(L->identity),
                         (long long)swaps, (long long)recomputes, (long long)(S->over_bytes > 0 ? S->over_bytes : 0));
}

/* Layout, evict, hoist and actions; 0 when out of memory. */
static int run_decode(const In *in, Lay *L, St *S, Out *o, Arena *a) {
    return build_layout(in, L, a) && new_state(in, L, S, a) && evict(in, L, S, a) && hoist(in, L, S, a)
           && actions(in, L, S, o, a);
}

/* The buffer kind of each entry of the problem tuple (int64, bool or float64). */
static const char PROBLEM_KINDS[NPROBLEM] = {'i', 'b', 'i', 'i', 'f', 'i', 'i', 'i', 'i', 'i', 'i', 'i'};

/* _fastdecode.recomputable: R15 per tensor of a problem (recomputable_flags), as bytes. */
static PyObject *fastdecode_recomputable(PyObject *self, PyObject *problem) {
    (void)self;
    if (!PyTuple_Check(problem) || PyTuple_GET_SIZE(problem) != NPROBLEM) {
        PyErr_SetString(PyExc_ValueError, "_fastdecode: the problem tuple must have 12 entries");
        return NULL;
    }
    Buf pb[NPROBLEM];
    memset(pb, 0, sizeof(pb));
    Arena arena;
    memset(&arena, 0, sizeof(arena));
    In in;
    memset(&in, 0, sizeof(in));
    PyObject *result = NULL;
    int ok = 1;
    for (int i = 0; ok && i < NPROBLEM; i++)
        ok = get_buf(PyTuple_GET_ITEM(problem, i), &pb[i], PROBLEM_KINDS[i], "problem");
    if (ok) {
        Py_ssize_t m = buf_len(&pb[0]), n = buf_len(&pb[3]);
        in.m = m; in.n = n;
        in.persistent = pb[1].view.buf; in.producer = pb[2].view.buf;
        in.upd_off = pb[8].view.buf; in.upd_op = pb[9].view.buf;
        if (buf_len(&pb[1]) != m || buf_len(&pb[2]) != m) {
            PyErr_SetString(PyExc_ValueError, "_fastdecode: the arrays' lengths disagree");
        } else if (all_in(in.producer, m, -1, n, "producer") && csr_ok(&pb[8], &pb[9], m, n, "upd_off")) {
            uint8_t *flags = recomputable_flags(&in, &arena);
            if (flags == NULL) PyErr_NoMemory();
            else result = PyBytes_FromStringAndSize((const char *)flags, m);
        }
    }
    release_all(&arena);
    for (int i = 0; i < NPROBLEM; i++) if (pb[i].held) PyBuffer_Release(&pb[i].view);
    return result;
}

/* _fastdecode.decode: read and check the inputs, decode without the GIL, build the result. */
static PyObject *fastdecode_decode(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *problem, *order, *weight, *remakable;
    long long persistent_bytes, budget;
    if (!PyArg_ParseTuple(args, "O!LLOOO:decode", &PyTuple_Type, &problem, &persistent_bytes, &budget, &order,
                          &weight, &remakable))
        return NULL;
    if (PyTuple_GET_SIZE(problem) != NPROBLEM) {
        PyErr_SetString(PyExc_ValueError, "_fastdecode: the problem tuple must have 12 entries");
        return NULL;
    }
    Buf pb[NPROBLEM], cb[3];
    memset(pb, 0, sizeof(pb));
    memset(cb, 0, sizeof(cb));
    Arena arena;
    memset(&arena, 0, sizeof(arena));
    In in;
    Lay lay;
    St st;
    Out out;
    memset(&in, 0, sizeof(in));
    memset(&lay, 0, sizeof(lay));
    memset(&st, 0, sizeof(st));
    memset(&out, 0, sizeof(out));
    PyObject *result = NULL;
    int ok = 1;
    for (int i = 0; ok && i < NPROBLEM; i++)
        ok = get_buf(PyTuple_GET_ITEM(problem, i), &pb[i], PROBLEM_KINDS[i], "problem");
    ok = ok && get_buf(order, &cb[0], 'i', "order") && get_buf(weight, &cb[1], 'f', "weight")
         && get_buf(remakable, &cb[2], 'b', "remakable");
    in.persistent_bytes = persistent_bytes;
    in.budget = budget;
    if (ok && check_inputs(&in, pb, cb, &arena)) {
        int done;
        Py_BEGIN_ALLOW_THREADS
        done = run_decode(&in, &lay, &st, &out, &arena);
        Py_END_ALLOW_THREADS
        if (!done) PyErr_NoMemory();
        else result = build_result(&lay, &st, &out);
    }
    release_all(&arena);
    for (int i = 0; i < NPROBLEM; i++) if (pb[i].held) PyBuffer_Release(&pb[i].view);
    for (int i = 0; i < 3; i++) if (cb[i].held) PyBuffer_Release(&cb[i].view);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", fastdecode_decode, METH_VARARGS,
     "decode(problem, persistent_bytes, budget, order, weight, remakable): one chromosome's plan as columns."},
    {"recomputable", fastdecode_recomputable, METH_O,
     "recomputable(problem): one byte per tensor, 1 where R15 lets it be recomputed."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastdecode",
                                    "The swapadvisor decoder in C (planner/swap_recompute/swapadvisor/decode.py is the reference).",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastdecode(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "ABI", ABI) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
