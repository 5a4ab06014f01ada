#!/bin/bash
# Count the .txt files in data/ and their lines.
files=0
lines=0
for file in $(ls data/*.txt); do
    files=$((files + 1))
    lines=$((lines + $(wc -l < $file)))
done
echo "$files files, $lines lines"
