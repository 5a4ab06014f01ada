#!/bin/sh
cat > /work/service.ini <<'INI'
[server]
host = 0.0.0.0
port = 8000
timeout = 30

[database]
url = postgres://db.internal:5432/app
pool_size = 5
INI
