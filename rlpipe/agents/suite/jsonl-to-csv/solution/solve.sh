#!/bin/bash
{ echo "id,user,action"; jq -r '[.id, .user, .action] | map(tostring) | join(",")' /work/events.jsonl; } > /work/events.csv
