#!/bin/sh
# Reward 1 iff the hidden checks in check.py pass.
# check.py runs the agent's code; before the reward is written, every process left behind
# is killed (one could keep writing the reward file): kill -1 spares this script.
python3 -I /tests/check.py
status=$?
while kill -9 -1 2>/dev/null; do :; done
if [ "$status" -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
