/* The rowwise + columnwise 1x16 NVFP4 fake quantization of a contiguous FP32 matrix
 * (precision/nvfp4.py fake_quantize_rowcol, round to nearest), fused into two passes over the
 * input, and the rowwise one alone (fake_quantize_amax's common case). Loaded by
 * precision/native.py, which compiles it with -ffp-contract=off and no fast-math: every line
 * below is the IEEE FP32 operation of the torch code it replaces, in the same order, so the
 * results are the same bits (tests/test_nvfp4_native.py). `threads`: OpenMP threads (torch's
 * intra-op count; with -fopenmp the process's libgomp is torch's own, loaded first); every
 * thread writes its own rows and blocks, so the results do not depend on it.
 *
 * Layout: x [rows, cols]; the rowwise blocks are 16 consecutive elements of a row, the
 * columnwise blocks 16 consecutive rows of a column. cols (and for the columnwise blocks rows)
 * are multiples of 16.
 */
#include <stdint.h>
#include <string.h>

#define BLOCK 16
#define EXP_MASK 0x7F800000u
#define ABS_MASK 0x7FFFFFFFu
#define E4M3_MAX 448.0f
#define FLT_MAX_F 3.4028234663852886e38f
/* Exponent clamps on the masked bits of a power of two (or 0, or inf), as unsigned integers:
 * for non-negative floats the order of the bits is the order of the values (the torch code
 * clamps the same bits as FP32 values) */
#define MIN_NORMAL_BITS 0x3C800000u   /* 2^-6, the smallest normal e4m3 exponent */
#define ONE_BITS 0x3F800000u          /* 1.0 */
#define FOUR_BITS 0x40800000u         /* 4.0 */
#define C_E4M3 1572864.0f             /* 1.5 * 2^20: ulp 2^-3 at 2^0 */
#define C_E2M1 6291456.0f             /* 1.5 * 2^22: ulp 2^-1 at 2^0 */

static inline uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float float_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* Block maxima of |x| as FP32 bit patterns (non-negative floats order as their bits; a NaN's
 * above +inf): amax_row [rows * cols/16], amax_col [rows/16 * cols] (NULL: rowwise only, and
 * rows need not be a multiple of 16). Returns the bits of max|x|. */
static inline uint32_t block_max(const uint32_t *v) {
    uint32_t m = 0;
    for (int i = 0; i < BLOCK; i++) {
        uint32_t a = v[i] & ABS_MASK;
        m = a > m ? a : m;
    }
    return m;
}

uint32_t nvfp4_block_amax(const float *x, int64_t rows, int64_t cols,
                          uint32_t *amax_row, uint32_t *amax_col, int threads) {
    const uint32_t *xb = (const uint32_t *)x;
    int64_t cb = cols / BLOCK;
    uint32_t top = 0;
    if (!amax_col) {
        #pragma omp parallel for num_threads(threads) if(threads > 1) reduction(max:top)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < cb; j++) {
                uint32_t m = amax_row[r * cb + j] = block_max(xb + r * cols + j * BLOCK);
                top = m > top ? m : top;
            }
        return top;
    }
    #pragma omp parallel for num_threads(threads) if(threads > 1) reduction(max:top)
    for (int64_t g = 0; g < rows / BLOCK; g++) {      /* 16 rows: one row of column blocks */
        uint32_t *col = amax_col + g * cols;
        memset(col, 0, (size_t)cols * sizeof(uint32_t));
        for (int64_t r = g * BLOCK; r < (g + 1) * BLOCK; r++) {
            const uint32_t *row = xb + r * cols;
            for (int64_t c = 0; c < cols; c++) {
                uint32_t a = row[c] & ABS_MASK;
                col[c] = a > col[c] ? a : col[c];
            }
            for (int64_t j = 0; j < cb; j++) {
                uint32_t m = amax_row[r * cb + j] = block_max(row + j * BLOCK);
                top = m > top ? m : top;
            }
        }
    }
    return top;
}

/* The e4m3 block scales s_b of block amaxes (torch: amax * k, clamp_(max=448),
 * rounding.round_e4m3_) and their encode factors enc = min(1 / (s_b * S_dec), FLT_MAX); a NaN
 * stays NaN, as in torch. One vectorised loop over every block of both layouts. */
static void block_scales(const uint32_t *amax, int64_t m, float k, float s_dec, float *s_b,
                         float *enc, int threads) {
    #pragma omp parallel for num_threads(threads) if(threads > 1 && m >= 8192)
    for (int64_t i = 0; i < m; i++) {
        float s = float_of(amax[i]) * k;
        s = s > E4M3_MAX ? E4M3_MAX : s;
        uint32_t eb = bits_of(s) & EXP_MASK;
        float e = float_of(eb < MIN_NORMAL_BITS ? MIN_NORMAL_BITS : eb);
        s = (s + e * C_E4M3) - e * C_E4M3;
        float v = 1.0f / (s * s_dec);
        enc[i] = v > FLT_MAX_F ? FLT_MAX_F : v;
        s_b[i] = s;
    }
}

/* x * enc clamped to [-6, 6], rounded to the nearest E2M1 value (ties to even), times s_b, times
 * S_dec: precision/rounding.round_e2m1_ and the dequantization. The clamp runs unconditionally:
 * the torch code skips it only when no |x * enc| reaches 7, and values in (6, 7) round to 6
 * either way (the E2M1 step there is 2). */
static inline float quantize(float v, float enc, float s_b, float s_dec) {
    float y = v * enc;
    y = y < -6.0f ? -6.0f : (y > 6.0f ? 6.0f : y);
    uint32_t eb = bits_of(y) & EXP_MASK;             /* 2^floor(log2|y|), 0 or inf */
    eb = eb < ONE_BITS ? ONE_BITS : (eb > FOUR_BITS ? FOUR_BITS : eb);
    float e = float_of(eb);
    y = (y + e * C_E2M1) - e * C_E2M1;
    return (y * s_b) * s_dec;
}

/* The rowwise dequantized values into out [rows * cols], from nvfp4_block_amax's rowwise
 * maxima amax [rows * cols / 16]; s_b and enc: scratch of as many floats. */
void nvfp4_row(const float *x, int64_t rows, int64_t cols, const uint32_t *amax, float k,
               float s_dec, float *s_b, float *enc, float *out, int threads) {
    int64_t m = rows * cols / BLOCK;
    block_scales(amax, m, k, s_dec, s_b, enc, threads);
    #pragma omp parallel for num_threads(threads) if(threads > 1)
    for (int64_t b = 0; b < m; b++)
        for (int i = 0; i < BLOCK; i++)
            out[b * BLOCK + i] = quantize(x[b * BLOCK + i], enc[b], s_b[b], s_dec);
}

/* Both dequantized layouts into out [2, rows * cols] (rowwise values first, then the columnwise
 * ones at the same positions). amax [2, m] (m = rows * cols / 16): the block maxima of
 * nvfp4_block_amax, rowwise then columnwise; k = fl32(S_enc / 6) and s_dec = S_dec as FP32;
 * s_b and enc [2, m]: scratch for the block scales and encode factors. */
void nvfp4_rowcol(const float *x, int64_t rows, int64_t cols, const uint32_t *amax, float k,
                  float s_dec, float *s_b, float *enc, float *out, int threads) {
    int64_t cb = cols / BLOCK, n = rows * cols, m = n / BLOCK;
    block_scales(amax, 2 * m, k, s_dec, s_b, enc, threads);
    const float *sb_col = s_b + m, *enc_col = enc + m;
    #pragma omp parallel for num_threads(threads) if(threads > 1)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        const float *sc = sb_col + (r / BLOCK) * cols, *ec = enc_col + (r / BLOCK) * cols;
        float *yr = out + r * cols, *yc = out + n + r * cols;
        for (int64_t j = 0; j < cb; j++) {
            float sb = s_b[r * cb + j], e = enc[r * cb + j];
            for (int i = 0; i < BLOCK; i++)
                yr[j * BLOCK + i] = quantize(xr[j * BLOCK + i], e, sb, s_dec);
        }
        for (int64_t c = 0; c < cols; c++)
            yc[c] = quantize(xr[c], ec[c], sc[c], s_dec);
    }
}
