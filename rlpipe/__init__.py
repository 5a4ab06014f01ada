"""rlpipe: RL post-training of language models with verifiable rewards.

Layers (arrows point to what may be imported; nothing imports upward):

    cli -> flows -> tasks -> {engines, rl, envs, storage} -> core
                       envs -> sandbox -> core
                       rl   -> core

See docs/ARCHITECTURE.md for the as-built design.
"""

__version__ = "0.1.0"
