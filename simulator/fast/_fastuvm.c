/*
 * UVM mode's run in C (R30-R37 of docs/simulation.md): the fast path of simulator/fast/uvm.py.
 *
 * One call, `_fastuvm.run(sequence, program, tensors, machine, budget)`, runs the two
 * back-to-back iterations of R36 as simulator/run/uvm.py's _UvmRun does with
 * simulator/run/uvm_memory.py's UvmMemory, in the same order and with the same integer arithmetic,
 * and returns the numbers _UvmRun._fill puts into a Result. The static rules stay in
 * Python (simulator/compile/uvm.py compile_uvm): the program arrives compiled, as flat arrays.
 *
 * Each function below is the port of the Python method named in its comment; the names of
 * fields follow the Python attributes. A Python `None` is -1 here (times, items and
 * transfers are never negative).
 *
 * Scope: full-duplex PCIe and host backing. What the C code does not model ends the call
 * with UNSUPPORTED, and simulator/fast/uvm.py runs the Python reference instead:
 *   - a drop among the start actions (the reference's own behaviour is its business);
 *   - (decided in simulator/fast/uvm.py before the call) SSD backing with its page cache (R35),
 *     half-duplex PCIe, and recorded timelines.
 * An instant past 2^61 ps ends the call with OVERFLOW (the reference has arbitrary-precision
 * integers); so every sum of two times fits in 64 bits before it is checked. Byte counts
 * are bounded by simulator/fast/uvm.py before the call (the profile's bytes times the items and
 * transfers stay below 2^61), so they never overflow either.
 *
 * Result layout (simulator/fast/uvm.py _result), every number an int:
 *   OK / INFEASIBLE: (status, now, last compute end, last transfer end, compute, stall data,
 *     stall memory, stall fault, peak, peak at, busy h2d, busy d2h, bytes down, bytes up,
 *     host peak, faults, fault bytes, evictions, write-back bytes, items done, stalls,
 *     blocked)  with stalls a list of (item, data, memory, fault) and blocked None or
 *     (what, item, tensor, needed, free, after, ((tensor, resident bytes), ...)).
 *   UNSUPPORTED, OVERFLOW: (status,)
 *
 * An _Infeasible raise of the reference (and the fallbacks) unwinds with longjmp to the
 * call's top; all the state lives in the Uvm struct, whose arrays are freed there.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_arena.h"
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef __int128 i128;

enum { ST_OK = 0, ST_INFEASIBLE = 2, ST_OVERFLOW = 3, ST_UNSUPPORTED = 4, ST_NOMEM = -1 };
enum { H2D = 0, D2H = 1 };                                 /* the two streams UVM mode uses */
enum { W_STUCK = 0, W_ALONE = 1, W_CAPACITY = 2 };         /* blocked.what (fastuvm._STUCK, ...) */
enum { AFTER_OFFLOAD = 0, AFTER_PREFETCH = 1, AFTER_WAIT = 2 };   /* blocked.after (fastuvm._AFTER) */

#define PS_PER_S ((int64_t)1000000000000LL)
#define TIME_LIMIT (((int64_t)1) << 61)
#define MAX_COUNT (INT32_MAX / 4)
#define NRESIDENTS 5                                       /* UvmMemory.largest(n=5) */

/* ================================================================== state */

typedef struct { int64_t *v; int64_t n, cap; } Vec;        /* a growable int64 list */

/* A run (run/uvm_memory.py Run): blocks first..last-1 of tensor t, resident since stamp; prev/next
 * link the tensor's live runs in the order they were added (UvmMemory.runs[t]). */
typedef struct {
    int64_t first, last, stamp;
    int32_t t, prev, next;
    uint8_t clean, alive;
} RunRec;

/* A heap entry (stamp, tensor, first block, push count, run): R32's order. The key is the
 * run's at push time; a run cut short keeps its entry. */
typedef struct { int64_t stamp, first, order; int32_t t, run; } Entry;

typedef struct { int64_t at, bytes; } Credit;

typedef struct { int32_t *queue; int64_t head, tail; int32_t running; int64_t busy_ps; } Stream;

/* The hint a stream runs (_UvmRun.slot): (transfer, end, busy, moved, the runs an offload copies). */
typedef struct {
    int active, offload;
    int32_t j;
    int64_t end, busy, moved;
    int32_t *runs; int64_t n_runs, cap;
} Slot;

typedef struct { int what, after; int32_t item, tensor; int64_t needed, free; } Blocked;

/* One of an oversubscribed item's own blocks it may evict (tensor, block, bytes, clean,
 * the batch that brings it or -1: on the GPU before the item) */
typedef struct { int32_t t; int64_t b, size, arrival; int clean; } Own;

typedef struct { int64_t rank, b; } Dropped;    /* an own block evicted, by its tensor's first appearance */

typedef struct {
    jmp_buf fail;
    int status;
    /* the compute sequence (fastuvm._sequence): per item */
    int32_t n, nt, nx;
    const int64_t *time_ps, *workspace, *alloc;
    const int32_t *pin_off, *pin_val, *read_off, *read_val, *out_off, *out_val, *upd_off, *upd_val;
    const int32_t *free_off, *free_val;
    /* the program (fastuvm._program) */
    const uint8_t *x_prefetch;                        /* per transfer: 1 prefetch, 0 offload */
    const int32_t *x_tensor, *x_source, *x_last_reader;
    int64_t *wait_off, *rel_off, *act_off;            /* per item (CSR, grouped here) */
    int32_t *wait_x, *rel_x, *act_code;               /* act_code: a transfer, or ~tensor for a drop */
    int32_t n_start;
    const int32_t *start_code;
    const uint8_t *initial, *read_mostly;             /* per tensor */
    /* the tensors */
    const int64_t *nbytes;
    const uint8_t *persistent;
    const int32_t *id_rank;
    /* the machine */
    int64_t block, fault_ps, batch_blocks, down, up, lat_in, lat_out, host_capacity, wb_full, in_full;
    int64_t page, big_pages, batch_faults, threshold;  /* R31: the driver's fault model (batch_blocks 0) */
    int64_t fault_down, kernel_fault_ps, touch_ps;     /* R31: the paging rate, per item, per first-touch batch */
    int64_t fault_bulk, fault_ramp;                   /* R31: the rate past an item's first fault_ramp bytes */
    /* UvmMemory */
    int64_t *nblocks, *tail, *resident, resident_total;
    RunRec *runs; int64_t n_runs, cap_runs;
    int32_t *run_head, *run_tail;                     /* per tensor: its live runs */
    int32_t *pins, *pinned, *pinned_at; int32_t n_pinned;   /* pinned: the tensors with pins > 0 */
    Entry *heap; int64_t n_heap, cap_heap, order;
    Credit *credits; int64_t n_credits, cap_credits;
    int64_t budget, ledger, peak, peak_at, host, host_peak, epoch;
    int64_t recycled, touch_fresh;  /* R31: freed GPU pages not yet reused; the head's fresh bytes */
    int64_t faults, fault_bytes, evictions, writeback_bytes;
    /* scratch lists */
    Vec ranges, pranges, writes, wb_dur, sizes, durations, ends, covered;
    Entry *stash; int64_t n_stash, cap_stash;
    int32_t *sorted; int64_t cap_sorted;
    Own *own; int64_t n_own, cap_own;             /* an oversubscribed item's (_decide_oversubscribed) */
    Vec batch_end, blocks, block_batch;           /* block_batch: per faulted block, its last batch */
    Dropped *dropped; int64_t cap_dropped;
    int32_t *rank;                                 /* per tensor: -1, or its place among the dropped */
    /* the iteration (_UvmRun / _Run) */
    int64_t now, enqueue_count;
    int64_t *enqueued_at;
    uint8_t *ended;
    Stream stream[2];
    int32_t *pending;                                 /* per tensor: offloads enqueued or running (R7) */
    uint8_t *dead_pending;
    int32_t head, items_done;
    int64_t running_until, ready_at, data_ready_at, decided_at, fault_start;
    int64_t last_compute_end, last_transfer_end, compute_ps, stall_data, stall_memory, stall_fault;
    int64_t *stall_d, *stall_m, *stall_f;
    uint8_t *stalled;
    int64_t h2d_free, d2h_free;
    Slot slot[2];
    int head_pinned, instant_ends;
    int64_t link_down, link_up;
    Blocked blocked;
} Uvm;

static void fail_with(Uvm *u, int status) {
    u->status = status;
    longjmp(u->fail, 1);
}

static int64_t checked(Uvm *u, int64_t t) {       /* a time: OVERFLOW past 2^61 ps */
    if (t > TIME_LIMIT || t < 0) fail_with(u, ST_OVERFLOW);
    return t;
}

/* ceil(bytes x 10^12 / rate): a flow's duration in ps (128-bit product). */
static int64_t flow_ps(Uvm *u, int64_t bytes, int64_t rate) {
    i128 q = ((i128)bytes * PS_PER_S + rate - 1) / rate;
    if (q > TIME_LIMIT) fail_with(u, ST_OVERFLOW);
    return (int64_t)q;
}

static void *grow(Uvm *u, void *p, int64_t *cap, int64_t need, size_t size) {
    if (need <= *cap) return p;
    int64_t cap2 = *cap ? *cap : 16;
    while (cap2 < need) cap2 *= 2;
    void *q = realloc(p, (size_t)cap2 * size);
    if (q == NULL) fail_with(u, ST_NOMEM);
    *cap = cap2;
    return q;
}

static void push(Uvm *u, Vec *v, int64_t x) {
    if (v->n == v->cap) v->v = grow(u, v->v, &v->cap, v->n + 1, sizeof(int64_t));
    v->v[v->n++] = x;
}

static void reserve(Uvm *u, Vec *v, int64_t n) { v->v = grow(u, v->v, &v->cap, n, sizeof(int64_t)); }

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* ================================================================== UvmMemory: runs and the heap */

/* range_bytes: blocks first..last-1 of t (its last block may be short) */
static int64_t range_bytes(const Uvm *u, int32_t t, int64_t first, int64_t last) {
    int64_t n = (last - first) * u->block;
    if (last == u->nblocks[t]) n -= u->block - u->tail[t];
    return n;
}

static int64_t run_bytes(const Uvm *u, const RunRec *r) { return range_bytes(u, r->t, r->first, r->last); }

static int entry_less(const Entry *a, const Entry *b) {
    if (a->stamp != b->stamp) return a->stamp < b->stamp;
    if (a->t != b->t) return a->t < b->t;
    if (a->first != b->first) return a->first < b->first;
    return a->order < b->order;
}

static void heap_insert(Uvm *u, Entry e) {
    u->heap = grow(u, u->heap, &u->cap_heap, u->n_heap + 1, sizeof(Entry));
    int64_t i = u->n_heap++;
    while (i > 0) {
        int64_t parent = (i - 1) / 2;
        if (!entry_less(&e, &u->heap[parent])) break;
        u->heap[i] = u->heap[parent];
        i = parent;
    }
    u->heap[i] = e;
}

static Entry heap_pop(Uvm *u) {
    Entry top = u->heap[0], e = u->heap[--u->n_heap];
    int64_t i = 0, n = u->n_heap;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && entry_less(&u->heap[c + 1], &u->heap[c])) c++;
        if (!entry_less(&u->heap[c], &e)) break;
        u->heap[i] = u->heap[c];
        i = c;
    }
    if (n) u->heap[i] = e;
    return top;
}

/* Run(...) placed in runs[t] after run `after` (-1: at the end), and its heap entry
 * (heappush with next(self.order)). */
static int32_t new_run(Uvm *u, int32_t t, int64_t first, int64_t last, int clean, int64_t stamp, int32_t after) {
    if (u->n_runs >= INT32_MAX) fail_with(u, ST_UNSUPPORTED);
    u->runs = grow(u, u->runs, &u->cap_runs, u->n_runs + 1, sizeof(RunRec));
    int32_t id = (int32_t)u->n_runs++;
    RunRec *r = &u->runs[id];
    r->first = first; r->last = last; r->stamp = stamp; r->t = t;
    r->clean = (uint8_t)(clean != 0); r->alive = 1;
    r->prev = after >= 0 ? after : u->run_tail[t];
    r->next = after >= 0 ? u->runs[after].next : -1;
    if (r->prev >= 0) u->runs[r->prev].next = id; else u->run_head[t] = id;
    if (r->next >= 0) u->runs[r->next].prev = id; else u->run_tail[t] = id;
    Entry e = {stamp, first, u->order++, t, id};
    heap_insert(u, e);
    return id;
}

/* runs[t].remove(run) */
static void unlink_run(Uvm *u, int32_t id) {
    RunRec *r = &u->runs[id];
    if (r->prev >= 0) u->runs[r->prev].next = r->next; else u->run_head[r->t] = r->next;
    if (r->next >= 0) u->runs[r->next].prev = r->prev; else u->run_tail[r->t] = r->prev;
    r->prev = r->next = -1;
}

/* UvmMemory.add_run */
static int64_t add_run(Uvm *u, int32_t t, int64_t first, int64_t last, int64_t stamp, int clean) {
    new_run(u, t, first, last, clean, stamp, -1);
    int64_t nbytes = range_bytes(u, t, first, last);
    u->resident[t] += nbytes;
    u->resident_total += nbytes;
    return nbytes;
}

/* UvmMemory.add_outputs: first touch (R31), item k's outputs resident whole, dirty */
static void add_outputs(Uvm *u, int32_t k, int64_t stamp) {
    int64_t total = 0;
    for (int32_t i = u->out_off[k]; i < u->out_off[k + 1]; i++) {
        int32_t t = u->out_val[i];
        if (u->nblocks[t]) {
            new_run(u, t, 0, u->nblocks[t], 0, stamp, -1);
            u->resident[t] += u->nbytes[t];
            total += u->nbytes[t];
        }
    }
    u->resident_total += total;
}

/* t's live runs sorted by first block, in u->sorted (insertion sort: a tensor has few runs) */
static int64_t sorted_runs(Uvm *u, int32_t t) {
    int64_t n = 0;
    for (int32_t id = u->run_head[t]; id >= 0; id = u->runs[id].next) {
        u->sorted = grow(u, u->sorted, &u->cap_sorted, n + 1, sizeof(int32_t));
        int64_t i = n++;
        int64_t first = u->runs[id].first;
        while (i > 0 && u->runs[u->sorted[i - 1]].first > first) { u->sorted[i] = u->sorted[i - 1]; i--; }
        u->sorted[i] = id;
    }
    return n;
}

/* UvmMemory.missing: the block ranges of t not on the GPU, appended to out as (t, first, last) */
static void missing(Uvm *u, int32_t t, Vec *out) {
    int64_t nb = u->nblocks[t];
    if (u->run_head[t] < 0) {
        if (nb) { push(u, out, t); push(u, out, 0); push(u, out, nb); }
        return;
    }
    int64_t n = sorted_runs(u, t);
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        const RunRec *r = &u->runs[u->sorted[i]];
        if (r->first > at) { push(u, out, t); push(u, out, at); push(u, out, r->first); }
        at = r->last;
    }
    if (at < nb) { push(u, out, t); push(u, out, at); push(u, out, nb); }
}

static void pin(Uvm *u, int32_t t) {
    if (u->pins[t]++ == 0) { u->pinned_at[t] = u->n_pinned; u->pinned[u->n_pinned++] = t; }
}

static void unpin(Uvm *u, int32_t t) {
    if (--u->pins[t] == 0) {
        int32_t at = u->pinned_at[t], last = u->pinned[--u->n_pinned];
        u->pinned[at] = last;
        u->pinned_at[last] = at;
    }
}

/* UvmMemory.evictable: resident bytes of unpinned tensors */
static int64_t evictable(const Uvm *u) {
    int64_t pinned = 0;
    for (int32_t i = 0; i < u->n_pinned; i++) pinned += u->resident[u->pinned[i]];
    return u->resident_total - pinned;
}

/* UvmMemory.evict (R32): unpinned blocks in arrival order until deficit bytes are found.
 * The sizes of the blocks to write back go to u->writes; returns the bytes discarded,
 * and the bytes written back in *wb_total. */
static int64_t evict(Uvm *u, int64_t deficit, int64_t *wb_total) {
    int64_t block = u->block, got = 0, discarded = 0;
    u->writes.n = 0;
    u->n_stash = 0;
    while (got < deficit) {
        if (u->n_heap == 0) fail_with(u, ST_UNSUPPORTED);   /* the reference would raise: not reached */
        Entry *top = &u->heap[0];
        RunRec *run = &u->runs[top->run];
        if (!run->alive) { heap_pop(u); continue; }
        int32_t t = run->t;
        if (u->pins[t]) {
            u->stash = grow(u, u->stash, &u->cap_stash, u->n_stash + 1, sizeof(Entry));
            u->stash[u->n_stash++] = heap_pop(u);
            continue;
        }
        int64_t count = run->last - run->first, whole = run_bytes(u, run);
        int64_t k = got + whole <= deficit ? count : (deficit - got + block - 1) / block;
        int64_t taken;
        int32_t id = top->run;
        if (k == count) {
            taken = whole;
            heap_pop(u);
            run = &u->runs[id];
            run->alive = 0;
            unlink_run(u, id);
        } else {
            taken = k * block;     /* blocks below the run's last one: full ones */
        }
        if (run->clean) {
            discarded += taken;
        } else {
            reserve(u, &u->writes, u->writes.n + k);
            if (run->first + k == u->nblocks[t] && u->tail[t] != block) {
                for (int64_t i = 0; i < k - 1; i++) u->writes.v[u->writes.n++] = block;
                u->writes.v[u->writes.n++] = u->tail[t];
            } else {
                for (int64_t i = 0; i < k; i++) u->writes.v[u->writes.n++] = block;
            }
            u->host += taken;
        }
        run->first += k;
        u->resident[t] -= taken;
        u->resident_total -= taken;
        u->evictions += k;
        got += taken;
    }
    for (int64_t i = 0; i < u->n_stash; i++) heap_insert(u, u->stash[i]);
    u->writeback_bytes += got - discarded;
    if (u->host > u->host_peak) u->host_peak = u->host;
    *wb_total = got - discarded;
    return discarded;
}

/* ================================================================== UvmMemory: the ledger */

static void commit(Uvm *u, int64_t delta, int64_t now) {
    u->ledger += delta;
    if (u->ledger > u->peak) { u->peak = u->ledger; u->peak_at = now; }
}

static int credit_less(const Credit *a, const Credit *b) {
    return a->at != b->at ? a->at < b->at : a->bytes < b->bytes;
}

/* UvmMemory.credit: nbytes leave the ledger at `at` (a write-back's end) */
static void credit(Uvm *u, int64_t at, int64_t nbytes) {
    u->credits = grow(u, u->credits, &u->cap_credits, u->n_credits + 1, sizeof(Credit));
    Credit c = {at, nbytes};
    int64_t i = u->n_credits++;
    while (i > 0 && credit_less(&c, &u->credits[(i - 1) / 2])) {
        u->credits[i] = u->credits[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    u->credits[i] = c;
}

/* UvmMemory.take_credits */
static void take_credits(Uvm *u, int64_t now) {
    while (u->n_credits && u->credits[0].at <= now) {
        Credit top = u->credits[0], c = u->credits[--u->n_credits];
        int64_t i = 0, n = u->n_credits;
        for (;;) {
            int64_t ch = 2 * i + 1;
            if (ch >= n) break;
            if (ch + 1 < n && credit_less(&u->credits[ch + 1], &u->credits[ch])) ch++;
            if (!credit_less(&u->credits[ch], &c)) break;
            u->credits[i] = u->credits[ch];
            i = ch;
        }
        if (n) u->credits[i] = c;
        commit(u, -top.bytes, now);
    }
}

static void host_add(Uvm *u, int64_t nbytes) {
    u->host += nbytes;
    if (u->host > u->host_peak) u->host_peak = u->host;
}

/* UvmMemory.free_tensor (R7): a dead tensor's blocks go, GPU and backing alike */
static void free_tensor(Uvm *u, int32_t t, int64_t now) {
    int64_t resident = u->resident[t], clean = 0;
    for (int32_t id = u->run_head[t]; id >= 0; id = u->runs[id].next) {
        RunRec *r = &u->runs[id];
        r->alive = 0;
        if (r->clean) clean += run_bytes(u, r);
    }
    u->run_head[t] = u->run_tail[t] = -1;
    u->host -= u->nbytes[t] - resident + clean;
    u->resident[t] = 0;
    u->resident_total -= resident;
    u->recycled += resident;     /* R31: GPU pages a new output takes with no first touch */
    commit(u, -resident, now);
}

/* UvmMemory.release_clean: t's blocks with a valid backing copy leave the GPU */
static void release_clean(Uvm *u, int32_t t, int64_t now) {
    int64_t gone = 0;
    for (int32_t id = u->run_head[t]; id >= 0;) {
        RunRec *r = &u->runs[id];
        int32_t next = r->next;
        if (r->clean) {
            r->alive = 0;
            gone += run_bytes(u, r);
            unlink_run(u, id);
        }
        id = next;
    }
    u->resident[t] -= gone;
    u->resident_total -= gone;
    commit(u, -gone, now);
}

/* UvmMemory.dirty (R16): t's backing copy is stale */
static void dirty(Uvm *u, int32_t t) {
    for (int32_t id = u->run_head[t]; id >= 0; id = u->runs[id].next) {
        RunRec *r = &u->runs[id];
        if (r->clean) { r->clean = 0; u->host -= run_bytes(u, r); }
    }
}

static int64_t lower_bound(const int64_t *v, int64_t n, int64_t x) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (v[mid] < x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

/* UvmMemory.drop_blocks: the blocks `blocks` (sorted) of t leave the GPU (an oversubscribed
 * item evicted them, R32); a run they cut goes on as pieces with its stamp, each placed
 * after the one before it. Returns their resident bytes; the ledger is the caller's. */
static int64_t drop_blocks(Uvm *u, int32_t t, const int64_t *blocks, int64_t nb) {
    int64_t gone = 0;
    for (int32_t id = u->run_head[t]; id >= 0;) {
        int32_t next = u->runs[id].next;
        int64_t first = u->runs[id].first, last = u->runs[id].last;
        int64_t lo = lower_bound(blocks, nb, first), hi = lower_bound(blocks, nb, last);
        if (lo == hi) {
            id = next;
            continue;
        }
        gone += run_bytes(u, &u->runs[id]);
        int64_t at = first;
        int32_t placed = -1;                 /* the last piece placed */
        for (int64_t i = lo; i <= hi; i++) {
            int64_t stop = i < hi ? blocks[i] : last;
            if (stop > at) {
                if (placed < 0) {            /* the first piece is the run itself (its heap entry stays) */
                    u->runs[id].first = at;
                    u->runs[id].last = stop;
                    placed = id;
                } else {
                    placed = new_run(u, t, at, stop, u->runs[id].clean, u->runs[id].stamp, placed);
                }
                gone -= range_bytes(u, t, at, stop);
            }
            at = stop + 1;
        }
        if (placed < 0) {
            u->runs[id].alive = 0;
            unlink_run(u, id);
        }
        id = next;
    }
    u->resident[t] -= gone;
    u->resident_total -= gone;
    return gone;
}

/* ================================================================== UvmMemory: room and fault batches */

typedef struct { int64_t ready, leftover, wb_bytes, wb_busy; } Room;

/* UvmMemory.make_room (R31, R32): 0 when even evicting every unpinned block would not do;
 * else the room, with the write-backs' sizes in u->writes and durations in u->wb_dur. */
static int make_room(Uvm *u, int64_t need, int64_t now, Room *room) {
    int64_t free = u->budget - u->ledger;
    u->writes.n = u->wb_dur.n = 0;
    memset(room, 0, sizeof(*room));
    if (need <= free) {
        commit(u, need, now);
        room->ready = free;
        return 1;
    }
    int64_t deficit = need - free;
    if (evictable(u) < deficit) return 0;
    int64_t wb_total;
    int64_t discarded = evict(u, deficit, &wb_total);
    room->ready = free + discarded;
    if (u->writes.n) {
        reserve(u, &u->wb_dur, u->writes.n);
        int64_t busy = 0;
        for (int64_t i = 0; i < u->writes.n; i++) {
            int64_t size = u->writes.v[i];    /* a write that is not a full block is a tensor's last */
            int64_t d = size == u->block ? u->wb_full : flow_ps(u, size, u->up);
            u->wb_dur.v[i] = d;
            busy = checked(u, busy + d);
        }
        u->wb_dur.n = u->writes.n;
        room->wb_busy = busy;
        room->leftover = room->ready + wb_total - need;
    }
    room->wb_bytes = wb_total;
    commit(u, need - discarded - wb_total + room->leftover, now);
    return 1;
}

/* UvmMemory._batches with run/uvm_memory.py block_train (R31): the driver's fault batches of the
 * blocks of ranges, every page touched once in address order: the next faults of the
 * batch being gathered grow to big pages, the tree over the block's pages is walked up
 * from the last faulted page and the largest node past the threshold migrates. Sizes and
 * durations in u->sizes and u->durations, each block's last batch in u->block_batch. */
static void page_batches(Uvm *u, const Vec *ranges) {
    int64_t page = u->page, big = u->big_pages, faults = u->batch_faults, threshold = u->threshold;
    int64_t room = 0;
    u->sizes.n = u->durations.n = u->block_batch.n = 0;
    for (int64_t i = 0; i < ranges->n; i += 3) {
        int32_t t = (int32_t)ranges->v[i];
        for (int64_t b = ranges->v[i + 1]; b < ranges->v[i + 2]; b++) {
            int64_t size = b == u->nblocks[t] - 1 ? u->tail[t] : u->block;
            int64_t pages = (size + page - 1) / page, at = 0;
            int levels = 1;
            while (((int64_t)1 << (levels - 1)) < pages) levels++;     /* (pages - 1).bit_length() + 1 */
            while (at < pages) {
                int fresh = room == 0;
                if (fresh) room = faults;
                int64_t n = room < pages - at ? room : pages - at;
                room -= n;
                int64_t touched = at + n;
                int64_t bitmap = (touched + big - 1) / big * big;
                if (bitmap > pages) bitmap = pages;
                int64_t last = touched - 1, end = touched;
                for (int l = 0; l < levels; l++) {
                    int64_t lo = (last >> l) << l, hi = lo + ((int64_t)1 << l);
                    if (hi > pages) hi = pages;
                    int64_t count = (hi < bitmap ? hi : bitmap) - lo;
                    if (count > 0 && (i128)count * 100 > (i128)(hi - lo) * threshold && hi > end) end = hi;
                }
                int64_t upto = end * page < size ? end * page : size, from = at * page < size ? at * page : size;
                if (fresh) push(u, &u->sizes, upto - from);
                else u->sizes.v[u->sizes.n - 1] += upto - from;
                at = end;
            }
            push(u, &u->block_batch, u->sizes.n - 1);
        }
    }
    reserve(u, &u->durations, u->sizes.n);
    int64_t done = 0;
    for (int64_t i = 0; i < u->sizes.n; i++) {      /* paging_ps: the first fault_ramp bytes at fault_down */
        int64_t size = u->sizes.v[i], slow = size;
        if (u->fault_bulk) {
            slow = u->fault_ramp - done;
            slow = slow < 0 ? 0 : slow > size ? size : slow;
        }
        u->durations.v[i] = checked(u, u->fault_ps + flow_ps(u, slow, u->fault_down)
                                       + (size > slow ? flow_ps(u, size - slow, u->fault_bulk) : 0));
        done += size;
    }
    u->durations.n = u->sizes.n;
    if (u->sizes.n) u->durations.v[0] = checked(u, u->durations.v[0] + u->kernel_fault_ps);   /* batch_durations */
}

/* UvmMemory.fault_blocks (no page cache): the fault batches of the ranges (t, first, last)
 * in u->sizes and u->durations */
static void fault_blocks(Uvm *u, const Vec *ranges) {
    int64_t block = u->block, g = u->batch_blocks;
    u->sizes.n = u->durations.n = 0;
    if (g == 1) {
        for (int64_t i = 0; i < ranges->n; i += 3) {
            int32_t t = (int32_t)ranges->v[i];
            int64_t first = ranges->v[i + 1], last = ranges->v[i + 2], count = last - first;
            int odd = last == u->nblocks[t] && u->tail[t] != block;
            reserve(u, &u->sizes, u->sizes.n + count);
            reserve(u, &u->durations, u->durations.n + count);
            for (int64_t b = 0; b < count - odd; b++) {
                u->sizes.v[u->sizes.n++] = block;
                u->durations.v[u->durations.n++] = u->in_full;
            }
            if (odd) {
                u->sizes.v[u->sizes.n++] = u->tail[t];
                u->durations.v[u->durations.n++] = u->fault_ps + flow_ps(u, u->tail[t], u->down);
            }
        }
        return;
    }
    if (g == 0) { page_batches(u, ranges); return; }
    int64_t sum = 0, in_batch = 0;    /* batches of g consecutive blocks, across ranges */
    for (int64_t i = 0; i < ranges->n; i += 3) {
        int32_t t = (int32_t)ranges->v[i];
        int64_t first = ranges->v[i + 1], last = ranges->v[i + 2];
        for (int64_t b = first; b < last; b++) {
            sum += (b == last - 1 && last == u->nblocks[t]) ? u->tail[t] : block;
            if (++in_batch == g) {
                push(u, &u->sizes, sum);
                push(u, &u->durations, u->fault_ps + flow_ps(u, sum, u->down));
                sum = in_batch = 0;
            }
        }
    }
    if (in_batch) {
        push(u, &u->sizes, sum);
        push(u, &u->durations, u->fault_ps + flow_ps(u, sum, u->down));
    }
}

/* UvmMemory.fault_totals: (batches, total ps) with one block a batch */
static int64_t fault_totals(Uvm *u, const Vec *ranges, int64_t *count) {
    int64_t total = 0;
    *count = 0;
    for (int64_t i = 0; i < ranges->n; i += 3) {
        int32_t t = (int32_t)ranges->v[i];
        int64_t last = ranges->v[i + 2], n = last - ranges->v[i + 1];
        *count += n;
        i128 part;
        if (last == u->nblocks[t] && u->tail[t] != u->block)
            part = (i128)(n - 1) * u->in_full + u->fault_ps + flow_ps(u, u->tail[t], u->down);
        else
            part = (i128)n * u->in_full;
        if (part > TIME_LIMIT) fail_with(u, ST_OVERFLOW);
        total = checked(u, total + (int64_t)part);
    }
    return total;
}

/* UvmMemory.writeback_ends (no page cache): back to back on d2h from base, into u->ends */
static void writeback_ends(Uvm *u, int64_t base) {
    reserve(u, &u->ends, u->wb_dur.n);
    int64_t end = base;
    for (int64_t i = 0; i < u->wb_dur.n; i++) u->ends.v[i] = end = checked(u, end + u->wb_dur.v[i]);
    u->ends.n = u->wb_dur.n;
}

/* bisect_left(covered, need) from `from` (needs only grow), as an index into u->ends */
static int64_t covering(Uvm *u, int64_t from, int64_t need) {
    while (from < u->covered.n && u->covered.v[from] < need) from++;
    if (from >= u->covered.n) fail_with(u, ST_UNSUPPORTED);   /* the reference's IndexError: not reached */
    return from;
}

/* run/uvm_memory.py fault_schedule (R31): the room time of the outputs (alloc bytes) and the end of
 * the last batch (*end), for the write-backs in u->writes ending at u->ends and the
 * batches in u->sizes / u->durations (none when with_batches is 0). The recurrence
 * end_i = max(end_(i-1), room_i) + d_i, exactly (the reference's numpy form is its
 * closed form). */
static int64_t fault_schedule(Uvm *u, int64_t now, int64_t h2d_free, int64_t ready, int64_t alloc,
                              int with_batches, int64_t *end_out) {
    reserve(u, &u->covered, u->writes.n);
    int64_t c = ready;
    for (int64_t i = 0; i < u->writes.n; i++) u->covered.v[i] = c += u->writes.v[i];
    u->covered.n = u->writes.n;
    int64_t j = 0;
    int64_t alloc_room = now;
    if (alloc > ready) { j = covering(u, 0, alloc); alloc_room = u->ends.v[j]; }
    int64_t end = h2d_free > now ? h2d_free : now;
    if (with_batches) {
        int64_t need = alloc, room = alloc_room;
        for (int64_t i = 0; i < u->sizes.n; i++) {
            need += u->sizes.v[i];
            if (need > ready) { j = covering(u, j, need); room = u->ends.v[j]; }
            end = checked(u, (end > room ? end : room) + u->durations.v[i]);
        }
    }
    *end_out = end;
    return alloc_room;
}

/* ================================================================== the run (_UvmRun) */

/* _UvmRun._train: a train of write-backs or fault batches on its stream */
static void train(Uvm *u, int stream, int64_t nbytes, int64_t busy, int64_t end) {
    u->stream[stream].busy_ps += busy;
    if (stream == H2D) u->link_down += nbytes; else u->link_up += nbytes;
    if (end > u->last_transfer_end) u->last_transfer_end = end;
}

/* _UvmRun._check_host (R19, R37): the backing tier's capacity */
static void check_host(Uvm *u) {
    if (u->host > u->host_capacity) {
        Blocked b = {W_CAPACITY, AFTER_WAIT, u->head < u->n ? u->head : -1, -1, u->host, u->host_capacity};
        u->blocked = b;
        fail_with(u, ST_INFEASIBLE);
    }
}

/* _UvmRun._schedule (full duplex, no page cache): the train of an item whose batches may
 * wait for write-backs; returns when the item can start, its batches in *batches */
static int64_t schedule(Uvm *u, const Room *room, int64_t alloc, const Vec *ranges, int64_t fault_bytes,
                        int64_t *batches) {
    int64_t now = u->now;
    if (ranges->n) fault_blocks(u, ranges); else u->sizes.n = u->durations.n = 0;
    int has_writes = u->writes.n > 0;
    if (has_writes) writeback_ends(u, max64(now, u->d2h_free)); else u->ends.n = 0;
    int64_t end;
    int64_t alloc_room = fault_schedule(u, now, u->h2d_free, room->ready, alloc, 1, &end);
    if (has_writes) u->d2h_free = u->ends.v[u->ends.n - 1];
    if (u->sizes.n) u->h2d_free = end;
    if (has_writes) {
        int64_t last = u->ends.v[u->ends.n - 1];
        if (room->leftover) credit(u, last, room->leftover);
        train(u, D2H, room->wb_bytes, room->wb_busy, last);
    }
    *batches = u->sizes.n;
    if (u->sizes.n) {
        int64_t busy = 0;
        for (int64_t i = 0; i < u->durations.n; i++) busy = checked(u, busy + u->durations.v[i]);
        train(u, H2D, fault_bytes, busy, end);
        return max64(alloc_room, end);
    }
    return alloc_room;
}

/* UvmMemory.largest: the top residents by (bytes desc, id) */
static int largest(const Uvm *u, int32_t *top) {
    int n = 0;
    for (int32_t t = 0; t < u->nt; t++) {
        if (!u->resident[t]) continue;
        int i = n < NRESIDENTS ? n++ : NRESIDENTS;
        while (i > 0) {
            int32_t o = top[i - 1];
            int before = u->resident[t] > u->resident[o]
                         || (u->resident[t] == u->resident[o] && u->id_rank[t] < u->id_rank[o]);
            if (!before) break;
            if (i < NRESIDENTS) top[i] = o;
            i--;
        }
        if (i < NRESIDENTS) top[i] = t;
    }
    return n;
}

static void alone(Uvm *u, int32_t k, int64_t alloc, int64_t free) {
    Blocked b = {W_ALONE, AFTER_WAIT, k, -1, alloc, free};
    u->blocked = b;
    fail_with(u, ST_INFEASIBLE);
}

static int updates(const Uvm *u, int32_t k, int32_t t) {     /* t in touch.updates */
    for (int32_t i = u->upd_off[k]; i < u->upd_off[k + 1]; i++) if (u->upd_val[i] == t) return 1;
    return 0;
}

static void add_own(Uvm *u, int32_t t, int64_t b, int64_t arrival, int clean) {
    u->own = grow(u, u->own, &u->cap_own, u->n_own + 1, sizeof(Own));
    Own o = {t, b, b == u->nblocks[t] - 1 ? u->tail[t] : u->block, arrival, clean};
    u->own[u->n_own++] = o;
}

/* The room an oversubscribed item has found so far (the reference's `state`) */
typedef struct { int64_t covered, other, own, room, cursor, written, busy; } Take;

/* take() of _decide_oversubscribed: the next source of room for the batches before
 * `before_batch`: a write-back of another tensor's block, else one of the item's own
 * blocks, once it is on the GPU (written back unless clean). */
static void take_room(Uvm *u, Take *s, int64_t before_batch, int32_t k, int64_t alloc, int64_t limit) {
    if (s->other < u->writes.n) {
        s->covered += u->writes.v[s->other];
        s->room = max64(s->room, u->ends.v[s->other]);
        s->other++;
        return;
    }
    if (s->own >= u->n_own || u->own[s->own].arrival >= before_batch) alone(u, k, alloc, limit);
    const Own *o = &u->own[s->own];
    int64_t arrived = o->arrival < 0 ? u->now : u->batch_end.v[o->arrival];
    if (o->clean) {
        s->room = max64(s->room, arrived);
    } else {
        int64_t busy = flow_ps(u, o->size, u->up);
        s->cursor = checked(u, max64(s->cursor, arrived) + busy);
        s->written += o->size;
        s->busy = checked(u, s->busy + busy);
        s->room = max64(s->room, s->cursor);
    }
    s->covered += o->size;
    s->own++;
}

static int cmp_dropped(const void *a, const void *b) {
    const Dropped *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return (x->b > y->b) - (x->b < y->b);
}

/* The item's first `taken` own blocks leave the GPU: drop_blocks per tensor, in the order
 * the tensors first appear among them, each with its blocks sorted. Returns the bytes. */
static int64_t drop_own(Uvm *u, int64_t taken) {
    int64_t ranks = 0, gone = 0;
    u->dropped = grow(u, u->dropped, &u->cap_dropped, taken, sizeof(Dropped));
    for (int64_t i = 0; i < taken; i++) {
        int32_t t = u->own[i].t;
        if (u->rank[t] < 0) {
            u->sorted = grow(u, u->sorted, &u->cap_sorted, ranks + 1, sizeof(int32_t));
            u->sorted[ranks] = t;
            u->rank[t] = (int32_t)ranks++;
        }
        u->dropped[i].rank = u->rank[t];
        u->dropped[i].b = u->own[i].b;
    }
    qsort(u->dropped, (size_t)taken, sizeof(Dropped), cmp_dropped);
    for (int64_t i = 0; i < taken;) {
        int64_t j = i;
        u->blocks.n = 0;
        while (j < taken && u->dropped[j].rank == u->dropped[i].rank) push(u, &u->blocks, u->dropped[j++].b);
        gone += drop_blocks(u, u->sorted[u->dropped[i].rank], u->blocks.v, u->blocks.n);
        i = j;
    }
    for (int64_t r = 0; r < ranks; r++) u->rank[u->sorted[r]] = -1;
    return gone;
}

/* _UvmRun._decide_oversubscribed (R32 as swapplan extends it): an item whose outputs,
 * workspace and faulted blocks cannot be on the GPU together, even with every unpinned
 * block evicted, streams through its inputs: every unpinned block is evicted first, then
 * the item's own input blocks in the order it touches them (those on the GPU before it,
 * then those it faults), each once it is on the GPU. Infeasible (R10, "alone") when a
 * batch or the outputs and workspace cannot get room even so. */
static void oversubscribed(Uvm *u, int32_t k, int64_t alloc, const Vec *ranges, int64_t fault_bytes) {
    int64_t now = u->now;
    int64_t room_total = u->budget - u->ledger + evictable(u);
    int64_t largest_batch = 0, own_resident = 0, batches_busy = 0;
    u->sizes.n = u->durations.n = 0;
    if (ranges->n) fault_blocks(u, ranges);
    for (int64_t i = 0; i < u->sizes.n; i++) {
        largest_batch = max64(largest_batch, u->sizes.v[i]);
        batches_busy = checked(u, batches_busy + u->durations.v[i]);
    }
    for (int32_t i = u->read_off[k]; i < u->read_off[k + 1]; i++) own_resident += u->resident[u->read_val[i]];
    int64_t limit = room_total + own_resident;
    if (max64(alloc, largest_batch) > limit) alone(u, k, alloc, limit);
    Room room;
    if (!make_room(u, room_total, now, &room)) fail_with(u, ST_UNSUPPORTED);   /* not reached: it evicts all */
    for (int32_t i = u->upd_off[k]; i < u->upd_off[k + 1]; i++) dirty(u, u->upd_val[i]);
    /* its own blocks: those on the GPU before it, then those it faults, each in the order it touches them */
    u->n_own = 0;
    for (int32_t i = u->read_off[k]; i < u->read_off[k + 1]; i++) {
        int32_t t = u->read_val[i];
        int64_t n = sorted_runs(u, t);
        for (int64_t r = 0; r < n; r++) {
            const RunRec *run = &u->runs[u->sorted[r]];
            int clean = run->clean;
            for (int64_t b = run->first, last = run->last; b < last; b++) add_own(u, t, b, -1, clean);
        }
    }
    int64_t index = 0;
    for (int64_t r = 0; r < ranges->n; r += 3) {
        int32_t t = (int32_t)ranges->v[r];
        int clean = u->read_mostly[t] && !updates(u, k, t);
        for (int64_t b = ranges->v[r + 1]; b < ranges->v[r + 2]; b++)
        {
            add_own(u, t, b, u->batch_blocks ? index / u->batch_blocks : u->block_batch.v[index], clean);
            index++;
        }
    }
    int64_t base = max64(now, u->d2h_free);
    if (u->writes.n) writeback_ends(u, base); else u->ends.n = 0;
    Take s = {room.ready, 0, 0, now, u->ends.n ? u->ends.v[u->ends.n - 1] : base, 0, 0};
    u->batch_end.n = 0;
    int64_t need = 0, end = max64(u->h2d_free, now);
    for (int64_t i = 0; i < u->sizes.n; i++) {
        need += u->sizes.v[i];
        while (s.covered < need) take_room(u, &s, i, k, alloc, limit);
        end = checked(u, max64(end, s.room) + u->durations.v[i]);
        push(u, &u->batch_end, end);
    }
    need += alloc;
    while (s.covered < need) take_room(u, &s, u->sizes.n, k, alloc, limit);
    int64_t start_at = max64(s.room, end);
    if (u->sizes.n) {
        u->h2d_free = end;
        train(u, H2D, fault_bytes, batches_busy, end);
        u->faults += u->sizes.n;
        u->fault_bytes += fault_bytes;
    }
    if (u->writes.n) train(u, D2H, room.wb_bytes, room.wb_busy, u->ends.v[u->ends.n - 1]);
    if (s.written) train(u, D2H, s.written, s.busy, s.cursor);
    u->d2h_free = max64(u->d2h_free, s.cursor);
    u->evictions += s.own;
    u->writeback_bytes += s.written;
    /* residency: outputs and faulted blocks arrive, then the item's own evicted blocks leave */
    int64_t stamp = u->epoch + now;
    if (u->out_off[k] < u->out_off[k + 1]) add_outputs(u, k, stamp);
    int64_t moved_off_host = 0;
    for (int64_t r = 0; r < ranges->n; r += 3) {
        int32_t t = (int32_t)ranges->v[r];
        int64_t moved = add_run(u, t, ranges->v[r + 1], ranges->v[r + 2], stamp,
                                u->read_mostly[t] && !updates(u, k, t));
        if (!u->read_mostly[t]) moved_off_host += moved;
    }
    int64_t gone = drop_own(u, s.own);
    u->host += s.written - moved_off_host;
    if (u->host > u->host_peak) u->host_peak = u->host;
    check_host(u);
    commit(u, alloc + fault_bytes - gone - room_total, now);   /* what the item keeps, less the room it was given */
    u->decided_at = now;
    u->fault_start = start_at;
}

/* _UvmRun._decide (R31, R32): item k pins what it touches, gets room for its outputs,
 * workspace and faulted blocks, and its train is scheduled; 0 when it must wait */
static int decide(Uvm *u, int32_t k) {
    int64_t now = u->now;
    if (!u->head_pinned) {
        for (int32_t i = u->pin_off[k]; i < u->pin_off[k + 1]; i++) pin(u, u->pin_val[i]);
        u->head_pinned = 1;
        /* R31 fresh_bytes: freed pages still free are taken first, with no first touch */
        int64_t reuse = u->recycled, free_now = u->budget - u->ledger;
        if (reuse > u->alloc[k]) reuse = u->alloc[k];
        if (reuse > free_now) reuse = free_now;
        if (reuse < 0) reuse = 0;
        u->recycled -= reuse;
        u->touch_fresh = u->alloc[k] - reuse;
    }
    Vec *ranges = &u->ranges;
    ranges->n = 0;
    int64_t fault_bytes = 0;
    for (int32_t i = u->read_off[k]; i < u->read_off[k + 1]; i++) {
        int32_t t = u->read_val[i];
        if (u->resident[t] != u->nbytes[t]) {
            int64_t from = ranges->n;
            missing(u, t, ranges);
            for (int64_t r = from; r < ranges->n; r += 3)
                fault_bytes += range_bytes(u, t, ranges->v[r + 1], ranges->v[r + 2]);
        }
    }
    int64_t alloc = u->alloc[k];
    if (!ranges->n && alloc <= u->budget - u->ledger) {    /* the common case: nothing to fault or evict */
        commit(u, alloc, now);
        if (u->out_off[k] < u->out_off[k + 1]) add_outputs(u, k, u->epoch + now);
        for (int32_t i = u->upd_off[k]; i < u->upd_off[k + 1]; i++)
            if (u->run_head[u->upd_val[i]] >= 0) dirty(u, u->upd_val[i]);
        u->decided_at = u->fault_start = now;
        return 1;
    }
    Room room;
    if (!make_room(u, alloc + fault_bytes, now, &room)) {
        if (u->slot[H2D].active || u->slot[D2H].active || u->n_credits)
            return 0;    /* a transfer in progress pins blocks, or bytes are on their way out */
        oversubscribed(u, k, alloc, ranges, fault_bytes);
        return 1;
    }
    int64_t start_at = now;
    int has_writes = u->writes.n > 0;
    if (ranges->n) {
        int64_t batches;
        if (!has_writes && u->batch_blocks == 1) {    /* nothing waits */
            int64_t busy = fault_totals(u, ranges, &batches);
            start_at = u->h2d_free = checked(u, (u->h2d_free > now ? u->h2d_free : now) + busy);
            train(u, H2D, fault_bytes, busy, start_at);
        } else {
            start_at = schedule(u, &room, alloc, ranges, fault_bytes, &batches);
        }
        u->faults += batches;
        u->fault_bytes += fault_bytes;
    } else if (has_writes) {
        int64_t batches;
        start_at = schedule(u, &room, alloc, ranges, 0, &batches);
    }
    int64_t stamp = u->epoch + now;
    if (u->out_off[k] < u->out_off[k + 1]) add_outputs(u, k, stamp);
    int64_t moved_off_host = 0;
    for (int64_t r = 0; r < ranges->n; r += 3) {
        int32_t t = (int32_t)ranges->v[r];
        int64_t moved = add_run(u, t, ranges->v[r + 1], ranges->v[r + 2], stamp, u->read_mostly[t]);
        if (!u->read_mostly[t]) moved_off_host += moved;
    }
    for (int32_t i = u->upd_off[k]; i < u->upd_off[k + 1]; i++) dirty(u, u->upd_val[i]);
    if (has_writes) check_host(u);
    u->host -= moved_off_host;
    u->decided_at = now;
    u->fault_start = start_at;
    return 1;
}

/* _UvmRun._try_compute */
static void try_compute(Uvm *u) {
    int32_t k = u->head;
    if (u->running_until >= 0 || k >= u->n) return;
    int64_t now = u->now;
    if (u->data_ready_at < 0) {
        for (int64_t i = u->wait_off[k]; i < u->wait_off[k + 1]; i++)
            if (!u->ended[u->wait_x[i]]) return;
        u->data_ready_at = now;
    }
    if (u->fault_start < 0 && !decide(u, k)) return;
    if (now < u->fault_start) return;
    int64_t data_wait = u->data_ready_at - u->ready_at, memory_wait = u->decided_at - u->data_ready_at;
    /* R31: first_touch_ps: the new outputs' and workspace's first-touch faults */
    int64_t touch = 0;
    if (u->touch_ps && u->touch_fresh > 0)
        touch = checked(u, (((u->touch_fresh + u->page - 1) / u->page + u->batch_faults - 1) / u->batch_faults) * u->touch_ps);
    touch = touch > u->time_ps[k] ? touch - u->time_ps[k] : 0;   /* touch_delay_ps: they overlap the kernel */
    int64_t fault_wait = now - u->decided_at + touch;
    now += touch;
    if (data_wait || memory_wait || fault_wait) {
        u->stall_data += data_wait;
        u->stall_memory += memory_wait;
        u->stall_fault += fault_wait;
        u->stall_d[k] += data_wait;
        u->stall_m[k] += memory_wait;
        u->stall_f[k] += fault_wait;
        u->stalled[k] = 1;
    }
    u->running_until = checked(u, now + u->time_ps[k]);
    u->compute_ps += u->time_ps[k];
}

/* _Run._enqueue */
static void enqueue(Uvm *u, int32_t j) {
    u->enqueued_at[j] = u->enqueue_count++;
    Stream *s = &u->stream[u->x_prefetch[j] ? H2D : D2H];
    s->queue[s->tail++] = j;
    if (!u->x_prefetch[j]) u->pending[u->x_tensor[j]] += 1;
}

/* _UvmRun._finish_item (R7): last-use frees, offload releases, the actions after the op */
static void finish_item(Uvm *u, int32_t k) {
    int64_t now = u->now;
    u->items_done++;
    for (int32_t i = u->free_off[k]; i < u->free_off[k + 1]; i++) {
        int32_t t = u->free_val[i];
        if (u->pending[t]) u->dead_pending[t] = 1;
        else free_tensor(u, t, now);
    }
    for (int64_t i = u->rel_off[k]; i < u->rel_off[k + 1]; i++) {
        int32_t j = u->rel_x[i];
        if (u->ended[j]) release_clean(u, u->x_tensor[j], now);
    }
    for (int64_t i = u->act_off[k]; i < u->act_off[k + 1]; i++) {
        int32_t code = u->act_code[i];
        if (code < 0) release_clean(u, ~code, now);   /* R33: a drop of a read-mostly tensor: all clean */
        else enqueue(u, code);
    }
}

/* _UvmRun._item_end */
static void item_end(Uvm *u) {
    int32_t k = u->head;
    int64_t now = u->now;
    u->running_until = -1;
    u->head = k + 1;
    u->ready_at = u->last_compute_end = now;
    u->data_ready_at = u->decided_at = u->fault_start = -1;
    if (u->workspace[k]) { commit(u, -u->workspace[k], now); u->recycled += u->workspace[k]; }   /* R31 */
    for (int32_t i = u->pin_off[k]; i < u->pin_off[k + 1]; i++) unpin(u, u->pin_val[i]);
    u->head_pinned = 0;
    finish_item(u, k);
}

/* _UvmRun._can_start (full duplex) */
static int can_start(const Uvm *u, int32_t j) {
    int prefetch = u->x_prefetch[j];
    if (u->now < (prefetch ? u->h2d_free : u->d2h_free)) return 0;
    return !(prefetch && u->x_source[j] >= 0 && !u->ended[u->x_source[j]]);
}

/* _UvmRun._transfer_end of the hint the stream `number` holds */
static void transfer_end(Uvm *u, int number) {
    Slot *s = &u->slot[number];
    int32_t j = s->j, t = u->x_tensor[j];
    int64_t now = u->now;
    u->ended[j] = 1;
    if (now > u->last_transfer_end) u->last_transfer_end = now;
    Stream *stream = &u->stream[number];
    stream->running = -1;
    s->active = 0;
    stream->busy_ps += s->busy;
    if (s->moved) unpin(u, t);
    if (s->offload) {
        for (int64_t i = 0; i < s->n_runs; i++) {
            RunRec *r = &u->runs[s->runs[i]];
            if (r->alive && !r->clean) r->clean = 1;   /* its backing copy is written (R33) */
        }
        u->pending[t] -= 1;
        if (u->dead_pending[t] && !u->pending[t]) {
            u->dead_pending[t] = 0;
            free_tensor(u, t, now);
        } else if (u->x_last_reader[j] < 0 || u->x_last_reader[j] < u->items_done) {   /* items end in order */
            release_clean(u, t, now);
        }
    }
}

/* _UvmRun._start_transfer (R33): a prefetch migrates t's blocks that are not on the GPU
 * (evicting for room, no fault latency); an offload copies t's blocks that have no valid
 * backing copy. Either pins t while it moves bytes and holds its stream until it ends. */
static void start_transfer(Uvm *u, int32_t j) {
    int64_t now = u->now, end = now, moved = 0, busy = 0;
    int32_t t = u->x_tensor[j];
    int number = u->x_prefetch[j] ? H2D : D2H;
    Stream *stream = &u->stream[number];
    Slot *s = &u->slot[number];
    stream->head++;                   /* the queue's head is j */
    stream->running = j;
    s->offload = !u->x_prefetch[j];
    s->n_runs = 0;
    if (u->x_prefetch[j]) {
        Vec *ranges = &u->pranges;
        ranges->n = 0;
        int64_t resident = u->resident[t];
        if (resident == u->nbytes[t]) {
            /* nothing to move */
        } else if (u->run_head[t] < 0) {
            push(u, ranges, t); push(u, ranges, 0); push(u, ranges, u->nblocks[t]);
            moved = u->nbytes[t];
        } else {
            missing(u, t, ranges);
            moved = u->nbytes[t] - resident;
        }
        Room room;
        if (!moved || !make_room(u, moved, now, &room)) {
            moved = 0;     /* nothing to move, or no room even evicting everything unpinned: skipped */
        } else {
            int64_t room_at = now;
            if (u->writes.n) {
                int64_t unused;
                writeback_ends(u, max64(now, u->d2h_free));
                room_at = fault_schedule(u, now, now, room.ready, moved, 0, &unused);
                int64_t last = u->ends.v[u->ends.n - 1];
                u->d2h_free = last;
                if (room.leftover) credit(u, last, room.leftover);
                train(u, D2H, room.wb_bytes, room.wb_busy, last);
            }
            busy = checked(u, u->lat_in + flow_ps(u, moved, u->down));
            end = checked(u, room_at + busy);
            int64_t stamp = u->epoch + now;
            int clean = u->read_mostly[t];
            for (int64_t r = 0; r < ranges->n; r += 3) add_run(u, t, ranges->v[r + 1], ranges->v[r + 2], stamp, clean);
            if (!clean) u->host -= moved;
            u->link_down += moved;
        }
    } else {
        int64_t all = 0;
        for (int32_t id = u->run_head[t]; id >= 0; id = u->runs[id].next) {
            all++;
            if (!u->runs[id].clean) {
                s->runs = grow(u, s->runs, &s->cap, s->n_runs + 1, sizeof(int32_t));
                s->runs[s->n_runs++] = id;
            }
        }
        if (s->n_runs == all) {
            moved = u->resident[t];
        } else {
            for (int64_t i = 0; i < s->n_runs; i++) moved += run_bytes(u, &u->runs[s->runs[i]]);
        }
        if (moved) {
            busy = checked(u, u->lat_out + flow_ps(u, moved, u->up));
            end = checked(u, now + busy);
            host_add(u, moved);
            check_host(u);
            u->link_up += moved;
        }
    }
    if (moved) pin(u, t);
    s->j = j; s->end = end; s->busy = busy; s->moved = moved; s->active = 1;
    if (end == now) {
        transfer_end(u, number);    /* moves nothing: it ends as it starts (R9: then compute, then transfers) */
        u->instant_ends = 1;
    }
}

/* _UvmRun._try_transfers (R9): the heads of h2d and d2h try to start, in enqueue order */
static void try_transfers(Uvm *u) {
    Stream *h = &u->stream[H2D], *d = &u->stream[D2H];
    int32_t first = h->head < h->tail && h->running < 0 ? h->queue[h->head] : -1;
    int32_t second = d->head < d->tail && d->running < 0 ? d->queue[d->head] : -1;
    if (first < 0) {
        first = second;
        second = -1;
    } else if (second >= 0 && u->enqueued_at[second] < u->enqueued_at[first]) {
        int32_t x = first; first = second; second = x;
    }
    if (first >= 0 && can_start(u, first)) start_transfer(u, first);
    if (second >= 0 && can_start(u, second)) start_transfer(u, second);
}

static int queued(const Uvm *u) {
    return u->stream[H2D].head < u->stream[H2D].tail || u->stream[D2H].head < u->stream[D2H].tail;
}

/* _UvmRun._stuck (R10): nothing runs, nothing is pending, and work remains */
static void stuck(Uvm *u) {
    int32_t j = -1;
    for (int s = 0; s < 2; s++) {
        const Stream *q = &u->stream[s];
        if (q->head < q->tail && (j < 0 || u->enqueued_at[q->queue[q->head]] < u->enqueued_at[j]))
            j = q->queue[q->head];
    }
    Blocked b = {W_STUCK, j < 0 ? AFTER_WAIT : u->x_prefetch[j] ? AFTER_PREFETCH : AFTER_OFFLOAD,
                 u->head < u->n ? u->head : -1, j < 0 ? -1 : u->x_tensor[j], 0, u->budget - u->ledger};
    u->blocked = b;
    fail_with(u, ST_INFEASIBLE);
}

/* try_transfers, then compute and transfers again while hints end as they start */
static void hints(Uvm *u) {
    try_transfers(u);
    while (u->instant_ends) {
        u->instant_ends = 0;
        try_compute(u);
        try_transfers(u);
    }
}

/* _UvmRun._loop: R9's instants with the UVM run's events */
static void loop(Uvm *u) {
    for (int32_t i = 0; i < u->n_start; i++) {
        if (u->start_code[i] < 0) fail_with(u, ST_UNSUPPORTED);   /* a drop with no after op */
        enqueue(u, u->start_code[i]);
    }
    Stream *h = &u->stream[H2D], *d = &u->stream[D2H];
    try_compute(u);
    if (queued(u)) hints(u);
    for (;;) {
        int64_t now = u->now, instant = u->running_until, start = u->fault_start;
        if (start >= 0 && start > now && (instant < 0 || start < instant)) instant = start;
        for (int s = 0; s < 2; s++)
            if (u->slot[s].active && (instant < 0 || u->slot[s].end < instant)) instant = u->slot[s].end;
        if (u->n_credits && (instant < 0 || u->credits[0].at < instant)) instant = u->credits[0].at;
        if (h->head < h->tail && u->h2d_free > now && (instant < 0 || u->h2d_free < instant)) instant = u->h2d_free;
        if (d->head < d->tail && u->d2h_free > now && (instant < 0 || u->d2h_free < instant)) instant = u->d2h_free;
        if (instant < 0) break;
        u->now = now = instant;
        if (u->n_credits && u->credits[0].at <= now) take_credits(u, now);
        if (u->running_until == now) item_end(u);
        int down = u->slot[H2D].active && u->slot[H2D].end == now;
        int up = u->slot[D2H].active && u->slot[D2H].end == now;
        if (down) {
            if (up && u->enqueued_at[u->slot[D2H].j] < u->enqueued_at[u->slot[H2D].j]) {
                transfer_end(u, D2H);
                up = 0;
            }
            transfer_end(u, H2D);
        }
        if (up) transfer_end(u, D2H);
        if (u->running_until < 0) try_compute(u);
        if ((h->head < h->tail && h->running < 0) || (d->head < d->tail && d->running < 0)) hints(u);
    }
    if (u->head < u->n || queued(u)) stuck(u);
}

/* _UvmRun._place_at_start (R36): persistent tensors on the GPU block by block in profile
 * order until the budget is full, except those `initial` places in the backing tier */
static void place_at_start(Uvm *u) {
    int full = 0;
    for (int32_t t = 0; t < u->nt; t++) {
        if (!u->persistent[t]) continue;
        int64_t nbytes = u->nbytes[t];
        int rm = u->read_mostly[t];
        if (u->initial[t] || full || !nbytes) {
            host_add(u, nbytes);
            continue;
        }
        int64_t free = u->budget - u->ledger;
        if (free < 0) fail_with(u, ST_UNSUPPORTED);     /* not reached: the ledger never passes the budget here */
        int64_t count = nbytes <= free ? u->nblocks[t] : free / u->block;   /* else min(free // block, nblocks - 1) */
        if (nbytes > free && count > u->nblocks[t] - 1) count = u->nblocks[t] - 1;
        int64_t placed = count ? add_run(u, t, 0, count, 0, rm) : 0;
        full = count < u->nblocks[t];
        commit(u, placed, 0);
        host_add(u, nbytes - placed + (rm ? placed : 0));
    }
}

/* A fresh _UvmRun over the same memory */
static void reset_iteration(Uvm *u) {
    u->now = u->enqueue_count = 0;
    memset(u->ended, 0, (size_t)u->nx);
    for (int s = 0; s < 2; s++) {
        u->stream[s].head = u->stream[s].tail = 0;
        u->stream[s].running = -1;
        u->stream[s].busy_ps = 0;
        u->slot[s].active = 0;
    }
    memset(u->pending, 0, (size_t)u->nt * sizeof(int32_t));
    memset(u->dead_pending, 0, (size_t)u->nt);
    u->head = u->items_done = 0;
    u->running_until = u->data_ready_at = u->decided_at = u->fault_start = -1;
    u->ready_at = u->last_compute_end = u->last_transfer_end = u->compute_ps = 0;
    u->stall_data = u->stall_memory = u->stall_fault = 0;
    memset(u->stall_d, 0, (size_t)u->n * sizeof(int64_t));
    memset(u->stall_m, 0, (size_t)u->n * sizeof(int64_t));
    memset(u->stall_f, 0, (size_t)u->n * sizeof(int64_t));
    memset(u->stalled, 0, (size_t)u->n);
    u->h2d_free = u->d2h_free = 0;
    u->head_pinned = u->instant_ends = 0;
    u->link_down = u->link_up = 0;
}

/* run/uvm.py _run_uvm (R36): two back-to-back iterations; the second starts with the
 * residency, order of arrival and ledger the first ended with. Returns the status; the
 * state is the second iteration's, or the first's when that one did not run to its end. */
static int run_both(Uvm *u) {
    if (setjmp(u->fail)) return u->status;
    u->wb_full = flow_ps(u, u->block, u->up);
    u->in_full = checked(u, u->fault_ps + flow_ps(u, u->block, u->down));
    reset_iteration(u);
    place_at_start(u);
    check_host(u);
    loop(u);
    take_credits(u, u->now);
    u->epoch = checked(u, u->epoch + u->now + 1);   /* every stamp of iteration 2 comes after iteration 1's */
    u->faults = u->fault_bytes = u->evictions = u->writeback_bytes = 0;
    u->peak = u->ledger;
    u->peak_at = 0;
    u->host_peak = u->host;
    reset_iteration(u);
    check_host(u);
    loop(u);
    return ST_OK;
}

/* ================================================================== inputs */

typedef struct { Py_buffer view; int held; } Buf;

static int get_buf(PyObject *obj, Buf *b, int itemsize, const char *name) {
    if (PyObject_GetBuffer(obj, &b->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return 0;
    b->held = 1;
    if (b->view.itemsize != itemsize) {
        PyErr_Format(PyExc_ValueError, "_fastuvm: %s must have items of %d bytes", name, itemsize);
        return 0;
    }
    return 1;
}

static Py_ssize_t buf_len(const Buf *b) { return b->view.len / b->view.itemsize; }

static int bad(const char *name) {
    PyErr_Format(PyExc_ValueError, "_fastuvm: %s is malformed", name);
    return 0;
}

static int ints_in(const int32_t *v, Py_ssize_t n, int64_t lo, int64_t hi, const char *name) {  /* lo <= v < hi */
    for (Py_ssize_t i = 0; i < n; i++) if (v[i] < lo || v[i] >= hi) return bad(name);
    return 1;
}

static int values_in(const int64_t *v, Py_ssize_t n, int64_t hi, const char *name) {   /* 0 <= v <= hi */
    for (Py_ssize_t i = 0; i < n; i++) if (v[i] < 0 || v[i] > hi) return bad(name);
    return 1;
}

/* offsets of n rows over values in [0, nt) */
static int csr_ok(const Buf *off, const Buf *val, int32_t n, int32_t nt, const char *name) {
    const int32_t *o = off->view.buf;
    if (buf_len(off) != (Py_ssize_t)n + 1 || o[0] != 0 || o[n] != buf_len(val)) return bad(name);
    for (int32_t k = 0; k < n; k++) if (o[k] > o[k + 1]) return bad(name);
    return ints_in(val->view.buf, buf_len(val), 0, nt, name);
}

/* (item, value) pairs grouped by item into CSR form, keeping their order within an item */
static int group(Arena *a, int32_t n, const Buf *keys, const Buf *vals, int64_t **off_out, int32_t **val_out) {
    Py_ssize_t count = buf_len(keys);
    const int32_t *k = keys->view.buf, *v = vals->view.buf;
    int64_t *off = take(a, (size_t)n + 1, sizeof(int64_t)), *fill = take(a, (size_t)n + 1, sizeof(int64_t));
    int32_t *out = take(a, (size_t)count, sizeof(int32_t));
    if (a->failed) return 0;
    for (Py_ssize_t i = 0; i < count; i++) off[k[i] + 1] += 1;
    for (int32_t i = 0; i < n; i++) off[i + 1] += off[i];
    memcpy(fill, off, ((size_t)n + 1) * sizeof(int64_t));
    for (Py_ssize_t i = 0; i < count; i++) out[fill[k[i]]++] = v[i];
    *off_out = off;
    *val_out = out;
    return 1;
}

enum { NSEQ = 13, NPROG = 13, NTENSOR = 3, NMACHINE = 17 };

static int read_inputs(PyObject *seq, PyObject *prog, PyObject *tensors, PyObject *machine, long long budget,
                       Buf *sb, Buf *pb, Buf *tb, Uvm *u, Arena *a) {
    static const char *snames[NSEQ] = {"time_ps", "workspace", "alloc", "pin_off", "pin_val", "read_off", "read_val",
                                       "out_off", "out_val", "upd_off", "upd_val", "free_off", "free_val"};
    static const int ssize[NSEQ] = {8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4};
    static const char *pnames[NPROG] = {"prefetch", "tensor", "source", "last_reader", "wait_item", "wait_x",
                                        "release_item", "release_x", "action_item", "action_code", "start_code",
                                        "initial", "read_mostly"};
    static const int psize[NPROG] = {1, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 1, 1};
    static const char *tnames[NTENSOR] = {"tensor_bytes", "persistent", "id_rank"};
    static const int tsize[NTENSOR] = {8, 1, 4};
    if (PyTuple_GET_SIZE(seq) != NSEQ || PyTuple_GET_SIZE(prog) != NPROG || PyTuple_GET_SIZE(tensors) != NTENSOR
        || PyTuple_GET_SIZE(machine) != NMACHINE) {
        PyErr_SetString(PyExc_ValueError, "_fastuvm: the sequence and program tuples must have 13 entries, "
                                          "the tensors 3 and the machine 17");
        return 0;
    }
    for (int i = 0; i < NSEQ; i++) if (!get_buf(PyTuple_GET_ITEM(seq, i), &sb[i], ssize[i], snames[i])) return 0;
    for (int i = 0; i < NPROG; i++) if (!get_buf(PyTuple_GET_ITEM(prog, i), &pb[i], psize[i], pnames[i])) return 0;
    for (int i = 0; i < NTENSOR; i++) if (!get_buf(PyTuple_GET_ITEM(tensors, i), &tb[i], tsize[i], tnames[i])) return 0;
    int64_t m[NMACHINE];
    for (int i = 0; i < NMACHINE; i++) {
        m[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(machine, i));
        if (m[i] == -1 && PyErr_Occurred()) return 0;
    }
    Py_ssize_t n = buf_len(&sb[0]), nt = buf_len(&tb[0]), nx = buf_len(&pb[0]);
    if (n > MAX_COUNT || nt > MAX_COUNT || nx > MAX_COUNT) return bad("size");
    u->n = (int32_t)n; u->nt = (int32_t)nt; u->nx = (int32_t)nx;
    if (buf_len(&sb[1]) != n || buf_len(&sb[2]) != n || buf_len(&tb[1]) != nt || buf_len(&tb[2]) != nt
        || buf_len(&pb[1]) != nx || buf_len(&pb[2]) != nx || buf_len(&pb[3]) != nx || buf_len(&pb[4]) != buf_len(&pb[5])
        || buf_len(&pb[6]) != buf_len(&pb[7]) || buf_len(&pb[8]) != buf_len(&pb[9])
        || buf_len(&pb[11]) != nt || buf_len(&pb[12]) != nt)
        return bad("a length");
    u->time_ps = sb[0].view.buf; u->workspace = sb[1].view.buf; u->alloc = sb[2].view.buf;
    u->pin_off = sb[3].view.buf; u->pin_val = sb[4].view.buf; u->read_off = sb[5].view.buf;
    u->read_val = sb[6].view.buf; u->out_off = sb[7].view.buf; u->out_val = sb[8].view.buf;
    u->upd_off = sb[9].view.buf; u->upd_val = sb[10].view.buf; u->free_off = sb[11].view.buf;
    u->free_val = sb[12].view.buf;
    u->x_prefetch = pb[0].view.buf; u->x_tensor = pb[1].view.buf; u->x_source = pb[2].view.buf;
    u->x_last_reader = pb[3].view.buf;
    u->n_start = (int32_t)buf_len(&pb[10]); u->start_code = pb[10].view.buf;
    u->initial = pb[11].view.buf; u->read_mostly = pb[12].view.buf;
    u->nbytes = tb[0].view.buf; u->persistent = tb[1].view.buf; u->id_rank = tb[2].view.buf;
    u->block = m[0]; u->fault_ps = m[1]; u->batch_blocks = m[2]; u->down = m[3]; u->up = m[4];
    u->lat_in = m[5]; u->lat_out = m[6]; u->host_capacity = m[7];
    u->page = m[8]; u->big_pages = m[9]; u->batch_faults = m[10]; u->threshold = m[11];
    u->fault_down = m[12]; u->kernel_fault_ps = m[13]; u->touch_ps = m[14];
    u->fault_bulk = m[15]; u->fault_ramp = m[16];
    u->budget = budget;
    if (!(values_in(u->time_ps, n, TIME_LIMIT, snames[0]) && values_in(u->workspace, n, TIME_LIMIT, snames[1])
          && values_in(u->alloc, n, TIME_LIMIT, snames[2]) && values_in(u->nbytes, nt, TIME_LIMIT, tnames[0])
          && csr_ok(&sb[3], &sb[4], u->n, u->nt, snames[3]) && csr_ok(&sb[5], &sb[6], u->n, u->nt, snames[5])
          && csr_ok(&sb[7], &sb[8], u->n, u->nt, snames[7]) && csr_ok(&sb[9], &sb[10], u->n, u->nt, snames[9])
          && csr_ok(&sb[11], &sb[12], u->n, u->nt, snames[11])
          && ints_in(u->x_tensor, nx, 0, nt, pnames[1]) && ints_in(u->x_source, nx, -1, nx, pnames[2])
          && ints_in(u->x_last_reader, nx, -1, n, pnames[3])
          && ints_in(pb[4].view.buf, buf_len(&pb[4]), 0, n, pnames[4])
          && ints_in(pb[5].view.buf, buf_len(&pb[5]), 0, nx, pnames[5])
          && ints_in(pb[6].view.buf, buf_len(&pb[6]), 0, n, pnames[6])
          && ints_in(pb[7].view.buf, buf_len(&pb[7]), 0, nx, pnames[7])
          && ints_in(pb[8].view.buf, buf_len(&pb[8]), 0, n, pnames[8])
          && ints_in(pb[9].view.buf, buf_len(&pb[9]), -(int64_t)nt, nx, pnames[9])
          && ints_in(u->start_code, u->n_start, -(int64_t)nt, nx, pnames[10])))
        return 0;
    if (u->block < 1 || u->batch_blocks < 0 || u->page < 1 || u->page > u->block || u->block / u->page > 1000000
        || u->big_pages < 1 || u->batch_faults < 1 || u->threshold < 0 || u->threshold > 100 || u->down < 1 || u->up < 1 || u->fault_down < 1 || u->fault_bulk < 0 || u->fault_ramp < 0 || u->kernel_fault_ps < 0
        || u->kernel_fault_ps > TIME_LIMIT || u->touch_ps < 0 || u->touch_ps > TIME_LIMIT || u->fault_ps < 0 || u->fault_ps > TIME_LIMIT
        || u->lat_in < 0 || u->lat_in > TIME_LIMIT || u->lat_out < 0 || u->lat_out > TIME_LIMIT || budget < 0
        || budget > TIME_LIMIT * 2)
        return bad("machine or budget");
    for (Py_ssize_t i = 0; i < nx; i++) if (u->x_prefetch[i] > 1) return bad(pnames[0]);
    /* every transfer is enqueued at most once an iteration: the queues hold nx each */
    uint8_t *seen = take(a, (size_t)nx, 1);
    if (a->failed) { PyErr_NoMemory(); return 0; }
    const int32_t *codes[2] = {pb[9].view.buf, u->start_code};
    Py_ssize_t counts[2] = {buf_len(&pb[9]), u->n_start};
    for (int c = 0; c < 2; c++)
        for (Py_ssize_t i = 0; i < counts[c]; i++) {
            int32_t x = codes[c][i];
            if (x >= 0 && seen[x]++) return bad("an action (a transfer enqueued twice)");
        }
    if (!(group(a, u->n, &pb[4], &pb[5], &u->wait_off, &u->wait_x)
          && group(a, u->n, &pb[6], &pb[7], &u->rel_off, &u->rel_x)
          && group(a, u->n, &pb[8], &pb[9], &u->act_off, &u->act_code))) {
        PyErr_NoMemory();
        return 0;
    }
    /* the run's own arrays */
    u->nblocks = take(a, (size_t)nt, sizeof(int64_t)); u->tail = take(a, (size_t)nt, sizeof(int64_t));
    u->resident = take(a, (size_t)nt, sizeof(int64_t));
    u->run_head = take(a, (size_t)nt, sizeof(int32_t)); u->run_tail = take(a, (size_t)nt, sizeof(int32_t));
    u->pins = take(a, (size_t)nt, sizeof(int32_t)); u->pinned = take(a, (size_t)nt, sizeof(int32_t));
    u->pinned_at = take(a, (size_t)nt, sizeof(int32_t));
    u->pending = take(a, (size_t)nt, sizeof(int32_t)); u->dead_pending = take(a, (size_t)nt, 1);
    u->enqueued_at = take(a, (size_t)nx, sizeof(int64_t)); u->ended = take(a, (size_t)nx, 1);
    u->stream[H2D].queue = take(a, (size_t)nx, sizeof(int32_t));
    u->stream[D2H].queue = take(a, (size_t)nx, sizeof(int32_t));
    u->stall_d = take(a, (size_t)n, sizeof(int64_t)); u->stall_m = take(a, (size_t)n, sizeof(int64_t));
    u->stall_f = take(a, (size_t)n, sizeof(int64_t)); u->stalled = take(a, (size_t)n, 1);
    u->rank = take(a, (size_t)nt, sizeof(int32_t));
    if (a->failed) { PyErr_NoMemory(); return 0; }
    for (int32_t t = 0; t < u->nt; t++) {
        int64_t b = (u->nbytes[t] + u->block - 1) / u->block;
        u->nblocks[t] = b;
        u->tail[t] = b ? u->nbytes[t] - (b - 1) * u->block : 0;
        u->run_head[t] = u->run_tail[t] = u->rank[t] = -1;
    }
    return 1;
}

/* ================================================================== the module */

static PyObject *build_result(int status, Uvm *u) {
    PyObject *stalls = PyList_New(0), *blocked = NULL;
    if (stalls == NULL) return NULL;
    for (int32_t k = 0; k < u->n; k++) {
        if (!u->stalled[k]) continue;
        PyObject *entry = Py_BuildValue("(iLLL)", (int)k, (long long)u->stall_d[k], (long long)u->stall_m[k],
                                        (long long)u->stall_f[k]);
        if (entry == NULL || PyList_Append(stalls, entry) < 0) { Py_XDECREF(entry); Py_DECREF(stalls); return NULL; }
        Py_DECREF(entry);
    }
    if (status != ST_INFEASIBLE) {
        blocked = Py_NewRef(Py_None);
    } else {
        const Blocked *b = &u->blocked;
        int32_t top[NRESIDENTS];
        int nr = b->what == W_CAPACITY ? 0 : largest(u, top);
        PyObject *residents = PyTuple_New(nr);
        for (int i = 0; residents != NULL && i < nr; i++) {
            PyObject *pair = Py_BuildValue("(iL)", (int)top[i], (long long)u->resident[top[i]]);
            if (pair == NULL) { Py_CLEAR(residents); break; }
            PyTuple_SET_ITEM(residents, i, pair);
        }
        blocked = residents == NULL ? NULL
                  : Py_BuildValue("(iiiLLiN)", b->what, (int)b->item, (int)b->tensor, (long long)b->needed,
                                  (long long)b->free, b->after, residents);
        if (blocked == NULL) { Py_DECREF(stalls); return NULL; }
    }
    return Py_BuildValue("(iLLLLLLLLLLLLLLLLLLiNN)", status, (long long)u->now, (long long)u->last_compute_end,
                         (long long)u->last_transfer_end, (long long)u->compute_ps, (long long)u->stall_data,
                         (long long)u->stall_memory, (long long)u->stall_fault, (long long)u->peak,
                         (long long)u->peak_at, (long long)u->stream[H2D].busy_ps, (long long)u->stream[D2H].busy_ps,
                         (long long)u->link_down, (long long)u->link_up, (long long)u->host_peak,
                         (long long)u->faults, (long long)u->fault_bytes, (long long)u->evictions,
                         (long long)u->writeback_bytes, (int)u->items_done, stalls, blocked);
}

static void free_growable(Uvm *u) {
    Vec *vecs[] = {&u->ranges, &u->pranges, &u->writes, &u->wb_dur, &u->sizes, &u->durations, &u->ends, &u->covered,
                   &u->batch_end, &u->blocks, &u->block_batch};
    for (size_t i = 0; i < sizeof(vecs) / sizeof(vecs[0]); i++) free(vecs[i]->v);
    free(u->runs); free(u->heap); free(u->credits); free(u->stash); free(u->sorted); free(u->own); free(u->dropped);
    free(u->slot[0].runs); free(u->slot[1].runs);
}

static PyObject *fastuvm_run(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *seq, *prog, *tensors, *machine;
    long long budget;
    if (!PyArg_ParseTuple(args, "O!O!O!O!L:run", &PyTuple_Type, &seq, &PyTuple_Type, &prog, &PyTuple_Type, &tensors,
                          &PyTuple_Type, &machine, &budget))
        return NULL;
    Buf sb[NSEQ], pb[NPROG], tb[NTENSOR];
    memset(sb, 0, sizeof(sb)); memset(pb, 0, sizeof(pb)); memset(tb, 0, sizeof(tb));
    Arena arena;
    memset(&arena, 0, sizeof(arena));
    Uvm *u = calloc(1, sizeof(Uvm));
    PyObject *result = NULL;
    if (u == NULL) { PyErr_NoMemory(); goto done; }
    if (!read_inputs(seq, prog, tensors, machine, budget, sb, pb, tb, u, &arena)) goto done;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = run_both(u);
    Py_END_ALLOW_THREADS
    if (status == ST_NOMEM) PyErr_NoMemory();
    else if (status == ST_OK || status == ST_INFEASIBLE) result = build_result(status, u);
    else result = Py_BuildValue("(i)", status);
done:
    if (u != NULL) { free_growable(u); free(u); }
    release_all(&arena);
    for (int i = 0; i < NSEQ; i++) if (sb[i].held) PyBuffer_Release(&sb[i].view);
    for (int i = 0; i < NPROG; i++) if (pb[i].held) PyBuffer_Release(&pb[i].view);
    for (int i = 0; i < NTENSOR; i++) if (tb[i].held) PyBuffer_Release(&tb[i].view);
    return result;
}

static PyMethodDef methods[] = {
    {"run", fastuvm_run, METH_VARARGS,
     "run(sequence, program, tensors, machine, budget): both iterations of one compiled UVM plan "
     "(simulator/fast/uvm.py)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastuvm",
                                    "UVM mode's run in C (simulator/fast/uvm.py packs its input).",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastuvm(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "ABI", 2) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
