#!/bin/sh
# A py-spy that never answers (a target stuck in a way py-spy cannot get past): it notes its PID in
# $FAKE_PY_SPY_LOG, then becomes a sleeper with the same PID, which gputop must kill at its timeout.
echo $$ >> "${FAKE_PY_SPY_LOG:-/dev/null}"
exec sleep 3600
