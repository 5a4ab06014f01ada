#!/bin/bash
awk '$5 == 500 { print $6; exit }' /work/access.log > /work/answer.txt
