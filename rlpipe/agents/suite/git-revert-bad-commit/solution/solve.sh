#!/bin/bash
cd /work
bad=$(git log --format='%H %s' | awk '$2 == "Tune" && $3 == "retries" { print $1 }')
git -c user.name=Oracle -c user.email=oracle@example.org revert --no-edit "$bad"
