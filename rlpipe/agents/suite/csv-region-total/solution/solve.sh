#!/bin/bash
awk -F, '$1 == "west" { total += $3 } END { printf "%.2f\n", total }' /work/sales.csv > /work/total.txt
