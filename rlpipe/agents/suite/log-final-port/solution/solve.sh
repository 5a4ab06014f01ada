#!/bin/bash
grep 'listening on' /work/server.log | tail -n 1 | sed 's/.*://' > /work/answer.txt
