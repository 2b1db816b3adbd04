/*
 * The simulator's fast path in C (rules version 2, SIMULATION.md).
 *
 * One call, `_fastsim.run(profile_arrays, machine, plan, budget)`, does what the Python
 * reference does for one plan, in the same order and with the same integer arithmetic:
 *
 *   1. the rules checked before the walk (simulator/compile/program.py check_plan_rules: R21, R20
 *      for initial placements, R15 for recomputes of persistent tensors);
 *   2. the compute sequence (simulator/compile/sequence.py: R5, R8);
 *   3. the static walk (simulator/compile/program.py _Compiler: R11-R16, R20). Python visits only
 *      the "interesting" items; the others change no state, so walking every item
 *      decides the same;
 *   4. the run (simulator/run/engine.py _Run) over the resources of simulator/run/resources.py:
 *      FIFO streams, links shared by max-min fairness (progressive filling, integer floor
 *      division), GPU memory, host and SSD tiers.
 *
 * The argument and result layouts are those of simulator/fast/explicit.py (ABI 2):
 *   OK / INFEASIBLE: (status, end, last compute end, compute, recompute, stall data,
 *     stall memory, peak bytes, peak at, busy per stream x4, bytes per link x4, host peak,
 *     SSD peak, transfers, recomputes, stalls, blocked, progress)
 *   INVALID: (1, rule, op or -1, tensor or -1)       OVERFLOW: (3,)
 * Times are int64 picoseconds. Products (rate x elapsed, bytes x 10^12) are 128-bit.
 * An instant that would pass 2^63 - 1 ps makes the run OVERFLOW (Python then uses its
 * arbitrary-precision reference); sums that can legitimately pass 2^63 (bytes per link,
 * compute time of an item cut short, bytes an op allocates) are kept in 128 bits.
 *
 * Robustness: every array length and index is checked (ValueError on a packing bug),
 * every buffer is sized from the inputs, every counter is 64-bit, and an allocation that
 * fails raises MemoryError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_arena.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef __int128 i128;

enum { ST_OK = 0, ST_INVALID = 1, ST_INFEASIBLE = 2, ST_OVERFLOW = 3, ST_NOMEM = -1 };
enum { A_OFFLOAD = 0, A_PREFETCH = 1, A_DROP = 2, A_RECOMPUTE = 3 };
enum { NSTREAM = 4, NLINK = 4, NROUTE = 4 };
/* a planned tensor's state in the walk (compile/program.py) */
enum { UNBORN = 0, GPU, LEAVING, AWAY, INCOMING, DEAD };
/* blocked.what (fastpath._WHAT) */
enum { W_START = 0, W_OP, W_RECOMPUTE, W_PREFETCH, W_STUCK, W_CAPACITY };

#define PS_PER_S ((int64_t)1000000000000LL)
#define TIME_MAX INT64_MAX          /* a saturated instant: choosing it is an overflow */
#define MAX_COUNT (INT32_MAX / 4)   /* ops, tensors, actions, pairs: far above R23's 10^7 */
#define MAX_VALUE (((int64_t)1) << 62)

/* ================================================================== allocation (the arena: _arena.h) */

/* Group (key, value) pairs by key 0..n-1 into CSR form, keeping their order within a key. */
static int group_by(Arena *a, int64_t n, const int32_t *keys, const int32_t *values, int64_t count,
                    int64_t **off_out, int32_t **idx_out) {
    int64_t *off = take(a, (size_t)n + 1, sizeof(int64_t));
    int32_t *idx = take(a, (size_t)count, sizeof(int32_t));
    int64_t *fill = take(a, (size_t)n + 1, sizeof(int64_t));
    *off_out = off;
    *idx_out = idx;
    if (a->failed) return ST_NOMEM;
    for (int64_t i = 0; i < count; i++) off[keys[i] + 1] += 1;
    for (int64_t k = 0; k < n; k++) off[k + 1] += off[k];
    for (int64_t k = 0; k <= n; k++) fill[k] = off[k];
    for (int64_t i = 0; i < count; i++) idx[fill[keys[i]]++] = values[i];
    return ST_OK;
}

/* ================================================================== inputs */

typedef struct { int stream, link[2], nlinks, engine; int64_t latency; } Route;

typedef struct {
    /* profile: simulator/compile/compiled.py _arrays */
    int32_t nt, no, np;
    const int64_t *tensor_bytes, *op_ps, *op_ws;
    const uint8_t *persistent;
    const int32_t *producer;                         /* op or -1 */
    const int32_t *in_off, *in_idx, *upd_off, *upd_idx, *out_off, *out_idx;   /* CSR per op */
    const int32_t *pair_before, *pair_after, *pair_blamed, *pair_tensor;    /* R21 */
    const int32_t *id_rank;                          /* R10: ties by id */
    const int64_t *rerun_extra;                      /* R15: other outputs a recompute's re-run makes */
    /* machine: fastpath.pack_machine */
    int half;
    int64_t tier_capacity[2];                        /* host, SSD */
    int64_t link_capacity[NLINK];
    Route route[NROUTE];                             /* prefetch host, offload host, prefetch SSD, offload SSD */
    /* plan: fastpath.pack_plan */
    int32_t na, ni;
    const uint8_t *a_kind, *a_tier;                  /* a_tier: offload's to / prefetch's from */
    const int32_t *a_tensor, *a_after, *a_before;    /* op positions or -1 */
    const int32_t *order;
    int has_schedule;
    const int32_t *init_tensor;
    const uint8_t *init_tier;
    int64_t budget;
} In;

static int route_of(int kind, int tier) { return 2 * tier + (kind == A_OFFLOAD); }

/* ================================================================== outcome */

typedef struct { int rule; int32_t op, tensor; } Invalid;

typedef struct {
    int rule, what;
    int32_t op, tensor;
    i128 needed;
    int64_t free;
    int32_t residents[5];
    int n_residents;
    int tier;
    int32_t after;
    int kind;
} Blocked;

/* ================================================================== the compute sequence (compile/sequence.py) */

typedef struct {
    /* R5: item k runs op item_op[k]; a recompute of item_rec[k] (or -1) before op item_group[k] */
    int32_t n_items, n_recomputes;
    int32_t *item_op, *item_rec, *item_group;
    i128 *item_alloc;                      /* allocs + workspace */
    i128 *item_ws;                         /* scratch held while it runs: workspace (+ R15's other outputs) */
    int32_t *group_start, *op_item;        /* per op */
    int64_t *use_off; int32_t *use_item;   /* per tensor: items that read or update it */
    int64_t *rec_off; int32_t *rec_item;   /* per tensor: its recompute items */
    int64_t *free_off; int32_t *free_t;    /* per item: R8 last uses, in tensor order */
    /* the program (compile/program.py Program) */
    int32_t n_transfers, n_drops;
    uint8_t *t_kind, *t_tier;
    int32_t *t_tensor, *t_source, *t_last_reader, *t_before_item, *t_after_op;
    int32_t *drop_tensor;
    int64_t *wait_off; int32_t *wait_tr;   /* per item: prefetches it waits for (R6) */
    int64_t *rel_off; int32_t *rel_tr;     /* per item: offloads whose window's last reader it is (R11) */
    int64_t *act_off; int32_t *act_code;   /* per item: actions enqueued at its end (R7); -(d+1): drop d */
    int32_t n_start; int32_t *start_code;
    int8_t *initial_tier;                  /* per tensor: plan.initial tier or -1 */
} Prog;

/* R5 and R8: for each op of the order its recomputes (plan order), then the op; the uses
 * of every tensor; the item at which each produced tensor is freed. */
static int build_sequence(const In *in, Prog *p, Arena *a) {
    int32_t no = in->no, nt = in->nt;
    int64_t n_rec = 0;
    for (int32_t i = 0; i < in->na; i++) n_rec += in->a_kind[i] == A_RECOMPUTE;
    int32_t *rk = take(a, (size_t)n_rec, sizeof(int32_t)), *rv = take(a, (size_t)n_rec, sizeof(int32_t));
    if (a->failed) return ST_NOMEM;
    int64_t m = 0;
    for (int32_t i = 0; i < in->na; i++)
        if (in->a_kind[i] == A_RECOMPUTE) { rk[m] = in->a_before[i]; rv[m++] = in->a_tensor[i]; }
    int64_t *before_off; int32_t *before_t;
    if (group_by(a, no, rk, rv, n_rec, &before_off, &before_t) != ST_OK) return ST_NOMEM;

    int32_t n = (int32_t)(no + n_rec);      /* bounded by the input checks */
    p->n_items = n;
    p->n_recomputes = (int32_t)n_rec;
    p->item_op = take(a, (size_t)n, sizeof(int32_t));
    p->item_rec = take(a, (size_t)n, sizeof(int32_t));
    p->item_group = take(a, (size_t)n, sizeof(int32_t));
    p->item_alloc = take(a, (size_t)n, sizeof(i128));
    p->item_ws = take(a, (size_t)n, sizeof(i128));
    p->group_start = take(a, (size_t)no, sizeof(int32_t));
    p->op_item = take(a, (size_t)no, sizeof(int32_t));
    if (a->failed) return ST_NOMEM;
    int32_t k = 0;
    for (int32_t x = 0; x < no; x++) {
        int32_t op = in->order[x];
        p->group_start[op] = k;
        for (int64_t r = before_off[op]; r < before_off[op + 1]; r++, k++) {
            int32_t t = before_t[r], made_by = in->producer[t];
            p->item_op[k] = made_by;
            p->item_rec[k] = t;
            p->item_group[k] = op;
            p->item_ws[k] = (i128)in->op_ws[made_by] + in->rerun_extra[t];
            p->item_alloc[k] = (i128)in->tensor_bytes[t] + p->item_ws[k];
        }
        p->op_item[op] = k;
        p->item_op[k] = op;
        p->item_rec[k] = -1;
        p->item_group[k] = op;
        i128 bytes = in->op_ws[op];
        p->item_ws[k] = bytes;
        for (int32_t i = in->out_off[op]; i < in->out_off[op + 1]; i++) bytes += in->tensor_bytes[in->out_idx[i]];
        p->item_alloc[k] = bytes;
        k++;
    }

    /* uses: an item counts once per tensor; a recompute reads its producer's inputs */
    int32_t *last_seen = take(a, (size_t)nt, sizeof(int32_t));
    int64_t *count = take(a, (size_t)nt + 1, sizeof(int64_t));
    if (a->failed) return ST_NOMEM;
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t t = 0; t < nt; t++) last_seen[t] = -1;
        for (k = 0; k < n; k++) {
            int32_t op = p->item_op[k];
            for (int list = 0; list < 2; list++) {
                if (list == 1 && p->item_rec[k] >= 0) break;
                const int32_t *off = list == 0 ? in->in_off : in->upd_off, *idx = list == 0 ? in->in_idx : in->upd_idx;
                for (int32_t i = off[op]; i < off[op + 1]; i++) {
                    int32_t t = idx[i];
                    if (last_seen[t] == k) continue;
                    last_seen[t] = k;
                    if (pass == 0) count[t + 1] += 1;
                    else p->use_item[count[t]++] = k;
                }
            }
        }
        if (pass == 0) {
            for (int32_t t = 0; t < nt; t++) count[t + 1] += count[t];
            p->use_off = take(a, (size_t)nt + 1, sizeof(int64_t));
            p->use_item = take(a, (size_t)count[nt], sizeof(int32_t));
            if (a->failed) return ST_NOMEM;
            memcpy(p->use_off, count, ((size_t)nt + 1) * sizeof(int64_t));
        }
    }

    /* recompute items per tensor; frees per item (R8: last use, else the producer's item) */
    int32_t *keys = take(a, (size_t)n_rec, sizeof(int32_t)), *vals = take(a, (size_t)n_rec, sizeof(int32_t));
    int32_t *fkeys = take(a, (size_t)nt, sizeof(int32_t)), *fvals = take(a, (size_t)nt, sizeof(int32_t));
    if (a->failed) return ST_NOMEM;
    m = 0;
    for (k = 0; k < n; k++)
        if (p->item_rec[k] >= 0) { keys[m] = p->item_rec[k]; vals[m++] = k; }
    if (group_by(a, nt, keys, vals, m, &p->rec_off, &p->rec_item) != ST_OK) return ST_NOMEM;
    m = 0;
    for (int32_t t = 0; t < nt; t++) {
        if (in->producer[t] < 0) continue;
        int64_t lo = p->use_off[t], hi = p->use_off[t + 1];
        fkeys[m] = hi > lo ? p->use_item[hi - 1] : p->op_item[in->producer[t]];
        fvals[m++] = t;
    }
    return group_by(a, n, fkeys, fvals, m, &p->free_off, &p->free_t);
}

/* ================================================================== rules before the walk */

/* check_plan_rules: R21 (dependencies in schedule order, inputs then updates; then the
 * update-order pairs), R20 (initial placements of non-persistent tensors), R15
 * (recomputes of persistent tensors). 0 when none breaks, else *bad is set. */
static int check_plan_rules(const In *in, Arena *a, Invalid *bad) {
    if (in->has_schedule) {
        int32_t *position = take(a, (size_t)in->no, sizeof(int32_t));
        if (a->failed) return ST_NOMEM;
        for (int32_t x = 0; x < in->no; x++) position[in->order[x]] = x;
        for (int32_t x = 0; x < in->no; x++) {
            int32_t op = in->order[x];
            for (int list = 0; list < 2; list++) {
                const int32_t *off = list == 0 ? in->in_off : in->upd_off, *idx = list == 0 ? in->in_idx : in->upd_idx;
                for (int32_t i = off[op]; i < off[op + 1]; i++) {
                    int32_t t = idx[i], made_by = in->producer[t];
                    if (made_by >= 0 && position[made_by] > x) {
                        *bad = (Invalid){21, op, t};
                        return ST_INVALID;
                    }
                }
            }
        }
        for (int32_t i = 0; i < in->np; i++)
            if (position[in->pair_before[i]] > position[in->pair_after[i]]) {
                *bad = (Invalid){21, in->pair_blamed[i], in->pair_tensor[i]};
                return ST_INVALID;
            }
    }
    for (int32_t i = 0; i < in->ni; i++)
        if (!in->persistent[in->init_tensor[i]]) {
            *bad = (Invalid){20, -1, in->init_tensor[i]};
            return ST_INVALID;
        }
    for (int32_t i = 0; i < in->na; i++)
        if (in->a_kind[i] == A_RECOMPUTE && in->persistent[in->a_tensor[i]]) {
            *bad = (Invalid){15, in->a_before[i], in->a_tensor[i]};
            return ST_INVALID;
        }
    return ST_OK;
}

/* ================================================================== the static walk (compile/program.py _Compiler) */

typedef struct {
    const In *in;
    Prog *p;
    uint8_t *state, *planned, *copies;             /* copies: a valid copy per tier, a bit each */
    int32_t *made_at, *updated_at;                 /* tensor -> the item that made / last updated it, or -1 */
    int32_t *open_offload;                         /* tensor -> offload whose window is open, or -1 */
    int32_t *last_to;                              /* 2 per tensor: last offload to each tier */
    int32_t *incoming;                             /* tensor -> its prefetch's before item (-1: end) */
    int32_t *inc_head, *inc_next, *inc_tensor;     /* per item: tensors whose prefetch lands there */
    int32_t n_inc;
    int32_t *act_item, *act_codes;                 /* (item, code) of the actions after ops */
    int32_t n_act;
    Invalid *bad;
} Walk;

static int invalid(Walk *w, int rule, int32_t k, int32_t t) {
    *w->bad = (Invalid){rule, k >= 0 ? w->p->item_group[k] : -1, t};
    return ST_INVALID;
}

static int has_use_from(const Prog *p, int32_t t, int32_t k) {
    int64_t hi = p->use_off[t + 1];
    return hi > p->use_off[t] && p->use_item[hi - 1] >= k;
}

/* The first of the sorted items[lo, hi) after item k, or -1. */
static int32_t first_after(const int32_t *items, int64_t lo, int64_t hi, int32_t k) {
    int64_t end = hi;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (items[mid] <= k) lo = mid + 1; else hi = mid;
    }
    return lo < end ? items[lo] : -1;
}

static void close_window(Walk *w, int32_t t) {
    w->open_offload[t] = -1;
    if (w->state[t] == LEAVING) w->state[t] = AWAY;
}

static int32_t new_transfer(Walk *w, int kind, int32_t t, int tier, int32_t k) {
    Prog *p = w->p;
    int32_t j = p->n_transfers++;
    p->t_kind[j] = (uint8_t)kind;
    p->t_tier[j] = (uint8_t)tier;
    p->t_tensor[j] = t;
    p->t_source[j] = -1;
    p->t_last_reader[j] = -1;
    p->t_before_item[j] = -1;
    p->t_after_op[j] = k >= 0 ? p->item_group[k] : -1;
    return j;
}

/* Apply action i at the end of item k (k = -1: the iteration start). */
static int issue(Walk *w, int32_t i, int32_t k) {
    const In *in = w->in;
    Prog *p = w->p;
    int32_t t = in->a_tensor[i];
    int st = w->state[t], tier = in->a_tier[i];
    int32_t code;
    if (in->a_kind[i] == A_OFFLOAD) {            /* R11: resident, no window open */
        if (st != GPU) return invalid(w, 11, k, t);
        int32_t j = new_transfer(w, A_OFFLOAD, t, tier, k);
        w->state[t] = LEAVING;
        w->open_offload[t] = j;
        w->copies[t] |= (uint8_t)(1 << tier);
        w->last_to[2 * t + tier] = j;
        code = j;
    } else if (in->a_kind[i] == A_PREFETCH) {    /* R12 */
        int persistent = in->persistent[t];
        if (st != AWAY && st != LEAVING) return invalid(w, 12, k, t);   /* resident, incoming, unborn, dead */
        if (!(w->copies[t] & (1 << tier))) return invalid(w, 12, k, t);
        int32_t before_item = -1;
        if (in->a_before[i] >= 0) {
            before_item = p->group_start[in->a_before[i]];
            if (before_item <= k) return invalid(w, 12, k, t);
            if (!persistent && !has_use_from(p, t, before_item)) return invalid(w, 12, k, t);
        } else if (!persistent) {
            return invalid(w, 12, k, t);
        }
        close_window(w, t);
        int32_t j = new_transfer(w, A_PREFETCH, t, tier, k);
        p->t_source[j] = w->last_to[2 * t + tier];
        p->t_before_item[j] = before_item;
        w->state[t] = INCOMING;
        w->incoming[t] = before_item;
        if (before_item >= 0) {
            w->inc_tensor[w->n_inc] = t;
            w->inc_next[w->n_inc] = w->inc_head[before_item];
            w->inc_head[before_item] = w->n_inc++;
        }
        code = j;
    } else {                                     /* drop, R14 */
        if (st != GPU) return invalid(w, 14, k, t);   /* not resident, or inside an offload window */
        int32_t next_use = first_after(p->use_item, p->use_off[t], p->use_off[t + 1], k);
        int32_t next_rec = first_after(p->rec_item, p->rec_off[t], p->rec_off[t + 1], k);
        int recomputed_first = next_rec >= 0 && (next_use < 0 || next_rec <= next_use);
        int never_again = !in->persistent[t] && next_use < 0;
        if (!(w->copies[t] || recomputed_first || never_again)) return invalid(w, 14, k, t);
        w->state[t] = (uint8_t)(never_again ? DEAD : AWAY);
        int32_t d = p->n_drops++;
        p->drop_tensor[d] = t;
        code = -(d + 1);
    }
    if (k < 0) p->start_code[p->n_start++] = code;
    else { w->act_item[w->n_act] = k; w->act_codes[w->n_act++] = code; }
    return ST_OK;
}

static int walk_item(Walk *w, int32_t k, const int64_t *after_off, const int32_t *after_idx) {
    const In *in = w->in;
    Prog *p = w->p;
    uint8_t *state = w->state, *planned = w->planned;
    for (int32_t x = w->inc_head[k]; x >= 0; x = w->inc_next[x]) {   /* R13: usable from its before op */
        int32_t t = w->inc_tensor[x];
        if (state[t] == INCOMING && w->incoming[t] == k) state[t] = GPU;
    }
    int32_t op = p->item_op[k], rec = p->item_rec[k];
    if (rec >= 0) {   /* R15: only a tensor offloaded or dropped, its producer updating nothing, never updated, */
        int st = state[rec];                            /* nor its producer's inputs since the producer ran */
        if (st != LEAVING && st != AWAY) return invalid(w, 15, k, rec);
        if (in->upd_off[op + 1] > in->upd_off[op] || w->updated_at[rec] >= 0) return invalid(w, 15, k, rec);
        for (int32_t i = in->in_off[op]; i < in->in_off[op + 1]; i++)
            if (w->updated_at[in->in_idx[i]] > w->made_at[rec]) return invalid(w, 15, k, rec);
        close_window(w, rec);
        state[rec] = GPU;
    }
    for (int32_t i = in->in_off[op]; i < in->in_off[op + 1]; i++) {   /* R13 reads; R11 last reader */
        int32_t t = in->in_idx[i];
        if (!planned[t]) continue;
        if (state[t] == LEAVING) p->t_last_reader[w->open_offload[t]] = k;
        else if (state[t] != GPU) return invalid(w, 13, k, t);
    }
    if (rec < 0) {
        for (int32_t i = in->upd_off[op]; i < in->upd_off[op + 1]; i++) {
            int32_t t = in->upd_idx[i];
            w->updated_at[t] = k;
            if (!planned[t]) continue;
            if (state[t] != GPU && state[t] != LEAVING) return invalid(w, 13, k, t);
            if (state[t] == LEAVING) return invalid(w, 11, k, t);   /* an update in an offload window */
            w->copies[t] = 0;                                          /* R16 */
        }
        for (int32_t i = in->out_off[op]; i < in->out_off[op + 1]; i++) {
            w->made_at[in->out_idx[i]] = k;
            if (planned[in->out_idx[i]]) state[in->out_idx[i]] = GPU;
        }
    }
    for (int64_t i = p->free_off[k]; i < p->free_off[k + 1]; i++) {   /* R7, R8 */
        int32_t t = p->free_t[i];
        if (planned[t] && (state[t] == GPU || state[t] == LEAVING)) { state[t] = DEAD; w->open_offload[t] = -1; }
    }
    if (rec < 0)
        for (int64_t i = after_off[op]; i < after_off[op + 1]; i++) {
            int r = issue(w, after_idx[i], k);
            if (r != ST_OK) return r;
        }
    return ST_OK;
}

/* R20, once the walk is over: persistent tensors end where they began. */
static int steady_state(Walk *w) {
    const In *in = w->in;
    const int8_t *init_tier = w->p->initial_tier;
    for (int32_t t = 0; t < in->nt; t++)
        if (w->planned[t] && w->state[t] == INCOMING && w->incoming[t] == -1) w->state[t] = GPU;
    for (int32_t t = 0; t < in->nt; t++) {
        if (!in->persistent[t] || !w->planned[t]) continue;
        int st = w->state[t];
        if (init_tier[t] >= 0) {
            if (!(st == AWAY || st == LEAVING) || !(w->copies[t] & (1 << init_tier[t]))) {
                *w->bad = (Invalid){20, -1, t};
                return ST_INVALID;
            }
        } else if (st != GPU) {
            *w->bad = (Invalid){20, -1, t};
            return ST_INVALID;
        }
    }
    return ST_OK;
}

/* compile_program: the rules before the walk, the sequence, the walk, the program. */
static int compile_plan(const In *in, Prog *p, Arena *a, Invalid *bad) {
    int r = check_plan_rules(in, a, bad);
    if (r != ST_OK) return r;
    if (build_sequence(in, p, a) != ST_OK) return ST_NOMEM;
    int32_t nt = in->nt, na = in->na, n = p->n_items;
    Walk w;
    memset(&w, 0, sizeof(w));
    w.in = in;
    w.p = p;
    w.bad = bad;
    w.state = take(a, (size_t)nt, 1);
    w.planned = take(a, (size_t)nt, 1);
    w.copies = take(a, (size_t)nt, 1);
    w.made_at = take(a, (size_t)nt, sizeof(int32_t));
    w.updated_at = take(a, (size_t)nt, sizeof(int32_t));
    p->initial_tier = take(a, (size_t)nt, 1);
    w.open_offload = take(a, (size_t)nt, sizeof(int32_t));
    w.last_to = take(a, 2 * (size_t)nt, sizeof(int32_t));
    w.incoming = take(a, (size_t)nt, sizeof(int32_t));
    w.inc_head = take(a, (size_t)n, sizeof(int32_t));
    w.inc_next = take(a, (size_t)na, sizeof(int32_t));
    w.inc_tensor = take(a, (size_t)na, sizeof(int32_t));
    w.act_item = take(a, (size_t)na, sizeof(int32_t));
    w.act_codes = take(a, (size_t)na, sizeof(int32_t));
    p->t_kind = take(a, (size_t)na, 1);
    p->t_tier = take(a, (size_t)na, 1);
    p->t_tensor = take(a, (size_t)na, sizeof(int32_t));
    p->t_source = take(a, (size_t)na, sizeof(int32_t));
    p->t_last_reader = take(a, (size_t)na, sizeof(int32_t));
    p->t_before_item = take(a, (size_t)na, sizeof(int32_t));
    p->t_after_op = take(a, (size_t)na, sizeof(int32_t));
    p->drop_tensor = take(a, (size_t)na, sizeof(int32_t));
    p->start_code = take(a, (size_t)na, sizeof(int32_t));
    int32_t *after_keys = take(a, (size_t)na, sizeof(int32_t)), *after_vals = take(a, (size_t)na, sizeof(int32_t));
    if (a->failed) return ST_NOMEM;

    for (int32_t t = 0; t < nt; t++) {
        w.open_offload[t] = w.made_at[t] = w.updated_at[t] = -1;
        w.last_to[2 * t] = w.last_to[2 * t + 1] = -1;
        p->initial_tier[t] = -1;
    }
    for (int32_t k = 0; k < n; k++) w.inc_head[k] = -1;
    for (int32_t i = 0; i < na; i++) {   /* planned: named by an action or by initial */
        int32_t t = in->a_tensor[i];
        w.planned[t] = 1;
        w.state[t] = (uint8_t)(in->persistent[t] ? GPU : UNBORN);
    }
    for (int32_t i = 0; i < in->ni; i++) {
        int32_t t = in->init_tensor[i];
        w.planned[t] = 1;
        w.state[t] = AWAY;
        w.copies[t] |= (uint8_t)(1 << in->init_tier[i]);
        p->initial_tier[t] = (int8_t)in->init_tier[i];
    }
    /* actions after each op, in plan order; after = -1 (the start) are issued first */
    int64_t m = 0;
    for (int32_t i = 0; i < na; i++) {
        if (in->a_kind[i] == A_RECOMPUTE) continue;
        if (in->a_after[i] < 0) {
            r = issue(&w, i, -1);
            if (r != ST_OK) return r;
            continue;
        }
        after_keys[m] = in->a_after[i];
        after_vals[m++] = i;
    }
    int64_t *after_off; int32_t *after_idx;
    if (group_by(a, in->no, after_keys, after_vals, m, &after_off, &after_idx) != ST_OK) return ST_NOMEM;
    for (int32_t k = 0; k < n; k++) {
        r = walk_item(&w, k, after_off, after_idx);
        if (r != ST_OK) return r;
    }
    r = steady_state(&w);
    if (r != ST_OK) return r;

    /* per item: the prefetches its group's first item waits for (R6), the offloads whose
     * window's last reader it is (R11), the actions after it (R7), each in transfer order */
    int32_t nj = p->n_transfers;
    int32_t *wk = take(a, (size_t)nj, sizeof(int32_t)), *wv = take(a, (size_t)nj, sizeof(int32_t));
    int32_t *rk = take(a, (size_t)nj, sizeof(int32_t)), *rv = take(a, (size_t)nj, sizeof(int32_t));
    if (a->failed) return ST_NOMEM;
    int64_t n_waits = 0, n_rel = 0;
    for (int32_t j = 0; j < nj; j++) {
        if (p->t_kind[j] == A_PREFETCH && p->t_before_item[j] >= 0) { wk[n_waits] = p->t_before_item[j]; wv[n_waits++] = j; }
        if (p->t_kind[j] == A_OFFLOAD && p->t_last_reader[j] >= 0) { rk[n_rel] = p->t_last_reader[j]; rv[n_rel++] = j; }
    }
    if (group_by(a, n, wk, wv, n_waits, &p->wait_off, &p->wait_tr) != ST_OK
        || group_by(a, n, rk, rv, n_rel, &p->rel_off, &p->rel_tr) != ST_OK
        || group_by(a, n, w.act_item, w.act_codes, w.n_act, &p->act_off, &p->act_code) != ST_OK)
        return ST_NOMEM;
    return ST_OK;
}

/* ================================================================== resources (run/resources.py) */

/* Phases of the transfer a stream runs (R17): its latency (holding the stream, not the
 * links), then its flow; FLOW_DONE: the flow has left the links, the end is being applied. */
enum { IDLE = 0, LATENCY, FLOW, FLOW_DONE };

typedef struct {
    /* Stream: a FIFO that runs one transfer at a time (R1) */
    int32_t *queue;
    int64_t qhead, qtail;
    int32_t running;           /* transfer or -1 */
    int64_t busy_ps;
    /* its running transfer's latency or flow (Links) */
    int phase;
    int64_t latency_until;
    int nlinks, link[2];
    int64_t remaining, rate, since, end;   /* end: TIME_MAX when it would pass 2^63 - 1 */
} Stream;

typedef struct {
    const In *in;
    const Prog *p;
    int64_t now;
    /* transfers */
    int64_t *enqueued_at, *start;
    uint8_t *ended;
    int64_t enqueue_count;
    Stream stream[NSTREAM];
    int32_t engine_holder;     /* half duplex: the transfer holding the copy engine, or -1 */
    i128 link_bytes[NLINK];
    /* Memory (R2, R4) */
    uint8_t *resident;
    int64_t used, peak, peak_at;
    /* Tiers (R19) */
    uint8_t *held;             /* a bit per tier */
    int64_t tier_used[2], tier_peak[2];
    int64_t *pending_offloads; /* R7: offloads enqueued or copying, per tensor */
    uint8_t *dead_pending;
    /* the compute stream */
    int32_t head;
    int64_t wait_cursor;       /* the head's waits before it have ended (they never un-end) */
    int running;
    int64_t running_until, ready_at;
    int data_ready;
    int64_t data_ready_at, last_compute_end, last_transfer_end;
    i128 compute_ps, recompute_ps;
    int64_t stall_data, stall_memory;
    int64_t *op_stall;         /* 2 per op: data, memory */
    uint8_t *stall_seen;
    int32_t *stall_order, n_stall_ops;
    Blocked blocked;
} Run;

static int64_t add_time(int64_t now, int64_t dt) {   /* both >= 0; saturates at TIME_MAX */
    return dt > TIME_MAX - now ? TIME_MAX : now + dt;
}

static int64_t floor_div(int64_t a, int64_t b) {      /* b > 0; Python's // */
    int64_t q = a / b;
    if ((a % b != 0) && (a < 0)) q -= 1;
    return q;
}

/* ---------------------------------------------------------------- links, shared by max-min fairness (R17) */

/* fair_rates: progressive filling over the running flows (the order of flows does not matter). */
static void share(Run *r) {
    Stream *s = r->stream;
    int64_t spare[NLINK];
    int unfrozen[NSTREAM], left = 0;
    for (int l = 0; l < NLINK; l++) spare[l] = r->in->link_capacity[l];
    for (int q = 0; q < NSTREAM; q++) {
        unfrozen[q] = s[q].phase == FLOW;
        left += unfrozen[q];
    }
    while (left > 0) {
        int64_t count[NLINK] = {0}, floors[NLINK];
        for (int q = 0; q < NSTREAM; q++)
            if (unfrozen[q]) for (int x = 0; x < s[q].nlinks; x++) count[s[q].link[x]] += 1;
        int have = 0;
        int64_t level = 0;
        for (int l = 0; l < NLINK; l++) {
            if (!count[l]) continue;
            floors[l] = floor_div(spare[l], count[l]);
            if (!have || floors[l] < level) level = floors[l];
            have = 1;
        }
        int64_t rate = level > 1 ? level : 1;
        for (int q = 0; q < NSTREAM; q++) {
            if (!unfrozen[q]) continue;
            int at_level = 0;
            for (int x = 0; x < s[q].nlinks; x++) at_level |= floors[s[q].link[x]] == level;
            if (!at_level) continue;
            s[q].rate = rate;
            for (int x = 0; x < s[q].nlinks; x++) spare[s[q].link[x]] -= rate;
            unfrozen[q] = 0;
            left -= 1;
        }
    }
    for (int q = 0; q < NSTREAM; q++) {
        if (s[q].phase != FLOW) continue;
        i128 dt = ((i128)s[q].remaining * PS_PER_S + s[q].rate - 1) / s[q].rate;   /* ceil */
        s[q].end = dt > (i128)(TIME_MAX - r->now) ? TIME_MAX : r->now + (int64_t)dt;
    }
}

/* Bring every flow's remaining bytes up to now at its current rate. */
static void advance(Run *r) {
    for (int q = 0; q < NSTREAM; q++) {
        Stream *s = &r->stream[q];
        if (s->phase != FLOW) continue;
        i128 moved = (i128)s->rate * (r->now - s->since) / PS_PER_S;
        s->remaining = moved >= s->remaining ? 0 : s->remaining - (int64_t)moved;
        s->since = r->now;
    }
}

/* Links.start: the flow of the transfer stream q runs. */
static void flow_start(Run *r, int q) {
    advance(r);
    Stream *s = &r->stream[q];
    s->phase = FLOW;
    s->remaining = r->in->tensor_bytes[r->p->t_tensor[s->running]];
    s->rate = 0;
    s->since = r->now;
    share(r);
}

/* ---------------------------------------------------------------- memory and tiers */

/* R4: the peak is noted as memory is allocated, after the instant's frees (R9). */
static void note_peak(Run *r) {
    if (r->used > r->peak) { r->peak = r->used; r->peak_at = r->now; }
}

static int fits(const Run *r, i128 extra) { return (i128)r->used + extra <= (i128)r->in->budget; }

static void mem_take(Run *r, int32_t t) {
    r->resident[t] = 1;
    r->used += r->in->tensor_bytes[t];
}

static void mem_free(Run *r, int32_t t) {
    if (r->resident[t]) { r->resident[t] = 0; r->used -= r->in->tensor_bytes[t]; }
}

static int tier_take(Run *r, int32_t t, int tier) {   /* R19: 0 when over capacity */
    if (r->held[t] & (1 << tier)) return 1;
    r->held[t] |= (uint8_t)(1 << tier);
    r->tier_used[tier] += r->in->tensor_bytes[t];
    if (r->tier_used[tier] > r->tier_peak[tier]) r->tier_peak[tier] = r->tier_used[tier];
    return r->tier_used[tier] <= r->in->tier_capacity[tier];
}

static void tier_release(Run *r, int32_t t) {
    for (int tier = 0; tier < 2; tier++)
        if (r->held[t] & (1 << tier)) {
            r->held[t] &= (uint8_t)~(1 << tier);
            r->tier_used[tier] -= r->in->tensor_bytes[t];
        }
}

/* Memory.largest: at most 5 residents, largest bytes first, ties by id. */
static void largest(const Run *r, Blocked *b) {
    const In *in = r->in;
    b->n_residents = 0;
    for (int32_t t = 0; t < in->nt; t++) {
        if (!r->resident[t]) continue;
        int n = b->n_residents, x = n;
        while (x > 0) {
            int32_t u = b->residents[x - 1];
            if (in->tensor_bytes[u] > in->tensor_bytes[t]
                || (in->tensor_bytes[u] == in->tensor_bytes[t] && in->id_rank[u] < in->id_rank[t])) break;
            x--;
        }
        if (x >= 5) continue;
        int last = n < 5 ? n : 4;
        for (int y = last; y > x; y--) b->residents[y] = b->residents[y - 1];
        b->residents[x] = t;
        if (n < 5) b->n_residents = n + 1;
    }
}

static void block(Run *r, int rule, int what, int32_t op, int32_t tensor, i128 needed, int64_t free, int with_residents) {
    Blocked *b = &r->blocked;
    memset(b, 0, sizeof(*b));
    b->rule = rule;
    b->what = what;
    b->op = op;
    b->tensor = tensor;
    b->needed = needed;
    b->free = free;
    b->tier = -1;
    b->after = -1;
    b->kind = -1;
    if (with_residents) largest(r, b);
}

/* ================================================================== the run loop (run/engine.py _Run) */

/* ---------------------------------------------------------------- completions */

static void enqueue(Run *r, int32_t j) {
    const Prog *p = r->p;
    Stream *s = &r->stream[r->in->route[route_of(p->t_kind[j], p->t_tier[j])].stream];
    r->enqueued_at[j] = r->enqueue_count++;
    s->queue[s->qtail++] = j;
    if (p->t_kind[j] == A_OFFLOAD) r->pending_offloads[p->t_tensor[j]] += 1;
}

/* R7: workspace, last-use frees, offload releases, then the actions after the op. */
static void item_end(Run *r) {
    const Prog *p = r->p;
    int32_t k = r->head;
    r->running = 0;
    r->head = k + 1;
    r->ready_at = r->last_compute_end = r->now;
    r->data_ready = 0;
    r->used -= (int64_t)p->item_ws[k];   /* it fitted the budget when the item started */
    for (int64_t i = p->free_off[k]; i < p->free_off[k + 1]; i++) {
        int32_t t = p->free_t[i];
        if (r->pending_offloads[t]) r->dead_pending[t] = 1;
        else { mem_free(r, t); tier_release(r, t); }
    }
    for (int64_t i = p->rel_off[k]; i < p->rel_off[k + 1]; i++) {
        int32_t j = p->rel_tr[i];
        if (r->ended[j]) mem_free(r, p->t_tensor[j]);
    }
    for (int64_t i = p->act_off[k]; i < p->act_off[k + 1]; i++) {
        int32_t code = p->act_code[i];
        if (code < 0) mem_free(r, p->drop_tensor[-code - 1]);   /* R14: at once */
        else enqueue(r, code);
    }
}

static void transfer_end(Run *r, int32_t j) {
    const Prog *p = r->p;
    Stream *s = &r->stream[r->in->route[route_of(p->t_kind[j], p->t_tier[j])].stream];
    r->ended[j] = 1;
    if (r->now > r->last_transfer_end) r->last_transfer_end = r->now;
    s->running = -1;
    s->phase = IDLE;
    s->busy_ps += r->now - r->start[j];
    if (r->engine_holder == j) r->engine_holder = -1;
    if (p->t_kind[j] == A_OFFLOAD) {
        int32_t t = p->t_tensor[j];
        r->pending_offloads[t] -= 1;
        if (p->t_last_reader[j] < r->head) mem_free(r, t);   /* its window's last reader has ended (R11) */
        if (r->dead_pending[t] && !r->pending_offloads[t]) {   /* R7: freed now that its offload ended */
            r->dead_pending[t] = 0;
            mem_free(r, t);
            tier_release(r, t);
        }
    }
}

/* Every completion at now (R9): the compute item, latencies (flows start), then flows. */
static void complete(Run *r) {
    if (r->running && r->running_until == r->now) item_end(r);
    for (int q = 0; q < NSTREAM; q++)
        if (r->stream[q].phase == LATENCY && r->stream[q].latency_until == r->now) flow_start(r, q);
    int32_t ending[NSTREAM];
    int n = 0;
    for (int q = 0; q < NSTREAM; q++)
        if (r->stream[q].phase == FLOW && r->stream[q].end == r->now) ending[n++] = r->stream[q].running;
    if (!n) return;
    advance(r);   /* Links.finish */
    for (int q = 0; q < NSTREAM; q++)
        if (r->stream[q].phase == FLOW && r->stream[q].end == r->now) r->stream[q].phase = FLOW_DONE;
    share(r);
    for (int a = 1; a < n; a++)   /* in enqueue order */
        for (int b = a; b > 0 && r->enqueued_at[ending[b - 1]] > r->enqueued_at[ending[b]]; b--) {
            int32_t tmp = ending[b]; ending[b] = ending[b - 1]; ending[b - 1] = tmp;
        }
    for (int x = 0; x < n; x++) transfer_end(r, ending[x]);
}

/* ---------------------------------------------------------------- starts */

static void try_compute(Run *r) {   /* R6, R15 */
    const Prog *p = r->p;
    if (r->running || r->head >= p->n_items) return;
    int32_t k = r->head, rec = p->item_rec[k], op = p->item_op[k];
    if (!r->data_ready) {
        /* every prefetch with before = its op has ended; the cursor skips those seen ended */
        if (r->wait_cursor < p->wait_off[k]) r->wait_cursor = p->wait_off[k];
        for (; r->wait_cursor < p->wait_off[k + 1]; r->wait_cursor++)
            if (!r->ended[p->wait_tr[r->wait_cursor]]) return;
        if (rec >= 0 && r->resident[rec]) return;   /* R15: the older copy is still being copied out */
        r->data_ready = 1;
        r->data_ready_at = r->now;
    }
    if (!fits(r, p->item_alloc[k])) return;
    int64_t data_wait = r->data_ready_at - r->ready_at, memory_wait = r->now - r->data_ready_at;
    if (data_wait || memory_wait) {
        int32_t g = p->item_group[k];
        r->stall_data += data_wait;
        r->stall_memory += memory_wait;
        if (!r->stall_seen[g]) { r->stall_seen[g] = 1; r->stall_order[r->n_stall_ops++] = g; }
        r->op_stall[2 * g] += data_wait;
        r->op_stall[2 * g + 1] += memory_wait;
    }
    if (rec >= 0) mem_take(r, rec);
    else for (int32_t i = r->in->out_off[op]; i < r->in->out_off[op + 1]; i++) mem_take(r, r->in->out_idx[i]);
    r->used += (int64_t)p->item_ws[k];
    note_peak(r);
    int64_t time_ps = r->in->op_ps[op];
    r->running = 1;
    r->running_until = add_time(r->now, time_ps);
    r->compute_ps += time_ps;
    if (rec >= 0) r->recompute_ps += time_ps;
}

/* R12, R17: the copy engine (half duplex) is free; a prefetch's source copy is written,
 * no older GPU copy remains and it fits. */
static int can_start(const Run *r, int32_t j) {
    const Prog *p = r->p;
    const Route *route = &r->in->route[route_of(p->t_kind[j], p->t_tier[j])];
    if (route->engine && r->engine_holder >= 0) return 0;
    if (p->t_kind[j] == A_PREFETCH) {
        if (p->t_source[j] >= 0 && !r->ended[p->t_source[j]]) return 0;
        int32_t t = p->t_tensor[j];
        if (r->resident[t] || !fits(r, r->in->tensor_bytes[t])) return 0;
    }
    return 1;
}

static int start_transfer(Run *r, int32_t j) {
    const Prog *p = r->p;
    const In *in = r->in;
    const Route *route = &in->route[route_of(p->t_kind[j], p->t_tier[j])];
    int32_t t = p->t_tensor[j];
    if (p->t_kind[j] == A_PREFETCH) {
        mem_take(r, t);
        note_peak(r);
    } else if (!tier_take(r, t, p->t_tier[j])) {   /* R19 */
        int tier = p->t_tier[j];
        block(r, 19, W_CAPACITY, -1, t, r->tier_used[tier], in->tier_capacity[tier], 0);
        r->blocked.tier = tier;
        r->blocked.after = p->t_after_op[j];
        return ST_INFEASIBLE;
    }
    Stream *s = &r->stream[route->stream];
    s->qhead += 1;
    s->running = j;
    for (int x = 0; x < route->nlinks; x++) r->link_bytes[route->link[x]] += in->tensor_bytes[t];
    if (route->engine) r->engine_holder = j;
    r->start[j] = r->now;
    s->nlinks = route->nlinks;
    s->link[0] = route->link[0];
    s->link[1] = route->link[1];
    if (route->latency) {
        s->phase = LATENCY;
        s->latency_until = add_time(r->now, route->latency);
    } else {
        flow_start(r, route->stream);
    }
    return ST_OK;
}

static int try_transfers(Run *r) {   /* R9: waiting heads in enqueue order */
    int32_t heads[NSTREAM];
    int n = 0;
    for (int q = 0; q < NSTREAM; q++) {
        Stream *s = &r->stream[q];
        if (s->qhead < s->qtail && s->running < 0) heads[n++] = s->queue[s->qhead];
    }
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0 && r->enqueued_at[heads[b - 1]] > r->enqueued_at[heads[b]]; b--) {
            int32_t tmp = heads[b]; heads[b] = heads[b - 1]; heads[b - 1] = tmp;
        }
    for (int x = 0; x < n; x++)
        if (can_start(r, heads[x]) && start_transfer(r, heads[x]) != ST_OK) return ST_INFEASIBLE;
    return ST_OK;
}

/* ---------------------------------------------------------------- the loop */

/* The next instant anything completes; 0 when nothing is pending. */
static int next_instant(const Run *r, int64_t *at) {
    int have = 0;
    int64_t best = 0;
    if (r->running) { best = r->running_until; have = 1; }
    for (int q = 0; q < NSTREAM; q++) {
        const Stream *s = &r->stream[q];
        int64_t t;
        if (s->phase == LATENCY) t = s->latency_until;
        else if (s->phase == FLOW) t = s->end;
        else continue;
        if (!have || t < best) best = t;
        have = 1;
    }
    *at = best;
    return have;
}

/* R10, R19 at the start: persistent tensors on the GPU in profile order; initial copies
 * take their tier's space from time 0. */
static int place_at_start(Run *r) {
    const In *in = r->in;
    for (int32_t t = 0; t < in->nt; t++) {
        if (!in->persistent[t] || r->p->initial_tier[t] >= 0) continue;
        if (!fits(r, in->tensor_bytes[t])) {
            block(r, 10, W_START, -1, t, in->tensor_bytes[t], in->budget - r->used, 1);
            return ST_INFEASIBLE;
        }
        mem_take(r, t);
        note_peak(r);
    }
    for (int32_t i = 0; i < in->ni; i++) {
        int32_t t = in->init_tensor[i];
        int tier = in->init_tier[i];
        if (!tier_take(r, t, tier)) {
            block(r, 19, W_CAPACITY, -1, t, r->tier_used[tier], in->tier_capacity[tier], 0);
            r->blocked.tier = tier;
            return ST_INFEASIBLE;
        }
    }
    return ST_OK;
}

/* R10: nothing runs, nothing is pending, and work remains: say what waits. */
static void stuck(Run *r) {
    const Prog *p = r->p;
    const In *in = r->in;
    int32_t k = r->head;
    int64_t free = in->budget - r->used;
    if (k < p->n_items && r->data_ready) {   /* the item itself waits for memory */
        int32_t rec = p->item_rec[k];
        block(r, 10, rec < 0 ? W_OP : W_RECOMPUTE, p->item_group[k], rec, p->item_alloc[k], free, 1);
        return;
    }
    int32_t heads[NSTREAM];
    int n = 0;
    for (int q = 0; q < NSTREAM; q++)
        if (r->stream[q].qhead < r->stream[q].qtail) heads[n++] = r->stream[q].queue[r->stream[q].qhead];
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0 && r->enqueued_at[heads[b - 1]] > r->enqueued_at[heads[b]]; b--) {
            int32_t tmp = heads[b]; heads[b] = heads[b - 1]; heads[b - 1] = tmp;
        }
    int32_t op = k < p->n_items ? p->item_group[k] : -1;
    for (int x = 0; x < n; x++) {
        int32_t j = heads[x], t = p->t_tensor[j];
        if (p->t_kind[j] == A_PREFETCH && (p->t_source[j] < 0 || r->ended[p->t_source[j]]) && !r->resident[t]) {
            block(r, 10, W_PREFETCH, op, t, in->tensor_bytes[t], free, 1);   /* it waits for room */
            return;
        }
    }
    if (n) {
        int32_t j = heads[0], t = p->t_tensor[j];
        block(r, 10, W_STUCK, op, t, in->tensor_bytes[t], free, 1);
        r->blocked.kind = p->t_kind[j] == A_OFFLOAD ? 0 : 1;
        return;
    }
    int32_t tensor = -1;   /* here k < n_items: otherwise a queue would hold the work left */
    if (k < p->n_items) {
        tensor = p->item_rec[k];
        for (int64_t i = p->wait_off[k]; i < p->wait_off[k + 1]; i++)
            if (!r->ended[p->wait_tr[i]]) { tensor = p->t_tensor[p->wait_tr[i]]; break; }
    }
    block(r, 10, W_STUCK, op, tensor, 0, free, 1);
    r->blocked.kind = 2;
}

static int run_program(Run *r, Arena *a) {
    const In *in = r->in;
    const Prog *p = r->p;
    int32_t nt = in->nt, nj = p->n_transfers;
    r->enqueued_at = take(a, (size_t)nj, sizeof(int64_t));
    r->start = take(a, (size_t)nj, sizeof(int64_t));
    r->ended = take(a, (size_t)nj, 1);
    r->resident = take(a, (size_t)nt, 1);
    r->held = take(a, (size_t)nt, 1);
    r->pending_offloads = take(a, (size_t)nt, sizeof(int64_t));
    r->dead_pending = take(a, (size_t)nt, 1);
    r->op_stall = take(a, 2 * (size_t)in->no, sizeof(int64_t));
    r->stall_seen = take(a, (size_t)in->no, 1);
    r->stall_order = take(a, (size_t)in->no, sizeof(int32_t));
    int64_t per_stream[NSTREAM] = {0};
    for (int32_t j = 0; j < nj; j++) per_stream[in->route[route_of(p->t_kind[j], p->t_tier[j])].stream] += 1;
    for (int q = 0; q < NSTREAM; q++) {
        r->stream[q].queue = take(a, (size_t)per_stream[q], sizeof(int32_t));
        r->stream[q].running = -1;
    }
    if (a->failed) return ST_NOMEM;
    r->engine_holder = -1;

    int st = place_at_start(r);
    if (st != ST_OK) return st;
    for (int32_t i = 0; i < p->n_start; i++) {
        int32_t code = p->start_code[i];
        if (code < 0) mem_free(r, p->drop_tensor[-code - 1]);   /* not reachable: a drop has an after op */
        else enqueue(r, code);
    }
    try_compute(r);
    if (try_transfers(r) != ST_OK) return ST_INFEASIBLE;
    for (;;) {
        int64_t instant;
        if (!next_instant(r, &instant)) break;
        if (instant == TIME_MAX) return ST_OVERFLOW;   /* R23: past 2^63 - 1 ps */
        r->now = instant;
        complete(r);
        try_compute(r);
        if (try_transfers(r) != ST_OK) return ST_INFEASIBLE;
    }
    int work_left = r->head < p->n_items;
    for (int q = 0; q < NSTREAM; q++) work_left |= r->stream[q].qhead < r->stream[q].qtail;
    if (work_left) {
        stuck(r);
        return ST_INFEASIBLE;
    }
    return ST_OK;
}

/* ================================================================== Python glue */

/* A buffer passed from Python (array.array or bytes): its item size and kind checked. */
typedef struct { Py_buffer view; int held; } Buf;

static int get_buf(PyObject *obj, Buf *b, int itemsize, const char *name) {
    if (PyObject_GetBuffer(obj, &b->view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return 0;
    b->held = 1;
    const char *f = b->view.format ? b->view.format : "B";
    if (*f == '@' || *f == '=') f++;
    int ok = b->view.ndim <= 1 && b->view.itemsize == itemsize && f[0] != '\0' && f[1] == '\0';
    if (ok) {
        if (itemsize == 1) ok = strchr("Bbc?", f[0]) != NULL;
        else if (itemsize == 4) ok = strchr("il", f[0]) != NULL;
        else ok = strchr("ql", f[0]) != NULL;
    }
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "_fastsim: %s must be an array of %d-byte signed integers", name, itemsize);
        return 0;
    }
    return 1;
}

static Py_ssize_t buf_len(const Buf *b) { return b->view.len / b->view.itemsize; }

static int bad_input(const char *what, const char *name, Py_ssize_t i) {
    PyErr_Format(PyExc_ValueError, "_fastsim: %s[%zd] %s", name, i, what);
    return 0;
}

static int length_is(const Buf *b, Py_ssize_t n, const char *name) {
    if (buf_len(b) != n) {
        PyErr_Format(PyExc_ValueError, "_fastsim: %s has %zd entries, expected %zd", name, buf_len(b), n);
        return 0;
    }
    return 1;
}

static int ints_in(const int32_t *v, Py_ssize_t n, int32_t lo, int32_t hi, const char *name) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (v[i] < lo || v[i] >= hi) return bad_input("is out of range", name, i);
    return 1;
}

static int values_in(const int64_t *v, Py_ssize_t n, int64_t lo, int64_t hi, const char *name) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (v[i] < lo || v[i] >= hi) return bad_input("is out of range", name, i);
    return 1;
}

static int bytes_in(const uint8_t *v, Py_ssize_t n, int hi, const char *name) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (v[i] >= hi) return bad_input("is out of range", name, i);
    return 1;
}

/* CSR offsets: n + 1 of them, from 0 up to the values' length, never decreasing. */
static int csr_ok(const Buf *off, const Buf *idx, int32_t n, int32_t nt, const char *name) {
    if (!length_is(off, (Py_ssize_t)n + 1, name)) return 0;
    const int32_t *o = off->view.buf;
    if (o[0] != 0 || o[n] != buf_len(idx)) return bad_input("does not span its values", name, 0);
    for (int32_t i = 0; i < n; i++)
        if (o[i] > o[i + 1]) return bad_input("decreases", name, i);
    return ints_in(idx->view.buf, buf_len(idx), 0, nt, name);
}

enum { NPROFILE = 17, NPLAN = 9 };

/* Read and check the three packed tuples; 0 with an exception set on a packing bug. */
static int read_inputs(PyObject *profile, PyObject *machine, PyObject *plan, long long budget,
                       Buf *pb, Buf *qb, In *in, Arena *a) {
    static const char *pnames[NPROFILE] = {
        "tensor_bytes", "persistent", "producer", "op_ps", "op_workspace", "in_off", "in_idx", "upd_off",
        "upd_idx", "out_off", "out_idx", "pair_before", "pair_after", "pair_blamed", "pair_tensor", "id_rank",
        "rerun_extra"};
    static const int psize[NPROFILE] = {8, 1, 4, 8, 8, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 8};
    static const char *qnames[NPLAN] = {"a_kind", "a_tier", "a_tensor", "a_after", "a_before", "order",
                                        "has_schedule", "init_tensor", "init_tier"};
    static const int qsize[NPLAN] = {1, 1, 4, 4, 4, 4, 0, 4, 1};
    if (PyTuple_GET_SIZE(profile) != NPROFILE || PyTuple_GET_SIZE(plan) != NPLAN) {
        PyErr_SetString(PyExc_ValueError, "_fastsim: the profile tuple must have 17 entries and the plan 9");
        return 0;
    }
    for (int i = 0; i < NPROFILE; i++)
        if (!get_buf(PyTuple_GET_ITEM(profile, i), &pb[i], psize[i], pnames[i])) return 0;
    for (int i = 0; i < NPLAN; i++) {
        if (qsize[i] == 0) continue;
        if (!get_buf(PyTuple_GET_ITEM(plan, i), &qb[i], qsize[i], qnames[i])) return 0;
    }
    Py_ssize_t nt = buf_len(&pb[0]), no = buf_len(&pb[3]), np = buf_len(&pb[11]);
    Py_ssize_t na = buf_len(&qb[0]), ni = buf_len(&qb[7]);
    if (nt > MAX_COUNT || no > MAX_COUNT || np > MAX_COUNT || na > MAX_COUNT || ni > MAX_COUNT) {
        PyErr_SetString(PyExc_ValueError, "_fastsim: too many ops, tensors, pairs or actions");
        return 0;
    }
    in->nt = (int32_t)nt; in->no = (int32_t)no; in->np = (int32_t)np;
    in->na = (int32_t)na; in->ni = (int32_t)ni;
    if (!(length_is(&pb[1], nt, pnames[1]) && length_is(&pb[2], nt, pnames[2]) && length_is(&pb[4], no, pnames[4])
          && length_is(&pb[12], np, pnames[12]) && length_is(&pb[13], np, pnames[13])
          && length_is(&pb[14], np, pnames[14]) && length_is(&pb[15], nt, pnames[15])
          && length_is(&pb[16], nt, pnames[16])
          && length_is(&qb[1], na, qnames[1]) && length_is(&qb[2], na, qnames[2])
          && length_is(&qb[3], na, qnames[3]) && length_is(&qb[4], na, qnames[4])
          && length_is(&qb[5], no, qnames[5]) && length_is(&qb[8], ni, qnames[8])))
        return 0;
    in->tensor_bytes = pb[0].view.buf; in->persistent = pb[1].view.buf; in->producer = pb[2].view.buf;
    in->op_ps = pb[3].view.buf; in->op_ws = pb[4].view.buf;
    in->in_off = pb[5].view.buf; in->in_idx = pb[6].view.buf; in->upd_off = pb[7].view.buf;
    in->upd_idx = pb[8].view.buf; in->out_off = pb[9].view.buf; in->out_idx = pb[10].view.buf;
    in->pair_before = pb[11].view.buf; in->pair_after = pb[12].view.buf; in->pair_blamed = pb[13].view.buf;
    in->pair_tensor = pb[14].view.buf; in->id_rank = pb[15].view.buf; in->rerun_extra = pb[16].view.buf;
    in->a_kind = qb[0].view.buf; in->a_tier = qb[1].view.buf; in->a_tensor = qb[2].view.buf;
    in->a_after = qb[3].view.buf; in->a_before = qb[4].view.buf; in->order = qb[5].view.buf;
    in->init_tensor = qb[7].view.buf; in->init_tier = qb[8].view.buf;
    in->budget = budget;
    int has_schedule = PyObject_IsTrue(PyTuple_GET_ITEM(plan, 6));
    if (has_schedule < 0) return 0;
    in->has_schedule = has_schedule;

    /* the profile (R23 bounds the values; sums are 128-bit where they can pass 2^63) */
    if (!(values_in(in->tensor_bytes, nt, 0, MAX_VALUE, pnames[0]) && bytes_in(in->persistent, nt, 2, pnames[1])
          && ints_in(in->producer, nt, -1, in->no, pnames[2]) && values_in(in->op_ps, no, 0, MAX_VALUE, pnames[3])
          && values_in(in->op_ws, no, 0, MAX_VALUE, pnames[4])
          && csr_ok(&pb[5], &pb[6], in->no, in->nt, pnames[5]) && csr_ok(&pb[7], &pb[8], in->no, in->nt, pnames[7])
          && csr_ok(&pb[9], &pb[10], in->no, in->nt, pnames[9])
          && ints_in(in->pair_before, np, 0, in->no, pnames[11]) && ints_in(in->pair_after, np, 0, in->no, pnames[12])
          && ints_in(in->pair_blamed, np, 0, in->no, pnames[13]) && ints_in(in->pair_tensor, np, 0, in->nt, pnames[14])
          && ints_in(in->id_rank, nt, 0, in->nt, pnames[15]) && values_in(in->rerun_extra, nt, 0, MAX_VALUE, pnames[16])))
        return 0;
    for (Py_ssize_t t = 0; t < nt; t++)   /* a persistent tensor has no producer; any other has one */
        if (in->persistent[t] != (in->producer[t] < 0)) return bad_input("disagrees with persistent", pnames[2], t);
    for (int32_t op = 0; op < in->no; op++)   /* outputs: each listed once, by their producer */
        for (int32_t i = in->out_off[op]; i < in->out_off[op + 1]; i++)
            if (in->producer[in->out_idx[i]] != op) return bad_input("is not its tensor's producer", pnames[10], i);
    /* the machine */
    long long cap[NLINK], host, ssd, lat[NROUTE];
    int half, stream[NROUTE], l0[NROUTE], l1[NROUTE], engine[NROUTE];
    if (!PyArg_ParseTuple(machine, "iLL(LLLL)((iiiLi)(iiiLi)(iiiLi)(iiiLi));_fastsim machine",
                          &half, &host, &ssd, &cap[0], &cap[1], &cap[2], &cap[3],
                          &stream[0], &l0[0], &l1[0], &lat[0], &engine[0], &stream[1], &l0[1], &l1[1], &lat[1], &engine[1],
                          &stream[2], &l0[2], &l1[2], &lat[2], &engine[2], &stream[3], &l0[3], &l1[3], &lat[3], &engine[3]))
        return 0;
    in->half = half != 0;
    in->tier_capacity[0] = host;
    in->tier_capacity[1] = ssd;
    if (host < 0 || host >= MAX_VALUE || ssd < 0 || ssd >= MAX_VALUE) return bad_input("is out of range", "tier capacity", 0);
    for (int l = 0; l < NLINK; l++) {
        if (cap[l] < 0 || cap[l] >= MAX_VALUE) return bad_input("is out of range", "link_capacity", l);
        in->link_capacity[l] = cap[l];
    }
    for (int x = 0; x < NROUTE; x++) {
        Route *route = &in->route[x];
        if (stream[x] < 0 || stream[x] >= NSTREAM || l0[x] < 0 || l0[x] >= NLINK || l1[x] < -1 || l1[x] >= NLINK
            || l1[x] == l0[x] || lat[x] < 0 || lat[x] >= MAX_VALUE)
            return bad_input("is malformed", "routes", x);
        route->stream = stream[x];
        route->link[0] = l0[x];
        route->link[1] = l1[x] < 0 ? 0 : l1[x];
        route->nlinks = l1[x] < 0 ? 1 : 2;
        route->latency = lat[x];
        route->engine = engine[x] != 0;
    }
    /* the plan */
    if (!(bytes_in(in->a_kind, na, 4, qnames[0]) && bytes_in(in->a_tier, na, 2, qnames[1])
          && ints_in(in->a_tensor, na, 0, in->nt, qnames[2]) && ints_in(in->a_after, na, -1, in->no, qnames[3])
          && ints_in(in->a_before, na, -1, in->no, qnames[4]) && ints_in(in->order, no, 0, in->no, qnames[5])
          && ints_in(in->init_tensor, ni, 0, in->nt, qnames[7]) && bytes_in(in->init_tier, ni, 2, qnames[8])))
        return 0;
    for (Py_ssize_t i = 0; i < na; i++) {
        int kind = in->a_kind[i];
        if ((kind == A_RECOMPUTE && in->a_before[i] < 0) || (kind == A_DROP && in->a_after[i] < 0))
            return bad_input("is malformed (a recompute needs before, a drop after)", "actions", i);
    }
    uint8_t *seen = take(a, (size_t)(no > nt ? no : nt), 1);
    if (seen == NULL) { PyErr_NoMemory(); return 0; }
    for (Py_ssize_t x = 0; x < no; x++) {   /* the order is a permutation of the ops */
        if (seen[in->order[x]]) return bad_input("repeats an op", qnames[5], x);
        seen[in->order[x]] = 1;
    }
    memset(seen, 0, (size_t)(no > nt ? no : nt));
    for (Py_ssize_t i = 0; i < buf_len(&pb[10]); i++) {   /* outputs deduplicated (compile/compiled.py) */
        if (seen[in->out_idx[i]]) return bad_input("repeats a tensor", pnames[10], i);
        seen[in->out_idx[i]] = 1;
    }
    memset(seen, 0, (size_t)(no > nt ? no : nt));
    for (Py_ssize_t i = 0; i < ni; i++) {   /* initial is a dict: each tensor once */
        if (seen[in->init_tensor[i]]) return bad_input("repeats a tensor", qnames[7], i);
        seen[in->init_tensor[i]] = 1;
    }
    if (no + (Py_ssize_t)na >= INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "_fastsim: too many items");
        return 0;
    }
    return 1;
}

/* An integer that may pass 64 bits, as a Python int. */
static PyObject *long_from_i128(i128 v) {
    if (v >= (i128)INT64_MIN && v <= (i128)INT64_MAX) return PyLong_FromLongLong((long long)v);
    int negative = v < 0;
    unsigned __int128 u = negative ? (unsigned __int128)(-(v + 1)) + 1 : (unsigned __int128)v;
    PyObject *hi = PyLong_FromUnsignedLongLong((unsigned long long)(u >> 64));
    PyObject *lo = PyLong_FromUnsignedLongLong((unsigned long long)u);
    PyObject *shift = PyLong_FromLong(64);
    PyObject *shifted = hi && shift ? PyNumber_Lshift(hi, shift) : NULL;
    PyObject *sum = shifted && lo ? PyNumber_Add(shifted, lo) : NULL;
    Py_XDECREF(hi); Py_XDECREF(lo); Py_XDECREF(shift); Py_XDECREF(shifted);
    if (sum && negative) {
        PyObject *neg = PyNumber_Negative(sum);
        Py_DECREF(sum);
        sum = neg;
    }
    return sum;
}

static PyObject *build_blocked(const Blocked *b) {
    PyObject *residents = PyTuple_New(b->n_residents);
    if (residents == NULL) return NULL;
    for (int x = 0; x < b->n_residents; x++) {
        PyObject *v = PyLong_FromLong(b->residents[x]);
        if (v == NULL) { Py_DECREF(residents); return NULL; }
        PyTuple_SET_ITEM(residents, x, v);
    }
    PyObject *needed = long_from_i128(b->needed);
    if (needed == NULL) { Py_DECREF(residents); return NULL; }
    return Py_BuildValue("(iiiiNLNiii)", b->rule, b->what, (int)b->op, (int)b->tensor, needed, (long long)b->free,
                         residents, b->tier, (int)b->after, b->kind);
}

static PyObject *build_result(int status, const Run *r, const Prog *p) {
    int64_t end = r->last_compute_end > r->last_transfer_end ? r->last_compute_end : r->last_transfer_end;
    if (status != ST_OK && r->now > end) end = r->now;
    PyObject *stalls = PyTuple_New(r->n_stall_ops);
    if (stalls == NULL) return NULL;
    for (int32_t x = 0; x < r->n_stall_ops; x++) {
        int32_t g = r->stall_order[x];
        PyObject *entry = Py_BuildValue("(iLL)", (int)g, (long long)r->op_stall[2 * g], (long long)r->op_stall[2 * g + 1]);
        if (entry == NULL) { Py_DECREF(stalls); return NULL; }
        PyTuple_SET_ITEM(stalls, x, entry);
    }
    PyObject *blocked;
    if (status == ST_OK) { Py_INCREF(Py_None); blocked = Py_None; }
    else blocked = build_blocked(&r->blocked);
    PyObject *compute = long_from_i128(r->compute_ps), *recompute = long_from_i128(r->recompute_ps);
    PyObject *links[NLINK];
    int failed = blocked == NULL || compute == NULL || recompute == NULL;
    for (int l = 0; l < NLINK; l++) {
        links[l] = long_from_i128(r->link_bytes[l]);
        failed |= links[l] == NULL;
    }
    if (failed) {
        Py_DECREF(stalls); Py_XDECREF(blocked); Py_XDECREF(compute); Py_XDECREF(recompute);
        for (int l = 0; l < NLINK; l++) Py_XDECREF(links[l]);
        return NULL;
    }
    double progress = p->n_items ? (double)r->head / (double)p->n_items : 1.0;
    return Py_BuildValue("(iLLNNLLLL(LLLL)(NNNN)LLiiNNd)", status, (long long)end, (long long)r->last_compute_end,
                         compute, recompute, (long long)r->stall_data, (long long)r->stall_memory,
                         (long long)r->peak, (long long)r->peak_at,
                         (long long)r->stream[0].busy_ps, (long long)r->stream[1].busy_ps,
                         (long long)r->stream[2].busy_ps, (long long)r->stream[3].busy_ps,
                         links[0], links[1], links[2], links[3],
                         (long long)r->tier_peak[0], (long long)r->tier_peak[1],
                         (int)p->n_transfers, (int)p->n_recomputes, stalls, blocked, progress);
}

static PyObject *fastsim_run(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *profile, *machine, *plan;
    long long budget;
    if (!PyArg_ParseTuple(args, "O!O!O!L:run", &PyTuple_Type, &profile, &PyTuple_Type, &machine,
                          &PyTuple_Type, &plan, &budget))
        return NULL;
    Buf pb[NPROFILE], qb[NPLAN];
    memset(pb, 0, sizeof(pb));
    memset(qb, 0, sizeof(qb));
    Arena arena;
    memset(&arena, 0, sizeof(arena));
    In in;
    memset(&in, 0, sizeof(in));
    PyObject *result = NULL;
    Prog prog;
    Run run;
    Invalid bad = {0, -1, -1};
    memset(&prog, 0, sizeof(prog));
    memset(&run, 0, sizeof(run));
    if (!read_inputs(profile, machine, plan, budget, pb, qb, &in, &arena)) goto done;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = compile_plan(&in, &prog, &arena, &bad);
    if (status == ST_OK) {
        run.in = &in;
        run.p = &prog;
        status = run_program(&run, &arena);
    }
    Py_END_ALLOW_THREADS
    if (status == ST_NOMEM) PyErr_NoMemory();
    else if (status == ST_INVALID) result = Py_BuildValue("(iiii)", ST_INVALID, bad.rule, (int)bad.op, (int)bad.tensor);
    else if (status == ST_OVERFLOW) result = Py_BuildValue("(i)", ST_OVERFLOW);
    else result = build_result(status, &run, &prog);
done:
    release_all(&arena);
    for (int i = 0; i < NPROFILE; i++) if (pb[i].held) PyBuffer_Release(&pb[i].view);
    for (int i = 0; i < NPLAN; i++) if (qb[i].held) PyBuffer_Release(&qb[i].view);
    return result;
}

/* ------------------------------------------------------------------ packing actions */

/* pack_actions(actions, tensor_index, op_index) -> (kinds, tiers, tensors, afters, befores)
 * as bytes (the last three of int32 values): what simulator/fast/explicit.py would build with
 * five passes in Python, in one. A malformed action (a kind, tier or field combination
 * that check_plan rejects) is a ValueError, an unknown id a KeyError; fastpath then runs
 * check_plan to word the error. */
static int tier_code(PyObject *tier) {   /* 0 host, 1 ssd, -1 anything else */
    if (tier == NULL || !PyUnicode_Check(tier)) return -1;
    if (PyUnicode_CompareWithASCIIString(tier, "host") == 0) return 0;
    if (PyUnicode_CompareWithASCIIString(tier, "ssd") == 0) return 1;
    return -1;
}

static int lookup_index(PyObject *index, PyObject *key, int none_ok, int32_t *out) {
    if (key == Py_None && none_ok) { *out = -1; return 1; }
    PyObject *v = PyDict_GetItemWithError(index, key);   /* borrowed */
    if (v == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
        return 0;
    }
    long x = PyLong_AsLong(v);
    if (x == -1 && PyErr_Occurred()) return 0;
    if (x < 0 || x > INT32_MAX) { PyErr_SetString(PyExc_ValueError, "_fastsim: index out of range"); return 0; }
    *out = (int32_t)x;
    return 1;
}

static PyObject *fastsim_pack_actions(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *actions, *tindex, *oindex;
    if (!PyArg_ParseTuple(args, "OO!O!", &actions, &PyDict_Type, &tindex, &PyDict_Type, &oindex)) return NULL;
    PyObject *seq = PySequence_Fast(actions, "_fastsim: actions must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *kinds = PyBytes_FromStringAndSize(NULL, n), *tiers = PyBytes_FromStringAndSize(NULL, n);
    PyObject *tensors = PyBytes_FromStringAndSize(NULL, n * 4), *afters = PyBytes_FromStringAndSize(NULL, n * 4);
    PyObject *befores = PyBytes_FromStringAndSize(NULL, n * 4);
    PyObject *names[6] = {PyUnicode_InternFromString("kind"), PyUnicode_InternFromString("to"),
                          PyUnicode_InternFromString("source"), PyUnicode_InternFromString("tensor"),
                          PyUnicode_InternFromString("after"), PyUnicode_InternFromString("before")};
    PyObject *result = NULL;
    int ok = kinds && tiers && tensors && afters && befores;
    for (int f = 0; f < 6; f++) ok = ok && names[f] != NULL;
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        PyObject *a = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *field[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
        for (int f = 0; f < 6 && ok; f++) ok = (field[f] = PyObject_GetAttr(a, names[f])) != NULL;
        int kind = -1, tier = 0;
        if (ok && PyUnicode_Check(field[0])) {
            if (PyUnicode_CompareWithASCIIString(field[0], "offload") == 0) {
                kind = A_OFFLOAD; tier = tier_code(field[1]);
                if (field[2] != Py_None) tier = -1;
            } else if (PyUnicode_CompareWithASCIIString(field[0], "prefetch") == 0) {
                kind = A_PREFETCH; tier = tier_code(field[2]);
                if (field[1] != Py_None) tier = -1;
            } else if (PyUnicode_CompareWithASCIIString(field[0], "drop") == 0) {
                kind = A_DROP; tier = (field[1] == Py_None && field[2] == Py_None) ? 0 : -1;
            } else if (PyUnicode_CompareWithASCIIString(field[0], "recompute") == 0) {
                kind = A_RECOMPUTE; tier = (field[1] == Py_None && field[2] == Py_None) ? 0 : -1;
            }
        }
        if (ok && (kind < 0 || tier < 0)) {
            PyErr_Format(PyExc_ValueError, "_fastsim: actions[%zd] is malformed", i);
            ok = 0;
        }
        int32_t t = 0, after = 0, before = 0;
        ok = ok && lookup_index(tindex, field[3], 0, &t) && lookup_index(oindex, field[4], 1, &after)
             && lookup_index(oindex, field[5], 1, &before);
        for (int f = 0; f < 6; f++) Py_XDECREF(field[f]);
        if (ok) {
            PyBytes_AS_STRING(kinds)[i] = (char)kind;
            PyBytes_AS_STRING(tiers)[i] = (char)tier;
            memcpy(PyBytes_AS_STRING(tensors) + 4 * i, &t, 4);
            memcpy(PyBytes_AS_STRING(afters) + 4 * i, &after, 4);
            memcpy(PyBytes_AS_STRING(befores) + 4 * i, &before, 4);
        }
    }
    if (ok) result = PyTuple_Pack(5, kinds, tiers, tensors, afters, befores);
    for (int f = 0; f < 6; f++) Py_XDECREF(names[f]);
    Py_XDECREF(kinds); Py_XDECREF(tiers); Py_XDECREF(tensors); Py_XDECREF(afters); Py_XDECREF(befores);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"run", fastsim_run, METH_VARARGS,
     "run(profile_arrays, machine, plan, budget): compile and run one packed plan (simulator/fast/explicit.py)."},
    {"pack_actions", fastsim_pack_actions, METH_VARARGS,
     "pack_actions(actions, tensor_index, op_index): the plan's actions as five packed columns."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastsim",
                                    "The simulator's fast path in C (simulator/fast/explicit.py packs its input).",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastsim(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "ABI", 2) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
