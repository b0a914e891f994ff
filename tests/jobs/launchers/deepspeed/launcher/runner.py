"""Stand-in for deepspeed.launcher.runner (the `deepspeed` command) on one node: like the real one it
starts `python -u -m deepspeed.launcher.launch --world_info=... program ...`, which starts the ranks."""

import base64
import json
import subprocess
import sys

count, argv = int(sys.argv[1]), sys.argv[2:]
world_info = base64.urlsafe_b64encode(json.dumps({"localhost": list(range(count))}).encode()).decode()
sys.exit(subprocess.call([sys.executable, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world_info}", *argv]))
