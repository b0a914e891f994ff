"""Classify a rank's main-thread stack and aggregate worker stacks.

The state labels are a contract: the TUI, diagnosis and report all use them.
"""

WAITING_FOR_DATA = "waiting for data"
IN_DATASET = "in dataset code"
FORWARD_BACKWARD = "forward/backward"
OPTIMIZER_STEP = "optimizer step"
COLLECTIVE = "collective/barrier"
EXPLICIT_SYNC = "explicit sync"
IDLE_OTHER = "idle/other"

MAIN_THREAD_STATES = (
    WAITING_FOR_DATA,
    IN_DATASET,
    FORWARD_BACKWARD,
    OPTIMIZER_STEP,
    COLLECTIVE,
    EXPLICIT_SYNC,
    IDLE_OTHER,
)
