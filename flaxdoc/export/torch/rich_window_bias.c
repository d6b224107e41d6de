/* Rich Attention's logits over ETC's sliding key windows, fused: one pass, no temporaries.

   Built at first use by flaxdoc/export/torch/native.py (the C compiler, -O3 -march=native,
   no other dependency) and called through ctypes; the PyTorch export falls back to its
   tensor form when it cannot be built. The mathematics is FormNet's Rich Attention
   (DESIGN.md; flaxdoc.nn.layout_terms.RichAttentionTerm), summed over the axes:

     z     = oq_i + ok_j                      order logit (oq includes the bias b)
     s     = logsigmoid(z) if c_i < c_j else logsigmoid(-z)
     m     = dq_i + dk_j - th * log1p(|c_i - c_j|)   (dq, dk, th already times |theta|/sqrt 2)
     logit = sum over axes of (s - m * m)

   written for query block n (c queries) and its window of c + 2r keys: query i of the
   block sees window key t when i <= t <= i + 2r (|key - query| <= r) and both tokens are
   valid; every other entry gets `big_neg`, as the tensor form's additive mask does.

   Why a kernel: the tensor form makes about seven passes per axis over the [H, c, c + 2r]
   logits of every block (about 107 ms a layer at 2,048 tokens on two cores, more than
   the attention itself). Here the head-shared parts (distance, order, mask) are computed
   once per (query, key) pair and every head's row is one vectorised loop over its keys,
   with exp and log as branch-free polynomials the compiler vectorises:

     logsigmoid(zx) + logsigmoid(zy) = min(zx, 0) + min(zy, 0)
                                       - log((1 + exp(-|zx|)) (1 + exp(-|zy|)))

   (one log for both axes; the product lies in [1, 4], so nothing overflows).
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

/* exp(x) for x <= 0: 2^n e^f with |f| <= ln2 / 2, e^f by its Taylor series to degree 7
   (truncation below 6e-9 relative). Below -87 it returns exp(-87) (~1.6e-38): the callers
   add it to 1. */
static inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
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
                         int64_t len) {
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
    row[t] = keep[t] != 0.0f ? logit : big_neg;
  }
}

/* The same with one axis. */
static void row_one_axis(float *restrict row, const float *restrict okx,
                         const float *restrict dkx, const float *restrict dx,
                         const float *restrict sx, const float *restrict keep, float oqx,
                         float dqx, float thx, float big_neg, int64_t len) {
  for (int64_t t = 0; t < len; t++) {
    const float zx = sx[t] * (oqx + okx[t]);
    const float ex = exp_nonpositive(-fabsf(zx));
    const float mx = dqx + dkx[t] - thx * dx[t];
    const float logit = (zx < 0.0f ? zx : 0.0f) - log_at_least_one(1.0f + ex) - mx * mx;
    row[t] = keep[t] != 0.0f ? logit : big_neg;
  }
}

typedef struct {
  const float *oq, *ok, *dq, *dk, *th, *cq, *ck;
  const uint8_t *vq, *vk;
  float *out;
  int64_t axes, batch, heads, blocks, block, radius;
  float big_neg;
  int64_t thread, threads;
} Args;

/* Axes handled by one pass; more (Rich over x, y and the index) are summed pass by pass. */
#define MAX_AXES 2

static void block_rows(const Args *a, int64_t b, int64_t n, float *scratch) {
  const int64_t c = a->block, r = a->radius, kk = c + 2 * r, H = a->heads;
  const int64_t nq = a->blocks * c, nk = nq + 2 * r;
  float *dist = scratch;               /* [MAX_AXES, kk]: th-free log1p |c_i - c_j| */
  float *sgn = scratch + MAX_AXES * kk; /* [MAX_AXES, kk]: +1 if c_i < c_j else -1 */
  float *keep = scratch + 2 * MAX_AXES * kk; /* [kk]: 1 for a valid key, else 0 */
  for (int64_t i = 0; i < c; i++) {
    const int64_t qi = n * c + i;
    float *row0 = a->out + (((b * a->blocks + n) * H) * c + i) * kk; /* head 0's row */
    const int64_t lo = i, hi = i + 2 * r + 1; /* the band inside the window */
    const int qvalid = a->vq[b * nq + qi] != 0;
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
    for (int64_t h = 0; h < H; h++) {
      float *row = row0 + h * c * kk;
      for (int64_t t = 0; t < lo; t++) row[t] = a->big_neg;
      for (int64_t t = hi; t < kk; t++) row[t] = a->big_neg;
      if (!qvalid) {
        for (int64_t t = lo; t < hi; t++) row[t] = a->big_neg;
        continue;
      }
      if (a->axes == 2) {
        const int64_t kx = ((0 * a->batch + b) * H + h), ky = ((1 * a->batch + b) * H + h);
        row_two_axes(row + lo, a->ok + kx * nk + n * c + lo, a->ok + ky * nk + n * c + lo,
                     a->dk + kx * nk + n * c + lo, a->dk + ky * nk + n * c + lo,
                     dist + lo, dist + kk + lo, sgn + lo, sgn + kk + lo, keep + lo,
                     a->oq[kx * nq + qi], a->oq[ky * nq + qi], a->dq[kx * nq + qi],
                     a->dq[ky * nq + qi], a->th[h * 2 + 0], a->th[h * 2 + 1], a->big_neg,
                     hi - lo);
      } else {
        const int64_t kx = b * H + h;
        row_one_axis(row + lo, a->ok + kx * nk + n * c + lo, a->dk + kx * nk + n * c + lo,
                     dist + lo, sgn + lo, keep + lo, a->oq[kx * nq + qi], a->dq[kx * nq + qi],
                     a->th[h], a->big_neg, hi - lo);
      }
    }
  }
}

static void *worker(void *p) {
  const Args *a = (const Args *)p;
  const int64_t kk = a->block + 2 * a->radius;
  float *scratch = (float *)malloc(sizeof(float) * (2 * MAX_AXES + 1) * kk);
  if (scratch == NULL) return (void *)1;
  const int64_t total = a->batch * a->blocks;
  for (int64_t w = a->thread; w < total; w += a->threads) {
    block_rows(a, w / a->blocks, w % a->blocks, scratch);
  }
  free(scratch);
  return NULL;
}

/* Shapes (all contiguous, float32 unless said; A = axes in {1, 2}, nq = blocks * block,
   nk = nq + 2 * radius: the keys padded by `radius` on both sides as the windows see them):
     oq, dq [A, B, H, nq]   ok, dk [A, B, H, nk]   th [H, A]
     cq [A, B, nq]   ck [A, B, nk]   vq uint8 [B, nq]   vk uint8 [B, nk]
     out [B, blocks, H, block, block + 2 * radius]
   Returns 0, or -1 for an argument it does not handle, -2 if a thread failed. */
int rich_window_bias(const float *oq, const float *ok, const float *dq, const float *dk,
                     const float *th, const float *cq, const float *ck, const uint8_t *vq,
                     const uint8_t *vk, float *out, int64_t axes, int64_t batch,
                     int64_t heads, int64_t blocks, int64_t block, int64_t radius,
                     float big_neg, int64_t threads) {
  if (axes < 1 || axes > MAX_AXES || block < 1 || radius < 0 || threads < 1) return -1;
  if (threads > 256) threads = 256;
  if (threads > batch * blocks) threads = batch * blocks > 0 ? batch * blocks : 1;
  Args args[256];
  pthread_t ids[256];
  int failed = 0;
  for (int64_t t = 0; t < threads; t++) {
    args[t] = (Args){oq, ok, dq, dk, th, cq, ck, vq, vk, out, axes, batch, heads, blocks,
                     block, radius, big_neg, t, threads};
  }
  int64_t started = 1;
  for (int64_t t = 1; t < threads; t++, started++) {
    if (pthread_create(&ids[t], NULL, worker, &args[t]) != 0) break;
  }
  if (started < threads) { /* could not start them all: this thread does the rest */
    for (int64_t t = started; t < threads; t++) failed |= worker(&args[t]) != NULL;
  }
  failed |= worker(&args[0]) != NULL;
  for (int64_t t = 1; t < started; t++) {
    void *res = NULL;
    pthread_join(ids[t], &res);
    failed |= res != NULL;
  }
  return failed ? -2 : 0;
}
