#!/bin/sh
# Reward 1 iff the hidden checks in check.py pass.
if python3 /tests/check.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
