import json
import sys

try:
    config = json.load(open("/work/config.json"))
except (OSError, ValueError) as exc:
    sys.exit(f"config.json does not load: {exc}")
expected = {"name": "billing", "port": 8080, "debug": False, "workers": 4, "allowed_hosts": ["api.internal", "localhost"]}
if config != expected or type(config["port"]) is not int:
    sys.exit(f"config.json holds {config!r}, expected {expected!r}")
