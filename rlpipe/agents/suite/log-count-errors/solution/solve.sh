#!/bin/bash
awk '$3 == "ERROR"' /work/app.log | wc -l > /work/answer.txt
