"""The files of a checkpoint folder (rl/checkpoint.py writes and reads them): the policy as
an HF user loads it, and the trainer's state beside it. Names only, so that the controller
(which exports the policy folder) never imports torch."""

POLICY_DIR = "policy"
TRAINER_DIR = "trainer"
OPTIMIZER_FILE = f"{TRAINER_DIR}/optimizer.pt"
META_FILE = f"{TRAINER_DIR}/rlpipe_checkpoint.json"
WEIGHTS_FILE = f"{POLICY_DIR}/model.safetensors"
ADAPTER_DIR = f"{TRAINER_DIR}/adapter"
ADAPTER_FILE = f"{ADAPTER_DIR}/adapter_model.safetensors"
