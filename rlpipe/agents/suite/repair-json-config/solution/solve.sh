#!/bin/sh
python3 -c 'import sys; open(sys.argv[1], "w").write(sys.stdin.read())' /work/config.json <<'JSON'
{
  "name": "billing",
  "port": 8080,
  "debug": false,
  "workers": 4,
  "allowed_hosts": ["api.internal", "localhost"]
}
JSON
