// wgrad_mma_cl: wgrad_mma's grad-weight on channels-last data, without channels-first
// copies (compiled after wgrad_mma.cu, whose body it runs with CLG > 0). A block takes CLG
// (8 or 16) consecutive channels, a warp each, all on the same work item; one TMA box a
// tensor a slot brings the block's channels' rows ([rows][columns][channels], 16 or 32
// bytes a pixel) into a staging ring, and the block's warps transpose each slot into the
// channels-first slot layout wgrad_mma's rows read (ldmatrix.trans + stmatrix). What the
// copies cost (a read and a write of both tensors: ~0.3 ms of the NDHWC seed's 0.62, H100
// runs 255-260) becomes shared-memory traffic.
// R: staging slots (boxes in flight + 1); RPS: output rows a slot; MINB: blocks an SM the
// register allocation must allow; GRP: groups of warps meeting at their own barriers.
template <typename T, int KD, int KH, int KW, int DW, int KS, int NT, int BK, int R, int RPS, int CLG, int GRP, int MINB, int EPI>
__global__ void __launch_bounds__(CLG * 32, MINB) wgrad_mma_cl_dwconv(ConvArgs a, EpiArgs, const __grid_constant__ TmaMaps maps) {
    extern __shared__ __align__(128) unsigned short wgrad_mma_cl_smem[];
    wgrad_mma_body<T, KD, KH, KW, DW, KS, NT, BK, R, true, true, RPS, 0, CLG, GRP>(a, wgrad_mma_cl_smem, maps);
}
