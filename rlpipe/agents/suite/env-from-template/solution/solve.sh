#!/bin/sh
python3 - <<'PY'
def read(path):
    pairs = {}
    for line in open(path):
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            pairs[key] = value
    return pairs

current = read("/work/settings.env")
with open("/work/settings.env", "a") as env:
    for key, value in read("/work/settings.env.example").items():
        if key not in current:
            env.write(f"{key}={value}\n")
PY
