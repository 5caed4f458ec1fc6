//! The data pattern written and checked on the device, so a round trip is verified where the
//! data lives. Two kernels, in hand-written PTX for NVIDIA (loaded by the driver, so no NVRTC is
//! needed) and in HIP source for AMD (compiled at run time for the GPU that is there), and the
//! same function on the host, which the tests hold the kernels to.
//!
//! Byte `i` for seed `s` is the top byte of `(i ^ key(s)) * GOLDEN` (64-bit wrapping). The key
//! mixes the seed, so the patterns of two seeds are not shifts of each other: a message
//! delivered to the wrong iteration, or one byte off, is caught.

pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The seed as the kernels take it.
pub fn key(seed: u64) -> u64 {
    let x = (seed ^ 0x2545_F491_4F6C_DD1D).wrapping_mul(0xD6E8_FEB8_6659_FD93);
    x ^ (x >> 32)
}

/// Byte `i` of the pattern for `seed` (the host reference of `wringer_fill`).
pub fn byte(seed: u64, i: u64) -> u8 {
    ((i ^ key(seed)).wrapping_mul(GOLDEN) >> 56) as u8
}

/// The first `len` bytes of the pattern for `seed`.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| byte(seed, i)).collect()
}

/// PTX ISA 7.0 for sm_70 and newer: the driver JIT-compiles it for the GPU at hand (V100 up to
/// H200 and Blackwell). Grid-stride loops, so any grid size covers any length.
pub const PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

// out[i] = ((i ^ key) * GOLDEN) >> 56 for i < n.
.visible .entry wringer_fill(
    .param .u64 out_param,
    .param .u64 n_param,
    .param .u64 key_param
)
{
    .reg .pred %p<2>;
    .reg .b16 %rs<2>;
    .reg .b32 %r<5>;
    .reg .b64 %rd<10>;

    ld.param.u64 %rd1, [out_param];
    ld.param.u64 %rd2, [n_param];
    ld.param.u64 %rd3, [key_param];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.u64 %rd6, %rd4, %rd5;
    mul.wide.u32 %rd7, %r4, %r2;
    setp.ge.u64 %p1, %rd6, %rd2;
    @%p1 bra FILL_DONE;
FILL_LOOP:
    xor.b64 %rd8, %rd6, %rd3;
    mul.lo.u64 %rd8, %rd8, 0x9E3779B97F4A7C15;
    shr.u64 %rd8, %rd8, 56;
    cvt.u16.u64 %rs1, %rd8;
    add.u64 %rd9, %rd1, %rd6;
    st.global.u8 [%rd9], %rs1;
    add.u64 %rd6, %rd6, %rd7;
    setp.lt.u64 %p1, %rd6, %rd2;
    @%p1 bra FILL_LOOP;
FILL_DONE:
    ret;
}

// *mismatches += count of i < n where buf[i] != ((i ^ key) * GOLDEN) >> 56.
.visible .entry wringer_check(
    .param .u64 buf_param,
    .param .u64 n_param,
    .param .u64 key_param,
    .param .u64 mismatches_param
)
{
    .reg .pred %p<3>;
    .reg .b16 %rs<3>;
    .reg .b32 %r<5>;
    .reg .b64 %rd<11>;

    ld.param.u64 %rd1, [buf_param];
    ld.param.u64 %rd2, [n_param];
    ld.param.u64 %rd3, [key_param];
    ld.param.u64 %rd10, [mismatches_param];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd10, %rd10;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.u64 %rd6, %rd4, %rd5;
    mul.wide.u32 %rd7, %r4, %r2;
    setp.ge.u64 %p1, %rd6, %rd2;
    @%p1 bra CHECK_DONE;
CHECK_LOOP:
    xor.b64 %rd8, %rd6, %rd3;
    mul.lo.u64 %rd8, %rd8, 0x9E3779B97F4A7C15;
    shr.u64 %rd8, %rd8, 56;
    cvt.u16.u64 %rs1, %rd8;
    add.u64 %rd9, %rd1, %rd6;
    ld.global.u8 %rs2, [%rd9];
    setp.ne.u16 %p2, %rs1, %rs2;
    @%p2 red.global.add.u32 [%rd10], 1;
    add.u64 %rd6, %rd6, %rd7;
    setp.lt.u64 %p1, %rd6, %rd2;
    @%p1 bra CHECK_LOOP;
CHECK_DONE:
    ret;
}
"#;

/// The same two kernels in HIP C++, compiled by the host's hiprtc for its GPU's architecture
/// (gfx90a, gfx942, …): shipping code objects would tie a build to the architectures one ROCm
/// release knew.
pub const HIP_SOURCE: &str = r#"
// out[i] = ((i ^ key) * GOLDEN) >> 56 for i < n.
extern "C" __global__ void wringer_fill(unsigned char* out, unsigned long long n,
                                        unsigned long long key) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < n; i += stride) {
        out[i] = (unsigned char)(((i ^ key) * 0x9E3779B97F4A7C15ull) >> 56);
    }
}

// *mismatches += count of i < n where buf[i] != ((i ^ key) * GOLDEN) >> 56.
extern "C" __global__ void wringer_check(const unsigned char* buf, unsigned long long n,
                                         unsigned long long key, unsigned int* mismatches) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < n; i += stride) {
        if (buf[i] != (unsigned char)(((i ^ key) * 0x9E3779B97F4A7C15ull) >> 56)) {
            atomicAdd(mismatches, 1u);
        }
    }
}
"#;

/// Threads per block, and the most blocks a launch uses (grid-stride loops cover the rest).
pub(crate) const BLOCK: u32 = 256;
const MAX_GRID: u64 = 1024;

/// Blocks for a launch over `n` bytes.
pub(crate) fn grid(n: usize) -> u32 {
    (n as u64).div_ceil(BLOCK as u64).clamp(1, MAX_GRID) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_reference_is_deterministic_and_seed_dependent() {
        assert_eq!(bytes(7, 4096), bytes(7, 4096));
        assert_eq!(bytes(7, 100)[37], byte(7, 37));
        // Different seeds disagree on most bytes, and never as a shift by one.
        let (a, b) = (bytes(1, 4096), bytes(2, 4096));
        let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
        assert!(same < 64, "{same} of 4096 bytes equal across seeds");
        let shifted = a[1..].iter().zip(&a).filter(|(x, y)| x == y).count();
        assert!(shifted < 64, "{shifted} bytes equal to their neighbour");
        // Every byte value occurs: the pattern is not confined to a few values.
        let mut seen = [false; 256];
        a.iter().for_each(|&v| seen[v as usize] = true);
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn grid_covers_any_length_within_bounds() {
        assert_eq!(grid(0), 1);
        assert_eq!(grid(1), 1);
        assert_eq!(grid(257), 2);
        assert_eq!(grid(1 << 30), MAX_GRID as u32);
    }
}
