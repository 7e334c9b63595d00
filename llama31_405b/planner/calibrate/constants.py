"""The model's constants, as data: the engineering priors it assumes (`ASSUMED`) and the
constants a calibration fits (`Fitted`). Nothing here computes or imports anything: the model
modules receive the `Fitted` constants as an argument, and the solver (`solver.py`) fills them.

* `ASSUMED`: engineering priors that are *not* fitted (collective latencies, NCCL's SMs, HBM
  efficiency of streaming kernels, ...). Each says where it comes from. Changing one changes the fit.
* `Fitted`: the constants `solver.solve` finds so that the simulated step of a measured layout
  (a `summary.Summary`) reproduces the measured one; each field names the figure it comes from.
"""
from __future__ import annotations

from dataclasses import dataclass


MODEL_REVISION = 23
"""The calibrated model's revision: raised whenever the same measurements give other constants
or predictions. A table derived from measurements (bench/planner_proof: docs/planner_proof/)
records the revision that derived it and re-derives under that revision's code only.
1: the proof runs of 2026-12-05 03:08-07:02 UTC (docs/planner_proof/2026-12-05T0308Z to T0643Z,
absent from their tables). 2: each compute part's time per layer pass that does not grow
with its work (`Fitted.call_s`), fitted where two layouts whose ranks each have a core separate
it from the rate (calibrate/joint.py `_call_times`); and the breakdown's exposed DP holds the
parameter all-gather the optimizer waits for when it is not overlapped (a profile counts it in
DP), its end-of-step work no longer (`step.Breakdown`; the step is unchanged). 3: the GEMMs'
and the attention's time that TP does not split counted per sequence of the microbatch, not per
pass (the layouts chosen by someone else, docs/planner_proof/extra_2026-12-05T1200Z_*: TP2 at
mbs 4 took twice mbs 1's GEMM time for twice the sequences, where a time per pass predicted
1.3x); and the norms and residual stream split over TP only with sequence parallelism
(`compute.elementwise_width`; the CPU path runs TP without it). 4: the pipeline's sends and
receives block where megatron-core's schedule makes them blocking (everywhere but interleaving
on GPUs: simulate.py runs pipeline.rank_program's exchanges, each message a rendezvous), where
every send had run in the background; a calibration file records its revision and one of
another is refused (calibrate/file.py `mismatches`). 5: within one exchange, two messages
between the same two ranks go one after the other (one connection per pair: PP 2 interleaved
sends a rank's activations and gradients to the same peer), found by a review of revision 4.
6: the LM head runs in the parameters' precision under FP8 and NVFP4 (megatron-core's output
layer is outside the recipes: `compute.part_precision`), where it had run in the recipe's; and
a CPU profile's precision probe prices BF16 GEMMs and attention on a CPU without BF16 units
(`calibrate/precisions.py`; tiny_cpu_gb200's LM head took 22x the FP32 fit's time per FLOP).
7: the probe's attention ratio at the layout's own bmm batch (a ladder: BF16's slowdown on the
CPU grows with the batch, 4-6x at 2 to 10-12x from 8), and elementwise work on BF16 activations
at the probe's BF16/FP32 ratio (then `Fitted.elementwise_scale`), where both had been priced at the
fit layouts' batch and at FP32's rate (tiny_cpu_gb200's attention 1.7-2.3x and elementwise
1.5-2.4x their predictions under revision 6). 8: a probe-priced precision scales the whole
part, its time per call with its rate (`Fitted.probe_scale`), where revision 7 scaled the rate
alone; and the emulated NVFP4 linears' quantisation is priced by the probe's emulated linear
(elementwise work), where it had been left out. 9: only the transformer layers' weights are cast at
a chunk's first forward and gathered in low precision, the embedding's and the output layer's
staying in the parameters' dtype (`costs.chunk_cost`; megatron-core builds the quantized parameters
layer by layer), where every parameter of the chunk was (tiny_cpu_gb200's embedding and LM head,
4,096 x 128 each, were about half of its casts); and a calibration's figures of an inner pipeline
rank less that rank's own DP slowdown, not the busiest rank's (`solver.compared_rank`), found by
the review of revision 8. 10: where the ranks are pinned to shared cores (systems `pin_ranks`,
parallel/cores.py: a pipeline stage's peers on one core, in step), the core share is the ranks
per core, where it had been the ranks' CPU demand over the step (`step.core_share`) with the
share of communication that keeps a core busy fitted (`Fitted.comm_core_fraction`, no longer
fitted there): unpinned, DP4's compute took 1.2-1.6x DP2's where the demand gave 1.2-1.3x, and
the rest of the sharing showed as ranks waiting for their peers. Where a core's ranks are TP
peers, each TP collective takes the ranks per core times its time (`costs.tp_peers_share_a_core`)
and their ops a fitted share of the stretch (`Fitted.shared_compute_share`, calibrate/joint.py
`_compute_share`): pinned, TP2 x DP2 took 1.5x TP2's compute and 1.8x its TP time. 11: the DP
replicas' waiting for the slowest of them (`Fitted.dp_peer_wait`, where a DP group's ranks run on
different cores or devices: `costs.dp_peers_on_one_core`) is its own part of the exposed DP, and
the transport is fitted to the DP collectives' time less it (`Summary.dp_transfer_s`), where the
waiting had been fitted as transfer time: TP2 x DP2's 38-40 ms of exposed DP on the 2-core
machine held 24-26 ms of waiting (its replicas on different cores), which the transport carried
into every layout, 2-3x the DP of DP4, PP2 x DP2 and PP2 x VP2 x DP2. 12: where pinned ranks put
several pipeline stages on one core (`costs.stages_per_core`: PP4 on the 2-core machine), each
stage's passes run at a share of the core only while another stage of its block runs (processor
sharing, simulated: simulate.py `_ranks`), where every pass had been stretched by the ranks per
core: GB200 settings at PP4 on 2 cores measured 0.70 of that prediction, stage 1 running alone
while stage 0 waited for its gradients. 13: the host time per layer pass grows with the rank's
tokens of the microbatch (systems `host_s_per_layer_token`) and the step has host time outside
the passes (systems `host_s_per_step`, stretched by the core share), both CPU priors fitted on
the committed 2-rank DP profiles (bench/host_priors.py), the calibration fitting the passes'
fixed part around them; where the fixed part per pass had carried both: TP2 x PP2 at
microbatches of 4 (12 passes a step, where the fit layouts have 24-48 of 1) took 1.40x its
predicted host time. 14: the elementwise work's time per layer pass and its rate fitted on the
fit layouts without TP, and the time a TP rank's pass adds (`compute.ELEMENTWISE_TP`) on those
with TP (calibrate/joint.py `_call_times`), where TP2 against DP2 had given every layout's time
per pass: read on TP2 and DP2 at one microbatch size, the work TP's passes add became a time per
pass of 2.25 ms at a rate of 0.82 of the model's, where the committed DP2 profiles at
microbatches of 1, 2 and 4 give 0.88 ms and 1.70 (TP2's alone 1.59 ms and 1.59), and layouts at
microbatches of 2 and 4 took 1.3-2.9x their predicted elementwise time. 15: where the ranks
share cores, a chunk's DP gradient reduce-scatter and its parameter all-gather each take a fixed
time beyond their latency and bytes (`Fitted.shared_core_dp_s`; once per chunk: per bucket it
added over 100 ms to tiny_cpu_gb200's predicted step, for `costs.chunk_cost` counts 22 buckets on
its first chunk where megatron-core's greedy layout, a parameter never split, closes 4, and the
profiles show the time per collective on megatron-core's count: the bucket count is the next
revision's), and a joint
fit takes the transport's bandwidth from its layouts whose ranks each have a core (DP2's DP, with
the latency from TP2 x DP2's TP), the fixed time from TP2 x DP2's DP, where the latency and the
bandwidth had both come from TP2 x DP2: its DP collectives moved half DP2's bytes per rank in as
long, so the transport priced every byte at 4 ranks 2.4x slower than at 2, and DP4's transfer
(three times TP2 x DP2's bytes per rank) came out 1.4-1.7x its measured time. Measured apart on
the 2-core machine (gloo's reduce-scatter and all-gather over the four proof layouts' groups at
1/8 to 2x the tiny model's buffer, 2026-12-07, bench/gloo_dp_groups.py `--scales`): a
reduce-scatter + all-gather took 5.7-8.9 ms more than its bytes at 4 ranks (1.4 ms at 2), its
bytes 1.28 ms per MB a rank sends at DP2 and 1.29 at DP4 (1.5-1.8 where two groups run at
once). 16: a bucketed chunk's buckets are megatron-core's (planner comm.dp_bucket_sizes: its
parameters in reverse, none split, a bucket closed once it holds the bucket size), where
ceil(parameters / bucket size) had counted 22 on tiny_cpu_gb200's first chunk and 33 on GB200
TP2 x DP2 (megatron-core: 4 and 13); the fixed time of revision 15 is taken per bucket's
collective (the profiles: 3.6-5.3 ms per collective on megatron-core's count); the first
bucket's gather that the first forward waits for, the backward's work before the first bucket's
gradients are ready and the forward's after the last bucket's parameters arrive are the buckets'
shares of the chunk's parameters (they had been 1 / buckets: the embedding's bucket is 76 % of
tiny_cpu_gb200's first chunk), the last bucket's reduce-scatter starting when the backward ends;
and the default bucket size grows with the DP group without CP, as megatron-core's (1M x DP x CP
before). 17: an activation on the wire (TP's collectives, CP's ring, the pipeline's sends) takes
the parameters' bytes (`comm.act_bytes`: 4 for the CPU's FP32 runs, as megatron-core is given
`params_dtype` and `pipeline_dtype`), where every run had been priced at BF16's 2 (the GPU
configs, all BF16, are unchanged; the proof's TP2 fit then takes its latency from 128 KB
all-reduces, not 64 KB). Under revision 17 the CPU profile's precision probe also times its
linears in bursts (profile/probe.py `BURST`; a measurement, so the summaries of earlier runs
re-derive as they were): the emulated NVFP4 quantisation had been priced 59 ms a step where
tiny_cpu_gb200 at DP2 with microbatches of 2 spent 7 (docs/planner_proof/quantisation/). 18: the
host time, read per op on the profiles (bench/host_where.py): the CPU's host priors refitted on
every committed 2-rank FP32 layout of the machine the proof runs on (bench/host_priors.py: DP, TP,
PP and VP, the proof's unseen layout left out; per step 5.3 ms beyond the assumed, where the 2-rank
DP profiles of the AVX2 machine had given 14: DP4's host had come out 0.70-0.79 of its prediction,
TP2 at one microbatch of 8 0.74); the emulated NVFP4 linears' Python priced per call (systems
`host_s_per_emulated_linear`, measured apart: 0.14 ms a forward and backward more than an FP32
linear's); and where the ranks share cores the host time per layer pass is the one fitted on the
fit layouts whose ranks each have a core, stretched by the ranks per core and by what each
core-mate adds (`Fitted.shared_host_extra`), fitted on those whose ranks share cores
(calibrate/joint.py), where the host time per pass had closed TP2 x DP2's step alone and carried
its TP calls into every 4-rank layout: the committed profiles' host time at 2 ranks to a core was
2.25-2.6 times their 2-rank twins' (DP4 2.4, PP2 x DP2 2.25, PP2 x VP2 x DP2 2.6, TP2 x DP2
2.5), not 2. 19: overlapped DP (the GB200 settings' small buckets, whose DP the layouts chosen by
someone else missed by 2.9-9.4x): the passes' host time while a DP collective runs is exposed DP,
as a profile counts it (a piece with communication and no compute: profile/analysis.py), where
the model had kept it as host time (`step.Breakdown.dp_host_s`, simulate.covered: GB200 settings
at DP4 had measured 0.58 of the predicted host time and 4.87x the DP); an overlapped
collective takes a fixed time per bucket beyond its latency and bytes (`Fitted.overlap_dp_s`,
planner comm.dp_waits_s), fitted by a joint fit from its layouts whose DP is overlapped, the
others fitting every other constant (calibrate/joint.py `_overlap_dp`; the thirteenth set's
traces: at DP2 with a core per rank a bucket's all-gather, 108,000 BF16 parameters on average,
took 1.1-1.4 ms while its rank computed and its reduce-scatter 1.6-2.5, where latency and bytes
gave 0.6); a DP collective's
fixed times (that one and `shared_core_dp_s`) are waits, not a core's work, and take nothing
from the compute they overlap (comm.dp_work_share: GB200 settings at DP4 had measured 0.75 of
the predicted compute); and the distributed optimizer's parameter all-gather moves the
parameters' dtype (comm.param_bytes: 4 bytes for the CPU's FP32 runs, which had been priced at
BF16's 2). 20: without the overlapped gradient reduce-scatter a chunk is one bucket, as
megatron-core 0.19.2's `DistributedDataParallel.__init__` sets `bucket_size` to None then, whatever
the config gave (comm.dp_bucket_params), where the planner had laid the config's buckets: the
fourteenth set's GB200 settings with their DP not overlapped, at DP2 and at PP2 x VP2 x DP2,
measured 0.37 and 0.69 of their predicted DP (20 buckets' latencies a collective). 21: an
overlapped DP collective whose group has peers pinned to one core waits for their turns at each
step of its ring (`Fitted.overlap_peer_core_dp_s`, comm.dp_peers_share_a_core; FP32 DP4 with the
GB200 settings' overlapped buckets had measured 3.06x its predicted DP, the GB200 settings at
DP4 3.4-3.7x); the DP replicas' waiting is a share of the step less all of its exposed DP, the
host time under a DP collective included (step._breakdown, as calibrate/solver.py
`_peer_wait` measures it); a DP stream's share of transfer counts the all-gathers only where
they run beside compute (comm.dp_work_share); gradients are reduced in the parameters' dtype
without `grad_reduce_in_fp32` (comm.grad_bytes_per_param: 2 bytes had been taken for FP32). 22:
each model chunk's pass has host time of its own beyond its layer slots' (systems and
`Fitted.host_s_per_chunk_pass`: the pipeline schedule's Python, about 0.5 ms a pass on the CPU),
fitted from a pipeline fit layout's host time (calibrate/joint.py `_chunk_host`), where the host
time per layer slot had given a one-layer chunk a sixth of a six-slot chunk's: the GB200
settings at PP2 x VP4, 32 passes of one layer slot a step, measured 1.71 of their predicted host
time. 23: a CPU probe's GEMM ratio at the layout's own LM-head shard, vocabulary / TP (a rung
per shard the fit layouts probed: calibrate/precisions.py `shard_rungs`, compute.probe_factor),
where the median over the fit layouts' probes had priced every layout alike: on an AVX2 CPU the
BF16 LM head's ratio grows with the shard, and the GB200 settings at TP 1 read compute
1.14-1.17 where the fit's median was a TP 2 shard's (docs/planner_proof/2026-12-07T1957Z)."""


@dataclass(kw_only=True, frozen=True, slots=True)
class Assumed:
    gemm_tile_m: int = 128
    gemm_tile_n: int = 256
    """Output tile of one CTA (CUTLASS/cuBLAS Blackwell and Hopper kernels use 128x256 class
    tiles); the wave-quantisation factor counts tiles against SMs."""
    gemm_peak_fraction: tuple[tuple[str, float], ...] = (("bf16", 0.75), ("fp8", 0.65), ("fp32", 0.5))
    """Best achievable fraction of the dense peak for a large GEMM, for precisions the calibration
    run does not use (NVFP4's is fitted). Typical of cuBLAS on H100/B200 (BF16 ~75%, FP8 ~65%)."""
    nvlink_latency_s: float = 12e-6
    """Per-collective latency of an NCCL all-gather/reduce-scatter inside an NVLink domain."""
    p2p_latency_s: float = 15e-6
    """Per-message latency of a pipeline send/recv (NCCL p2p)."""
    cp_step_overhead_s: float = 40e-6
    """Per ring step of context-parallel attention: kernel launches, the KV exchange's sync and
    the partial-softmax correction that cannot hide behind the attention kernel."""
    scaleout_latency_s: float = 30e-6
    """Per-collective latency across racks (InfiniBand, a few hops)."""
    scaleout_bus_efficiency: float = 0.8
    """Achieved fraction of the per-GPU scale-out bandwidth by large DP collectives (NCCL ring
    reduce-scatter/all-gather over InfiniBand typically reaches 80-90% of line rate)."""
    nccl_dp_ctas: int = 8
    """SMs NCCL's overlapped DP collectives occupy (one CTA per channel): the shipped configs cap
    the `dp` and `dp_cp` communicators at 8 CTAs (configs/nccl/gb200_communicators.yaml,
    megatron-core's per-communicator `max_ctas`). While a DP collective runs, compute-bound
    kernels of that GPU get the other SMs only."""
    nccl_hbm_bytes_per_wire_byte: float = 3.0
    """HBM traffic of a reduce-scatter per byte on the wire (read the local and the received
    chunk, write the sum): memory-bound kernels lose this share of HBM bandwidth meanwhile."""
    tp_overlap_hidden: float = 0.6
    """Share of TP communication hidden when performance.tp_comm_overlap is on (TE userbuffers)."""
    hbm_stream_efficiency: float = 0.85
    """Achieved fraction of HBM bandwidth by streaming kernels over large buffers (the optimizer,
    zeroing and scaling the gradient buffer)."""
    optimizer_bytes_per_param: float = 30.0
    """Adam with FP32 master weights reads master, grad, m, v and writes master, m, v, param."""
    host_step_overhead_s: float = 2e-3
    """Host work per step the GPUs wait for: the optimizer reads the gradient norm on the host
    (a synchronisation), then launches the optimizer kernels and the next step's first work."""
    memory_reserved_gb: float = 10.0
    """Per GPU memory outside the model's tensors: CUDA context (~1 GB), NCCL buffers of about ten
    communicators (TP, CP, PP, DP, DP x CP, embedding, ...), cuBLAS/TE workspaces, the memory
    pools of the per-layer CUDA graphs and caching-allocator slack."""
    activation_fragmentation: float = 0.2
    """Memory lost to the caching allocator on the activations, as a share of them. Weights,
    gradients and optimizer state live in Megatron's contiguous buffers, allocated once; the
    activations are allocated and freed every microbatch, in mixed sizes (BF16 tensors, NVFP4
    data and scale tensors) and in the interleaved schedule's order, and with per-layer CUDA
    graphs they sit in private pools that eager allocations cannot reuse. Allocator studies of
    LLM training report 10-30% of reserved memory lost to fragmentation; 20% of the activations
    is a middle value. The planner's memory verdicts depend on it (docs/planner.md: "Memory
    headroom")."""
    first_step_extra_s: float = 3.0
    """Extra time of the first timed step. CUDA graphs, NCCL communicators and the allocator's
    pools are warmed before run_start, but the MLPerf rules forbid touching the dataset before
    it: the training datasets are opened (index caches read from shared storage by every rank)
    and the first batches fetched inside the first step."""
    run_overhead_s: float = 2.0
    """run_start bookkeeping, the evaluation that converges being logged and run_stop."""
    eval_micro_batch_size: int = 1
    """Microbatch of the evaluation forward passes."""
    nvfp4_samples_factor: float = 1.0
    """Samples an NVFP4 run needs to converge, relative to the BF16 reference convergence points
    (the RCPs are BF16 runs). 1.0 assumes NVFP4 training converges like BF16, as the published
    NVFP4 runs passing the RCP check suggest; it is an assumption, not a measurement."""


ASSUMED = Assumed()


@dataclass(kw_only=True, frozen=True, slots=True)
class Fitted:
    nvfp4_gemm_peak_fraction: float
    """NVFP4 GEMM efficiency (fraction of the dense FP4 peak before wave quantisation), from
    'FFN up/down GEMMs ~54% of compute' of the 733 ms."""
    attention_bf16_fraction: float
    """Fused attention efficiency (executed causal FLOPs / BF16 peak), from 'GEMMs 74% of
    compute' minus the FFN and the other linear layers (the fused attention kernels are counted
    as GEMMs)."""
    elementwise_passes: float
    """Bytes moved by non-GEMM kernels (norms, SwiGLU, RoPE, quantisation, residuals, loss),
    in units of one BF16 pass over a layer's activations, from the 26% of compute that is not
    GEMM."""
    nvlink_bus_efficiency: float
    """Achieved fraction of NVLink bandwidth by the collectives and sends inside a rack (TP's
    sequence-parallel all-gathers and reduce-scatters, CP's ring, pipeline sends), from closing
    the simulated 1.27 s step."""
    # What a profile measures beyond the published figures (neutral when absent: the published
    # calibration leaves them at their defaults, and so reproduces the four constants alone).
    gemm_fraction: tuple[tuple[str, float], ...] = ()
    """GEMM efficiency of the profiled precision when it is not native NVFP4 (precision ->
    fraction of its peak; `ASSUMED.gemm_peak_fraction` for the others)."""
    attention_fraction: tuple[tuple[str, float], ...] = ()
    """Attention efficiency in a precision other than the profiled attention's (precision ->
    fraction of its peak); `attention_bf16_fraction` for the others. A CPU probe's precisions
    keep the profiled one's (their time ratio is in `probe_scale`)."""
    probe_scale: tuple[tuple[str, float], ...] = ()
    """A CPU profile's precision probe (calibrate/precisions.py): "<operation>_<precision>" ->
    the time of a part in that precision over its time in the profiled one (rate and time per
    call alike; `compute.probe_factor`): "gemm_<q>", "attention_<q>", "attention-b<B>_<q>" (the
    ladder of bmm batches), "elementwise_<q>" (activations in q), "gemm_nvfp4" (the emulated
    NVFP4 linear: its quantisation); 1 where absent (a GPU's calibration)."""
    gemm_part_scale: tuple[tuple[str, float], ...] = ()
    """Time of the QKV, output-projection and LM-head GEMMs relative to the FFN GEMMs' rate
    (part -> factor, 1 when absent): their shapes run at another rate than the FFN's."""
    call_s: tuple[tuple[str, float], ...] = ()
    """Time of a compute part that TP does not split, forward + backward (part -> seconds;
    `compute.CALL_PARTS`): for the GEMMs and the attention per layer and sequence of the
    microbatch (it grows with the sequences, not the split width: model revision 3), for the
    elementwise work per layer pass (operator dispatch). Measured where a fit has two layouts whose
    ranks each have a core and whose operators differ in size for the same work per rank (TP2 and
    DP2: split GEMMs take longer per FLOP; calibrate/joint.py `_call_times`); () where none does
    (the published calibration's and a single profile's). The elementwise work's time per pass
    from layouts without TP only; `compute.ELEMENTWISE_TP` ("elementwise_tp", per layer pass of
    a TP rank) what TP adds to it (model revision 14)."""
    comm_scale: tuple[tuple[str, float], ...] = ()
    """Measured / modelled time of each communication kind (TP, CP, PP, DP), 1 when absent."""
    collective_latency_s: float | None = None
    """Per-call latency of every collective and send, fitted with `nvlink_bus_efficiency` (the
    bandwidth) where the system has one transport (systems `one_transport`) and the profile
    measured collectives of two sizes; None: the system's `collective_latency_s` or ASSUMED's."""
    host_s_per_layer_pass: float | None = None
    """Host time (nothing running) per layer and microbatch pass, forward or backward; None:
    the system's `host_s_per_layer_pass`."""
    core_share: float = 1.0
    """How much longer compute and host time take because ranks share cores (systems
    `shared_cores`): resolved per layout by `step.breakdown`, 1 in every calibration."""
    shared_compute_share: float | None = None
    """Where ranks pinned to one core are TP peers (planner costs.tp_peers_share_a_core): the
    share of the core sharing's stretch (k - 1) their ops take (planner
    costs.shared_compute_share). Fitted from a 4-rank layout whose ranks share cores next to the 2-rank
    layouts that give the kernels' time (calibrate/joint.py `_compute_share`; TP2 x DP2 against
    TP2 and DP2 on the 2-core machine); None: 1."""
    dp_peer_wait: float | None = None
    """The DP replicas' waiting for the slowest of them at the gradient collectives, per second of
    the rest of the step (the work between two DP synchronisations, whose length differs from
    replica to replica by a few per cent: cores or devices of slightly different speed), where a DP
    group's ranks run on different cores or devices (planner costs.dp_peers_on_one_core): its
    measured share (a profile's waiting for peers in DP over the step less its exposed DP) of the fit
    layouts whose DP groups span cores (calibrate/solver.py `_peer_wait`; the 2-core machine:
    TP2 x DP2's 24-26 ms of a 730 ms step, 3.7 %); None: not measured (a summary without the
    waiting, the published one: the transport then carries it, as before model revision 11)."""
    shared_core_dp_s: float | None = None
    """Where ranks share cores (`core_share` > 1): the time a chunk's DP gradient reduce-scatter,
    and again its parameter all-gather, take beyond their latency and bytes, per bucket of
    megatron-core's layout (planner comm.dp_reduce_s, comm.dp_gather_s; once per chunk under
    model revision 15): the turns a synchronous
    collective waits for on cores its ranks' core-mates also run. Fitted where a joint fit has
    layouts whose ranks each have a core, which give the bytes' rate, and a layout with DP whose
    ranks share cores (calibrate/joint.py `_shared_link`: TP2 x DP2 next to TP2 and DP2 on the
    2-core machine); None: 0 (model revision 15)."""
    overlap_dp_s: float | None = None
    """The time an overlapped DP collective (megatron-core's `overlap_grad_reduce`,
    `overlap_param_gather`: dispatched while its rank computes) takes beyond its latency and
    bytes (and `shared_core_dp_s`), per bucket (planner comm.dp_waits_s). Fitted where a joint
    fit has a layout whose DP collectives are overlapped and others with DP that are not
    (calibrate/joint.py `_overlap_dp`: those price a collective that runs while nothing else
    does); none from one profile, nor where only overlapped layouts have DP (they give the
    transport its DP figure); None: 0 (model revision 19)."""
    overlap_peer_core_dp_s: float | None = None
    """Where an overlapped DP collective's group has peers pinned to one core (planner
    comm.dp_peers_share_a_core: DP4 and PP2 x DP2 on the 2-core machine), the time it takes
    beyond `overlap_dp_s`, per bucket and per step of its ring (group size less one: planner
    comm.dp_waits_s), each transfer waiting for both its ranks' turns on a core that runs their
    compute. Fitted where a joint fit has an overlapped layout whose DP peers share a core next
    to one whose peers do not (calibrate/joint.py `_overlap_dp`); None: 0 (model revision 21)."""
    host_s_per_chunk_pass: float | None = None
    """Host time per model chunk and microbatch pass, forward or backward, beyond its layer
    slots' (`host_s_per_layer_pass`): the pipeline schedule's Python around each pass and its
    exchanges (planner costs.chunk_host_s). Fitted where a joint fit has a pipeline layout
    whose ranks each have a core next to layouts without a pipeline, for which its modelled host
    time is its measured host time (calibrate/joint.py `_chunk_host`): every chunk pass of a
    layout without a pipeline holds all its layers, so only a pipeline's passes of fewer layer
    slots tell the two apart; None: the system's `host_s_per_chunk_pass` (model revision 22)."""
    shared_host_extra: float | None = None
    """Where ranks share cores: the share of a rank's host time each of its core-mates adds on top
    of their turns (host time stretches by k + extra x (k - 1) at k ranks to a core: planner
    costs.host_stretch); the Python between ops slows more than the kernels where the ranks hand
    the core to each other. Fitted where a joint fit has layouts whose ranks each have a core,
    which give the host time per layer pass, and some whose ranks share cores, whose steps it
    closes (calibrate/joint.py `_shared_host`; TP2 x DP2 next to TP2 and DP2 on the 2-core
    machine); None: 0 (model revision 18)."""
    comm_core_fraction: float | None = None
    """Where ranks share cores: the share of its communication time (TP, CP and PP exposed, a
    DP collective's whole duration, overlapped or not) during which a rank keeps a core busy
    (gloo's polling, copying and reducing over loopback), counted in the demand that stretches
    compute (`step.core_share`) where the ranks are not pinned. Fitted by model revisions 2-9
    from one layout profiled at ranks <= cores and at more ranks; since revision 10 the CPU's
    ranks are pinned (systems `pin_ranks`) and no calibration fits it. None: the system's
    `comm_core_fraction`."""
    # The memory model's constants a GPU profile measures (neutral when absent: the memory check
    # then uses the assumed ones).
    activation_scale: float = 1.0
    """Measured / modelled activation memory: the peak the allocator recorded
    (max_memory_allocated) less the static buffers (weights, gradients, optimizer state), over
    the activations `memory.py` counts."""
    activation_fragmentation: float | None = None
    """The caching allocator's loss on the activations as a share of them, measured as
    (max_memory_reserved - max_memory_allocated) / activations; None: ASSUMED's."""

    def scale(self, table: str, key: str) -> float:
        return dict(getattr(self, table)).get(key, 1.0)


# Starting point of the solver (close to the solution, so it converges in a few rounds).
INITIAL = Fitted(nvfp4_gemm_peak_fraction=0.56, attention_bf16_fraction=0.77, elementwise_passes=22.0,
                 nvlink_bus_efficiency=0.45)
