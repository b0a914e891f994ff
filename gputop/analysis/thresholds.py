"""Every number a check uses, with where it comes from (one place to read and tune them)."""

# Input-bound scale of TF Profiler's input-pipeline analyzer (FACTS.md "Thresholds others use"):
# input time >= 20% of step time is "highly input-bound", >= 5% "moderately", below that "not input-bound".
INPUT_BOUND_HIGH = 0.20
INPUT_BOUND_MODERATE = 0.05
# A pause for data is a phase (an epoch start re-forking workers, an evaluation or checkpoint with its own
# loader), not continuous starvation, when the input dumps form one stretch of at most 60 s and outside it the
# rank is not input-bound; a stretch still going at the end counts only while it is under 10 s.
INPUT_PHASE_MAX_S = 60.0
INPUT_PHASE_OPEN_MAX_S = 10.0
# torch-tb-profiler advises on communication > 10% of the step (FACTS.md).
COMMUNICATION_HEAVY = 0.10
# torch-tb-profiler advises on GPU utilization < 0.5 (FACTS.md).
LOW_UTILIZATION = 50.0
# The seed case study calls >= 90% utilization tuned; a host-side data wait while the GPUs stay this busy
# is overlapped with GPU work (CUDA runs ahead of the host), so it costs nothing.
BUSY_UTILIZATION = 90.0
# Stack fractions need a few dumps: 5 distinct dumps is ~10 s at the default 2 s stack interval.
MIN_STACK_SAMPLES = 5
# ... or, sampled densely (py-spy record, 10-500 a second), samples over at least 4 s: a share of a
# shorter stretch is one phase of the loop, not the loop.
MIN_SAMPLED_SECONDS = 4.0
# The job's input share pools its ranks.  A rank whose loop began less than this long ago and has not yet
# got MIN_SAMPLED_SECONDS of samples is waited for, so that the first verdict does not rest on the first
# rank measured alone: one rank's first 4 s of loop (6 steps of the starved demo, the first ones slower)
# read 0.27-0.32 where the job waits 0.67, and the verdict a minute later differed by 40 points.
POOL_WAIT_S = 15.0
# The live shares cover the last minute (the screen says so): long enough for 1,500 samples a rank at the
# screen's 25 Hz, short enough that a phase that ended (start-up, an evaluation) no longer dilutes the one
# now.  A report's shares cover everything it observed.
SHARE_WINDOW_S = 60.0
# A hang must last this long: far longer than any one step of a sane job, yet short enough to name the
# stuck frame within the 30 s the issue allows for a verdict.
HANG_MIN_SECONDS = 10.0
# ... or this long when the progress counters read beside each dump stood still too (no voluntary context
# switch of the thread, no CPU, no I/O): a live thread, however slow, moves them within a second or two
# (FACTS.md: a thread looping on a 20 ms sleep gained 99 switches in 2 s; one blocked on a lock, 0).  Short
# enough that a hang which began before gputop attached shows in a 12 s report.
HANG_STILL_MIN_SECONDS = 5.0
# Evidence of life between two dumps: the thread woke at least once a second (a DataLoader main thread
# blocked on a dead worker polls its queue every 5 s: 0.2/s), or it used 5% of a core, or the process read or
# wrote anything (/proc/PID/io rchar/wchar count pipes too, so a worker handing over a batch moves them).
LIVE_SWITCHES_PER_S = 1.0
LIVE_CPU_SHARE = 0.05
# /proc reports CPU time in USER_HZ ticks, 100 a second on Linux whatever the kernel's HZ.
USER_HZ = 100
# A NCCL collective waiting for a missing peer spins: ~100% utilization at a small share of the power limit
# (NVIDIA/nccl issues 968, 257, 238: ~100-150 W on a 700 W board), where a compute kernel at 100% draws most of it.
SPIN_UTILIZATION_MIN = 90.0
SPIN_POWER_MAX_SHARE = 0.4
# Ranks waiting in a collective for one rank that keeps moving: an evaluation or a checkpoint on that rank
# (normal), until the wait passes 90 s (a long one, or a rank that skipped the collective: said so).  Under
# the 120 s window, which bounds what a frozen run can show.
RANK_WAIT_LONG_S = 90.0
# NVML reports whole percents and an idle GPU reads 0; 1% allows for a driver housekeeping blip.
HANG_UTILIZATION_MAX = 1.0
# "Memory held": more than a bare CUDA context (~0.3-0.5 GiB per process).
HELD_MEMORY_BYTES = 1 << 30
# A worker or rank burning >= 90% of one core is CPU-bound; the article (2.1) calls host CPU > 90% for long
# a preprocessing bottleneck.
PROCESS_PINNED_PERCENT = 90.0
CORES_SATURATED_PERCENT = 90.0
# Saw-tooth detection on the utilization series (sampled at the poll interval, ~1 s):
HICCUP_MIN_SAMPLES = 12  # fewer than this and no period can be seen three times
HICCUP_MIN_PERIODS = 3  # a period must repeat at least 3 times inside the window
HICCUP_ACF_MIN = 0.35  # autocorrelation at the period; white noise stays near 0, a clean saw-tooth near 1
HICCUP_MIN_SWING = 25.0  # p90 - p10 in percentage points: the article's 0% <-> 90% "electrocardiogram"
HICCUP_MIN_PEAK = 50.0  # the GPU must get at least half busy between collapses (a starved GPU stays ~1/3 busy)
# ...and the dips must cost something: troughs collapse to <= 30% (the article's "0% <-> 90%"), or the mean sits
# >= 15 points under the p90 peak.  A short optimizer/all-reduce dip every few seconds in a healthy DDP job
# (mean a few points under its peak, troughs ~40%) is the normal step rhythm, not a hiccup.
HICCUP_COLLAPSE = 30.0
HICCUP_MIN_LOSS = 15.0
# Collapse events (when the period wanders, e.g. epochs of uneven length on a loaded box): a collapse starts when
# utilization falls from >= 60% of the p90 peak to <= 25% of it; the gaps between collapse starts must be regular
# (coefficient of variation <= 0.5) for "periodic".
COLLAPSE_HIGH = 0.6
COLLAPSE_LOW = 0.25
HICCUP_MAX_GAP_CV = 0.5
# Epoch-boundary worker restarts explain a period when restarts repeat at that period within 35%.
PERIOD_MATCH_TOLERANCE = 0.35
# Sync-bound: a rank caught at a host-device sync (.item(), .cpu(), synchronize()) in 30% of its dumps while
# its GPUs are under BUSY_UTILIZATION: host and device take turns instead of overlapping.
SYNC_BOUND_FRACTION = 0.3
# Straggler: one rank input-bound (TF "highly") while the others are not (TF "not input-bound") and spend at
# least half their time in a collective / backward waiting for it.
STRAGGLER_OTHERS_SYNC_MIN = 0.5
# PCIe: idle GPUs drop the link generation to save power (FACTS.md: "flag current < max only under load";
# NVIDIA's nvidia-smi -q documents "PCIe Generation: Current" as lowered while the GPU is idle), so the generation
# is judged only at or above this utilization.  One value for every sink: the TUI's card, topology picture and
# affinity table, the diagnosis and report, the exporter's gputop_gpu_pcie_degraded and `gputop check`'s
# "PCIe link under load".  30% rather than the TUI's former 20%: a GPU sampled at 20-30% is often between kernels
# of a light or starved job and its link may still be stepping up from the idle P-state, which is exactly the
# false "degraded" the bar exists to avoid; 30% is what the diagnosis, the report and the exporter's alert
# rule (contrib/) already used, so the screen now flags what the report and the alert say.
PCIE_LOAD_UTILIZATION = 30.0
# Throttling counts when a reason is active in at least this share of samples.
THROTTLE_MIN_FRACTION = 0.2
# A GPU whose enforced power limit is below 90% of its peers' has had its limit lowered (same model, same box).
POWER_LIMIT_LOWERED = 0.9
# Memory >= 95% of the card for half the window: the next larger batch or shape OOMs (article 5.3, OOM row).
MEMORY_NEARLY_FULL = 0.95
# Machine view (no --pid): a GPU under 5% with no process is idle; with a process and above it, in use.
MISPLACED_IDLE_UTILIZATION = 5.0

# The window diagnose() looks at by default: long enough for ~60 stack dumps and three cycles of a 40 s hiccup,
# short enough that the live verdict follows a fix (more workers) within two minutes.  Reports pass window=None.
DIAGNOSIS_WINDOW_S = 120.0
# The longest hiccup period searched for in that window (an epoch of a small dataset).
HICCUP_MAX_PERIOD_S = 60.0
# Epoch-level hiccups recur every few minutes: when the window shows none, the last 10 minutes (all the
# history keeps) are searched too, for periods up to 200 s (three of them fit), thinned to one sample per
# 5 s so that the search stays as cheap as the short one.
LONG_WINDOW_S = 600.0
LONG_HICCUP_MAX_PERIOD_S = 200.0
LONG_WINDOW_STRIDE_S = 5.0

# Worker advice (analysis/advice.py): a producer in __getitem__ under half a core waits on I/O (sleeps in a
# read); above it, it computes.  I/O-bound workers may outnumber the cores, but each forked worker holds
# its own RSS: they get at most half the memory the job may still take, and never more than 32 per rank
# (loader_math.HARD_MAX_WORKERS, the ceiling `gputop bench` sweeps to).
IO_BOUND_CPU_PERCENT = 50.0
# ... unless it wants a core more than it gets one: on a busy box a computing worker gets a third of a core and
# waits for the rest runnable (/proc state R), where one waiting on I/O sleeps (S, D).  Runnable in this share of
# the snapshots (the last ten), it computes, whatever its CPU.
CPU_BOUND_RUNNABLE_SHARE = 0.5
# A step share under 1% (the rank was hardly ever caught stepping) is too small to divide by: the advice
# is then "at least N", N from the share's interval, and `gputop bench` measures the rest.
MIN_STEP_SHARE = 0.01
IO_MEMORY_SHARE = 0.5
MAX_IO_WORKERS = 32

EVIDENCE_RANKS = 4  # per-rank / per-GPU evidence lines shown before "… N more"

# z of the one-sided lower bound on an input fraction: ~84% confidence.  One waiting dump in 19 (5.3%) is
# not evidence of a 5% wait; 24 in 240 (10%) is.
WILSON_Z = 1.0
# The intervals shown with every share (and the ranges of the advice derived from them): 95%, two-sided.
INTERVAL_Z = 1.96
# Trace findings (`gputop trace`, gputop/analysis/checks/trace.py):
# the article's rule: communication > 30% of the step means gradient accumulation, overlap, a topology check.
TRACE_COMM_HEAVY = 0.30
# AMP: at least half of the GEMM kernel time in fp32 on a GPU with tensor cores (compute capability >= 7).
TRACE_FP32_GEMM_SHARE = 0.5
# Launch-bound: most kernels shorter than a launch costs the host (~5-10 us), while the GPU idles >= 30%.
TRACE_SHORT_KERNEL_US = 10.0
TRACE_SHORT_KERNEL_SHARE = 0.5
TRACE_LAUNCH_BOUND_IDLE = 0.3
# Syncs every step count when they also cost >= 2% of wall time (a lone .item() at 1 us is not worth a finding).
TRACE_SYNC_SHARE = 0.02
# Fragmentation: >= 30% of the reserved bytes sit in inactive split blocks (torch.cuda.memory_stats).
TRACE_FRAGMENTED_SHARE = 0.3

# GPM (NVML's GPU Performance Monitoring, Hopper and newer; gputop/analysis/checks/kernels.py).  GPU-Util is the
# share of time at least one kernel ran, so a collective spinning on one SM, a memory-bound kernel and a tensor-core
# GEMM all read 100% (issue 24); GPM says what the SMs, tensor cores and DRAM did.
# A NCCL collective occupies one thread block per channel, and NCCL runs 2-32 channels (NCCL_MIN/MAX_NCHANNELS,
# NCCL's environment documentation): 1.5-24% of an H100's 132 SMs, on the wire only while data moves.  Spinning
# on a missing peer, those blocks poll and the other SMs idle; a compute kernel at ~100% GPU-Util keeps most SMs
# active.  So at >= SPIN_UTILIZATION_MIN, SM activity at or under 10% is a collective waiting, whatever the power
# (this replaces the power heuristic above where GPM exists, and the power heuristic stays where it does not).
GPM_SPIN_SM_ACTIVE_MAX = 10.0
# "SMs busy": at least half of them active over the interval (torch-tb-profiler's 0.5 rule for GPU utilization,
# FACTS.md, applied to the SMs instead of to "a kernel ran").
GPM_SM_BUSY = 50.0
# Tensor cores "near zero": under 5% of the time (what a few stray ops give) while the FP32 pipe is busy at least
# 20% of it: the model's matmuls and convolutions run in fp32, on the CUDA cores.  Ampere (compute capability 8)
# is where bf16 tensor cores start, so bf16 autocast applies from there (the article's "Ampere and newer"
# advice for AMP, 4.2); issue 24 asks for capability >= 8.
GPM_TENSOR_IDLE_MAX = 5.0
GPM_FP32_BUSY = 20.0
TENSOR_CORE_BF16_MIN_CAPABILITY = 8
# Memory-bandwidth-bound: DRAM at >= 60% of its peak bandwidth and busier than the SMs (the roofline reading: the
# memory roof is the one being hit).  60% of peak is where a streaming kernel's achieved bandwidth sits on HBM
# (about 2-2.7 of H100's 3.35 TB/s in STREAM-like copies), gputop's choice, to be checked on a lent GPU.
GPM_DRAM_BOUND = 60.0
# A GPM verdict needs this many samples with GPM in the window (~5 s at the default 1 s refresh), and the GPU
# busy (LOW_UTILIZATION) on average: an idle or starving GPU's kernels are not its problem.
GPM_MIN_SAMPLES = 5
