"""Stand-in for deepspeed.launcher.launch: starts one rank per local device with RANK, LOCAL_RANK and
WORLD_SIZE set and `--local_rank=N` appended, as the real one does."""

import base64
import json
import os
import subprocess
import sys

world_info = json.loads(base64.urlsafe_b64decode(sys.argv[1].split("=", 1)[1]))
count, argv = len(world_info["localhost"]), sys.argv[2:]
ranks = [
    subprocess.Popen(
        [sys.executable, "-u", *argv, f"--local_rank={i}"],
        env=dict(os.environ, RANK=str(i), LOCAL_RANK=str(i), WORLD_SIZE=str(count)),
    )
    for i in range(count)
]
for rank in ranks:
    rank.wait()
