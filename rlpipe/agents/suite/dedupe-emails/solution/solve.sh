#!/bin/bash
find /work/contacts -type f -exec cat {} + | tr -d ' ' | tr '[:upper:]' '[:lower:]' | grep -v '^$' | sort -u > /work/emails.txt
