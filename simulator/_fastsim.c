/*
 * The simulator's fast path in C: the static compile of a plan (simulator/program.py)
 * and the run loop (simulator/engine.py, class _Run), with the same rules in the same
 * order, over flat arrays packed by simulator/fastpath.py. It computes the numbers of a
 * run that succeeds; when a plan is invalid or its run infeasible it only says so (a
 * non-zero status) and Python runs the reference to explain why. Rule numbers are those
 * of docs/simulation.md.
 *
 * The compile walks every item of the compute sequence (the Python walk visits only the
 * items that touch planned tensors; the others change no state, so both decide the
 * same), and the run loop then runs the program it built.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { OK = 0, NOT_OK = 1, NO_MEMORY = 2 };
enum { Q_H2D = 0, Q_D2H = 1, Q_SSD_READ = 2, Q_SSD_WRITE = 3, NQ = 4 };
enum { A_OFFLOAD = 0, A_PREFETCH = 1, A_DROP = 2, A_RECOMPUTE = 3 };
enum { UNBORN = 0, GPU, LEAVING, AWAY, INCOMING, DEAD };   /* a planned tensor's state */
#define MAX_EVENTS 16
#define MAX_BLOCKS 160   /* arrays one call allocates: about 100 */

/* ------------------------------------------------------------------ memory */

/* Every array of one call, freed together. */
typedef struct { void *block[MAX_BLOCKS]; int n; int failed; } Arena;

static void *take(Arena *a, size_t count, size_t size) {
    if (a->failed || a->n == MAX_BLOCKS) { a->failed = 1; return NULL; }
    void *p = calloc(count + 1, size);
    if (p == NULL) { a->failed = 1; return NULL; }
    a->block[a->n++] = p;
    return p;
}

static void release_all(Arena *a) {
    for (int i = 0; i < a->n; i++) free(a->block[i]);
    a->n = 0;
}

/* ------------------------------------------------------------------ inputs */

typedef struct {
    /* profile */
    int32_t n_ops, n_tensors;
    const int64_t *tensor_bytes;
    const int8_t *persistent;
    const int32_t *producer;                  /* op index or -1 */
    const double *op_time;
    const int64_t *op_workspace;
    const int32_t *in_off, *in_idx;           /* CSR: op inputs, as listed */
    const int32_t *upd_off, *upd_idx;         /* CSR: op updates */
    const int32_t *out_off, *out_idx;         /* CSR: op outputs, each once */
    /* plan */
    int32_t n_actions, n_initial;
    const int8_t *a_kind, *a_tier;            /* a_tier: offload's to / prefetch's from (0 host, 1 ssd) */
    const int32_t *a_tensor, *a_after, *a_before;   /* op indices or -1 */
    const int32_t *order;                     /* the op order (schedule), n_ops long */
    const int32_t *init_tensor;
    const int8_t *init_tier;
    /* hardware */
    int has_ssd, half_duplex;
    double latency[2][2], rate[2][2];         /* [offload, prefetch][host, ssd]: us, bytes per us */
    int64_t budget, capacity[2];
} In;

/* ------------------------------------------------------------------ the program */

typedef struct {
    /* the compute sequence (R5): item k runs op item_op[k], recomputing item_rec[k] (or -1) */
    int32_t n_items, n_recomputes;
    int32_t *item_op, *item_rec, *item_group;
    int64_t *alloc_bytes;
    int32_t *group_start, *op_item;           /* per op */
    int32_t *use_off, *use_item;              /* CSR per tensor: items that read or update it */
    int32_t *rec_off, *rec_item;              /* CSR per tensor: its recompute items */
    int32_t *free_off, *free_idx;             /* CSR per item: last uses (R8) */
    /* transfers */
    int32_t n_transfers;
    int8_t *t_kind, *t_tier, *t_mask;
    int32_t *t_tensor, *t_source, *t_last_reader, *t_prev_offload;
    int32_t *t_before_op;                     /* prefetch: its before op, or -1 */
    int64_t *t_bytes;
    double *t_duration;
    /* drops: the tensor, and its newest offload issued before (a chain through t_prev_offload) */
    int32_t n_drops;
    int32_t *drop_tensor, *drop_last_offload;
    /* per item: prefetches waited for (R6), offloads released (R11), actions enqueued (R7) */
    int32_t *wait_off, *wait_idx, *rel_off, *rel_idx, *act_off, *act_code;   /* code: j >= 0 transfer, -(d+1) drop */
    int32_t n_start;
    int32_t *start_code;
    int8_t *initial_tier;                     /* per tensor: its tier in plan.initial, or -1 */
} Prog;

/* Group (key, value) pairs by key (0..n-1), keeping their order within a key. */
static void group_pairs(Arena *a, int32_t n, const int32_t *keys, const int32_t *values, int32_t count,
                        int32_t **off_out, int32_t **idx_out) {
    int32_t *off = take(a, (size_t)n + 1, sizeof(int32_t));
    int32_t *idx = take(a, (size_t)count, sizeof(int32_t));
    int32_t *fill = take(a, (size_t)n, sizeof(int32_t));
    *off_out = off; *idx_out = idx;
    if (a->failed) return;
    for (int32_t i = 0; i < count; i++) off[keys[i] + 1] += 1;
    for (int32_t k = 0; k < n; k++) off[k + 1] += off[k];
    for (int32_t i = 0; i < count; i++) idx[off[keys[i]] + fill[keys[i]]++] = values[i];
}

/* R5 and R8: the items (each op's recomputes in plan order, then the op), every tensor's
 * uses and recompute items, and the item at which each non-persistent tensor is freed. */
static void build_sequence(const In *in, Prog *p, Arena *a) {
    int32_t n_ops = in->n_ops, nt = in->n_tensors;
    int32_t n_rec = 0;
    for (int32_t i = 0; i < in->n_actions; i++) n_rec += in->a_kind[i] == A_RECOMPUTE;
    int32_t *rec_keys = take(a, (size_t)n_rec, sizeof(int32_t));
    int32_t *rec_vals = take(a, (size_t)n_rec, sizeof(int32_t));
    if (a->failed) return;
    n_rec = 0;
    for (int32_t i = 0; i < in->n_actions; i++)
        if (in->a_kind[i] == A_RECOMPUTE) { rec_keys[n_rec] = in->a_before[i]; rec_vals[n_rec++] = in->a_tensor[i]; }
    int32_t *before_off, *before_idx;
    group_pairs(a, n_ops, rec_keys, rec_vals, n_rec, &before_off, &before_idx);

    int32_t n = n_ops + n_rec;
    p->n_items = n;
    p->n_recomputes = n_rec;
    p->item_op = take(a, (size_t)n, sizeof(int32_t));
    p->item_rec = take(a, (size_t)n, sizeof(int32_t));
    p->item_group = take(a, (size_t)n, sizeof(int32_t));
    p->alloc_bytes = take(a, (size_t)n, sizeof(int64_t));
    p->group_start = take(a, (size_t)n_ops, sizeof(int32_t));
    p->op_item = take(a, (size_t)n_ops, sizeof(int32_t));
    if (a->failed) return;
    int32_t k = 0;
    for (int32_t x = 0; x < n_ops; x++) {
        int32_t op = in->order[x];
        p->group_start[op] = k;
        for (int32_t r = before_off[op]; r < before_off[op + 1]; r++, k++) {
            int32_t t = before_idx[r], made_by = in->producer[t];
            p->item_op[k] = made_by; p->item_rec[k] = t; p->item_group[k] = op;
            p->alloc_bytes[k] = in->tensor_bytes[t] + in->op_workspace[made_by];
        }
        p->op_item[op] = k;
        p->item_op[k] = op; p->item_rec[k] = -1; p->item_group[k] = op;
        int64_t bytes = in->op_workspace[op];
        for (int32_t i = in->out_off[op]; i < in->out_off[op + 1]; i++) bytes += in->tensor_bytes[in->out_idx[i]];
        p->alloc_bytes[k] = bytes;
        k++;
    }

    /* uses: each item counts once per tensor (a recompute reads its producer's inputs) */
    int32_t *last_seen = take(a, (size_t)nt, sizeof(int32_t));
    int32_t *count = take(a, (size_t)nt + 1, sizeof(int32_t));
    if (a->failed) return;
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t t = 0; t < nt; t++) last_seen[t] = -1;
        for (k = 0; k < n; k++) {
            int32_t op = p->item_op[k];
            for (int list = 0; list < 2; list++) {
                const int32_t *off = list == 0 ? in->in_off : in->upd_off, *idx = list == 0 ? in->in_idx : in->upd_idx;
                if (list == 1 && p->item_rec[k] >= 0) break;
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
            p->use_off = take(a, (size_t)nt + 1, sizeof(int32_t));
            p->use_item = take(a, (size_t)count[nt], sizeof(int32_t));
            if (a->failed) return;
            memcpy(p->use_off, count, ((size_t)nt + 1) * sizeof(int32_t));
        }
    }

    int32_t *rec_items = take(a, (size_t)n_rec, sizeof(int32_t));
    int32_t *rec_tensors = take(a, (size_t)n_rec, sizeof(int32_t));
    int32_t *free_items = take(a, (size_t)nt, sizeof(int32_t));
    int32_t *free_tensors = take(a, (size_t)nt, sizeof(int32_t));
    if (a->failed) return;
    int32_t m = 0;
    for (k = 0; k < n; k++)
        if (p->item_rec[k] >= 0) { rec_tensors[m] = p->item_rec[k]; rec_items[m++] = k; }
    group_pairs(a, nt, rec_tensors, rec_items, m, &p->rec_off, &p->rec_item);
    m = 0;
    for (int32_t t = 0; t < nt; t++) {
        if (in->producer[t] < 0) continue;   /* R8: its last use, else its producer's own item */
        int32_t last = p->use_off[t + 1] > p->use_off[t] ? p->use_item[p->use_off[t + 1] - 1]
                                                         : p->op_item[in->producer[t]];
        free_items[m] = last; free_tensors[m++] = t;
    }
    group_pairs(a, n, free_items, free_tensors, m, &p->free_off, &p->free_idx);
}

/* ------------------------------------------------------------------ the static walk */

typedef struct {
    const In *in;
    Prog *p;
    int8_t *state, *planned, *copies, *updated;   /* copies: valid copy per tier, a bit each */
    int32_t *open_offload, *last_to, *last_offload, *incoming;   /* last_to: 2 per tensor */
    int32_t *inc_head, *inc_next, *inc_tensor, n_inc;   /* per item: tensors whose prefetch lands there */
    int32_t *act_item, n_act;                     /* (item, code) pairs of p->act_code */
    int32_t *act_codes;
} Walk;

static int has_use_from(const Prog *p, int32_t t, int32_t k) {
    int32_t hi = p->use_off[t + 1];
    return hi > p->use_off[t] && p->use_item[hi - 1] >= k;
}

/* The first of the sorted items[lo, hi) after item k, or -1. */
static int32_t first_after(const int32_t *items, int32_t lo, int32_t hi, int32_t k) {
    int32_t end = hi;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (items[mid] <= k) lo = mid + 1; else hi = mid;
    }
    return lo < end ? items[lo] : -1;
}

static void close_window(Walk *w, int32_t t) {
    w->open_offload[t] = -1;
    if (w->state[t] == LEAVING) w->state[t] = AWAY;
}

static int32_t new_transfer(Walk *w, int kind, int32_t t, int tier) {
    Prog *p = w->p;
    const In *in = w->in;
    int32_t j = p->n_transfers++;
    int64_t nbytes = in->tensor_bytes[t];
    p->t_kind[j] = (int8_t)kind;
    p->t_tier[j] = (int8_t)tier;
    p->t_mask[j] = (int8_t)(kind == A_OFFLOAD ? ((1 << Q_D2H) | (tier ? 1 << Q_SSD_WRITE : 0))
                                              : ((1 << Q_H2D) | (tier ? 1 << Q_SSD_READ : 0)));
    p->t_tensor[j] = t;
    p->t_source[j] = -1;
    p->t_last_reader[j] = -1;
    p->t_prev_offload[j] = -1;
    p->t_before_op[j] = -1;
    p->t_bytes[j] = nbytes;
    p->t_duration[j] = in->latency[kind][tier] + (double)nbytes / in->rate[kind][tier];
    return j;
}

/* Apply action i at the end of item k (k = -1: iteration start); NOT_OK when it breaks a rule. */
static int issue(Walk *w, int32_t i, int32_t k) {
    const In *in = w->in;
    Prog *p = w->p;
    int32_t t = in->a_tensor[i];
    int st = w->state[t], tier = in->a_tier[i];
    int32_t code;
    if (in->a_kind[i] == A_OFFLOAD) {   /* R11, R18 */
        if (st != GPU || (tier == 1 && !in->has_ssd)) return NOT_OK;
        int32_t j = new_transfer(w, A_OFFLOAD, t, tier);
        w->state[t] = LEAVING;
        w->open_offload[t] = j;
        w->copies[t] |= (int8_t)(1 << tier);
        w->last_to[2 * t + tier] = j;
        p->t_prev_offload[j] = w->last_offload[t];
        w->last_offload[t] = j;
        code = j;
    } else if (in->a_kind[i] == A_PREFETCH) {   /* R12, R18 */
        int persistent = in->persistent[t];
        if (st == GPU || st == INCOMING || st == UNBORN || st == DEAD) return NOT_OK;
        if (tier == 1 && !in->has_ssd) return NOT_OK;
        if (!(w->copies[t] & (1 << tier))) return NOT_OK;
        int32_t before_item = -1, before = in->a_before[i];
        if (before >= 0) {
            before_item = p->group_start[before];
            if (before_item <= k) return NOT_OK;
            if (!persistent && !has_use_from(p, t, before_item)) return NOT_OK;
        } else if (!persistent) {
            return NOT_OK;
        }
        close_window(w, t);
        int32_t j = new_transfer(w, A_PREFETCH, t, tier);
        p->t_source[j] = w->last_to[2 * t + tier];
        p->t_before_op[j] = before;
        w->state[t] = INCOMING;
        w->incoming[t] = before_item;
        if (before_item >= 0) {
            w->inc_tensor[w->n_inc] = t;
            w->inc_next[w->n_inc] = w->inc_head[before_item];
            w->inc_head[before_item] = w->n_inc++;
        }
        code = j;
    } else {   /* drop, R14 */
        if (st != GPU && st != LEAVING) return NOT_OK;
        int32_t next_use = first_after(p->use_item, p->use_off[t], p->use_off[t + 1], k);
        int32_t next_rec = first_after(p->rec_item, p->rec_off[t], p->rec_off[t + 1], k);
        int recomputed_first = next_rec >= 0 && (next_use < 0 || next_rec <= next_use);
        int never_again = !in->persistent[t] && next_use < 0;
        if (!(w->copies[t] || recomputed_first || never_again)) return NOT_OK;
        w->open_offload[t] = -1;
        w->state[t] = (int8_t)(never_again ? DEAD : AWAY);
        int32_t d = p->n_drops++;
        p->drop_tensor[d] = t;
        p->drop_last_offload[d] = w->last_offload[t];
        code = -(d + 1);
    }
    if (k < 0) p->start_code[p->n_start++] = code;
    else { w->act_item[w->n_act] = k; w->act_codes[w->n_act++] = code; }
    return OK;
}

/* A use (read or update) of a planned tensor must find it resident (R13). */
#define RESIDENT(st) ((st) == GPU || (st) == LEAVING)

static int walk_item(Walk *w, int32_t k, const int32_t *after_off, const int32_t *after_idx) {
    const In *in = w->in;
    Prog *p = w->p;
    int8_t *state = w->state, *planned = w->planned;
    for (int32_t x = w->inc_head[k]; x >= 0; x = w->inc_next[x]) {
        int32_t t = w->inc_tensor[x];
        if (state[t] == INCOMING && w->incoming[t] == k) state[t] = GPU;
    }
    int32_t op = p->item_op[k], rec = p->item_rec[k];
    if (rec >= 0) {   /* R15: only a tensor that was offloaded or dropped, never updated in place */
        int st = state[rec];
        if (in->persistent[rec] || !(st == AWAY || st == LEAVING)) return NOT_OK;
        if (in->upd_off[op + 1] > in->upd_off[op] || w->updated[rec]) return NOT_OK;
        close_window(w, rec);
        state[rec] = GPU;
    }
    for (int32_t i = in->in_off[op]; i < in->in_off[op + 1]; i++) {
        int32_t t = in->in_idx[i];
        if (!planned[t]) continue;
        if (state[t] == LEAVING) p->t_last_reader[w->open_offload[t]] = k;
        else if (state[t] != GPU) return NOT_OK;
    }
    if (rec < 0) {
        for (int32_t i = in->upd_off[op]; i < in->upd_off[op + 1]; i++) {
            int32_t t = in->upd_idx[i];
            if (!planned[t]) continue;
            if (state[t] != GPU) return NOT_OK;   /* R13, and R11: no update in an offload window */
            w->copies[t] = 0;                     /* R16 */
            w->updated[t] = 1;
        }
        for (int32_t i = in->out_off[op]; i < in->out_off[op + 1]; i++)
            if (planned[in->out_idx[i]]) state[in->out_idx[i]] = GPU;
    }
    for (int32_t i = p->free_off[k]; i < p->free_off[k + 1]; i++) {
        int32_t t = p->free_idx[i];
        if (planned[t] && RESIDENT(state[t])) { state[t] = DEAD; w->open_offload[t] = -1; }
    }
    if (rec < 0)
        for (int32_t i = after_off[op]; i < after_off[op + 1]; i++)
            if (issue(w, after_idx[i], k) != OK) return NOT_OK;
    return OK;
}

/* R20: persistent tensors end where they began. */
static int steady_state(Walk *w) {
    const In *in = w->in;
    const int8_t *init_tier = w->p->initial_tier;
    for (int32_t t = 0; t < in->n_tensors; t++)
        if (w->planned[t] && w->state[t] == INCOMING && w->incoming[t] == -1) w->state[t] = GPU;
    for (int32_t t = 0; t < in->n_tensors; t++) {
        if (!in->persistent[t] || !w->planned[t]) continue;
        int st = w->state[t];
        if (init_tier[t] >= 0) {
            if (!(st == AWAY || st == LEAVING) || !(w->copies[t] & (1 << init_tier[t]))) return NOT_OK;
        } else if (st != GPU) {
            return NOT_OK;
        }
    }
    return OK;
}

/* Build the program and check every rule decidable from the plan (program.py). */
static int compile_plan(const In *in, Prog *p, Arena *a) {
    build_sequence(in, p, a);
    int32_t nt = in->n_tensors, na = in->n_actions, n = p->n_items;
    Walk w;
    memset(&w, 0, sizeof(w));
    w.in = in; w.p = p;
    w.state = take(a, (size_t)nt, 1); w.planned = take(a, (size_t)nt, 1);
    w.copies = take(a, (size_t)nt, 1); w.updated = take(a, (size_t)nt, 1);
    p->initial_tier = take(a, (size_t)nt, 1);
    w.open_offload = take(a, (size_t)nt, sizeof(int32_t));
    w.last_to = take(a, 2 * (size_t)nt, sizeof(int32_t));
    w.last_offload = take(a, (size_t)nt, sizeof(int32_t));
    w.incoming = take(a, (size_t)nt, sizeof(int32_t));
    w.inc_head = take(a, (size_t)n, sizeof(int32_t));
    w.inc_next = take(a, (size_t)na, sizeof(int32_t));
    w.inc_tensor = take(a, (size_t)na, sizeof(int32_t));
    w.act_item = take(a, (size_t)na, sizeof(int32_t));
    w.act_codes = take(a, (size_t)na, sizeof(int32_t));
    p->t_kind = take(a, (size_t)na, 1); p->t_tier = take(a, (size_t)na, 1); p->t_mask = take(a, (size_t)na, 1);
    p->t_tensor = take(a, (size_t)na, sizeof(int32_t));
    p->t_source = take(a, (size_t)na, sizeof(int32_t));
    p->t_last_reader = take(a, (size_t)na, sizeof(int32_t));
    p->t_prev_offload = take(a, (size_t)na, sizeof(int32_t));
    p->t_before_op = take(a, (size_t)na, sizeof(int32_t));
    p->t_bytes = take(a, (size_t)na, sizeof(int64_t));
    p->t_duration = take(a, (size_t)na, sizeof(double));
    p->drop_tensor = take(a, (size_t)na, sizeof(int32_t));
    p->drop_last_offload = take(a, (size_t)na, sizeof(int32_t));
    p->start_code = take(a, (size_t)na, sizeof(int32_t));
    int32_t *after_keys = take(a, (size_t)na, sizeof(int32_t));
    int32_t *after_vals = take(a, (size_t)na, sizeof(int32_t));
    if (a->failed) return NO_MEMORY;

    for (int32_t t = 0; t < nt; t++) {
        w.open_offload[t] = w.last_offload[t] = -1;
        w.last_to[2 * t] = w.last_to[2 * t + 1] = -1;
        p->initial_tier[t] = -1;
    }
    for (int32_t k = 0; k < n; k++) w.inc_head[k] = -1;
    for (int32_t i = 0; i < na; i++) {
        int32_t t = in->a_tensor[i];
        w.planned[t] = 1;
        w.state[t] = (int8_t)(in->persistent[t] ? GPU : UNBORN);
    }
    for (int32_t i = 0; i < in->n_initial; i++) {
        int32_t t = in->init_tensor[i];
        w.planned[t] = 1;
        w.state[t] = AWAY;
        w.copies[t] |= (int8_t)(1 << in->init_tier[i]);
        p->initial_tier[t] = in->init_tier[i];
    }
    /* actions after each op, in plan order; after = -1 is the iteration start */
    int32_t m = 0;
    for (int32_t i = 0; i < na; i++) {
        if (in->a_kind[i] == A_RECOMPUTE) continue;
        if (in->a_after[i] < 0) { if (issue(&w, i, -1) != OK) return NOT_OK; continue; }
        after_keys[m] = in->a_after[i]; after_vals[m++] = i;
    }
    int32_t *after_off, *after_idx;
    group_pairs(a, in->n_ops, after_keys, after_vals, m, &after_off, &after_idx);
    if (a->failed) return NO_MEMORY;
    for (int32_t k = 0; k < n; k++)
        if (walk_item(&w, k, after_off, after_idx) != OK) return NOT_OK;
    if (steady_state(&w) != OK) return NOT_OK;

    /* per item: the prefetches it waits for (every item of the before op's group, R6),
       the offloads whose window's last reader it is (R11), the actions after it (R7) */
    int32_t n_waits = 0, n_rel = 0;
    for (int32_t j = 0; j < p->n_transfers; j++) {
        int32_t b = p->t_before_op[j];
        if (b >= 0) n_waits += p->op_item[b] - p->group_start[b] + 1;
        n_rel += p->t_kind[j] == A_OFFLOAD && p->t_last_reader[j] >= 0;
    }
    int32_t *wait_keys = take(a, (size_t)n_waits, sizeof(int32_t));
    int32_t *wait_vals = take(a, (size_t)n_waits, sizeof(int32_t));
    int32_t *rel_keys = take(a, (size_t)n_rel, sizeof(int32_t));
    int32_t *rel_vals = take(a, (size_t)n_rel, sizeof(int32_t));
    if (a->failed) return NO_MEMORY;
    n_waits = n_rel = 0;
    for (int32_t j = 0; j < p->n_transfers; j++) {
        int32_t b = p->t_before_op[j];
        if (b >= 0)
            for (int32_t k = p->group_start[b]; k <= p->op_item[b]; k++) { wait_keys[n_waits] = k; wait_vals[n_waits++] = j; }
        if (p->t_kind[j] == A_OFFLOAD && p->t_last_reader[j] >= 0) { rel_keys[n_rel] = p->t_last_reader[j]; rel_vals[n_rel++] = j; }
    }
    group_pairs(a, n, wait_keys, wait_vals, n_waits, &p->wait_off, &p->wait_idx);
    group_pairs(a, n, rel_keys, rel_vals, n_rel, &p->rel_off, &p->rel_idx);
    group_pairs(a, n, w.act_item, w.act_codes, w.n_act, &p->act_off, &p->act_code);
    return a->failed ? NO_MEMORY : OK;
}

/* ------------------------------------------------------------------ the run loop */

typedef struct {
    const In *in;
    const Prog *p;
    /* state */
    double now, ready_at, data_ready_at, last_compute_end, last_transfer_end;
    int data_ready, running;
    int64_t mem, peak, tier_used[2], tier_peak[2];
    double peak_at;
    int32_t head;
    int8_t *on_gpu, *dead_pending, *tier_space, *ended;
    int32_t *in_flight;
    int64_t *seq;          /* enqueue order of each transfer (R1, R9) */
    int32_t *queue[NQ];
    int32_t qh[NQ], qt[NQ];
    int busy[NQ], res_of[NQ];
    int64_t transfer_seq, event_seq;
    /* pending completions: the compute item (j = -1) or transfer j */
    double ev_time[MAX_EVENTS];
    int64_t ev_seq[MAX_EVENTS];
    int32_t ev_j[MAX_EVENTS];
    int n_events;
    /* outputs */
    double compute_us, recompute_us, stall_data, stall_memory;
    int64_t bytes_on[NQ];
    double busy_us[NQ];
    double *item_stall;    /* 2 per item: data, memory */
    int status;
} Sim;

static void push_event(Sim *s, double time, int32_t j) {
    s->event_seq += 1;
    s->ev_time[s->n_events] = time;
    s->ev_seq[s->n_events] = s->event_seq;
    s->ev_j[s->n_events] = j;
    s->n_events += 1;
}

static void note_peak(Sim *s) {
    if (s->mem > s->peak) { s->peak = s->mem; s->peak_at = s->now; }
}

static void gpu_take(Sim *s, int32_t t) {
    s->on_gpu[t] = 1;
    s->mem += s->in->tensor_bytes[t];
}

static void gpu_free(Sim *s, int32_t t) {
    if (s->on_gpu[t]) { s->on_gpu[t] = 0; s->mem -= s->in->tensor_bytes[t]; }
}

static void tier_release(Sim *s, int32_t t) {
    for (int tier = 0; tier < 2; tier++) {
        if (s->tier_space[t] & (1 << tier)) {
            s->tier_space[t] &= (int8_t)~(1 << tier);
            s->tier_used[tier] -= s->in->tensor_bytes[t];
        }
    }
}

static int tier_take(Sim *s, int32_t t, int tier) {   /* R19; 0 when over capacity */
    if (s->tier_space[t] & (1 << tier)) return 1;
    s->tier_space[t] |= (int8_t)(1 << tier);
    s->tier_used[tier] += s->in->tensor_bytes[t];
    if (s->tier_used[tier] > s->tier_peak[tier]) s->tier_peak[tier] = s->tier_used[tier];
    return s->tier_used[tier] <= s->in->capacity[tier];
}

static void enqueue(Sim *s, int32_t code) {
    const Prog *p = s->p;
    if (code < 0) {   /* a drop: R14, no offload of the tensor may still be in flight */
        int32_t d = -code - 1;
        for (int32_t j = p->drop_last_offload[d]; j >= 0; j = p->t_prev_offload[j])
            if (!s->ended[j]) { s->status = NOT_OK; return; }
        gpu_free(s, p->drop_tensor[d]);
        return;
    }
    s->transfer_seq += 1;
    s->seq[code] = s->transfer_seq;
    for (int q = 0; q < NQ; q++)
        if (p->t_mask[code] & (1 << q)) s->queue[q][s->qt[q]++] = code;
}

static void item_end(Sim *s, int32_t k) {   /* R7 */
    const Prog *p = s->p;
    s->running = 0;
    s->head = k + 1;
    s->ready_at = s->now;
    s->data_ready = 0;
    s->last_compute_end = s->now;
    s->mem -= s->in->op_workspace[p->item_op[k]];
    for (int32_t i = p->free_off[k]; i < p->free_off[k + 1]; i++) {
        int32_t t = p->free_idx[i];
        if (s->in_flight[t]) s->dead_pending[t] = 1;
        else { gpu_free(s, t); tier_release(s, t); }
    }
    for (int32_t i = p->rel_off[k]; i < p->rel_off[k + 1]; i++) {
        int32_t j = p->rel_idx[i];
        if (s->ended[j]) gpu_free(s, p->t_tensor[j]);
    }
    for (int32_t i = p->act_off[k]; i < p->act_off[k + 1] && s->status == OK; i++) enqueue(s, p->act_code[i]);
}

static void transfer_end(Sim *s, int32_t j) {
    const Prog *p = s->p;
    s->ended[j] = 1;
    if (s->now > s->last_transfer_end) s->last_transfer_end = s->now;
    for (int q = 0; q < NQ; q++)
        if (p->t_mask[j] & (1 << q)) s->busy[s->res_of[q]] = 0;
    if (p->t_kind[j] == A_OFFLOAD) {
        int32_t t = p->t_tensor[j];
        s->in_flight[t] -= 1;
        if (p->t_last_reader[j] < s->head) gpu_free(s, t);   /* its window's last reader has ended */
        if (s->dead_pending[t] && !s->in_flight[t]) {
            s->dead_pending[t] = 0;
            gpu_free(s, t);
            tier_release(s, t);
        }
    }
}

static void try_compute(Sim *s) {   /* R6 */
    const Prog *p = s->p;
    const In *in = s->in;
    if (s->running || s->head >= p->n_items) return;
    int32_t k = s->head, rec = p->item_rec[k], op = p->item_op[k];
    if (!s->data_ready) {
        for (int32_t i = p->wait_off[k]; i < p->wait_off[k + 1]; i++)
            if (!s->ended[p->wait_idx[i]]) return;
        if (rec >= 0 && s->on_gpu[rec]) return;   /* R15: the older copy is still being copied out */
        s->data_ready = 1;
        s->data_ready_at = s->now;
    }
    if (s->mem + p->alloc_bytes[k] > in->budget) return;
    double data_wait = s->data_ready_at - s->ready_at;
    double memory_wait = s->now - s->data_ready_at;
    if (data_wait > 0 || memory_wait > 0) {
        s->stall_data += data_wait;
        s->stall_memory += memory_wait;
        s->item_stall[2 * k] += data_wait;
        s->item_stall[2 * k + 1] += memory_wait;
    }
    if (rec >= 0) gpu_take(s, rec);
    else for (int32_t i = in->out_off[op]; i < in->out_off[op + 1]; i++) gpu_take(s, in->out_idx[i]);
    s->mem += in->op_workspace[op];
    note_peak(s);
    s->running = 1;
    s->compute_us += in->op_time[op];
    if (rec >= 0) s->recompute_us += in->op_time[op];
    push_event(s, s->now + in->op_time[op], -1);
}

static void try_transfers(Sim *s) {   /* R9, R12, R17, R18 */
    const Prog *p = s->p;
    int32_t heads[NQ];
    int n = 0;
    for (int q = 0; q < NQ; q++) {
        if (s->qh[q] < s->qt[q]) {
            int32_t j = s->queue[q][s->qh[q]];
            int seen = 0;
            for (int x = 0; x < n; x++) if (heads[x] == j) seen = 1;
            if (!seen) heads[n++] = j;
        }
    }
    for (int a = 1; a < n; a++) {   /* in enqueue order */
        int32_t j = heads[a];
        int b = a - 1;
        while (b >= 0 && s->seq[heads[b]] > s->seq[j]) { heads[b + 1] = heads[b]; b--; }
        heads[b + 1] = j;
    }
    for (int x = 0; x < n; x++) {
        int32_t j = heads[x];
        int ready = 1;
        for (int q = 0; q < NQ; q++) {
            if (!(p->t_mask[j] & (1 << q))) continue;
            if (s->qh[q] >= s->qt[q] || s->queue[q][s->qh[q]] != j || s->busy[s->res_of[q]]) ready = 0;
        }
        if (!ready) continue;
        int32_t t = p->t_tensor[j];
        if (p->t_kind[j] == A_PREFETCH) {
            if (p->t_source[j] >= 0 && !s->ended[p->t_source[j]]) continue;
            if (s->on_gpu[t] || s->mem + p->t_bytes[j] > s->in->budget) continue;
            gpu_take(s, t);
            note_peak(s);
        } else {
            if (!tier_take(s, t, p->t_tier[j])) { s->status = NOT_OK; return; }
            s->in_flight[t] += 1;
        }
        for (int q = 0; q < NQ; q++) {
            if (!(p->t_mask[j] & (1 << q))) continue;
            s->qh[q] += 1;
            s->busy[s->res_of[q]] = 1;
            s->bytes_on[q] += p->t_bytes[j];
            s->busy_us[q] += p->t_duration[j];
        }
        push_event(s, s->now + p->t_duration[j], j);
    }
}

static void step(Sim *s) {
    try_compute(s);
    if (s->status == OK) try_transfers(s);
}

static int run_program(Sim *s, Arena *a) {
    const In *in = s->in;
    const Prog *p = s->p;
    int32_t nt = in->n_tensors, nj = p->n_transfers;
    s->on_gpu = take(a, (size_t)nt, 1);
    s->dead_pending = take(a, (size_t)nt, 1);
    s->tier_space = take(a, (size_t)nt, 1);
    s->in_flight = take(a, (size_t)nt, sizeof(int32_t));
    s->seq = take(a, (size_t)nj, sizeof(int64_t));
    s->ended = take(a, (size_t)nj, 1);
    s->item_stall = take(a, 2 * (size_t)p->n_items, sizeof(double));
    for (int q = 0; q < NQ; q++) s->queue[q] = take(a, (size_t)nj, sizeof(int32_t));
    if (a->failed) return NO_MEMORY;
    s->res_of[Q_H2D] = Q_H2D;
    s->res_of[Q_D2H] = in->half_duplex ? Q_H2D : Q_D2H;   /* half duplex: one PCIe resource */
    s->res_of[Q_SSD_READ] = Q_SSD_READ;
    s->res_of[Q_SSD_WRITE] = Q_SSD_WRITE;

    for (int32_t t = 0; t < nt; t++)
        if (in->persistent[t] && p->initial_tier[t] < 0) gpu_take(s, t);
    s->peak = s->mem;
    if (s->mem > in->budget) return NOT_OK;   /* R10 at start */
    for (int32_t i = 0; i < in->n_initial; i++)
        if (!tier_take(s, in->init_tensor[i], in->init_tier[i])) return NOT_OK;
    for (int32_t i = 0; i < p->n_start && s->status == OK; i++) enqueue(s, p->start_code[i]);
    if (s->status == OK) step(s);
    while (s->n_events > 0 && s->status == OK) {
        double now = s->ev_time[0];
        for (int e = 1; e < s->n_events; e++) if (s->ev_time[e] < now) now = s->ev_time[e];
        s->now = now;
        /* every completion at this instant, in the order they were pushed (R9) */
        while (s->status == OK) {
            int pick = -1;
            for (int e = 0; e < s->n_events; e++)
                if (s->ev_time[e] == now && (pick < 0 || s->ev_seq[e] < s->ev_seq[pick])) pick = e;
            if (pick < 0) break;
            int32_t j = s->ev_j[pick];
            s->n_events -= 1;
            s->ev_time[pick] = s->ev_time[s->n_events];
            s->ev_seq[pick] = s->ev_seq[s->n_events];
            s->ev_j[pick] = s->ev_j[s->n_events];
            if (j < 0) item_end(s, s->head); else transfer_end(s, j);
        }
        if (s->status == OK) step(s);
    }
    if (s->status != OK) return s->status;
    if (s->head < p->n_items) return NOT_OK;   /* R10: work is left and nothing can run */
    for (int q = 0; q < NQ; q++) if (s->qh[q] < s->qt[q]) return NOT_OK;
    return OK;
}

/* ------------------------------------------------------------------ Python glue */

/* A buffer passed from Python (array.array or bytes), checked for item size and length. */
typedef struct { Py_buffer view; int held; } Buf;

static int get_buf(PyObject *obj, Buf *b, Py_ssize_t itemsize, Py_ssize_t len, const char *name) {
    if (PyObject_GetBuffer(obj, &b->view, PyBUF_C_CONTIGUOUS) < 0) return 0;
    b->held = 1;
    if (b->view.len != itemsize * len) {
        PyErr_Format(PyExc_ValueError, "_fastsim: buffer %s has %zd bytes, expected %zd", name, b->view.len,
                     itemsize * len);
        return 0;
    }
    return 1;
}

/* Every index the compile follows must be in range: a packing bug raises, never crashes. */
static int in_range(const int32_t *values, Py_ssize_t count, int32_t lo, int32_t hi, const char *name) {
    for (Py_ssize_t i = 0; i < count; i++)
        if (values[i] < lo || values[i] >= hi) {
            PyErr_Format(PyExc_ValueError, "_fastsim: %s[%zd] = %d is out of range", name, i, (int)values[i]);
            return 0;
        }
    return 1;
}

static int offsets_ok(const int32_t *off, int32_t n, Py_ssize_t total, const char *name) {
    if (off[0] != 0 || off[n] != total) {
        PyErr_Format(PyExc_ValueError, "_fastsim: offsets %s do not span their values", name);
        return 0;
    }
    for (int32_t i = 0; i < n; i++)
        if (off[i] > off[i + 1]) {
            PyErr_Format(PyExc_ValueError, "_fastsim: offsets %s decrease", name);
            return 0;
        }
    return 1;
}

#define NBUF 19

static PyObject *fastsim_simulate(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *objs[NBUF];
    int n_ops, n_tensors, n_actions, n_initial, has_ssd, half;
    long long budget, cap_host, cap_ssd;
    double lat[4], rate[4];
    if (!PyArg_ParseTuple(args, "iiiiiiLLL(dddd)(dddd)OOOOOOOOOOOOOOOOOOO",
                          &n_ops, &n_tensors, &n_actions, &n_initial, &has_ssd, &half, &budget, &cap_host,
                          &cap_ssd, &lat[0], &lat[1], &lat[2], &lat[3], &rate[0], &rate[1], &rate[2], &rate[3],
                          &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &objs[6], &objs[7],
                          &objs[8], &objs[9], &objs[10], &objs[11], &objs[12], &objs[13], &objs[14],
                          &objs[15], &objs[16], &objs[17], &objs[18]))
        return NULL;
    if (n_ops < 0 || n_tensors < 0 || n_actions < 0 || n_initial < 0) {
        PyErr_SetString(PyExc_ValueError, "_fastsim: negative count");
        return NULL;
    }
    Buf b[NBUF];
    memset(b, 0, sizeof(b));
    PyObject *result = NULL;
    Arena arena;
    memset(&arena, 0, sizeof(arena));
    /* the 8 CSR value arrays have no fixed length: their offsets say it */
    static const char *names[NBUF] = {
        "tensor_bytes", "persistent", "producer", "op_time", "op_workspace", "in_off", "in_idx", "upd_off",
        "upd_idx", "out_off", "out_idx", "a_kind", "a_tier", "a_tensor", "a_after", "a_before", "order",
        "init_tensor", "init_tier"};
    const Py_ssize_t sizes[NBUF] = {8, 1, 4, 8, 8, 4, 4, 4, 4, 4, 4, 1, 1, 4, 4, 4, 4, 4, 1};
    Py_ssize_t lens[NBUF] = {n_tensors, n_tensors, n_tensors, n_ops, n_ops, n_ops + 1, -1, n_ops + 1, -1,
                             n_ops + 1, -1, n_actions, n_actions, n_actions, n_actions, n_actions, n_ops,
                             n_initial, n_initial};
    for (int i = 0; i < NBUF; i++) {
        if (lens[i] < 0) lens[i] = ((const int32_t *)b[i - 1].view.buf)[n_ops];   /* the offsets' last entry */
        if (!get_buf(objs[i], &b[i], sizes[i], lens[i], names[i])) goto done;
    }
    In in;
    memset(&in, 0, sizeof(in));
    in.n_ops = n_ops; in.n_tensors = n_tensors; in.n_actions = n_actions; in.n_initial = n_initial;
    in.tensor_bytes = b[0].view.buf; in.persistent = b[1].view.buf; in.producer = b[2].view.buf;
    in.op_time = b[3].view.buf; in.op_workspace = b[4].view.buf;
    in.in_off = b[5].view.buf; in.in_idx = b[6].view.buf; in.upd_off = b[7].view.buf; in.upd_idx = b[8].view.buf;
    in.out_off = b[9].view.buf; in.out_idx = b[10].view.buf;
    in.a_kind = b[11].view.buf; in.a_tier = b[12].view.buf; in.a_tensor = b[13].view.buf;
    in.a_after = b[14].view.buf; in.a_before = b[15].view.buf; in.order = b[16].view.buf;
    in.init_tensor = b[17].view.buf; in.init_tier = b[18].view.buf;
    in.has_ssd = has_ssd; in.half_duplex = half;
    in.budget = budget; in.capacity[0] = cap_host; in.capacity[1] = cap_ssd;
    for (int kind = 0; kind < 2; kind++)
        for (int tier = 0; tier < 2; tier++) {
            in.latency[kind][tier] = lat[2 * kind + tier];
            in.rate[kind][tier] = rate[2 * kind + tier];
        }
    if (!(in_range(in.producer, n_tensors, -1, n_ops, "producer")
          && offsets_ok(in.in_off, n_ops, lens[6], "in_off") && in_range(in.in_idx, lens[6], 0, n_tensors, "in_idx")
          && offsets_ok(in.upd_off, n_ops, lens[8], "upd_off") && in_range(in.upd_idx, lens[8], 0, n_tensors, "upd_idx")
          && offsets_ok(in.out_off, n_ops, lens[10], "out_off") && in_range(in.out_idx, lens[10], 0, n_tensors, "out_idx")
          && in_range(in.a_tensor, n_actions, 0, n_tensors, "a_tensor")
          && in_range(in.a_after, n_actions, -1, n_ops, "a_after")
          && in_range(in.a_before, n_actions, -1, n_ops, "a_before")
          && in_range(in.order, n_ops, 0, n_ops, "order")
          && in_range(in.init_tensor, n_initial, 0, n_tensors, "init_tensor")))
        goto done;
    for (int32_t i = 0; i < n_actions; i++) {
        int kind = in.a_kind[i], tier = in.a_tier[i];
        int32_t t = in.a_tensor[i];
        if (kind < 0 || kind > 3 || tier < 0 || tier > 1
            || (kind == A_RECOMPUTE && (in.a_before[i] < 0 || in.producer[t] < 0))) {
            PyErr_Format(PyExc_ValueError, "_fastsim: action %d is malformed", (int)i);
            goto done;
        }
    }
    for (int32_t i = 0; i < n_initial; i++)
        if (in.init_tier[i] < 0 || in.init_tier[i] > 1) {
            PyErr_Format(PyExc_ValueError, "_fastsim: init_tier[%d] is out of range", (int)i);
            goto done;
        }

    Prog prog;
    Sim sim;
    memset(&prog, 0, sizeof(prog));
    memset(&sim, 0, sizeof(sim));
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = compile_plan(&in, &prog, &arena);
    if (status == OK) {
        sim.in = &in;
        sim.p = &prog;
        status = run_program(&sim, &arena);
    }
    Py_END_ALLOW_THREADS
    if (status == NO_MEMORY) { PyErr_NoMemory(); goto done; }
    if (status != OK) { result = Py_BuildValue("(i)", status); goto done; }

    /* stalls per op, in the order ops first stalled (as the reference fills its dict) */
    PyObject *stalls = PyList_New(0);
    if (stalls == NULL) goto done;
    {
        int32_t *slot = take(&arena, (size_t)n_ops, sizeof(int32_t));   /* op -> position + 1 */
        double *acc = take(&arena, 2 * (size_t)prog.n_items, sizeof(double));
        int32_t *ops_seen = take(&arena, (size_t)prog.n_items, sizeof(int32_t));
        int32_t n_seen = 0;
        if (arena.failed) { Py_DECREF(stalls); PyErr_NoMemory(); goto done; }
        for (int32_t k = 0; k < prog.n_items; k++) {
            double dw = sim.item_stall[2 * k], mw = sim.item_stall[2 * k + 1];
            if (!(dw > 0 || mw > 0)) continue;
            int32_t op = prog.item_group[k];
            if (!slot[op]) { ops_seen[n_seen] = op; slot[op] = ++n_seen; }
            acc[2 * (slot[op] - 1)] += dw;
            acc[2 * (slot[op] - 1) + 1] += mw;
        }
        int failed = 0;
        for (int32_t x = 0; x < n_seen && !failed; x++) {
            PyObject *entry = Py_BuildValue("(idd)", (int)ops_seen[x], acc[2 * x], acc[2 * x + 1]);
            failed = entry == NULL || PyList_Append(stalls, entry) < 0;
            Py_XDECREF(entry);
        }
        if (failed) { Py_DECREF(stalls); goto done; }
    }
    result = Py_BuildValue("(idddddddLLLLLddddLLiiN)", OK, sim.last_compute_end, sim.last_transfer_end,
                           sim.compute_us, sim.recompute_us, sim.stall_data, sim.stall_memory, sim.peak_at,
                           (long long)sim.peak, (long long)sim.bytes_on[0], (long long)sim.bytes_on[1],
                           (long long)sim.bytes_on[2], (long long)sim.bytes_on[3], sim.busy_us[0],
                           sim.busy_us[1], sim.busy_us[2], sim.busy_us[3], (long long)sim.tier_peak[0],
                           (long long)sim.tier_peak[1], (int)prog.n_transfers, (int)prog.n_recomputes, stalls);
done:
    release_all(&arena);
    for (int i = 0; i < NBUF; i++) if (b[i].held) PyBuffer_Release(&b[i].view);
    return result;
}

static PyMethodDef methods[] = {
    {"simulate", fastsim_simulate, METH_VARARGS,
     "Compile and run one packed plan (see simulator/fastpath.py); (0, numbers...) or (status,)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastsim",
                                    "The simulator's fast path in C (simulator/fastpath.py packs its input).",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastsim(void) { return PyModule_Create(&module); }
