"""Root of the test suite. Importing rlpipe first turns off Prefect's and MLflow's usage
telemetry (rlpipe/__init__.py) before either library reads its settings: tests send
traffic only to 127.0.0.1."""

import rlpipe  # noqa: F401  (side effect: telemetry off)
