import sys

pairs = {}
for number, line in enumerate(open("/work/settings.env"), start=1):
    line = line.strip()
    if not line or line.startswith("#"):
        continue
    if "=" not in line:
        sys.exit(f"settings.env line {number} is not KEY=value: {line!r}")
    key, value = line.split("=", 1)
    if key in pairs:
        sys.exit(f"settings.env sets {key} twice")
    pairs[key] = value
expected = {"DATABASE_URL": "postgres://prod-db/app", "LOG_LEVEL": "warning", "CACHE_TTL_S": "300", "FEATURE_SEARCH": "off"}
if pairs != expected:
    sys.exit(f"settings.env holds {pairs!r}, expected {expected!r}")
