#!/bin/sh
# A py-spy that is killed mid-dump (OOM killer, an admin's kill -9): no output, exit by SIGKILL.
echo $$ >> "${FAKE_PY_SPY_LOG:-/dev/null}"
kill -9 $$
