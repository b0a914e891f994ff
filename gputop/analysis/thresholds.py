"""Every number a check uses, with where it comes from (one place to read and tune them)."""

# Input-bound scale of TF Profiler's input-pipeline analyzer (FACTS.md "Thresholds others use"):
# input time >= 20% of step time is "highly input-bound", >= 5% "moderately", below that "not input-bound".
INPUT_BOUND_HIGH = 0.20
INPUT_BOUND_MODERATE = 0.05
# torch-tb-profiler advises on communication > 10% of the step (FACTS.md).
COMMUNICATION_HEAVY = 0.10
# torch-tb-profiler advises on GPU utilization < 0.5 (FACTS.md).
LOW_UTILIZATION = 50.0
# The seed case study calls >= 90% utilization tuned; a host-side data wait while the GPUs stay this busy
# is overlapped with GPU work (CUDA runs ahead of the host), so it costs nothing.
BUSY_UTILIZATION = 90.0
# Stack fractions need a few dumps: 5 distinct dumps is ~10 s at the default 2 s stack interval.
MIN_STACK_SAMPLES = 5
# A hang must last this long: far longer than any one step of a sane job, yet short enough to name the
# stuck frame within the 30 s the issue allows for a verdict.
HANG_MIN_SECONDS = 10.0
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
# Straggler: one rank input-bound (TF "highly") while the others are not (TF "not input-bound") and spend at
# least half their time in a collective / backward waiting for it.
STRAGGLER_OTHERS_SYNC_MIN = 0.5
# PCIe: idle GPUs drop the link generation to save power (FACTS.md), so judge the generation only under load.
PCIE_LOAD_UTILIZATION = 30.0
# Throttling counts when a reason is active in at least this share of samples.
THROTTLE_MIN_FRACTION = 0.2
# A GPU whose enforced power limit is below 90% of its peers' has had its limit lowered (same model, same box).
POWER_LIMIT_LOWERED = 0.9
# Memory >= 95% of the card for half the window: the next larger batch or shape OOMs (article 5.3, OOM row).
MEMORY_NEARLY_FULL = 0.95
# Rank misplacement without --pid: the busy GPU mean and the idle GPUs' mean.
MISPLACED_BUSY_UTILIZATION = 50.0
MISPLACED_IDLE_UTILIZATION = 5.0

# The window diagnose() looks at by default: long enough for ~60 stack dumps and three cycles of a 40 s hiccup,
# short enough that the live verdict follows a fix (more workers) within two minutes.  Reports pass window=None.
DIAGNOSIS_WINDOW_S = 120.0
# The longest hiccup period searched for (an epoch of a small dataset; longer is not a "hiccup").
HICCUP_MAX_PERIOD_S = 60.0

EVIDENCE_RANKS = 4  # per-rank / per-GPU evidence lines shown before "… N more"

# z of the one-sided lower bound on an input fraction: ~84% confidence.  One waiting dump in 19 (5.3%) is
# not evidence of a 5% wait; 24 in 240 (10%) is.
WILSON_Z = 1.0
