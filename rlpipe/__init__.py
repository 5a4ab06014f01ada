"""rlpipe: RL post-training of language models with verifiable rewards.

Layers (arrows point to what may be imported; nothing imports upward):

    cli -> flows -> tasks -> {engines, rl, envs, storage} -> core
                       envs -> sandbox -> core
                       rl   -> core

See docs/ARCHITECTURE.md for the as-built design.
"""

__version__ = "0.1.0"

import os as _os

# rlpipe sends nothing off the machine on its own: no usage telemetry from the Prefect
# server it may start (ephemeral mode, `rlpipe up`) or from MLflow. Set before either is
# imported; an explicit setting in the environment wins.
ENVIRONMENT_DEFAULTS = (
    ("PREFECT_SERVER_ANALYTICS_ENABLED", "false"),
    ("MLFLOW_DISABLE_TELEMETRY", "true"),
    ("DO_NOT_TRACK", "true"),
    ("HF_HUB_OFFLINE", "1"),
)
for _name, _value in ENVIRONMENT_DEFAULTS:
    _os.environ.setdefault(_name, _value)
