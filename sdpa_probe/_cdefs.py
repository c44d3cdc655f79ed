"""cffi declarations mirroring native/include/*.h (cffi cannot read #include)."""

from . import _cdef_blocks, _cdef_caller, _cdef_fence, _cdef_machine

ABI = """
#define SDPA_ABI_VERSION 1
enum sdpa_dtype { SDPA_F32 = 0, SDPA_F16 = 1, SDPA_BF16 = 2, SDPA_I8 = 3 };
enum sdpa_status { SDPA_OK = 0, SDPA_UNSUPPORTED = 1, SDPA_INVALID = 2 };
typedef struct sdpa_tensor {
  void *data; int32_t dtype; int64_t stride[4];
  const float *scale; const int8_t *zero_point; int64_t qstride[3];
} sdpa_tensor;
typedef struct sdpa_args {
  int32_t abi_version;
  int64_t batch, n_heads, n_kv_heads, q_len, kv_len, head_dim;
  sdpa_tensor q, k, v, out;
  const float *mask; int64_t mask_row_stride;
  int32_t is_causal; int64_t start_pos; float scale; int32_t n_threads;
} sdpa_args;
typedef int (*sdpa_probe_forward_fn)(const sdpa_args *args);
"""

USER_KERNEL = ABI + """
int sdpa_forward(const sdpa_args *args);
"""

LIB = ABI + """
#define SDPA_PROBE_MAX_THREADS 64
typedef struct sdpa_probe_kernel_info {
  const char *name; const char *description; uint32_t dtypes; uint32_t features;
} sdpa_probe_kernel_info;
int64_t sdpa_probe_kernel_count(void);
const sdpa_probe_kernel_info *sdpa_probe_kernel_get(int64_t index);
int sdpa_probe_kernel_forward(int64_t index, const sdpa_args *args);
int64_t sdpa_probe_kernel_scratch_bytes(int64_t index, const sdpa_args *args);
typedef struct sdpa_probe_flash_opts { int64_t q_block; int64_t kv_block; int32_t n_splits; }
  sdpa_probe_flash_opts;
int sdpa_probe_flash_forward_ex(const sdpa_args *args, const sdpa_probe_flash_opts *opts);
int sdpa_probe_flash_maskskip_forward_ex(const sdpa_args *args, const sdpa_probe_flash_opts *opts);
const char *sdpa_probe_flash_bf16_why(void);
int sdpa_probe_default_threads(void);
int64_t sdpa_probe_align_up(int64_t x, int64_t a);
void sdpa_probe_alloc_stats(int64_t *count, int64_t *bytes);
void sdpa_probe_alloc_reset(void);
int sdpa_probe_process_alloc_stats(int64_t *allocs, int64_t *bytes, int64_t *frees,
                                   int64_t *threads);
int64_t sdpa_probe_fp_control(void);
void sdpa_probe_fp_control_set(int64_t v);
int64_t sdpa_probe_heap_in_use(void);
int64_t sdpa_probe_program_break(void);
typedef struct sdpa_probe_alloc_record {
  int64_t seq; int64_t bytes; int64_t high_water; int64_t touched; int64_t overrun;
  int64_t underrun;
} sdpa_probe_alloc_record;
void sdpa_probe_alloc_guard(int on);
int64_t sdpa_probe_alloc_guard_records(sdpa_probe_alloc_record *out, int64_t max);
int sdpa_probe_alloc_guard_test(int64_t bytes, int64_t write_from, int64_t write_to);
int sdpa_probe_call_watched(sdpa_probe_forward_fn fn, int64_t kernel_index, const sdpa_args *a,
                            const void *watch, void *copy, int64_t nbytes);
int sdpa_probe_bench_loop(int64_t kernel_index, const sdpa_args *args, int64_t n_args,
                          int64_t iters, double *seconds_out);
int sdpa_probe_bench_loop_fn(sdpa_probe_forward_fn fn, const sdpa_args *args, int64_t n_args,
                             int64_t iters, double *seconds_out);
"""

# Feature bits of enum sdpa_probe_feature, in bit order.
FEATURES = [
    "gqa-in-kernel", "gqa-broadcast", "causal", "mask", "strided", "online-softmax",
    "mask-skip", "split-k", "per-token-i8", "alloc-per-block", "full-scores", "bf16-products",
]

# The non-kernel parts of the library (decode building blocks, machine
# micro-benchmarks) each keep their declarations in sdpa_probe/_cdef_<part>.py
# as CDEF (cdef text) and INCLUDE (the #include line for set_source).
PARTS = (_cdef_blocks, _cdef_machine, _cdef_caller, _cdef_fence)


EXTRA = "".join(part.CDEF for part in PARTS)
EXTRA_INCLUDES = "".join(part.INCLUDE for part in PARTS)
