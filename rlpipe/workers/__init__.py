"""The run's worker processes: a rollout engine worker and a trainer worker.

The controller (the flow-run process) holds handles to them (`client.py`); each worker is
`python -m rlpipe.workers.main`, or a fork of the controller's zygote that imported torch
and transformers once (`launch.py`, `zygote.py`), serving typed requests (`protocol.py`)
over an AF_UNIX `multiprocessing.connection` socket with an authkey (`server.py`). Weights
cross as one safetensors file on /dev/shm (`weights.py`). With cluster.trainer_nproc > 1
the trainer worker relays to ranks of a torchrun group it starts (`trainer_group.py`,
`trainer_rank.py`). Nothing here imports prefect.
"""
