/* The editor's hottest calls in C: the embedded model's forward pass for a decoding step, a prompt's
 * prefill or a draft's verification, and the workspace memory's suffix-array searches (at the end of
 * this file).
 *
 * Under TorchScript a decoding step of the embedded model is about 1,300 tensor operations, each
 * costing more in dispatch than in arithmetic. Here ``forward`` computes a call of ``t`` tokens as
 * plain loops over the same fp32 weights (the model's own tensors, read in place, never copied):
 * the RMS norms, the fused projections, RoPE, DSA's choice of keys past the top-k (the indexer's
 * scores with the attention policy's key bias), the absorbed multi-latent attention of each row over
 * its keys, the router's choice (sigmoid scores, correction bias, groups), the chosen and shared
 * experts, the final norm and the output head for the last row (or every row: a draft's
 * verification). It writes the same cache rows (latents and the indexer's keys) as the other paths,
 * which may take over at any token.
 *
 * One row (a decoding step) reads each weight once with dot products: the read is the step's whole
 * cost. Several rows (a prefill, a verification) use copies of the weights in panels of 32 outputs
 * (``native.py`` makes them) and outer products, four rows and a panel at a time, with no sums across
 * vector lanes.
 *
 * It covers what the editor runs: one sequence (the error context's forced keys and rows included),
 * no statistics' probe;
 * ``native.py`` checks that and the scripted path runs otherwise. The sums run in another order than
 * torch's, so logits agree to rounding (tests: 1e-4), not bit for bit; of keys whose indexer scores
 * tie at the top-k's edge (all 0 after the ReLU, say) it keeps the first, where torch's top-k keeps
 * others. ``forward_start`` runs a call on a worker thread of this module's own, so a prompt's
 * prefill goes on while the caller's Python does.
 *
 * Built as an optional extension (``setup.py``); a compiler-less install runs the scripted path.
 * The kernels are compiled for AVX-512, AVX2 and plain x86-64, chosen at load (GCC's
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
    const float *iq_w; /* the indexer's queries [i_heads * i_dim, q_lora] (full layers) */
    int64_t is_moe;
    const float *gate_w, *up_w, *down_w; /* dense MLP or shared experts: [I, hidden], [I, hidden], [hidden, I] */
    int64_t inter;
    const float *router_w, *router_bias; /* [E, hidden], [E] */
    const float *gate_up, *down;         /* [E, 2 * Ie, hidden], [E, hidden, Ie] */
    float *latents;                      /* cache rows [capacity, kv_rank + rope] */
    float *index_keys;                   /* cache rows [capacity, i_dim] (full layers) */
    /* The same products' weights in panels (``linear_rows_t``; NULL: none), for several tokens at once. */
    const float *w_x_t, *q_b_t, *o_proj_t, *gate_t, *up_t, *down_t, *router_t;
    const float *gate_up_t, *down_e_t; /* per expert, its matrices' panels (each the size of the matrix) */
    const float *iq_w_t;
} Layer;

typedef struct {
    int64_t hidden, heads, nope, rope, kv_rank, v_dim, q_lora, i_dim, i_heads;
    int64_t n_layers, vocab, n_experts, top_k, n_group, topk_group, norm_topk_prob, moe_inter;
    float scaling, attn_scale, i_scale; /* i_scale: the indexer's per-head score scale */
    const float *embed, *norm_w, *lm_head;
    float norm_eps;
    Layer *layers;
    const float *lm_head_t; /* in panels (NULL: none), for several rows' logits */
} Model;

/* ---- kernels ------------------------------------------------------------------------------------ */

/* row . x with sixteen partial sums, so the loop vectorises without reassociating one running sum
   (inlined into each of its callers' clones). */
static inline __attribute__((always_inline)) float dot(const float *restrict row, const float *restrict x,
                                                       int64_t cols) {
    float acc[16] = {0};
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16)
        for (int k = 0; k < 16; k++) acc[k] += row[c + k] * x[c + k];
    float s = 0.0f;
    for (; c < cols; c++) s += row[c] * x[c];
    for (int k = 0; k < 16; k++) s += acc[k];
    return s;
}

/* y[r] = W[r, :] . x for r < rows (W [rows, cols]). */
CLONES static void matvec(const float *restrict w, const float *restrict x, float *restrict y, int64_t rows,
                          int64_t cols) {
    for (int64_t r = 0; r < rows; r++) y[r] = dot(w + r * cols, x, cols);
}

/* y[j] = W[sel[j], :] . x for j < n: ``matvec`` over the rows ``sel`` lists (DSA's selected keys). */
CLONES static void gathered_dots(const float *restrict w, const int64_t *restrict sel, const float *restrict x,
                                 float *restrict y, int64_t n, int64_t cols) {
    for (int64_t j = 0; j < n; j++) y[j] = dot(w + sel[j] * cols, x, cols);
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

static int64_t wide_max(const Model *m) { return m->q_lora + m->kv_rank + m->rope + m->i_dim + m->i_heads; }

#define KEY_BLOCK 128 /* keys scored at once for every selecting row (``index_scores_rows``) */

/* Queries padded to a multiple of 16 (``index_scores_rows``' panels: 32 wide, the last 16 or 32). */
static inline int64_t padded_queries(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* Floats of scratch a call of ``t`` tokens needs, with room for ``capacity`` keys and DSA selections
   of up to ``width`` keys a row (the top-k and the forced keys; 0: every key attended). */
static int64_t scratch_floats(const Model *m, int64_t t, int64_t capacity, int64_t width) {
    const int64_t q_rows = m->heads * (m->nope + m->rope), lat_w = m->kv_rank + m->rope;
    const int64_t k = m->top_k > 0 ? m->top_k : 1;
    const int64_t per_row = 5 * m->hidden + wide_max(m) + m->q_lora + q_rows + m->heads * m->v_dim +
                            2 * m->n_experts + k + 2 * m->n_experts /* int64 member lists */ + 3 * max_inter(m) +
                            m->i_heads * m->i_dim + 2 * width /* int64 selections */ + 2;
    const int64_t np = padded_queries(t * m->i_heads);
    const int64_t selecting = width ? 2 * t + 1 /* int64 rows, aligned */ + t * capacity + KEY_BLOCK * np + np * m->i_dim : 0;
    return t * per_row + 2 * m->n_experts /* int64 counts */ + m->heads * lat_w + m->heads * m->kv_rank + m->i_dim +
           (width ? 3 * capacity : capacity) + selecting + 64;
}

/* One panel's ``width`` outputs (32 or 16, a constant where it is inlined) of ``nr`` (1 to 4) rows of
   X: ``wp`` the panel ([cols, width], contiguous), ``y`` the first row's first output of the panel (row
   stride ``rows``). The sums are held in registers. */
static inline __attribute__((always_inline)) void outer_block(const float *restrict x0, int64_t cols,
                                                              const float *restrict wp, float *restrict y,
                                                              int64_t rows, const int nr, const int width) {
    float a[4][32] = {{0}};
    for (int64_t c = 0; c < cols; c++) {
        const float *wr = wp + c * width;
        for (int j = 0; j < nr; j++)
            for (int k = 0; k < width; k++) a[j][k] += x0[j * cols + c] * wr[k];
    }
    for (int j = 0; j < nr; j++) memcpy(y + j * rows, a[j], (size_t)width * sizeof(float));
}

/* One panel's outputs for every row of X: four rows at a time, then the last one to three. */
static inline __attribute__((always_inline)) void outer_panel(const float *restrict x, const float *restrict wp,
                                                              float *restrict y, int64_t t, int64_t rows,
                                                              int64_t cols, const int width) {
    int64_t i = 0;
    for (; i + 4 <= t; i += 4) outer_block(x + i * cols, cols, wp, y + i * rows, rows, 4, width);
    switch (t - i) {
    case 3: outer_block(x + i * cols, cols, wp, y + i * rows, rows, 3, width); break;
    case 2: outer_block(x + i * cols, cols, wp, y + i * rows, rows, 2, width); break;
    case 1: outer_block(x + i * cols, cols, wp, y + i * rows, rows, 1, width); break;
    default: break;
    }
}

/* Y[i, :] = X[i, :] W^T for ``t`` rows (X [t, cols], Y [t, rows]) from the weight in panels (``native.py``'s
   ``panels``): outputs r0 .. r0 + 31 as one contiguous [cols, 32] block at ``wp + r0 * cols``, the last
   panel as wide as what is left. Outer products, up to four rows and a panel's 32 outputs at a time in
   registers, so no sum is reduced across vector lanes (about 2.5x the row-by-row dot products' rate at
   the model's sizes). Each panel (24 KB at the hidden size) is read from memory once and stays in
   cache for every row; and it is contiguous, where the plain transpose's 32 outputs lay one weight row
   apart (16 KB for the output head: every line in one cache set). */
CLONES static void linear_rows_t(const float *restrict x, const float *restrict wp, float *restrict y, int64_t t,
                                 int64_t rows, int64_t cols) {
    int64_t r0 = 0;
    for (; r0 + 32 <= rows; r0 += 32) outer_panel(x, wp + r0 * cols, y + r0, t, rows, cols, 32);
    const int64_t width = rows - r0; /* the last panel, [cols, width] */
    if (width == 16) {
        outer_panel(x, wp + r0 * cols, y + r0, t, rows, cols, 16);
        return;
    }
    const float *last = wp + r0 * cols;
    for (int64_t i = 0; i < t; i++)
        for (int64_t k = 0; k < width; k++) {
            const float *xi = x + i * cols;
            float acc = 0.0f;
            for (int64_t c = 0; c < cols; c++) acc += xi[c] * last[c * width + k];
            y[i * rows + r0 + k] = acc;
        }
}

/* Y = X W^T for ``t`` rows: the weight's panels' outer products where there are panels and several
   rows, else one dot product per output (a decoding step: the weights' read is its whole cost). */
static void linear_rows(const float *x, const float *w, const float *wt, float *y, int64_t t, int64_t rows,
                        int64_t cols) {
    if (t > 1 && wt != NULL) {
        linear_rows_t(x, wt, y, t, rows, cols);
        return;
    }
    for (int64_t i = 0; i < t; i++) matvec(w, x + i * cols, y + i * rows, rows, cols);
}

/* A SwiGLU MLP on ``n`` rows ``x`` (gate and up [inter, hd], down [hd, inter]; ``*_t`` in panels):
   ``y`` [n, hd]. */
static void swiglu_rows(const float *gate_w, const float *gate_t, const float *up_w, const float *up_t,
                        const float *down_w, const float *down_t, int64_t inter, int64_t hd, const float *x, int64_t n,
                        float *g, float *u, float *y) {
    linear_rows(x, gate_w, gate_t, g, n, inter, hd);
    linear_rows(x, up_w, up_t, u, n, inter, hd);
    for (int64_t i = 0; i < n * inter; i++) g[i] = silu(g[i]) * u[i];
    linear_rows(g, down_w, down_t, y, n, hd, inter);
}

/* A routed expert on ``n`` rows: gate_up [2 * ie, hd] (gate rows, then up rows), down [hd, ie]
   (``*_t`` in panels); ``gu`` [n, 2 * ie] and ``g`` [n, ie] scratch, ``y`` [n, hd]. */
static void expert_rows(const float *gate_up, const float *gate_up_t, const float *down, const float *down_t,
                        int64_t ie, int64_t hd, const float *x, int64_t n, float *gu, float *g, float *y) {
    linear_rows(x, gate_up, gate_up_t, gu, n, 2 * ie, hd);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < ie; j++) g[i * ie + j] = silu(gu[i * 2 * ie + j]) * gu[i * 2 * ie + ie + j];
    linear_rows(g, down, down_t, y, n, hd, ie);
}


/* One query's absorbed attention over keys 0 .. n - 1 of a layer, or over the ``n`` keys ``sel`` lists
   (DSA's selection): ``out`` [heads * v_dim]. */
static void attend(const Model *m, const Layer *L, const float *q, const float *cos_, const float *sin_,
                   const int64_t *sel, int64_t kend, float *q_cat, float *o_lat, float *probs, float *out) {
    const int64_t heads = m->heads, nope = m->nope, r = m->rope, kvr = m->kv_rank;
    const int64_t q_dim = nope + r, lat_w = kvr + r;
    for (int64_t hh = 0; hh < heads; hh++) {
        const float *qh = q + hh * q_dim;
        float *qc = q_cat + hh * lat_w;
        vecmat(qh, L->w_uk + hh * nope * kvr, qc, nope, kvr); /* q_nope @ w_uk[h] */
        rope(qh + nope, cos_, sin_, qc + kvr, r);
    }
    for (int64_t hh = 0; hh < heads; hh++) {
        const float *qc = q_cat + hh * lat_w;
        if (sel == NULL)
            matvec(L->latents, qc, probs, kend, lat_w);
        else
            gathered_dots(L->latents, sel, qc, probs, kend, lat_w);
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
            const float *lat = L->latents + (sel == NULL ? t : sel[t]) * lat_w;
            for (int64_t c = 0; c < kvr; c++) ol[c] += p * lat[c];
        }
        vecmat(ol, L->w_uv_t + hh * kvr * m->v_dim, out + hh * m->v_dim, kvr, m->v_dim);
    }
}

/* Reorders ``work[0 .. n)`` so that its ``want``-th largest value is at ``work[want]`` (quickselect,
   descending) and returns it. */
static float kth_largest(float *work, int64_t n, int64_t want) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        const float pivot = work[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (work[i] > pivot) i++;
            while (work[j] < pivot) j--;
            if (i <= j) {
                const float tmp = work[i];
                work[i] = work[j];
                work[j] = tmp;
                i++;
                j--;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else break;
    }
    return work[want];
}

/* The ``k`` largest of ``n`` scores (k < n): their indices into ``sel``, in no particular order (of
   equal scores at the boundary, the first ones). ``work`` holds n floats. The k-th largest is found
   among the candidates at or above a threshold read off every fourth score (the (k/2)-th largest of
   those: about 2k candidates, and never fewer than k but by a rare chance, where every score is
   searched instead): the same value, selected from about 2k candidates instead of every score. */
static void top_k(const float *scores, int64_t n, int64_t k, float *work, int64_t *sel) {
    const int64_t want = k - 1; /* the k-th largest's place once sorted descending */
    float kth;
    int64_t found = 0;
    if (n >= 4 * k && k >= 8) {
        int64_t m = 0;
        for (int64_t j = 0; j < n; j += 4) work[m++] = scores[j];
        const float bar = kth_largest(work, m, k / 2);
        for (int64_t j = 0; j < n; j++) {
            work[found] = scores[j];
            found += scores[j] >= bar;
        }
    }
    if (found >= k) {
        kth = kth_largest(work, found, want);
    } else {
        memcpy(work, scores, (size_t)n * sizeof(float));
        kth = kth_largest(work, n, want);
    }
    int64_t above = 0;
    for (int64_t j = 0; j < n; j++) above += scores[j] > kth;
    int64_t at = 0, ties = k - above;
    for (int64_t j = 0; j < n && at < k; j++)
        if (scores[j] > kth || (scores[j] == kth && ties-- > 0)) sel[at++] = j;
    for (int64_t j = n - 1; at < k; j--) sel[at++] = j; /* (NaN scores only: the newest keys) */
}

/* DSA's choice for one query of a full layer at key count ``kend`` > topk, from the indexer's scores of
   keys 0 .. kend - 1 (``scores``, changed here): the policy's key bias scaled by their standard
   deviation, the ``topk`` best into ``sel``; with ``forced`` keys (the error context), the ``topk``
   best of the others, then every forced key. Returns how many were chosen, or 0 where that is every
   key (no more than ``topk`` keys are not forced). ``work`` holds kend floats. */
static int64_t dsa_choose(float *scores, const float *key_bias, const uint8_t *forced, int64_t kend, int64_t topk,
                          float *work, int64_t *sel) {
    if (key_bias != NULL) {
        double mean = 0.0, var = 0.0;
        for (int64_t j = 0; j < kend; j++) mean += scores[j];
        mean /= (double)kend;
        for (int64_t j = 0; j < kend; j++) var += (scores[j] - mean) * (scores[j] - mean);
        float sd = (float)sqrt(var / (double)kend);
        if (!(sd > 0.0f)) sd = 1.0f;
        for (int64_t j = 0; j < kend; j++) scores[j] += key_bias[j] * sd;
    }
    if (forced == NULL) {
        top_k(scores, kend, topk, work, sel);
        return topk;
    }
    int64_t n_forced = 0;
    for (int64_t j = 0; j < kend; j++) n_forced += forced[j] != 0;
    if (kend - n_forced <= topk) return 0; /* the others all fit the budget: every key */
    for (int64_t j = 0; j < kend; j++)
        if (forced[j]) scores[j] = -INFINITY; /* chosen below, outside the budget */
    top_k(scores, kend, topk, work, sel);
    int64_t n = topk;
    for (int64_t j = 0; j < kend; j++)
        if (forced[j]) sel[n++] = j;
    return n;
}

/* The indexer's score of keys 0 .. kend - 1 for one query (``iq``: its heads, RoPE applied): per head
   relu(scale * q . k), weighted by the head weights. */
static void index_scores_one(const Model *m, const Layer *L, const float *iq, const float *head_w, int64_t kend,
                             float *scores, float *work) {
    const int64_t di = m->i_dim;
    const float head_scale = 1.0f / sqrtf((float)m->i_heads);
    memset(scores, 0, (size_t)kend * sizeof(float));
    for (int64_t hh = 0; hh < m->i_heads; hh++) {
        const float w = head_w[hh] * head_scale;
        matvec(L->index_keys, iq + hh * di, work, kend, di);
        for (int64_t j = 0; j < kend; j++) {
            const float v = work[j] * m->i_scale;
            scores[j] += w * (v > 0.0f ? v : 0.0f);
        }
    }
}

/* ``index_scores_one`` for the ``n`` rows ``rows`` lists at once (row ``i`` scoring keys 0 .. pos + i),
   into ``out`` (row ``s``'s scores at ``out + s * stride``): every row's heads are one set of queries in
   panels (``qp``), and each block of ``KEY_BLOCK`` keys is read once for all of them by the outer
   products of ``linear_rows_t`` (``block`` [KEY_BLOCK, padded queries]), where one row at a time reads
   every key again for each row and head. ``iq`` [t, i_heads * i_dim] (RoPE applied), ``head_w(i)`` at
   ``parts + i * wide + head_at``. */
static void index_scores_rows(const Model *m, const Layer *L, const float *iq, const float *parts, int64_t wide,
                              int64_t head_at, const int64_t *rows, int64_t n, int64_t pos, float *qp, float *block,
                              float *out, int64_t stride) {
    const int64_t di = m->i_dim, ih = m->i_heads, iw = ih * di, nq = n * ih, np = padded_queries(nq);
    const float head_scale = 1.0f / sqrtf((float)ih);
    for (int64_t q = 0; q < np; q++) {
        const int64_t p0 = q / 32 * 32, width = np - p0 >= 32 ? 32 : np - p0, k = q - p0;
        float *panel = qp + p0 * di;
        const float *src = q < nq ? iq + rows[q / ih] * iw + (q % ih) * di : NULL;
        for (int64_t c = 0; c < di; c++) panel[c * width + k] = src != NULL ? src[c] : 0.0f;
    }
    const int64_t kmax = pos + rows[n - 1] + 1;
    for (int64_t j0 = 0; j0 < kmax; j0 += KEY_BLOCK) {
        const int64_t nb = kmax - j0 < KEY_BLOCK ? kmax - j0 : KEY_BLOCK;
        linear_rows_t(L->index_keys + j0 * di, qp, block, nb, np, di);
        for (int64_t s = 0; s < n; s++) {
            const int64_t kend = pos + rows[s] + 1;
            const float *head_w = parts + rows[s] * wide + head_at;
            float *scores = out + s * stride;
            for (int64_t jj = 0; jj < nb && j0 + jj < kend; jj++) {
                const float *v = block + jj * np + s * ih;
                float total = 0.0f;
                for (int64_t hh = 0; hh < ih; hh++) {
                    const float x = v[hh] * m->i_scale;
                    total += head_w[hh] * head_scale * (x > 0.0f ? x : 0.0f);
                }
                scores[j0 + jj] = total;
            }
        }
    }
}

/* ``t`` tokens at positions pos .. pos + t - 1 (cos/sin [t, rope / 2]): their cache rows written, the
   last ``n_out`` rows' logits [n_out, vocab] (1: a step or a prompt's prefill; t: a draft's
   verification). Each row attends to every key before it and itself, or, with ``topk`` > 0 and more
   keys than that, to DSA's choice of ``topk`` of them: chosen in each full layer by the indexer
   (with the policy's ``key_bias`` [capacity], or none), and reused by the shared layers after it.
   ``forced`` [capacity] (or NULL): keys every such row attends to besides its top-k (the error
   context); ``forced_rows`` [t] (or NULL): rows that attend to every key (error-context queries).
   ``width``: the most keys a row's choice may hold (topk plus the forced keys). */
static void forward(const Model *m, const int64_t *tokens, int64_t t, int64_t pos, const float *cos_,
                    const float *sin_, float *logits, float *scratch, int64_t n_out, int64_t topk,
                    const float *key_bias, const uint8_t *forced, const uint8_t *forced_rows, int64_t width) {
    const int64_t hd = m->hidden, heads = m->heads, nope = m->nope, r = m->rope, kvr = m->kv_rank;
    const int64_t q_dim = nope + r, lat_w = kvr + r, half = r / 2, wmax = wide_max(m), mi = max_inter(m);
    const int64_t e_n = m->n_experts, k = m->top_k > 0 ? m->top_k : 1;
    float *s = scratch;
    float *x = s; s += t * hd;
    float *h = s; s += t * hd;
    float *acc = s; s += t * hd;
    float *xe = s; s += t * hd;
    float *ye = s; s += t * hd;
    float *parts = s; s += t * wmax;
    float *qn = s; s += t * m->q_lora;
    float *q = s; s += t * heads * q_dim;
    float *out = s; s += t * heads * m->v_dim;
    float *scores = s; s += t * e_n;
    float *choice = s; s += t * e_n;
    float *weights = s; s += t * k;
    float *iq = s; s += t * m->i_heads * m->i_dim;
    s = scratch + ((s - scratch + 1) & ~(int64_t)1); /* 8-byte aligned (the scratch itself is) */
    int64_t *members = (int64_t *)s; s += 2 * (t * e_n + e_n); /* per expert, the rows routed to it; counts */
    int64_t *sel = (int64_t *)s; s += 2 * t * width;           /* each row's selected keys */
    int64_t *chosen_n = (int64_t *)s; s += 2 * t;              /* how many (0: every key, none chosen) */
    float *g = s; s += t * mi;
    float *u = s; s += 2 * t * mi;
    float *q_cat = s; s += heads * lat_w;
    float *o_lat = s; s += heads * kvr;
    float *ik = s; s += m->i_dim;
    float *probs = s; s += pos + t;
    float *work = s; s += pos + t; /* the indexer's scores, and a copy to select from */
    float *work2 = s; s += pos + t;
    int64_t *selecting = NULL; /* the rows that choose their keys, their scores, the queries' panels */
    float *row_scores = NULL, *qp = NULL, *key_block = NULL;
    if (width) {
        s = scratch + ((s - scratch + 1) & ~(int64_t)1); /* 8-byte aligned */
        selecting = (int64_t *)s; s += 2 * t;
        row_scores = s; s += t * (pos + t);
        qp = s; s += padded_queries(t * m->i_heads) * m->i_dim;
        key_block = s;
    }
    const int sparse = topk > 0 && pos + t > topk;
    memset(chosen_n, 0, (size_t)t * sizeof(int64_t));

    for (int64_t i = 0; i < t; i++) memcpy(x + i * hd, m->embed + tokens[i] * hd, (size_t)hd * sizeof(float));
    for (int64_t li = 0; li < m->n_layers; li++) {
        const Layer *L = &m->layers[li];
        /* attention: the rows' projections, their cache rows, then each row over its keys */
        const int64_t wide = m->q_lora + kvr + r + (L->has_index ? m->i_dim + m->i_heads : 0);
        for (int64_t i = 0; i < t; i++) rms_norm(x + i * hd, L->in_norm, L->in_eps, h + i * hd, hd);
        linear_rows(h, L->w_x, L->w_x_t, parts, t, wide, hd);
        for (int64_t i = 0; i < t; i++) {
            const float *p = parts + i * wide;
            const float *kv_latent = p + m->q_lora, *rope_key = kv_latent + kvr;
            const float *c = cos_ + i * half, *sn = sin_ + i * half;
            rms_norm(p, L->q_norm, L->q_eps, qn + i * m->q_lora, m->q_lora);
            float *row = L->latents + (pos + i) * lat_w;
            rms_norm(kv_latent, L->kv_norm, L->kv_eps, row, kvr);
            rope(rope_key, c, sn, row + kvr, r);
            if (L->has_index) {
                layer_norm(rope_key + r, L->ik_w, L->ik_b, L->ik_eps, ik, m->i_dim);
                float *keys = L->index_keys + (pos + i) * m->i_dim;
                rope(ik, c, sn, keys, r);
                memcpy(keys + r, ik + r, (size_t)(m->i_dim - r) * sizeof(float));
            }
        }
        linear_rows(qn, L->q_b, L->q_b_t, q, t, heads * q_dim, m->q_lora);
        if (sparse && L->has_index) { /* DSA: each row past the top-k chooses its keys (a shared layer reuses them) */
            const int64_t iw = m->i_heads * m->i_dim;
            linear_rows(qn, L->iq_w, L->iq_w_t, iq, t, iw, m->q_lora);
            const int64_t head_at = m->q_lora + kvr + r + m->i_dim; /* a row's head weights in ``parts`` */
            int64_t n_sel = 0;
            for (int64_t i = 0; i < t; i++) {
                const int64_t kend = pos + i + 1;
                chosen_n[i] = 0;
                if (kend <= topk || (forced_rows != NULL && forced_rows[i])) continue; /* every key */
                float *qi = iq + i * iw;
                for (int64_t hh = 0; hh < m->i_heads; hh++) { /* RoPE on each head's first rope dims, in place */
                    float *head = qi + hh * m->i_dim;
                    float rot[r > 0 ? r : 1];
                    rope(head, cos_ + i * half, sin_ + i * half, rot, r);
                    memcpy(head, rot, (size_t)r * sizeof(float));
                }
                selecting[n_sel++] = i;
            }
            if (n_sel > 1) /* several rows: each block of keys read once for all of them */
                index_scores_rows(m, L, iq, parts, wide, head_at, selecting, n_sel, pos, qp, key_block, row_scores,
                                  pos + t);
            for (int64_t j = 0; j < n_sel; j++) {
                const int64_t i = selecting[j], kend = pos + i + 1;
                float *scores = n_sel > 1 ? row_scores + j * (pos + t) : work;
                if (n_sel == 1) index_scores_one(m, L, iq + i * iw, parts + i * wide + head_at, kend, scores, work2);
                chosen_n[i] = dsa_choose(scores, key_bias, forced, kend, topk, work2, sel + i * width);
            }
        }
        for (int64_t i = 0; i < t; i++)
            attend(m, L, q + i * heads * q_dim, cos_ + i * half, sin_ + i * half, chosen_n[i] ? sel + i * width : NULL,
                   chosen_n[i] ? chosen_n[i] : pos + i + 1, q_cat, o_lat, probs, out + i * heads * m->v_dim);
        linear_rows(out, L->o_proj, L->o_proj_t, acc, t, hd, heads * m->v_dim);
        for (int64_t i = 0; i < t * hd; i++) x[i] += acc[i];

        /* MLP, or MoE: each row's experts chosen, then each expert on the rows routed to it */
        for (int64_t i = 0; i < t; i++) rms_norm(x + i * hd, L->post_norm, L->post_eps, h + i * hd, hd);
        memset(acc, 0, (size_t)(t * hd) * sizeof(float));
        if (L->is_moe) {
            const int64_t ie = m->moe_inter;
            int64_t *count = members + t * e_n; /* rows per expert (after the member lists) */
            int64_t chosen[256];
            linear_rows(h, L->router_w, L->router_t, scores, t, e_n, hd);
            memset(count, 0, (size_t)e_n * sizeof(int64_t));
            for (int64_t i = 0; i < t; i++) {
                float *sc = scores + i * e_n;
                for (int64_t e = 0; e < e_n; e++) sc[e] = sigmoid(sc[e]);
                const int64_t n = route(m, sc, L->router_bias, chosen, weights + i * k, choice);
                for (int64_t j = 0; j < n; j++) {
                    const int64_t e = chosen[j];
                    members[e * t + count[e]] = i * k + j; /* the row and its slot among the row's weights */
                    count[e]++;
                }
            }
            for (int64_t e = 0; e < e_n; e++) {
                const int64_t n = count[e];
                if (!n) continue;
                for (int64_t j = 0; j < n; j++)
                    memcpy(xe + j * hd, h + (members[e * t + j] / k) * hd, (size_t)hd * sizeof(float));
                expert_rows(L->gate_up + e * 2 * ie * hd, L->gate_up_t ? L->gate_up_t + e * hd * 2 * ie : NULL,
                            L->down + e * hd * ie, L->down_e_t ? L->down_e_t + e * ie * hd : NULL, ie, hd, xe, n, u,
                            g, ye);
                for (int64_t j = 0; j < n; j++) {
                    const int64_t slot = members[e * t + j];
                    const float w = weights[slot];
                    float *dst = acc + (slot / k) * hd;
                    const float *src = ye + j * hd;
                    for (int64_t c = 0; c < hd; c++) dst[c] += w * src[c];
                }
            }
        }
        swiglu_rows(L->gate_w, L->gate_t, L->up_w, L->up_t, L->down_w, L->down_t, L->inter, hd, h, t, g, u, ye);
        for (int64_t i = 0; i < t * hd; i++) x[i] += acc[i] + ye[i];
    }
    for (int64_t i = 0; i < n_out; i++) rms_norm(x + (t - n_out + i) * hd, m->norm_w, m->norm_eps, h + i * hd, hd);
    linear_rows(h, m->lm_head, m->lm_head_t, logits, n_out, m->vocab, hd);
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

/* A search's arguments: the shard (the first five) and the ``count`` integers after it, exactly. */
static int read_shard_call(PyObject *const *args, Py_ssize_t nargs, const char *name, Shard *s, long long *v,
                           int count) {
    if (nargs != 5 + count) {
        PyErr_Format(PyExc_TypeError, "%s() takes %d integer arguments", name, 5 + count);
        return -1;
    }
    if (read_shard(args, s) < 0) return -1;
    for (int i = 0; i < count; i++) {
        v[i] = PyLong_AsLongLong(args[5 + i]);
        if (v[i] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

/* sa_find(tokens, tokens_size, n, sa, sa_size, lo, hi, depth, pattern, count) -> (lo, hi): the
   suffixes of sa[lo:hi] (sharing ``depth`` ids already) narrowed by the ``count`` int64 ids at
   address ``pattern``, one depth each. */
static PyObject *py_sa_find(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    Shard s;
    long long v[5];
    if (read_shard_call(args, nargs, "sa_find", &s, v, 5) < 0) return NULL;
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
    Shard s;
    long long v[4];
    if (read_shard_call(args, nargs, "sa_narrow", &s, v, 4) < 0) return NULL;
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

/* forward(model_address, tokens_address, t, pos, cos_address, sin_address, logits_address,
   scratch_address, n_out, topk, key_bias_address, forced_address, forced_rows_address, width):
   ``forward`` above on a ``Model`` that ``native.py`` built with ctypes (addresses as ints; ``t`` int64
   token ids; scratch of ``scratch_floats(model, t, capacity, width)`` floats; logits for the last
   ``n_out`` rows, 1 <= n_out <= t; ``topk`` 0: every key; an address 0: none; ``width`` >= topk).
   Runs without the interpreter lock. */
#define N_ARGS 14
/* Whether some occurrence sa[lo:hi] of a ``length``-id sequence is live: the position after it not
   dead (``alive``, 1 byte a position, or NULL: all live) and outside [ex_lo, ex_hi). More occurrences
   than ``spare`` (positions that could be skipped) are live without a look. */
static int any_live(const Shard *s, int64_t lo, int64_t hi, int64_t length, const uint8_t *alive, int64_t ex_lo,
                    int64_t ex_hi, int64_t spare) {
    if (hi <= lo) return 0;
    if (hi - lo > spare) return 1;
    for (int64_t i = lo; i < hi; i++) {
        const int64_t after = suffix_at(s, i) + length;
        if ((alive == NULL || alive[after]) && (after < ex_lo || after >= ex_hi)) return 1;
    }
    return 0;
}

/* The range of the last ``length`` of the ``count`` ids at ``pattern``, or an empty one where it has no
   live occurrence. */
static int probe_suffix(const Shard *s, const int64_t *pattern, int64_t count, int64_t length, const uint8_t *alive,
                        int64_t ex_lo, int64_t ex_hi, int64_t spare, int64_t *lo, int64_t *hi) {
    int64_t a = 0, b = s->n;
    const int64_t *p = pattern + count - length;
    for (int64_t i = 0; i < length && a < b; i++) narrow_range(s, &a, &b, i, p[i]);
    if (!any_live(s, a, b, length, alive, ex_lo, ex_hi, spare)) return 0;
    *lo = a;
    *hi = b;
    return 1;
}

/* sa_longest(tokens, tokens_size, n, sa, sa_size, pattern, count, alive, ex_lo, ex_hi, spare) ->
   (length, lo, hi): the longest suffix of the ``count`` int64 ids at ``pattern`` with a live occurrence
   (``any_live``; ``alive`` an address or 0) and its range; (0, 0, n) where none. A search over the
   length (a suffix that occurs has every shorter one occurring too), galloping up first: most
   matches are short and a probe costs in its length (``SuffixIndex.longest``). */
static PyObject *py_sa_longest(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    Shard s;
    long long v[6];
    if (read_shard_call(args, nargs, "sa_longest", &s, v, 6) < 0) return NULL;
    const int64_t *pattern = (const int64_t *)(intptr_t)v[0];
    const int64_t count = v[1];
    const uint8_t *alive = (const uint8_t *)(intptr_t)v[2];
    const int64_t ex_lo = v[3], ex_hi = v[4], spare = v[5];
    if (count < 0 || (count && !pattern)) {
        PyErr_SetString(PyExc_ValueError, "sa_longest(): no pattern");
        return NULL;
    }
    int64_t best = 0, best_lo = 0, best_hi = s.n, lo, hi;
    int64_t good = 0, bad = count + 1, probe = 1;
    while (probe < bad) {
        if (!probe_suffix(&s, pattern, count, probe, alive, ex_lo, ex_hi, spare, &lo, &hi)) {
            bad = probe;
            break;
        }
        best = good = probe;
        best_lo = lo;
        best_hi = hi;
        probe = probe < count ? (probe * 2 < count ? probe * 2 : count) : bad;
    }
    while (bad - good > 1) {
        const int64_t mid = (good + bad) / 2;
        if (probe_suffix(&s, pattern, count, mid, alive, ex_lo, ex_hi, spare, &lo, &hi)) {
            best = good = mid;
            best_lo = lo;
            best_hi = hi;
        } else {
            bad = mid;
        }
    }
    return Py_BuildValue("(LLL)", (long long)best, (long long)best_lo, (long long)best_hi);
}

static int read_call(PyObject *const *args, Py_ssize_t nargs, long long *v, const Model **m);

static PyObject *py_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long long v[N_ARGS];
    const Model *m;
    if (read_call(args, nargs, v, &m) < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    forward(m, (const int64_t *)(intptr_t)v[1], v[2], v[3], (const float *)(intptr_t)v[4], (const float *)(intptr_t)v[5],
            (float *)(intptr_t)v[6], (float *)(intptr_t)v[7], v[8], v[9], (const float *)(intptr_t)v[10],
            (const uint8_t *)(intptr_t)v[11], (const uint8_t *)(intptr_t)v[12], v[13]);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* ---- one forward call in the background ------------------------------------------------------------

   ``forward_start`` hands a call to a worker thread of this module's own (no interpreter lock is
   involved) and returns at once; ``forward_wait`` waits for it, letting go of the interpreter lock.
   One call at a time, process-wide: a start while one runs is refused (False). A prompt's prefill
   then runs on a second core while the caller's Python goes on. (Not on Windows: no pthreads; the
   calls there answer False and the caller runs the prefill itself.) */
#ifndef _WIN32
#include <pthread.h>

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state; /* 0 idle, 1 queued, 2 running, 3 done */
    int started, started_once;
    pthread_t thread;
    const Model *m;
    const int64_t *tokens;
    int64_t t, pos, n_out, topk, width;
    const float *cos_, *sin_, *key_bias;
    const uint8_t *forced, *forced_rows;
    float *logits, *scratch;
} job = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};

/* A forked child has no worker (only the thread that forked goes on there): it starts its own. */
static void after_fork_in_child(void) {
    pthread_mutex_init(&job.mu, NULL);
    pthread_cond_init(&job.cv, NULL);
    job.state = 0;
    job.started = 0;
}

static void *worker(void *unused) {
    (void)unused;
    pthread_mutex_lock(&job.mu);
    for (;;) {
        while (job.state != 1) pthread_cond_wait(&job.cv, &job.mu);
        job.state = 2;
        pthread_mutex_unlock(&job.mu);
        forward(job.m, job.tokens, job.t, job.pos, job.cos_, job.sin_, job.logits, job.scratch, job.n_out, job.topk,
                job.key_bias, job.forced, job.forced_rows, job.width);
        pthread_mutex_lock(&job.mu);
        job.state = 3;
        pthread_cond_broadcast(&job.cv);
    }
    return NULL;
}
#endif

static int check_call(long long *v, const Model **m_out) {
    const Model *m = (const Model *)(intptr_t)v[0];
    const int64_t *tokens = (const int64_t *)(intptr_t)v[1];
    const int64_t t = v[2];
    if (m == NULL || tokens == NULL || t < 1 || v[3] < 0 || !v[4] || !v[5] || !v[6] || !v[7] || v[8] < 1 || v[8] > t ||
        v[9] < 0 || v[13] < v[9]) {
        PyErr_SetString(PyExc_ValueError,
                        "forward(): no model, no tokens, or a position, a count of rows or a top-k out of range");
        return -1;
    }
    for (int64_t i = 0; i < t; i++)
        if (tokens[i] < 0 || tokens[i] >= m->vocab) {
            PyErr_Format(PyExc_ValueError, "forward(): token id %lld out of range (vocabulary %lld)",
                         (long long)tokens[i], (long long)m->vocab);
            return -1;
        }
    *m_out = m;
    return 0;
}

static int read_call(PyObject *const *args, Py_ssize_t nargs, long long *v, const Model **m) {
    if (nargs != N_ARGS) {
        PyErr_SetString(PyExc_TypeError, "forward() takes 14 integer arguments");
        return -1;
    }
    for (int i = 0; i < N_ARGS; i++) {
        v[i] = PyLong_AsLongLong(args[i]);
        if (v[i] == -1 && PyErr_Occurred()) return -1;
    }
    return check_call(v, m);
}

/* forward_start(...): ``forward``'s arguments; True when the worker took the call, False when one
   runs already (or there is no worker here). */
static PyObject *py_forward_start(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long long v[N_ARGS];
    const Model *m;
    if (read_call(args, nargs, v, &m) < 0) return NULL;
#ifdef _WIN32
    Py_RETURN_FALSE;
#else
    pthread_mutex_lock(&job.mu);
    if (job.state == 1 || job.state == 2) {
        pthread_mutex_unlock(&job.mu);
        Py_RETURN_FALSE;
    }
    if (!job.started) {
        if (pthread_create(&job.thread, NULL, worker, NULL) != 0) {
            pthread_mutex_unlock(&job.mu);
            Py_RETURN_FALSE;
        }
        pthread_detach(job.thread);
        if (!job.started_once) pthread_atfork(NULL, NULL, after_fork_in_child);
        job.started = 1;
        job.started_once = 1;
    }
    job.m = m;
    job.tokens = (const int64_t *)(intptr_t)v[1];
    job.t = v[2];
    job.pos = v[3];
    job.cos_ = (const float *)(intptr_t)v[4];
    job.sin_ = (const float *)(intptr_t)v[5];
    job.logits = (float *)(intptr_t)v[6];
    job.scratch = (float *)(intptr_t)v[7];
    job.n_out = v[8];
    job.topk = v[9];
    job.key_bias = (const float *)(intptr_t)v[10];
    job.forced = (const uint8_t *)(intptr_t)v[11];
    job.forced_rows = (const uint8_t *)(intptr_t)v[12];
    job.width = v[13];
    job.state = 1;
    pthread_cond_broadcast(&job.cv);
    pthread_mutex_unlock(&job.mu);
    Py_RETURN_TRUE;
#endif
}

/* forward_wait(): wait for the call ``forward_start`` handed over (True), or return False at once
   when none is under way. */
static PyObject *py_forward_wait(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
#ifdef _WIN32
    Py_RETURN_FALSE;
#else
    int waited = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&job.mu);
    while (job.state == 1 || job.state == 2) {
        waited = 1;
        pthread_cond_wait(&job.cv, &job.mu);
    }
    if (job.state == 3) {
        waited = 1;
        job.state = 0;
    }
    pthread_mutex_unlock(&job.mu);
    Py_END_ALLOW_THREADS
    if (waited) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
#endif
}

/* scratch_floats(model_address, t, capacity, width): floats of scratch a call of ``t`` tokens needs. */
static PyObject *py_scratch_floats(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "scratch_floats() takes 4 integer arguments");
        return NULL;
    }
    const long long address = PyLong_AsLongLong(args[0]);
    const long long t = PyLong_AsLongLong(args[1]);
    const long long capacity = PyLong_AsLongLong(args[2]);
    const long long width = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromLongLong(scratch_floats((const Model *)(intptr_t)address, t, capacity, width));
}

/* The sizes of the two structs, so the ctypes side can check its layout against this build's. */
static PyObject *py_layout(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return Py_BuildValue("(nn)", (Py_ssize_t)sizeof(Model), (Py_ssize_t)sizeof(Layer));
}

static PyMethodDef methods[] = {
    {"forward", (PyCFunction)(void (*)(void))py_forward, METH_FASTCALL, "Tokens through the model (native.c)."},
    {"forward_start", (PyCFunction)(void (*)(void))py_forward_start, METH_FASTCALL, "forward() on the worker."},
    {"forward_wait", py_forward_wait, METH_NOARGS, "Wait for forward_start's call."},
    {"scratch_floats", (PyCFunction)(void (*)(void))py_scratch_floats, METH_FASTCALL, "Scratch a step needs."},
    {"layout", py_layout, METH_NOARGS, "sizeof(Model), sizeof(Layer)."},
    {"sa_find", (PyCFunction)(void (*)(void))py_sa_find, METH_FASTCALL, "A suffix-array range narrowed by ids."},
    {"sa_narrow", (PyCFunction)(void (*)(void))py_sa_narrow, METH_FASTCALL, "A suffix-array range narrowed by one id."},
    {"sa_longest", (PyCFunction)(void (*)(void))py_sa_longest, METH_FASTCALL, "The longest live suffix's range."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "glm5-lsp's native decoding step.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
