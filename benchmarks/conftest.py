import os
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
if "RLVR_DATA_DIR" not in os.environ and _DEFAULT_DATA.is_dir():
    os.environ["RLVR_DATA_DIR"] = str(_DEFAULT_DATA)
