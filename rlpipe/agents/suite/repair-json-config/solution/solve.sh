#!/bin/sh
cat > /work/config.json <<'JSON'
{
  "name": "billing",
  "port": 8080,
  "debug": false,
  "workers": 4,
  "allowed_hosts": ["api.internal", "localhost"]
}
JSON
