/* ETC attention with FormNet's Rich Attention on CPU: two kernels, no temporaries.

   - etc_rich_attention: the long queries' whole attention, per query block and head in
     one pass (scores through register tiles, Rich and the mask added in place, the
     globals beside them, one softmax, the weighted values).
   - rich_window_bias: Rich's logits and the mask alone, written into the float mask that
     SDPA reads (layers with other terms or ETC's relative ids).

   Built at first use by flaxdoc/export/torch/native.py (the C compiler, -O3 -march=native,
   no other dependency) and called through ctypes; the PyTorch export falls back to its
   tensor form when it cannot be built. The mathematics is FormNet's Rich Attention
   (DESIGN.md; flaxdoc.nn.layout_terms.RichAttentionTerm), summed over the axes:

     z     = oq_i + ok_j                      order logit (oq includes the bias b)
     s     = logsigmoid(z) if c_i < c_j else logsigmoid(-z)
     m     = dq_i + dk_j - th * log1p(|c_i - c_j|)   (dq, dk, th already times |theta|/sqrt 2)
     logit = sum over axes of (s - m * m)

   for query block n (c queries) and its window of c + 2r keys: query i of the block sees
   window key t when i <= t <= i + 2r (|key - query| <= r) and both tokens are valid;
   every other entry gets `big_neg`, as the tensor form's additive mask does.

   Why kernels: the tensor form makes about seven passes per axis over the [H, c, c + 2r]
   logits of every block (about 107 ms a layer at 2,048 tokens on two cores, more than
   the attention itself). Here the head-shared parts (distance, order, mask) are computed
   once per (query, key) pair and every head's row is one vectorised loop over its keys,
   with exp and log as branch-free polynomials the compiler vectorises:

     logsigmoid(zx) + logsigmoid(zy) = min(zx, 0) + min(zy, 0)
                                       - log((1 + exp(-|zx|)) (1 + exp(-|zy|)))

   (one log for both axes; the product lies in [1, 4], so nothing overflows), or, when the
   order logits are bounded, with per-token exponentials (row_two_axes_factored).
*/

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float bits_to_float(int32_t i) {
  float f;
  memcpy(&f, &i, sizeof f);
  return f;
}

static inline int32_t float_to_bits(float f) {
  int32_t i;
  memcpy(&i, &f, sizeof i);
  return i;
}

/* exp(x) for x <= 0 (a positive x gives 1): 2^n e^f with |f| <= ln2 / 2, e^f by its
   Taylor series to degree 7 (truncation below 6e-9 relative). Below -87 it returns
   exp(-87) (~1.6e-38), a weight of 0 beside any visible key's. */
static inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 0.0f ? 0.0f : x;
  float n = floorf(x * 1.44269504088896341f + 0.5f);
  float f = x - n * 0.693359375f;
  f = f + n * 2.12194440e-4f; /* ln 2 = 0.693359375 - 2.12194440e-4, split for exactness */
  float p = 1.0f / 5040.0f;
  p = p * f + 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  return p * bits_to_float(((int32_t)n + 127) << 23);
}

/* log(x) for finite x >= 1 (the callers' arguments): x = 2^e m with m in [sqrt(1/2),
   sqrt 2), log m = 2 atanh(s), s = (m - 1) / (m + 1) in [-0.172, 0.172], by its series to
   s^9 (truncation below 1e-9 relative). */
static inline float log_at_least_one(float x) {
  int32_t bits = float_to_bits(x);
  int32_t e = ((bits >> 23) & 0xff) - 127;
  float m = bits_to_float((bits & 0x007fffff) | 0x3f800000); /* [1, 2) */
  int32_t big = m > 1.41421356f;
  m = big ? 0.5f * m : m;
  e += big;
  float s = (m - 1.0f) / (m + 1.0f);
  float s2 = s * s;
  float p = 1.0f / 9.0f;
  p = p * s2 + 1.0f / 7.0f;
  p = p * s2 + 1.0f / 5.0f;
  p = p * s2 + 1.0f / 3.0f;
  p = p * s2 + 1.0f;
  return 2.0f * s * p + (float)e * 0.693147180559945309f;
}

/* One head's band of one query row, two axes: `len` keys from the band's first. */
static void row_two_axes(float *restrict row, const float *restrict okx,
                         const float *restrict oky, const float *restrict dkx,
                         const float *restrict dky, const float *restrict dx,
                         const float *restrict dy, const float *restrict sx,
                         const float *restrict sy, const float *restrict keep, float oqx,
                         float oqy, float dqx, float dqy, float thx, float thy, float big_neg,
                         float scale, int64_t len) {
  for (int64_t t = 0; t < len; t++) {
    const float zx = sx[t] * (oqx + okx[t]);
    const float zy = sy[t] * (oqy + oky[t]);
    const float ex = exp_nonpositive(-fabsf(zx));
    const float ey = exp_nonpositive(-fabsf(zy));
    const float order = (zx < 0.0f ? zx : 0.0f) + (zy < 0.0f ? zy : 0.0f)
                        - log_at_least_one((1.0f + ex) * (1.0f + ey));
    const float mx = dqx + dkx[t] - thx * dx[t];
    const float my = dqy + dky[t] - thy * dy[t];
    const float logit = order - mx * mx - my * my;
    row[t] = keep[t] != 0.0f ? scale * row[t] + logit : big_neg;
  }
}

/* row_two_axes with the order logits' exponentials factored per token: exp(-s z) =
   exp(-s oq) exp(-s ok), so logsigmoid(zx) + logsigmoid(zy) = -log((1 + ux)(1 + uy)) with
   ux = nqx nkx (s = +1) or pqx pkx (s = -1), `p*` = exp(o), `n*` = exp(-o) precomputed per
   token: one log per pair and head instead of two exps and a log. Used when every |oq| +
   |ok| <= FACTOR_BOUND, so u <= e^40 and the product stays far from overflow. */
static void row_two_axes_factored(float *restrict row, const float *restrict pkx,
                                  const float *restrict nkx, const float *restrict pky,
                                  const float *restrict nky, const float *restrict dkx,
                                  const float *restrict dky, const float *restrict dx,
                                  const float *restrict dy, const float *restrict sx,
                                  const float *restrict sy, const float *restrict keep,
                                  float pqx, float nqx, float pqy, float nqy, float dqx,
                                  float dqy, float thx, float thy, float big_neg, float scale,
                                  int64_t len) {
  for (int64_t t = 0; t < len; t++) {
    const float ux = sx[t] > 0.0f ? nqx * nkx[t] : pqx * pkx[t];
    const float uy = sy[t] > 0.0f ? nqy * nky[t] : pqy * pky[t];
    const float order = -log_at_least_one((1.0f + ux) * (1.0f + uy));
    const float mx = dqx + dkx[t] - thx * dx[t];
    const float my = dqy + dky[t] - thy * dy[t];
    const float logit = order - mx * mx - my * my;
    row[t] = keep[t] != 0.0f ? scale * row[t] + logit : big_neg;
  }
}

#define FACTOR_BOUND 40.0f

/* The same with one axis. */
static void row_one_axis(float *restrict row, const float *restrict okx,
                         const float *restrict dkx, const float *restrict dx,
                         const float *restrict sx, const float *restrict keep, float oqx,
                         float dqx, float thx, float big_neg, float scale, int64_t len) {
  for (int64_t t = 0; t < len; t++) {
    const float zx = sx[t] * (oqx + okx[t]);
    const float ex = exp_nonpositive(-fabsf(zx));
    const float mx = dqx + dkx[t] - thx * dx[t];
    const float logit = (zx < 0.0f ? zx : 0.0f) - log_at_least_one(1.0f + ex) - mx * mx;
    row[t] = keep[t] != 0.0f ? scale * row[t] + logit : big_neg;
  }
}

/* Axes handled by one pass; more (Rich over x, y and the index) are summed pass by pass. */
#define MAX_AXES 2

typedef struct {
  /* Rich Attention (both kernels) */
  const float *oq, *ok, *dq, *dk, *th, *cq, *ck;
  const uint8_t *vq, *vk;
  int64_t axes, batch, heads, blocks, block, radius;
  float big_neg;
  /* the bias kernel's output */
  float *bias;
  /* the attention kernel: queries, keys transposed, values, globals, output */
  const float *q, *k, *v; /* [B, G + tokens, H, D]: the G globals, then the long tokens */
  const uint8_t *vg_valid;
  float *out;
  int64_t dim, globals, tokens;
  float scale;
  /* its packed copies (pack_tokens) */
  float *qp, *kp, *vp;
  int64_t packed_panels;
  /* the attention kernel's Rich projection weights, [H, 2A, D]: the queries' (order then
     distance, per axis) and the keys'; b, c [H, A] (oq/ok/dq/dk above are then its own
     buffers, filled while packing) */
  const float *wq_t, *wk_t, *rich_b, *rich_c;
  /* exp(o) and exp(-o) of the order projections (queries [A, B, H, nq], keys [.., nk]),
     or NULL: the factored Rich rows (factor_exponentials) */
  float *exp_qp, *exp_qn, *exp_kp, *exp_kn;
} Args;

/* The head-shared parts of query row i of block n against its window's band (t in
   [i, i + 2r]): log1p distance and order sign per axis, key validity. Returns whether the
   query is valid. `dist`, `sgn` [MAX_AXES, kk], `keep` [kk]. */
static int pair_terms(const Args *a, int64_t b, int64_t n, int64_t i, float *dist, float *sgn,
                      float *keep) {
  const int64_t c = a->block, r = a->radius, kk = c + 2 * r;
  const int64_t nq = a->blocks * c, nk = nq + 2 * r, qi = n * c + i;
  const int64_t lo = i, hi = i + 2 * r + 1;
  for (int64_t ax = 0; ax < a->axes; ax++) {
    const float ci = a->cq[(ax * a->batch + b) * nq + qi];
    const float *ckw = a->ck + (ax * a->batch + b) * nk + n * c;
    float *d = dist + ax * kk, *sg = sgn + ax * kk;
    for (int64_t t = lo; t < hi; t++) {
      const float diff = ci - ckw[t];
      d[t] = log_at_least_one(1.0f + fabsf(diff));
      sg[t] = ci < ckw[t] ? 1.0f : -1.0f;
    }
  }
  const uint8_t *vkw = a->vk + b * nk + n * c;
  for (int64_t t = lo; t < hi; t++) keep[t] = vkw[t] ? 1.0f : 0.0f; /* all-float loops vectorise */
  return a->vq[b * nq + qi] != 0;
}

/* Head h's row for query i of block n: row[t] = scale * row[t] + Rich logit on the band
   where the key is valid, `big_neg` everywhere else in [0, kk). */
static void rich_row(const Args *a, int64_t b, int64_t n, int64_t i, int64_t h, int qvalid,
                     const float *dist, const float *sgn, const float *keep, float *row,
                     float scale) {
  const int64_t c = a->block, r = a->radius, kk = c + 2 * r, H = a->heads;
  const int64_t nq = a->blocks * c, nk = nq + 2 * r, qi = n * c + i;
  const int64_t lo = i, hi = i + 2 * r + 1;
  for (int64_t t = 0; t < lo; t++) row[t] = a->big_neg;
  for (int64_t t = hi; t < kk; t++) row[t] = a->big_neg;
  if (!qvalid) {
    for (int64_t t = lo; t < hi; t++) row[t] = a->big_neg;
    return;
  }
  if (a->axes == 2 && a->exp_qp != NULL) {
    const int64_t kx = ((0 * a->batch + b) * H + h), ky = ((1 * a->batch + b) * H + h);
    const int64_t w = n * c + lo; /* the band's first key */
    row_two_axes_factored(row + lo, a->exp_kp + kx * nk + w, a->exp_kn + kx * nk + w,
                          a->exp_kp + ky * nk + w, a->exp_kn + ky * nk + w,
                          a->dk + kx * nk + w, a->dk + ky * nk + w, dist + lo, dist + kk + lo,
                          sgn + lo, sgn + kk + lo, keep + lo, a->exp_qp[kx * nq + qi],
                          a->exp_qn[kx * nq + qi], a->exp_qp[ky * nq + qi],
                          a->exp_qn[ky * nq + qi], a->dq[kx * nq + qi], a->dq[ky * nq + qi],
                          a->th[h * 2 + 0], a->th[h * 2 + 1], a->big_neg, scale, hi - lo);
  } else if (a->axes == 2) {
    const int64_t kx = ((0 * a->batch + b) * H + h), ky = ((1 * a->batch + b) * H + h);
    row_two_axes(row + lo, a->ok + kx * nk + n * c + lo, a->ok + ky * nk + n * c + lo,
                 a->dk + kx * nk + n * c + lo, a->dk + ky * nk + n * c + lo, dist + lo,
                 dist + kk + lo, sgn + lo, sgn + kk + lo, keep + lo, a->oq[kx * nq + qi],
                 a->oq[ky * nq + qi], a->dq[kx * nq + qi], a->dq[ky * nq + qi],
                 a->th[h * 2 + 0], a->th[h * 2 + 1], a->big_neg, scale, hi - lo);
  } else {
    const int64_t kx = b * H + h;
    row_one_axis(row + lo, a->ok + kx * nk + n * c + lo, a->dk + kx * nk + n * c + lo,
                 dist + lo, sgn + lo, keep + lo, a->oq[kx * nq + qi], a->dq[kx * nq + qi],
                 a->th[h], a->big_neg, scale, hi - lo);
  }
}

/* ---------------------------------------------------------------- the bias kernel */

static int bias_block(const Args *a, int64_t item, float *scratch) {
  const int64_t b = item / a->blocks, n = item % a->blocks;
  const int64_t c = a->block, kk = c + 2 * a->radius, H = a->heads;
  float *dist = scratch, *sgn = scratch + MAX_AXES * kk, *keep = scratch + 2 * MAX_AXES * kk;
  for (int64_t i = 0; i < c; i++) {
    const int qvalid = pair_terms(a, b, n, i, dist, sgn, keep);
    for (int64_t h = 0; h < H; h++) {
      float *row = a->bias + (((b * a->blocks + n) * H + h) * c + i) * kk;
      for (int64_t t = i; t <= i + 2 * a->radius; t++) row[t] = 0.0f;
      rich_row(a, b, n, i, h, qvalid, dist, sgn, keep, row, 1.0f);
    }
  }
  return 0;
}

/* ------------------------------------------------------- the attention kernel */

/* GCC / Clang vector extensions: AVX2 registers with -march=native on x86, NEON on ARM. */
typedef float v8 __attribute__((vector_size(32)));
#define ROWS 4 /* query rows per register tile */

static inline v8 load8(const float *p) {
  v8 x;
  memcpy(&x, p, sizeof x);
  return x;
}

static inline void store8(float *p, v8 x) { memcpy(p, &x, sizeof x); }

/* s[ROWS, 8 nv] = q[ROWS, D] . keys: q rows D apart, keys packed 8 at a time (`panel`:
   [D, 8] per 8 keys, panels D * 8 apart). nv is a constant at every call, so the
   accumulators stay in registers. */
static inline __attribute__((always_inline)) void qk_tile(const float *q, const float *panel,
                                                          int64_t dim, float *s,
                                                          int64_t s_stride, int nv) {
  v8 acc[ROWS][3];
  for (int r = 0; r < ROWS; r++)
    for (int j = 0; j < nv; j++) acc[r][j] = (v8){0};
  for (int64_t d = 0; d < dim; d++) {
    v8 k[3];
    for (int j = 0; j < nv; j++) k[j] = load8(panel + j * dim * 8 + d * 8);
    for (int r = 0; r < ROWS; r++) {
      const float qv = q[r * dim + d];
      for (int j = 0; j < nv; j++) acc[r][j] += qv * k[j];
    }
  }
  for (int r = 0; r < ROWS; r++)
    for (int j = 0; j < nv; j++) store8(s + r * s_stride + 8 * j, acc[r][j]);
}

/* o[ROWS, 8 nv] = p[ROWS, 0:len] . v[0:len, 8 nv] (v rows `v_stride` apart); nv <= 3. */
static inline __attribute__((always_inline)) void pv_tile(const float *p, int64_t p_stride,
                                                          const float *v, int64_t v_stride,
                                                          int64_t len, float *o,
                                                          int64_t o_stride, int nv) {
  v8 acc[ROWS][3];
  for (int r = 0; r < ROWS; r++)
    for (int j = 0; j < nv; j++) acc[r][j] = (v8){0};
  for (int64_t t = 0; t < len; t++) {
    v8 vv[3];
    for (int j = 0; j < nv; j++) vv[j] = load8(v + t * v_stride + 8 * j);
    for (int r = 0; r < ROWS; r++) {
      const float pr = p[r * p_stride + t];
      for (int j = 0; j < nv; j++) acc[r][j] += pr * vv[j];
    }
  }
  for (int r = 0; r < ROWS; r++)
    for (int j = 0; j < nv; j++) store8(o + r * o_stride + 8 * j, acc[r][j]);
}

/* max(init, x[0:n]) and, below, x <- exp(x - top) returning the sum: in vectors of 8
   lanes, so neither needs the compiler to reassociate (no -ffast-math). */
typedef int32_t i8v __attribute__((vector_size(32)));

static float row_max(const float *x, int64_t n, float init) {
  v8 m = {init, init, init, init, init, init, init, init};
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) {
    const v8 v = load8(x + t);
    const i8v gt = v > m;
    m = (v8)((gt & (i8v)v) | (~gt & (i8v)m));
  }
  float top = m[0];
  for (int l = 1; l < 8; l++) top = m[l] > top ? m[l] : top;
  for (; t < n; t++) top = x[t] > top ? x[t] : top;
  return top;
}

static float exp_and_sum(float *x, int64_t n, float top) {
  float acc[8] = {0};
  int64_t t = 0;
  for (; t + 8 <= n; t += 8)
    for (int l = 0; l < 8; l++) {
      x[t + l] = exp_nonpositive(x[t + l] - top);
      acc[l] += x[t + l];
    }
  for (; t < n; t++) {
    x[t] = exp_nonpositive(x[t] - top);
    acc[0] += x[t];
  }
  float sum = 0.0f;
  for (int l = 0; l < 8; l++) sum += acc[l];
  return sum;
}

/* The packed copies, per (batch, head): queries [nq + ROWS, D], keys in panels
   [nkv, D, 8], values [nk + 8, D]. Packing once (instead of reading [token, head, D] rows
   3 KB apart in the tiles) keeps every tile's loads contiguous. One item is PACK_TOKENS
   tokens of one batch row, every head: each token's [H, D] row is read once, in order. */
#define PACK_TOKENS 64

/* x . y over n (a multiple of 8) in 8 lanes. */
static inline float dot(const float *x, const float *y, int64_t n) {
  v8 acc = {0};
  for (int64_t d = 0; d < n; d += 8) acc += load8(x + d) * load8(y + d);
  float s = 0.0f;
  for (int l = 0; l < 8; l++) s += acc[l];
  return s;
}

static int pack_tokens(const Args *a, int64_t item, float *scratch) {
  (void)scratch;
  const int64_t H = a->heads, D = a->dim, r = a->radius, n = a->tokens;
  const int64_t chunks = (n + PACK_TOKENS - 1) / PACK_TOKENS;
  const int64_t b = item / chunks, i0 = item % chunks * PACK_TOKENS;
  const int64_t i1 = i0 + PACK_TOKENS < n ? i0 + PACK_TOKENS : n;
  const int64_t nq = a->blocks * a->block, nk = nq + 2 * r, nkv = a->packed_panels;
  const int64_t G = a->globals, T = G + n; /* q, k, v: [B, T, H, D], globals first */
  const int64_t A = a->axes, B = a->batch;
  /* the projections are written through the const pointers' own buffers */
  float *oq = (float *)a->oq, *dq = (float *)a->dq, *ok = (float *)a->ok, *dk = (float *)a->dk;
  for (int64_t i = i0; i < i1; i++) {
    const int64_t j = i + r; /* the window position of key token i */
    for (int64_t h = 0; h < H; h++) {
      const int64_t src = ((b * T + G + i) * H + h) * D, bh = b * H + h;
      memcpy(a->qp + (bh * (nq + ROWS) + i) * D, a->q + src, D * 4);
      float *dst = a->kp + (bh * nkv + j / 8) * D * 8 + j % 8;
      for (int64_t d = 0; d < D; d++) dst[d * 8] = a->k[src + d];
      memcpy(a->vp + (bh * (nk + 8) + j) * D, a->v + src, D * 4);
      for (int64_t ax = 0; ax < A; ax++) { /* Rich's per-token projections */
        const float th = a->th[h * A + ax];
        const float *wq = a->wq_t + (h * 2 * A + ax) * D, *wk = a->wk_t + (h * 2 * A + ax) * D;
        oq[((ax * B + b) * H + h) * nq + i] = dot(a->q + src, wq, D) + a->rich_b[h * A + ax];
        dq[((ax * B + b) * H + h) * nq + i] =
            (dot(a->q + src, wq + A * D, D) + a->rich_c[h * A + ax]) * th;
        ok[((ax * B + b) * H + h) * nk + j] = dot(a->k + src, wk, D);
        dk[((ax * B + b) * H + h) * nk + j] = dot(a->k + src, wk + A * D, D) * th;
      }
    }
  }
  return 0;
}

/* Zeros where no token lands (the padding of the blocks and windows), before packing. */
static void zero_padding(const Args *a) {
  const int64_t D = a->dim, r = a->radius, n = a->tokens;
  const int64_t nq = a->blocks * a->block, nk = nq + 2 * r, nkv = a->packed_panels;
  const int64_t lead = (r + 7) / 8, tail = (r + n) / 8; /* panels holding padding keys */
  for (int64_t bh = 0; bh < a->batch * a->heads; bh++) {
    memset(a->qp + (bh * (nq + ROWS) + n) * D, 0, (nq + ROWS - n) * D * 4);
    float *kp = a->kp + bh * nkv * D * 8, *vp = a->vp + bh * (nk + 8) * D;
    memset(kp, 0, lead * D * 8 * 4);
    memset(kp + tail * D * 8, 0, (nkv - tail) * D * 8 * 4);
    memset(vp, 0, r * D * 4);
    memset(vp + (r + n) * D, 0, (nk + 8 - r - n) * D * 4);
  }
}

/* Attention for every head of query block n: the window scores through register tiles,
   Rich and the mask added in place, the globals' scores beside them, one softmax, and the
   weighted values. Query rows go ROWS at a time; a tile's rows share the key range from
   its first row's key rounded down to 8 (a panel) to its last row's last key. */
static int attention_block(const Args *a, int64_t item, float *scratch) {
  const int64_t b = item / a->blocks, n = item % a->blocks;
  const int64_t c = a->block, r = a->radius, kk = c + 2 * r, H = a->heads, D = a->dim;
  const int64_t G = a->globals, nq = a->blocks * c, nk = nq + 2 * r, nkv = a->packed_panels;
  const int64_t c4 = (c + ROWS - 1) / ROWS * ROWS, kkp = (c4 + 2 * r + 40 + 7) / 8 * 8;
  float *dist = scratch;                       /* [c, MAX_AXES, kk] */
  float *sgn = dist + c * MAX_AXES * kk;       /* [c, MAX_AXES, kk] */
  float *keep = sgn + c * MAX_AXES * kk;       /* [c, kk] */
  float *s = keep + c * kk;                    /* [c4, kkp]: key t of row i at s[i kkp + 8 + t] */
  float *gs = s + c4 * kkp;                    /* [c4, G] global scores, then weights */
  float *o = gs + c4 * (G > 0 ? G : 1);        /* [c4, D] */
  int *qvalid = (int *)(o + c4 * D);           /* [c] */
  for (int64_t i = 0; i < c; i++)
    qvalid[i] = pair_terms(a, b, n, i, dist + i * MAX_AXES * kk, sgn + i * MAX_AXES * kk,
                           keep + i * kk);
  const int64_t first = n * c; /* the window's first key, in padded key positions */
  for (int64_t h = 0; h < H; h++) {
    const float *qh = a->qp + (b * H + h) * (nq + ROWS) * D + first * D;
    const float *kh = a->kp + (b * H + h) * nkv * D * 8;
    const float *vh = a->vp + (b * H + h) * (nk + 8) * D;
    for (int64_t i0 = 0; i0 < c4; i0 += ROWS) {
      const int64_t j0 = (first + i0) / 8 * 8, j1 = first + i0 + ROWS + 2 * r;
      for (int64_t j = j0; j < j1; j += 24) {
        const int64_t left = (j1 - j + 7) / 8; /* panels still to cover */
        const float *panel = kh + (j / 8) * D * 8;
        float *st = s + i0 * kkp + 8 + (j - first);
        if (left >= 3) qk_tile(qh + i0 * D, panel, D, st, kkp, 3);
        else if (left == 2) qk_tile(qh + i0 * D, panel, D, st, kkp, 2);
        else qk_tile(qh + i0 * D, panel, D, st, kkp, 1);
      }
    }
    for (int64_t i = 0; i < c; i++) {
      float *row = s + i * kkp + 8;
      rich_row(a, b, n, i, h, qvalid[i], dist + i * MAX_AXES * kk, sgn + i * MAX_AXES * kk,
               keep + i * kk, row, a->scale);
      float *grow = gs + i * G;
      const float *qi = qh + i * D;
      for (int64_t g = 0; g < G; g++) {
        const float *kg = a->k + ((b * (G + a->tokens) + g) * H + h) * D;
        float dot = 0.0f;
        for (int64_t d = 0; d < D; d++) dot += qi[d] * kg[d];
        grow[g] = qvalid[i] && a->vg_valid[b * G + g] ? a->scale * dot : a->big_neg;
      }
      /* softmax over the band and the globals; masked keys hold big_neg (weight ~0) */
      const int64_t lo = i, hi = i + 2 * r + 1;
      float top = row_max(row + lo, hi - lo, a->big_neg);
      for (int64_t g = 0; g < G; g++) top = grow[g] > top ? grow[g] : top;
      int visible = 0;
      for (int64_t t = lo; t < hi; t++) visible |= keep[i * kk + t] != 0.0f;
      for (int64_t g = 0; g < G; g++) visible |= a->vg_valid[b * G + g] != 0;
      visible &= qvalid[i];
      float sum = exp_and_sum(row + lo, hi - lo, top);
      for (int64_t g = 0; g < G; g++) {
        grow[g] = exp_nonpositive(grow[g] - top);
        sum += grow[g];
      }
      const float inv = visible ? 1.0f / sum : 0.0f;
      for (int64_t t = lo; t < hi; t++) row[t] *= inv;
      for (int64_t g = 0; g < G; g++) grow[g] *= inv;
      /* the rest of the tile's key range carries no weight for this row */
      const int64_t t0 = (first + i / ROWS * ROWS) / 8 * 8 - first;
      const int64_t t1 = i / ROWS * ROWS + ROWS + 2 * r;
      for (int64_t t = t0; t < lo; t++) row[t] = 0.0f;
      for (int64_t t = hi; t < t1; t++) row[t] = 0.0f;
    }
    for (int64_t i = c; i < c4; i++) /* the last tile's padding rows: no weight */
      memset(s + i * kkp, 0, kkp * sizeof(float));
    for (int64_t i0 = 0; i0 < c4; i0 += ROWS) {
      const int64_t t0 = (first + i0) / 8 * 8 - first, t1 = i0 + ROWS + 2 * r;
      const int64_t len = (t1 < kk ? t1 : kk) - t0;
      const float *p = s + i0 * kkp + 8 + t0, *v = vh + (first + t0) * D;
      for (int64_t d = 0; d < D;) { /* 3 vectors at a time: 12 accumulator chains */
        const int64_t left = (D - d) / 8;
        if (left >= 3) pv_tile(p, kkp, v + d, D, len, o + i0 * D + d, D, 3);
        else if (left == 2) pv_tile(p, kkp, v + d, D, len, o + i0 * D + d, D, 2);
        else pv_tile(p, kkp, v + d, D, len, o + i0 * D + d, D, 1);
        d += 8 * (left >= 3 ? 3 : left);
      }
    }
    for (int64_t i = 0; i < c && first + i < a->tokens; i++) {
      float *dst = a->out + ((b * a->tokens + first + i) * H + h) * D;
      for (int64_t d = 0; d < D; d++) dst[d] = o[i * D + d];
      for (int64_t g = 0; g < G; g++) {
        const float w = gs[i * G + g], *vg = a->v + ((b * (G + a->tokens) + g) * H + h) * D;
        for (int64_t d = 0; d < D; d++) dst[d] += w * vg[d];
      }
    }
  }
  return 0;
}

/* ------------------------------------------------------------------ threads */

typedef int (*ItemFn)(const Args *, int64_t, float *);

typedef struct {
  const Args *args;
  ItemFn fn;
  int64_t items, scratch_floats, thread, threads;
} Job;

static void *worker(void *p) {
  const Job *job = (const Job *)p;
  const int64_t floats = job->scratch_floats > 0 ? job->scratch_floats : 1;
  float *scratch = (float *)malloc(sizeof(float) * floats);
  if (scratch == NULL) return (void *)1;
  int failed = 0;
  for (int64_t w = job->thread; w < job->items; w += job->threads)
    failed |= job->fn(job->args, w, scratch);
  free(scratch);
  return failed ? (void *)1 : NULL;
}

/* fn(args, item) for item in [0, items), striped over `threads` threads (this one too). */
static int run_threads(const Args *args, ItemFn fn, int64_t items, int64_t scratch_floats,
                       int64_t threads) {
  if (threads > 256) threads = 256;
  if (threads > items) threads = items > 0 ? items : 1;
  Job jobs[256];
  pthread_t ids[256];
  for (int64_t t = 0; t < threads; t++)
    jobs[t] = (Job){args, fn, items, scratch_floats, t, threads};
  int failed = 0;
  int64_t started = 1;
  for (int64_t t = 1; t < threads; t++, started++)
    if (pthread_create(&ids[t], NULL, worker, &jobs[t]) != 0) break;
  for (int64_t t = started; t < threads; t++) failed |= worker(&jobs[t]) != NULL; /* not started */
  failed |= worker(&jobs[0]) != NULL;
  for (int64_t t = 1; t < started; t++) {
    void *res = NULL;
    pthread_join(ids[t], &res);
    failed |= res != NULL;
  }
  return failed ? -2 : 0;
}

/* Shapes (all contiguous, float32 unless said; A = axes in {1, 2}, nq = blocks * block,
   nk = nq + 2 * radius: the keys padded by `radius` on both sides as the windows see them):
     oq, dq [A, B, H, nq]   ok, dk [A, B, H, nk]   th [H, A]
     cq [A, B, nq]   ck [A, B, nk]   vq uint8 [B, nq]   vk uint8 [B, nk]
     bias (out) [B, blocks, H, block, block + 2 * radius]
   Returns 0, or -1 for an argument it does not handle, -2 if a thread failed. */
int rich_window_bias(const float *oq, const float *ok, const float *dq, const float *dk,
                     const float *th, const float *cq, const float *ck, const uint8_t *vq,
                     const uint8_t *vk, float *bias, int64_t axes, int64_t batch,
                     int64_t heads, int64_t blocks, int64_t block, int64_t radius,
                     float big_neg, int64_t threads) {
  if (axes < 1 || axes > MAX_AXES || block < 1 || radius < 0 || threads < 1) return -1;
  Args args = {.oq = oq, .ok = ok, .dq = dq, .dk = dk, .th = th, .cq = cq, .ck = ck, .vq = vq,
               .vk = vk, .axes = axes, .batch = batch, .heads = heads, .blocks = blocks,
               .block = block, .radius = radius, .big_neg = big_neg, .bias = bias};
  return run_threads(&args, bias_block, batch * blocks, (2 * MAX_AXES + 1) * (block + 2 * radius),
                     threads);
}

/* pos = exp(x), neg = exp(-x) for |x| <= FACTOR_BOUND: one vectorised exp and a division. */
static void exp_both(const float *restrict x, float *restrict pos, float *restrict neg,
                     int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const float small = exp_nonpositive(-fabsf(x[i])), large = 1.0f / small;
    pos[i] = x[i] > 0.0f ? large : small;
    neg[i] = x[i] > 0.0f ? small : large;
  }
}

/* For two axes with every |oq| + |ok| <= FACTOR_BOUND (per axis; trained and random
   models alike stay far inside it): exp(+-o) per token into one allocation that the
   caller frees, pointed to from `a`; otherwise (or out of memory) NULL and the exact
   rows. */
static float *factor_exponentials(Args *a) {
  if (a->axes != 2) return NULL;
  const int64_t nq = a->blocks * a->block, nk = nq + 2 * a->radius;
  const int64_t per_axis_q = a->batch * a->heads * nq, per_axis_k = a->batch * a->heads * nk;
  for (int64_t ax = 0; ax < 2; ax++) {
    float mq = 0.0f, mk = 0.0f;
    for (int64_t i = 0; i < per_axis_q; i++) {
      const float x = fabsf(a->oq[ax * per_axis_q + i]);
      mq = x > mq ? x : mq;
      if (!(x <= FACTOR_BOUND)) return NULL; /* also NaN */
    }
    for (int64_t i = 0; i < per_axis_k; i++) {
      const float x = fabsf(a->ok[ax * per_axis_k + i]);
      mk = x > mk ? x : mk;
      if (!(x <= FACTOR_BOUND)) return NULL;
    }
    if (!(mq + mk <= FACTOR_BOUND)) return NULL;
  }
  const int64_t nqs = 2 * per_axis_q, nks = 2 * per_axis_k;
  float *buf = (float *)malloc(sizeof(float) * 2 * (nqs + nks));
  if (buf == NULL) return NULL;
  a->exp_qp = buf;
  a->exp_qn = buf + nqs;
  a->exp_kp = buf + 2 * nqs;
  a->exp_kn = buf + 2 * nqs + nks;
  exp_both(a->oq, a->exp_qp, a->exp_qn, nqs);
  exp_both(a->ok, a->exp_kp, a->exp_kn, nks);
  return buf;
}

/* The long queries' attention with Rich Attention over the windows and the globals:
     w_q, w_k, v_q, v_k [H, D, A]: Rich's projection weights (order: w, distance: v)
     b, c, th [H, A]: its biases and |theta| / sqrt 2
     cq [A, B, nq], ck [A, B, nk], vq uint8 [B, nq], vk uint8 [B, nk]: coordinates and
       validity of the block and window positions (nq = blocks * block, nk = nq + 2r)
     q, k, v [B, G + tokens, H, D]: the G global tokens first, then the long ones
       (tokens <= nq; the kernel pads the blocks and windows itself)
     vg_valid uint8 [B, G]
     out [B, tokens, H, D]: softmax(scale q.k + Rich, over |key - query| <= radius and the
     globals, valid keys only) . v; 0 for a query that sees no key. D % 8 == 0.
   Rich's per-token projections are computed while packing (each token once).
   Returns 0, -1 for an argument it does not handle, -2 if a thread failed, -3 if out of
   memory. */
int etc_rich_attention(const float *w_q, const float *w_k, const float *v_q, const float *v_k,
                       const float *rich_b, const float *rich_c, const float *th,
                       const float *cq, const float *ck, const uint8_t *vq, const uint8_t *vk,
                       const float *q, const float *k, const float *v, const uint8_t *vg_valid,
                       float *out, int64_t axes, int64_t batch, int64_t heads, int64_t blocks,
                       int64_t block, int64_t radius, int64_t dim, int64_t globals,
                       int64_t tokens, float scale, float big_neg, int64_t threads) {
  const int64_t kk = block + 2 * radius, nq = blocks * block, nk = nq + 2 * radius;
  if (axes < 1 || axes > MAX_AXES || block < 1 || radius < 0 || threads < 1 || dim < 8
      || dim % 8 != 0 || globals < 0 || tokens < 0 || tokens > nq)
    return -1;
  const int64_t panels = (nk + 8 + 24 + 7) / 8; /* slack for the tiles' last panels */
  const int64_t bh = batch * heads, A = axes, D = dim;
  /* one allocation: packed q, k panels, v, the projections and the transposed weights */
  const int64_t n_qp = bh * (nq + ROWS) * D, n_kp = bh * panels * D * 8, n_vp = bh * (nk + 8) * D;
  const int64_t n_pq = A * bh * nq, n_pk = A * bh * nk, n_w = heads * 2 * A * D;
  const int64_t total = n_qp + n_kp + n_vp + 2 * n_pq + 2 * n_pk + 2 * n_w;
  float *mem = (float *)malloc(sizeof(float) * total);
  if (mem == NULL) return -3;
  float *oq = mem + n_qp + n_kp + n_vp, *dq = oq + n_pq, *ok = dq + n_pq, *dk = ok + n_pk;
  float *wq_t = dk + n_pk, *wk_t = wq_t + n_w;
  for (int64_t h = 0; h < heads; h++) /* [H, D, A] -> [H, 2A, D]: order rows, then distance */
    for (int64_t ax = 0; ax < A; ax++)
      for (int64_t d = 0; d < D; d++) {
        wq_t[(h * 2 * A + ax) * D + d] = w_q[(h * D + d) * A + ax];
        wq_t[(h * 2 * A + A + ax) * D + d] = v_q[(h * D + d) * A + ax];
        wk_t[(h * 2 * A + ax) * D + d] = w_k[(h * D + d) * A + ax];
        wk_t[(h * 2 * A + A + ax) * D + d] = v_k[(h * D + d) * A + ax];
      }
  /* padding positions: what projecting a zero token gives (b and c th for queries, 0 for
     keys); pack_tokens overwrites the tokens' */
  for (int64_t ax = 0; ax < A; ax++)
    for (int64_t b = 0; b < batch; b++)
      for (int64_t h = 0; h < heads; h++) {
        const int64_t row = (ax * batch + b) * heads + h;
        for (int64_t i = 0; i < nq; i++) {
          oq[row * nq + i] = rich_b[h * A + ax];
          dq[row * nq + i] = rich_c[h * A + ax] * th[h * A + ax];
        }
        for (int64_t j = 0; j < nk; j++) ok[row * nk + j] = dk[row * nk + j] = 0.0f;
      }
  Args args = {.oq = oq, .ok = ok, .dq = dq, .dk = dk, .th = th, .cq = cq, .ck = ck, .vq = vq,
               .vk = vk, .axes = axes, .batch = batch, .heads = heads, .blocks = blocks,
               .block = block, .radius = radius, .big_neg = big_neg, .q = q, .k = k, .v = v,
               .vg_valid = vg_valid, .out = out, .dim = dim, .globals = globals,
               .tokens = tokens, .scale = scale, .packed_panels = panels, .wq_t = wq_t,
               .wk_t = wk_t, .rich_b = rich_b, .rich_c = rich_c};
  args.qp = mem;
  args.kp = mem + n_qp;
  args.vp = mem + n_qp + n_kp;
  zero_padding(&args);
  int rc = run_threads(&args, pack_tokens, batch * ((tokens + PACK_TOKENS - 1) / PACK_TOKENS), 0,
                       threads);
  float *exps = rc == 0 ? factor_exponentials(&args) : NULL;
  if (rc == 0) {
    const int64_t c4 = (block + ROWS - 1) / ROWS * ROWS;
    const int64_t kkp = (c4 + 2 * radius + 40 + 7) / 8 * 8;
    const int64_t floats = block * (2 * MAX_AXES + 1) * kk + c4 * kkp
                           + c4 * (globals > 0 ? globals : 1) + c4 * dim + block + 16;
    rc = run_threads(&args, attention_block, batch * blocks, floats, threads);
  }
  free(mem);
  free(exps);
  return rc;
}
