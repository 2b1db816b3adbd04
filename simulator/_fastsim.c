/*
 * The simulator's run loop in C: the same rules, in the same order, as the pure-Python
 * reference (simulator/engine.py, class _Run), over flat arrays packed by
 * simulator/fastpath.py. It computes the numbers of a run that succeeds; when a run is
 * invalid or infeasible it only says so (a non-zero status) and Python re-runs the
 * reference to explain why. Rule numbers are those of docs/simulation.md.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { OK = 0, NOT_OK = 1 };
enum { Q_H2D = 0, Q_D2H = 1, Q_SSD_READ = 2, Q_SSD_WRITE = 3, NQ = 4 };
#define MAX_EVENTS 16

typedef struct {
    /* inputs */
    Py_ssize_t n_items, n_transfers, n_tensors;
    const int64_t *tensor_bytes;
    const int64_t *alloc_bytes, *workspace;
    const double *time_us;
    const int32_t *recomputed;                 /* tensor index or -1 */
    const int32_t *alloc_off, *alloc_idx;      /* CSR: tensors allocated by item k */
    const int32_t *free_off, *free_idx;        /* CSR: last uses ending at item k */
    const int32_t *wait_off, *wait_idx;        /* CSR (built here): transfers item k waits for */
    const int32_t *rel_off, *rel_idx;          /* CSR (built here): offloads released when item k ends */
    const int32_t *act_off, *act_code;         /* CSR (built here): actions after item k
                                                  (j >= 0 a transfer, -(d+1) a drop) */
    const int8_t *t_kind;                      /* 0 offload, 1 prefetch */
    const int32_t *t_tensor, *t_source, *t_last_reader;
    const int8_t *t_mask, *t_tier;             /* queues used (bit per queue); 0 host, 1 ssd */
    const int64_t *t_bytes;
    const double *t_duration;
    const int32_t *drop_tensor, *drop_off, *drop_idx;   /* CSR: offloads of the dropped tensor */
    int64_t budget, capacity[2];
    int half_duplex;
    /* state */
    double now, ready_at, data_ready_at, last_compute_end, last_transfer_end;
    int data_ready;
    int64_t mem, peak, tier_used[2], tier_peak[2];
    double peak_at;
    Py_ssize_t head;
    int running;
    char *on_gpu, *dead_pending, *tier_space;
    int32_t *in_flight;
    int64_t *seq;          /* enqueue order of each transfer */
    char *ended;
    int32_t *queue[NQ];
    Py_ssize_t qh[NQ], qt[NQ];
    int busy[NQ];
    int res_of[NQ];
    int64_t transfer_seq, event_seq;
    /* events: compute end (j = -1) or transfer end (j) */
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

static void free_tensor(Sim *s, int32_t t) {
    if (s->on_gpu[t]) { s->on_gpu[t] = 0; s->mem -= s->tensor_bytes[t]; }
}

static void tier_release(Sim *s, int32_t t) {
    for (int tier = 0; tier < 2; tier++) {
        if (s->tier_space[t] & (1 << tier)) {
            s->tier_space[t] &= (char)~(1 << tier);
            s->tier_used[tier] -= s->tensor_bytes[t];
        }
    }
}

static int tier_take(Sim *s, int32_t t, int tier) {   /* R19; 0 when over capacity */
    if (s->tier_space[t] & (1 << tier)) return 1;
    s->tier_space[t] |= (char)(1 << tier);
    s->tier_used[tier] += s->tensor_bytes[t];
    if (s->tier_used[tier] > s->tier_peak[tier]) s->tier_peak[tier] = s->tier_used[tier];
    return s->tier_used[tier] <= s->capacity[tier];
}

static void enqueue(Sim *s, int32_t j) {
    s->transfer_seq += 1;
    s->seq[j] = s->transfer_seq;
    for (int q = 0; q < NQ; q++)
        if (s->t_mask[j] & (1 << q)) s->queue[q][s->qt[q]++] = j;
}

static void item_end(Sim *s, Py_ssize_t k) {   /* R7 */
    s->running = 0;
    s->head = k + 1;
    s->ready_at = s->now;
    s->data_ready = 0;
    s->last_compute_end = s->now;
    s->mem -= s->workspace[k];
    for (int32_t i = s->free_off[k]; i < s->free_off[k + 1]; i++) {
        int32_t t = s->free_idx[i];
        if (s->in_flight[t]) s->dead_pending[t] = 1;
        else { free_tensor(s, t); tier_release(s, t); }
    }
    for (int32_t i = s->rel_off[k]; i < s->rel_off[k + 1]; i++) {
        int32_t j = s->rel_idx[i];
        if (s->ended[j]) free_tensor(s, s->t_tensor[j]);
    }
    for (int32_t i = s->act_off[k]; i < s->act_off[k + 1]; i++) {
        int32_t code = s->act_code[i];
        if (code >= 0) { enqueue(s, code); continue; }
        int32_t d = -code - 1;
        for (int32_t x = s->drop_off[d]; x < s->drop_off[d + 1]; x++)
            if (!s->ended[s->drop_idx[x]]) { s->status = NOT_OK; return; }   /* R14 */
        free_tensor(s, s->drop_tensor[d]);
    }
}

static void transfer_end(Sim *s, int32_t j) {
    s->ended[j] = 1;
    if (s->now > s->last_transfer_end) s->last_transfer_end = s->now;
    for (int q = 0; q < NQ; q++)
        if (s->t_mask[j] & (1 << q)) s->busy[s->res_of[q]] = 0;
    if (s->t_kind[j] == 0) {
        int32_t t = s->t_tensor[j];
        s->in_flight[t] -= 1;
        if (s->t_last_reader[j] < s->head) free_tensor(s, t);
        if (s->dead_pending[t] && !s->in_flight[t]) {
            s->dead_pending[t] = 0;
            free_tensor(s, t);
            tier_release(s, t);
        }
    }
}

static void try_compute(Sim *s) {   /* R6 */
    if (s->running || s->head >= s->n_items) return;
    Py_ssize_t k = s->head;
    int32_t rec = s->recomputed[k];
    if (!s->data_ready) {
        for (int32_t i = s->wait_off[k]; i < s->wait_off[k + 1]; i++)
            if (!s->ended[s->wait_idx[i]]) return;
        if (rec >= 0 && s->on_gpu[rec]) return;   /* R15 */
        s->data_ready = 1;
        s->data_ready_at = s->now;
    }
    if (s->mem + s->alloc_bytes[k] > s->budget) return;
    double data_wait = s->data_ready_at - s->ready_at;
    double memory_wait = s->now - s->data_ready_at;
    if (data_wait > 0 || memory_wait > 0) {
        s->stall_data += data_wait;
        s->stall_memory += memory_wait;
        s->item_stall[2 * k] += data_wait;
        s->item_stall[2 * k + 1] += memory_wait;
    }
    for (int32_t i = s->alloc_off[k]; i < s->alloc_off[k + 1]; i++) {
        int32_t t = s->alloc_idx[i];
        s->on_gpu[t] = 1;
        s->mem += s->tensor_bytes[t];
    }
    s->mem += s->workspace[k];
    note_peak(s);
    s->running = 1;
    s->compute_us += s->time_us[k];
    if (rec >= 0) s->recompute_us += s->time_us[k];
    push_event(s, s->now + s->time_us[k], -1);
}

static void try_transfers(Sim *s) {   /* R9, R12, R17, R18 */
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
    for (int a = 1; a < n; a++) {   /* enqueue order */
        int32_t j = heads[a];
        int b = a - 1;
        while (b >= 0 && s->seq[heads[b]] > s->seq[j]) { heads[b + 1] = heads[b]; b--; }
        heads[b + 1] = j;
    }
    for (int x = 0; x < n; x++) {
        int32_t j = heads[x];
        int ready = 1;
        for (int q = 0; q < NQ; q++) {
            if (!(s->t_mask[j] & (1 << q))) continue;
            if (s->qh[q] >= s->qt[q] || s->queue[q][s->qh[q]] != j || s->busy[s->res_of[q]]) ready = 0;
        }
        if (!ready) continue;
        int32_t t = s->t_tensor[j];
        if (s->t_kind[j] == 1) {
            if (s->t_source[j] >= 0 && !s->ended[s->t_source[j]]) continue;
            if (s->on_gpu[t] || s->mem + s->t_bytes[j] > s->budget) continue;
            s->on_gpu[t] = 1;
            s->mem += s->tensor_bytes[t];
            note_peak(s);
        } else {
            if (!tier_take(s, t, s->t_tier[j])) { s->status = NOT_OK; return; }
            s->in_flight[t] += 1;
        }
        for (int q = 0; q < NQ; q++) {
            if (!(s->t_mask[j] & (1 << q))) continue;
            s->qh[q] += 1;
            s->busy[s->res_of[q]] = 1;
            s->bytes_on[q] += s->t_bytes[j];
            s->busy_us[q] += s->t_duration[j];
        }
        push_event(s, s->now + s->t_duration[j], j);
    }
}

static void step(Sim *s) {
    try_compute(s);
    if (s->status == OK) try_transfers(s);
}

/* Group (item, value) pairs by item, keeping their order within an item. */
static int build_csr(Py_ssize_t n, const int32_t *items, const int32_t *values, Py_ssize_t count,
                     int32_t **off_out, int32_t **idx_out) {
    int32_t *off = calloc((size_t)n + 2, sizeof(int32_t));
    int32_t *idx = malloc(((size_t)count + 1) * sizeof(int32_t));
    int32_t *fill = calloc((size_t)n + 1, sizeof(int32_t));
    if (!off || !idx || !fill) { free(off); free(idx); free(fill); return 0; }
    for (Py_ssize_t i = 0; i < count; i++) off[items[i] + 1] += 1;
    for (Py_ssize_t k = 0; k < n; k++) off[k + 1] += off[k];
    for (Py_ssize_t i = 0; i < count; i++) {
        int32_t k = items[i];
        idx[off[k] + fill[k]++] = values[i];
    }
    free(fill);
    *off_out = off;
    *idx_out = idx;
    return 1;
}

static void simulate(Sim *s, const int32_t *start_codes, Py_ssize_t n_start,
                     const int32_t *initial_gpu, Py_ssize_t n_initial,
                     const int32_t *copy_tensor, const int8_t *copy_tier, Py_ssize_t n_copies) {
    for (Py_ssize_t i = 0; i < n_initial; i++) {
        s->on_gpu[initial_gpu[i]] = 1;
        s->mem += s->tensor_bytes[initial_gpu[i]];
    }
    s->peak = s->mem;
    if (s->mem > s->budget) { s->status = NOT_OK; return; }   /* R10 at start */
    for (Py_ssize_t i = 0; i < n_copies; i++)
        if (!tier_take(s, copy_tensor[i], copy_tier[i])) { s->status = NOT_OK; return; }
    for (Py_ssize_t i = 0; i < n_start; i++) enqueue(s, start_codes[i]);
    step(s);
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
    if (s->status != OK) return;
    if (s->head < s->n_items) { s->status = NOT_OK; return; }   /* R10 */
    for (int q = 0; q < NQ; q++) if (s->qh[q] < s->qt[q]) { s->status = NOT_OK; return; }
}

/* Buffers passed from Python (array.array), checked for item size and length. */
typedef struct { Py_buffer view; int held; } Buf;

static int get_buf(PyObject *obj, Buf *b, Py_ssize_t itemsize, Py_ssize_t min_len, const char *name) {
    if (PyObject_GetBuffer(obj, &b->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return 0;
    b->held = 1;
    if (b->view.itemsize != itemsize || b->view.len / itemsize < min_len) {
        PyErr_Format(PyExc_ValueError, "_fastsim: buffer %s has the wrong item size or length", name);
        return 0;
    }
    return 1;
}

#define NBUF 30

static PyObject *fastsim_run(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *objs[NBUF];
    Py_ssize_t n_items, n_transfers, n_tensors, n_drops;
    long long budget, cap_host, cap_ssd;
    int half;
    if (!PyArg_ParseTuple(args, "nnnnLLLiOOOOOOOOOOOOOOOOOOOOOOOOOOOOOO",
                          &n_items, &n_transfers, &n_tensors, &n_drops, &budget, &cap_host, &cap_ssd, &half,
                          &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &objs[6], &objs[7],
                          &objs[8], &objs[9], &objs[10], &objs[11], &objs[12], &objs[13], &objs[14],
                          &objs[15], &objs[16], &objs[17], &objs[18], &objs[19], &objs[20], &objs[21],
                          &objs[22], &objs[23], &objs[24], &objs[25], &objs[26], &objs[27], &objs[28],
                          &objs[29]))
        return NULL;
    Buf b[NBUF];
    memset(b, 0, sizeof(b));
    /* each buffer's name, item size and minimum length */
    static const char *names[NBUF] = {
        "tensor_bytes", "alloc_bytes", "workspace", "time_us", "recomputed", "alloc_off", "alloc_idx",
        "free_off", "free_idx", "wait_item", "wait_idx", "rel_item", "rel_idx", "act_item", "act_code",
        "t_kind", "t_tensor", "t_source", "t_last_reader", "t_mask", "t_tier", "t_bytes", "t_duration",
        "drop_tensor", "drop_off", "drop_idx", "start_codes", "initial_gpu", "copy_tensor", "copy_tier"};
    const Py_ssize_t sizes[NBUF] = {8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 1, 4, 4, 4, 1, 1, 8, 8,
                                    4, 4, 4, 4, 4, 4, 1};
    const Py_ssize_t mins[NBUF] = {n_tensors, n_items, n_items, n_items, n_items, n_items + 1, 0,
                                   n_items + 1, 0, 0, 0, 0, 0, 0, 0,
                                   n_transfers, n_transfers, n_transfers, n_transfers, n_transfers,
                                   n_transfers, n_transfers, n_transfers, n_drops, n_drops + 1, 0,
                                   0, 0, 0, 0};
    PyObject *result = NULL;
    Sim s;
    memset(&s, 0, sizeof(s));
    for (int i = 0; i < NBUF; i++)
        if (!get_buf(objs[i], &b[i], sizes[i], mins[i], names[i])) goto done;

    s.n_items = n_items; s.n_transfers = n_transfers; s.n_tensors = n_tensors;
    s.tensor_bytes = b[0].view.buf; s.alloc_bytes = b[1].view.buf; s.workspace = b[2].view.buf;
    s.time_us = b[3].view.buf; s.recomputed = b[4].view.buf;
    s.alloc_off = b[5].view.buf; s.alloc_idx = b[6].view.buf;
    s.free_off = b[7].view.buf; s.free_idx = b[8].view.buf;
    int32_t *wait_off = NULL, *wait_idx = NULL, *rel_off = NULL, *rel_idx = NULL, *act_off = NULL, *act_idx = NULL;
    s.t_kind = b[15].view.buf; s.t_tensor = b[16].view.buf; s.t_source = b[17].view.buf;
    s.t_last_reader = b[18].view.buf; s.t_mask = b[19].view.buf; s.t_tier = b[20].view.buf;
    s.t_bytes = b[21].view.buf; s.t_duration = b[22].view.buf;
    s.drop_tensor = b[23].view.buf; s.drop_off = b[24].view.buf; s.drop_idx = b[25].view.buf;
    s.budget = budget; s.capacity[0] = cap_host; s.capacity[1] = cap_ssd;
    s.half_duplex = half;
    s.res_of[Q_H2D] = half ? 0 : Q_H2D;
    s.res_of[Q_D2H] = half ? 0 : Q_D2H;
    s.res_of[Q_SSD_READ] = Q_SSD_READ;
    s.res_of[Q_SSD_WRITE] = Q_SSD_WRITE;

    s.on_gpu = calloc((size_t)n_tensors + 1, 1);
    s.dead_pending = calloc((size_t)n_tensors + 1, 1);
    s.tier_space = calloc((size_t)n_tensors + 1, 1);
    s.in_flight = calloc((size_t)n_tensors + 1, sizeof(int32_t));
    s.seq = calloc((size_t)n_transfers + 1, sizeof(int64_t));
    s.ended = calloc((size_t)n_transfers + 1, 1);
    s.item_stall = calloc(2 * (size_t)n_items + 2, sizeof(double));
    int ok = s.on_gpu && s.dead_pending && s.tier_space && s.in_flight && s.seq && s.ended && s.item_stall;
    for (int q = 0; q < NQ; q++) {
        s.queue[q] = calloc((size_t)n_transfers + 1, sizeof(int32_t));
        ok = ok && s.queue[q];
    }
    for (int i = 9; i <= 13; i += 2) {
        if (b[i].view.len != b[i + 1].view.len) {
            PyErr_Format(PyExc_ValueError, "_fastsim: %s and %s differ in length", names[i], names[i + 1]);
            goto cleanup;
        }
        const int32_t *items = b[i].view.buf;
        for (Py_ssize_t x = 0; x < b[i].view.len / 4; x++)
            if (items[x] < 0 || items[x] >= n_items) {
                PyErr_Format(PyExc_ValueError, "_fastsim: %s holds an item out of range", names[i]);
                goto cleanup;
            }
    }
    ok = ok && build_csr(n_items, b[9].view.buf, b[10].view.buf, b[9].view.len / 4, &wait_off, &wait_idx)
            && build_csr(n_items, b[11].view.buf, b[12].view.buf, b[11].view.len / 4, &rel_off, &rel_idx)
            && build_csr(n_items, b[13].view.buf, b[14].view.buf, b[13].view.len / 4, &act_off, &act_idx);
    if (!ok) { PyErr_NoMemory(); goto cleanup; }
    s.wait_off = wait_off; s.wait_idx = wait_idx;
    s.rel_off = rel_off; s.rel_idx = rel_idx;
    s.act_off = act_off; s.act_code = act_idx;

    Py_BEGIN_ALLOW_THREADS
    simulate(&s, b[26].view.buf, b[26].view.len / 4, b[27].view.buf, b[27].view.len / 4,
             b[28].view.buf, b[29].view.buf, b[29].view.len);
    Py_END_ALLOW_THREADS

    {
        PyObject *stalls = PyBytes_FromStringAndSize((const char *)s.item_stall,
                                                     (Py_ssize_t)(2 * n_items * sizeof(double)));
        if (stalls == NULL) goto cleanup;
        result = Py_BuildValue("(iddddddddLLLLLddddLLN)", s.status, s.now, s.last_compute_end,
                               s.last_transfer_end, s.compute_us, s.recompute_us, s.stall_data,
                               s.stall_memory, s.peak_at, (long long)s.peak,
                               (long long)s.bytes_on[0], (long long)s.bytes_on[1], (long long)s.bytes_on[2],
                               (long long)s.bytes_on[3], s.busy_us[0], s.busy_us[1], s.busy_us[2],
                               s.busy_us[3], (long long)s.tier_peak[0], (long long)s.tier_peak[1], stalls);
    }
cleanup:
    free(wait_off); free(wait_idx); free(rel_off); free(rel_idx); free(act_off); free(act_idx);
    free(s.on_gpu); free(s.dead_pending); free(s.tier_space); free(s.in_flight);
    free(s.seq); free(s.ended); free(s.item_stall);
    for (int q = 0; q < NQ; q++) free(s.queue[q]);
done:
    for (int i = 0; i < NBUF; i++) if (b[i].held) PyBuffer_Release(&b[i].view);
    return result;
}

static PyMethodDef methods[] = {
    {"run", fastsim_run, METH_VARARGS, "Run one packed simulation (see simulator/fastpath.py)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastsim",
                                    "The simulator's run loop in C (simulator/fastpath.py packs its input).",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastsim(void) { return PyModule_Create(&module); }
