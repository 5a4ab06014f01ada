#!/bin/sh
python3 -c 'import sys; open(sys.argv[1], "w").write(sys.stdin.read())' /work/service.ini <<'INI'
[server]
host = 0.0.0.0
port = 8000
timeout = 30

[database]
url = postgres://db.internal:5432/app
pool_size = 5
INI
