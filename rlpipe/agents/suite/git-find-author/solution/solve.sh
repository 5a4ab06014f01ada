#!/bin/bash
cd /work
git log --reverse -S MAGIC_TOKEN --format=%ae -- settings.txt | head -n 1 > answer.txt
