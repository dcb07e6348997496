/* The editor's hottest calls in C: one decoding step of the embedded model, and the workspace
 * memory's suffix-array searches (at the end of this file).
 *
 * One decoding step in one call.
 *
 * ``lean.decode_one`` (and its TorchScript form) computes a token's logits in about 1,300 tensor
 * operations, and on the embedded model (hidden 192) each costs more in dispatch than in arithmetic.
 * Here the same step is plain loops over the same fp32 weights (the model's own tensors, read in
 * place, never copied): the RMS norms, the fused projections, the absorbed multi-latent attention
 * over every cached key, RoPE, the router's choice (sigmoid scores, correction bias, groups), the
 * chosen and shared experts, the final norm and the output head. It writes the same cache rows
 * (latents and the indexer's keys) and so may alternate with the other paths at any token.
 *
 * It covers the case the editor runs: one token of one sequence whose every key is attended (DSA's
 * top-k holds them all, or attention is dense), no statistics' probe. ``native.py`` checks that and
 * falls back to the scripted path otherwise. The sums run in another order than torch's, so logits
 * agree to rounding (tests: 1e-4), not bit for bit.
 *
 * Built as an optional extension (``setup.py``); a compiler-less install runs the scripted path.
 * The inner products are compiled for AVX-512, AVX2 and plain x86-64, chosen at load (GCC's
 * ``target_clones``), elsewhere for the compiler's default target.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define CLONES __attribute__((target_clones("avx512f", "avx2,fma", "default")))
#else
#define CLONES
#endif

/* Per layer: pointers to the weights (fp32, row-major, contiguous) and the cache rows. */
typedef struct {
    const float *in_norm, *post_norm;
    float in_eps, post_eps;
    const float *w_x;    /* [q_lora + kv_rank + rope (+ i_dim + i_heads), hidden] */
    const float *q_norm; /* [q_lora] */
    float q_eps;
    const float *kv_norm; /* [kv_rank] */
    float kv_eps;
    const float *q_b;    /* [heads * q_dim, q_lora] */
    const float *w_uk;   /* [heads, nope, kv_rank] */
    const float *w_uv_t; /* [heads, kv_rank, v_dim] */
    const float *o_proj; /* [hidden, heads * v_dim] */
    int64_t has_index;
    const float *ik_w, *ik_b; /* [i_dim] */
    float ik_eps;
    int64_t is_moe;
    const float *gate_w, *up_w, *down_w; /* dense MLP or shared experts: [I, hidden], [I, hidden], [hidden, I] */
    int64_t inter;
    const float *router_w, *router_bias; /* [E, hidden], [E] */
    const float *gate_up, *down;         /* [E, 2 * Ie, hidden], [E, hidden, Ie] */
    float *latents;                      /* cache rows [capacity, kv_rank + rope] */
    float *index_keys;                   /* cache rows [capacity, i_dim] (full layers) */
} Layer;

typedef struct {
    int64_t hidden, heads, nope, rope, kv_rank, v_dim, q_lora, i_dim, i_heads;
    int64_t n_layers, vocab, n_experts, top_k, n_group, topk_group, norm_topk_prob, moe_inter;
    float scaling, attn_scale;
    const float *embed, *norm_w, *lm_head;
    float norm_eps;
    Layer *layers;
    float *scratch; /* at least glm5_scratch_floats() floats */
} Model;

/* ---- kernels ------------------------------------------------------------------------------------ */

/* y[r] = W[r, :] . x for r < rows (W [rows, cols]); sixteen partial sums a row, so the loop
   vectorises without reassociating one running sum. */
CLONES static void matvec(const float *restrict w, const float *restrict x, float *restrict y, int64_t rows,
                          int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *row = w + r * cols;
        float acc[16] = {0};
        int64_t c = 0;
        for (; c + 16 <= cols; c += 16)
            for (int k = 0; k < 16; k++) acc[k] += row[c + k] * x[c + k];
        float s = 0.0f;
        for (; c < cols; c++) s += row[c] * x[c];
        for (int k = 0; k < 16; k++) s += acc[k];
        y[r] = s;
    }
}

/* y[:] = x @ W for W [rows, cols] (y has cols entries): rows of W scaled and added. */
CLONES static void vecmat(const float *restrict x, const float *restrict w, float *restrict y, int64_t rows,
                          int64_t cols) {
    memset(y, 0, (size_t)cols * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        const float a = x[r];
        const float *row = w + r * cols;
        for (int64_t c = 0; c < cols; c++) y[c] += a * row[c];
    }
}

static void rms_norm(const float *x, const float *w, float eps, float *out, int64_t n) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const float scale = (float)(1.0 / sqrt(ss / (double)n + eps));
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * w[i] * scale;
}

static void layer_norm(const float *x, const float *w, const float *b, float eps, float *out, int64_t n) {
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < n; i++) mean += x[i];
    mean /= (double)n;
    for (int64_t i = 0; i < n; i++) var += ((double)x[i] - mean) * ((double)x[i] - mean);
    const double inv = 1.0 / sqrt(var / (double)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = (float)(((double)x[i] - mean) * inv) * w[i] + b[i];
}

/* Interleaved pairs rotated, written as the rotated even slots then the rotated odd ones
   (``attention.apply_rope``'s layout). */
static void rope(const float *x, const float *cos_, const float *sin_, float *out, int64_t r) {
    const int64_t half = r / 2;
    for (int64_t j = 0; j < half; j++) {
        const float a = x[2 * j], b = x[2 * j + 1];
        out[j] = a * cos_[j] - b * sin_[j];
        out[half + j] = b * cos_[j] + a * sin_[j];
    }
}

static inline float silu(float v) { return v / (1.0f + expf(-v)); }
static inline float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

/* silu(gate) * up, then down: a SwiGLU MLP on ``h`` added (scaled) into ``out``. */
static void swiglu_add(const float *gate_w, const float *up_w, const float *down_w, int64_t inter, int64_t hidden,
                       const float *h, float scale, float *tmp, float *out) {
    float *g = tmp, *u = tmp + inter, *y = tmp + 2 * inter;
    matvec(gate_w, h, g, inter, hidden);
    matvec(up_w, h, u, inter, hidden);
    for (int64_t i = 0; i < inter; i++) g[i] = silu(g[i]) * u[i];
    matvec(down_w, g, y, hidden, inter);
    for (int64_t i = 0; i < hidden; i++) out[i] += scale * y[i];
}

/* ``Router.choose`` for one row: the chosen experts (largest first, the first of equal ones first)
   and their weights. */
static int64_t route(const Model *m, const float *scores, const float *bias, int64_t *chosen, float *weights,
                     float *choice) {
    const int64_t e_n = m->n_experts, k = m->top_k;
    for (int64_t e = 0; e < e_n; e++) choice[e] = scores[e] + bias[e];
    if (m->n_group > 1) {
        const int64_t per = e_n / m->n_group;
        float group_score[64];
        int keep[64] = {0};
        for (int64_t g = 0; g < m->n_group; g++) {
            float best = -INFINITY, second = -INFINITY;
            for (int64_t j = 0; j < per; j++) {
                const float v = choice[g * per + j];
                if (v > best) {
                    second = best;
                    best = v;
                } else if (v > second) {
                    second = v;
                }
            }
            group_score[g] = per >= 2 ? best + second : best;
        }
        for (int64_t t = 0; t < m->topk_group; t++) {
            int64_t best = -1;
            for (int64_t g = 0; g < m->n_group; g++)
                if (!keep[g] && (best < 0 || group_score[g] > group_score[best])) best = g;
            keep[best] = 1;
        }
        for (int64_t e = 0; e < e_n; e++)
            if (!keep[e / per]) choice[e] = -INFINITY;
    }
    int taken[256] = {0};
    int64_t n = 0;
    for (int64_t t = 0; t < k && t < e_n; t++) {
        int64_t best = -1;
        for (int64_t e = 0; e < e_n; e++)
            if (!taken[e] && (best < 0 || choice[e] > choice[best])) best = e;
        taken[best] = 1;
        chosen[n++] = best;
    }
    float total = 0.0f;
    for (int64_t t = 0; t < n; t++) {
        weights[t] = scores[chosen[t]];
        total += weights[t];
    }
    for (int64_t t = 0; t < n; t++) {
        if (m->norm_topk_prob) weights[t] = weights[t] / (total + 1e-20f);
        weights[t] *= m->scaling;
    }
    return n;
}

/* ---- the step ----------------------------------------------------------------------------------- */

/* The widest MLP's intermediate size (routed experts, shared experts, dense MLPs). */
static int64_t max_inter(const Model *m) {
    int64_t inter = m->moe_inter;
    for (int64_t i = 0; i < m->n_layers; i++)
        if (m->layers[i].inter > inter) inter = m->layers[i].inter;
    return inter;
}

/* Floats of scratch a step needs (``Model.scratch``), with room for ``capacity`` keys. */
static int64_t scratch_floats(const Model *m, int64_t capacity) {
    const int64_t q_rows = m->heads * (m->nope + m->rope);
    const int64_t wide = m->q_lora + m->kv_rank + m->rope + m->i_dim + m->i_heads;
    return 3 * m->hidden + wide + m->q_lora + q_rows + m->i_dim + m->heads * (m->kv_rank + m->rope) +
           m->heads * m->kv_rank + m->heads * m->v_dim + capacity + (2 * max_inter(m) + m->hidden) +
           3 * m->n_experts + 16;
}

static void step(const Model *m, int64_t token, int64_t pos, const float *cos_, const float *sin_, float *logits) {
    const int64_t hd = m->hidden, heads = m->heads, nope = m->nope, r = m->rope, kvr = m->kv_rank;
    const int64_t q_dim = nope + r, lat_w = kvr + r, kend = pos + 1;
    float *s = m->scratch;
    float *x = s; s += hd;
    float *h = s; s += hd;
    float *acc = s; s += hd;
    float *parts = s; s += m->q_lora + kvr + r + m->i_dim + m->i_heads;
    float *qn = s; s += m->q_lora;
    float *q = s; s += heads * q_dim;
    float *ik = s; s += m->i_dim;
    float *q_cat = s; s += heads * lat_w;
    float *o_lat = s; s += heads * kvr;
    float *out = s; s += heads * m->v_dim;
    float *probs = s; s += kend;
    float *tmp = s; /* the MLPs' temporaries, then the router's */

    memcpy(x, m->embed + token * hd, (size_t)hd * sizeof(float));
    for (int64_t li = 0; li < m->n_layers; li++) {
        const Layer *L = &m->layers[li];
        /* attention */
        rms_norm(x, L->in_norm, L->in_eps, h, hd);
        const int64_t wide = m->q_lora + kvr + r + (L->has_index ? m->i_dim + m->i_heads : 0);
        matvec(L->w_x, h, parts, wide, hd);
        const float *q_latent = parts, *kv_latent = parts + m->q_lora, *rope_key = kv_latent + kvr;
        rms_norm(q_latent, L->q_norm, L->q_eps, qn, m->q_lora);
        matvec(L->q_b, qn, q, heads * q_dim, m->q_lora);

        float *row = L->latents + pos * lat_w;
        rms_norm(kv_latent, L->kv_norm, L->kv_eps, row, kvr);
        rope(rope_key, cos_, sin_, row + kvr, r);
        if (L->has_index) {
            layer_norm(rope_key + r, L->ik_w, L->ik_b, L->ik_eps, ik, m->i_dim);
            float *keys = L->index_keys + pos * m->i_dim;
            rope(ik, cos_, sin_, keys, r);
            memcpy(keys + r, ik + r, (size_t)(m->i_dim - r) * sizeof(float));
        }
        for (int64_t hh = 0; hh < heads; hh++) {
            const float *qh = q + hh * q_dim;
            float *qc = q_cat + hh * lat_w;
            vecmat(qh, L->w_uk + hh * nope * kvr, qc, nope, kvr); /* q_nope @ w_uk[h] */
            rope(qh + nope, cos_, sin_, qc + kvr, r);
        }
        for (int64_t hh = 0; hh < heads; hh++) {
            const float *qc = q_cat + hh * lat_w;
            matvec(L->latents, qc, probs, kend, lat_w);
            float mx = -INFINITY;
            for (int64_t t = 0; t < kend; t++) {
                probs[t] *= m->attn_scale;
                if (probs[t] > mx) mx = probs[t];
            }
            float total = 0.0f;
            for (int64_t t = 0; t < kend; t++) {
                probs[t] = expf(probs[t] - mx);
                total += probs[t];
            }
            const float inv = 1.0f / total;
            for (int64_t t = 0; t < kend; t++) probs[t] *= inv;
            float *ol = o_lat + hh * kvr;
            memset(ol, 0, (size_t)kvr * sizeof(float));
            for (int64_t t = 0; t < kend; t++) {
                const float p = probs[t];
                const float *lat = L->latents + t * lat_w;
                for (int64_t c = 0; c < kvr; c++) ol[c] += p * lat[c];
            }
            vecmat(ol, L->w_uv_t + hh * kvr * m->v_dim, out + hh * m->v_dim, kvr, m->v_dim);
        }
        matvec(L->o_proj, out, acc, hd, heads * m->v_dim);
        for (int64_t i = 0; i < hd; i++) x[i] += acc[i];

        /* MLP or MoE */
        rms_norm(x, L->post_norm, L->post_eps, h, hd);
        memset(acc, 0, (size_t)hd * sizeof(float));
        if (L->is_moe) {
            const int64_t ie = m->moe_inter, e_n = m->n_experts;
            float *scores = tmp + 2 * max_inter(m) + hd;
            float *choice = scores + e_n;
            float *weights = choice + e_n;
            int64_t chosen[256];
            matvec(L->router_w, h, scores, e_n, hd);
            for (int64_t e = 0; e < e_n; e++) scores[e] = sigmoid(scores[e]);
            const int64_t n = route(m, scores, L->router_bias, chosen, weights, choice);
            for (int64_t t = 0; t < n; t++) {
                const float *gu = L->gate_up + chosen[t] * 2 * ie * hd;
                swiglu_add(gu, gu + ie * hd, L->down + chosen[t] * hd * ie, ie, hd, h, weights[t], tmp, acc);
            }
        }
        swiglu_add(L->gate_w, L->up_w, L->down_w, L->inter, hd, h, 1.0f, tmp, acc);
        for (int64_t i = 0; i < hd; i++) x[i] += acc[i];
    }
    rms_norm(x, m->norm_w, m->norm_eps, h, hd);
    matvec(m->lm_head, h, logits, m->vocab, hd);
}

/* ---- suffix-array ranges (the workspace memory's ``SuffixIndex.narrow`` and ``find``) -------------- */

/* A shard's ids (unsigned, 1, 2 or 4 bytes) and suffix array (signed, 4 or 8 bytes), read in place. */
typedef struct {
    const void *tokens, *sa;
    int64_t n;
    int tokens_size, sa_size;
} Shard;

static inline int64_t token_at(const Shard *s, int64_t i) {
    if (i >= s->n) return -1; /* past the end: below every id (no suffix of a valid pattern gets here) */
    switch (s->tokens_size) {
    case 1: return ((const uint8_t *)s->tokens)[i];
    case 2: return ((const uint16_t *)s->tokens)[i];
    default: return ((const uint32_t *)s->tokens)[i];
    }
}

static inline int64_t suffix_at(const Shard *s, int64_t i) {
    return s->sa_size == 4 ? ((const int32_t *)s->sa)[i] : ((const int64_t *)s->sa)[i];
}

/* Of the suffixes sa[lo:hi] (sharing their first ``depth`` ids), those whose next id is ``token``. */
static void narrow_range(const Shard *s, int64_t *lo, int64_t *hi, int64_t depth, int64_t token) {
    int64_t a = *lo, b = *hi;
    while (a < b) { /* the first whose id at depth is >= token */
        const int64_t mid = a + ((b - a) >> 1);
        if (token_at(s, suffix_at(s, mid) + depth) < token) a = mid + 1;
        else b = mid;
    }
    const int64_t start = a;
    b = *hi;
    while (a < b) { /* the first whose id at depth is > token */
        const int64_t mid = a + ((b - a) >> 1);
        if (token_at(s, suffix_at(s, mid) + depth) <= token) a = mid + 1;
        else b = mid;
    }
    *lo = start;
    *hi = a;
}

static int read_shard(PyObject *const *args, Shard *s) {
    long long v[5];
    for (int i = 0; i < 5; i++) {
        v[i] = PyLong_AsLongLong(args[i]);
        if (v[i] == -1 && PyErr_Occurred()) return -1;
    }
    s->tokens = (const void *)(intptr_t)v[0];
    s->tokens_size = (int)v[1];
    s->n = v[2];
    s->sa = (const void *)(intptr_t)v[3];
    s->sa_size = (int)v[4];
    if (!s->tokens || !s->sa || (s->tokens_size != 1 && s->tokens_size != 2 && s->tokens_size != 4) ||
        (s->sa_size != 4 && s->sa_size != 8) || s->n < 0) {
        PyErr_SetString(PyExc_ValueError, "not a shard: ids of 1, 2 or 4 bytes and a suffix array of 4 or 8");
        return -1;
    }
    return 0;
}

/* sa_find(tokens, tokens_size, n, sa, sa_size, lo, hi, depth, pattern, count) -> (lo, hi): the
   suffixes of sa[lo:hi] (sharing ``depth`` ids already) narrowed by the ``count`` int64 ids at
   address ``pattern``, one depth each. */
static PyObject *py_sa_find(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "sa_find() takes 10 integer arguments");
        return NULL;
    }
    Shard s;
    if (read_shard(args, &s) < 0) return NULL;
    long long v[5];
    for (int i = 0; i < 5; i++) {
        v[i] = PyLong_AsLongLong(args[5 + i]);
        if (v[i] == -1 && PyErr_Occurred()) return NULL;
    }
    int64_t lo = v[0], hi = v[1], depth = v[2];
    const int64_t *pattern = (const int64_t *)(intptr_t)v[3];
    const int64_t count = v[4];
    if (lo < 0 || hi > s.n || depth < 0 || count < 0 || (count && !pattern)) {
        PyErr_SetString(PyExc_ValueError, "sa_find(): a range or pattern out of bounds");
        return NULL;
    }
    for (int64_t i = 0; i < count && lo < hi; i++) narrow_range(&s, &lo, &hi, depth + i, pattern[i]);
    if (hi < lo) hi = lo;
    return Py_BuildValue("(LL)", (long long)lo, (long long)hi);
}

/* sa_narrow(tokens, tokens_size, n, sa, sa_size, lo, hi, depth, token) -> (lo, hi). */
static PyObject *py_sa_narrow(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "sa_narrow() takes 9 integer arguments");
        return NULL;
    }
    Shard s;
    if (read_shard(args, &s) < 0) return NULL;
    long long v[4];
    for (int i = 0; i < 4; i++) {
        v[i] = PyLong_AsLongLong(args[5 + i]);
        if (v[i] == -1 && PyErr_Occurred()) return NULL;
    }
    int64_t lo = v[0], hi = v[1];
    if (lo < 0 || hi > s.n || v[2] < 0) {
        PyErr_SetString(PyExc_ValueError, "sa_narrow(): a range out of bounds");
        return NULL;
    }
    if (lo < hi) narrow_range(&s, &lo, &hi, v[2], v[3]);
    else hi = lo;
    return Py_BuildValue("(LL)", (long long)lo, (long long)hi);
}

/* ---- the module --------------------------------------------------------------------------------- */

/* decode(model_address, token, pos, cos_address, sin_address, logits_address): the step above on a
   ``Model`` that ``native.py`` built with ctypes (its address as an int). Runs without the
   interpreter lock. */
static PyObject *py_decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "decode() takes 6 integer arguments");
        return NULL;
    }
    long long v[6];
    for (int i = 0; i < 6; i++) {
        v[i] = PyLong_AsLongLong(args[i]);
        if (v[i] == -1 && PyErr_Occurred()) return NULL;
    }
    const Model *m = (const Model *)(intptr_t)v[0];
    if (m == NULL || v[1] < 0 || v[1] >= m->vocab || v[2] < 0) {
        PyErr_SetString(PyExc_ValueError, "decode(): no model, or a token or position out of range");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    step(m, v[1], v[2], (const float *)(intptr_t)v[3], (const float *)(intptr_t)v[4], (float *)(intptr_t)v[5]);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* scratch_floats(model_address, capacity): floats of scratch a step needs. */
static PyObject *py_scratch_floats(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "scratch_floats() takes 2 integer arguments");
        return NULL;
    }
    const long long address = PyLong_AsLongLong(args[0]);
    const long long capacity = PyLong_AsLongLong(args[1]);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromLongLong(scratch_floats((const Model *)(intptr_t)address, capacity));
}

/* The sizes of the two structs, so the ctypes side can check its layout against this build's. */
static PyObject *py_layout(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return Py_BuildValue("(nn)", (Py_ssize_t)sizeof(Model), (Py_ssize_t)sizeof(Layer));
}

static PyMethodDef methods[] = {
    {"decode", (PyCFunction)(void (*)(void))py_decode, METH_FASTCALL, "One decoding step (see native.c)."},
    {"scratch_floats", (PyCFunction)(void (*)(void))py_scratch_floats, METH_FASTCALL, "Scratch a step needs."},
    {"layout", py_layout, METH_NOARGS, "sizeof(Model), sizeof(Layer)."},
    {"sa_find", (PyCFunction)(void (*)(void))py_sa_find, METH_FASTCALL, "A suffix-array range narrowed by ids."},
    {"sa_narrow", (PyCFunction)(void (*)(void))py_sa_narrow, METH_FASTCALL, "A suffix-array range narrowed by one id."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "glm5-lsp's native decoding step.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
