#!/bin/bash
awk '{ print $2 }' /work/access.log | sort | uniq -c | sort -rn | head -n 1 | awk '{ print $2 }' > /work/answer.txt
