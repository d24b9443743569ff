"""Load a model for generation: device choice, and the convert-once cache for GGUF.

De-quantising a GGUF takes 20-50 s, so it is done once and the result kept as
safetensors under MODEL_CACHE_DIR/<sha256 of the GGUF>/; later loads take well
under a second. No Django imports here.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from inference.registry import ModelSpec

logger = logging.getLogger(__name__)

COMPLETE_MARKER = "chatsite-complete.json"

# Held while transformers builds a model: from_pretrained swaps PreTrainedModel.tie_weights
# and torch.linspace for the whole process while it builds one, so a second thread building
# another meanwhile gets untied weights (lm_head left on the meta device). Two engines of one
# process (CHAT_MAX_LOADED_MODELS, the embedding model, an unload racing a load) do meet here.
MODEL_BUILDING = threading.Lock()


def resolve_device(setting: str) -> torch.device:
    """CHAT_DEVICE → a torch device; `auto` means CUDA when there is one."""
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if setting.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"CHAT_DEVICE={setting} but CUDA is not available")
    return torch.device(setting)


def dtype_for(device: torch.device, setting: str = "auto") -> torch.dtype:
    """CHAT_DTYPE → the weights' dtype. `auto`: bfloat16 on CUDA and on CPUs with native
    bfloat16 arithmetic, float32 elsewhere.

    A decoding step of a small model on a CPU mostly reads weights: in bfloat16 it reads
    half as much and runs about twice as fast (docs/benchmarks.md). The packaged models
    are 4-bit GGUF files, whose steps are far coarser than bfloat16's rounding. Where the
    CPU lacks the instructions, bfloat16 is emulated and slower than float32.
    """
    if setting != "auto":
        chosen: torch.dtype = getattr(torch, setting)
        return chosen
    return torch.bfloat16 if device.type == "cuda" or cpu_has_native_bf16() else torch.float32


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (x86 AVX512-BF16 or AMX, Arm BF16)."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: stay with float32
        return False
    found = re.search(r"^(?:flags|Features)\s*:(.*)$", cpuinfo, re.MULTILINE)
    return bool(found and {"avx512_bf16", "amx_bf16", "bf16"} & set(found.group(1).split()))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def cached_conversion(
    source: Path,
    cache_dir: Path,
    convert: Callable[[Path, Path], None],
    load: Callable[[Path], Any],
) -> Any:
    """Load the converted copy of `source`, converting it first when missing or broken.

    The cache entry is keyed by the source's sha256 and only counts once its
    completion marker is written, so an interrupted conversion is redone, and
    one that no longer loads is rebuilt. A file lock makes concurrent callers
    (threads or processes) wait for one conversion instead of racing.
    """
    sha = file_sha256(source)
    target = cache_dir / sha
    if (target / COMPLETE_MARKER).exists():
        try:
            return load(target)
        except Exception:
            logger.warning("Cached model in %s does not load; converting again", target, exc_info=True)
            broken = True
    else:
        broken = False
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (cache_dir / f"{sha}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # Someone else may have converted it while we waited for the lock.
        if broken or not (target / COMPLETE_MARKER).exists():
            _convert_into(source, target, sha, convert)
    return load(target)


def _convert_into(source: Path, target: Path, sha: str, convert: Callable[[Path, Path], None]) -> None:
    shutil.rmtree(target, ignore_errors=True)
    building = Path(tempfile.mkdtemp(prefix=f"{sha[:12]}-", dir=target.parent))
    try:
        logger.info("Converting %s once into %s (this takes a while)", source.name, target)
        convert(source, building)
        (building / COMPLETE_MARKER).write_text(json.dumps({"source": source.name, "sha256": sha}))
        os.replace(building, target)
    finally:
        shutil.rmtree(building, ignore_errors=True)


def assemble_gguf(spec: ModelSpec, cache_dir: Path) -> Path:
    """The GGUF file of a packaged model; multi-part ones are joined once into the cache."""
    paths = [part.locate() for part in spec.gguf_parts]
    missing = [part.package for part, path in zip(spec.gguf_parts, paths, strict=False) if path is None]
    if missing:
        raise FileNotFoundError(f"{spec.name}: packages not installed: {', '.join(missing)}")
    if len(paths) == 1:
        assert paths[0] is not None
        return paths[0]
    joined = cache_dir / "gguf" / spec.gguf_name
    total = sum(path.stat().st_size for path in paths if path)
    if not joined.exists() or joined.stat().st_size != total:
        joined.parent.mkdir(parents=True, exist_ok=True)
        partial = joined.with_suffix(".partial")
        with partial.open("wb") as out:
            for path in paths:
                assert path is not None
                with path.open("rb") as part:
                    shutil.copyfileobj(part, out, 1 << 20)
        os.replace(partial, joined)
    return joined


def convert_gguf(gguf: Path, target: Path, *, chat_template: str | None = None) -> None:
    """De-quantise a GGUF into a safetensors model directory with its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with MODEL_BUILDING:
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # A model loaded from GGUF refuses save_pretrained while it carries its
    # quantizer marker, although its weights are plain tensors by now.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if chat_template and not tokenizer.chat_template:
        tokenizer.chat_template = chat_template
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)


# CHAT_QUANTIZATION=int4's group: 32 input features share a scale and a zero point. It divides
# every hidden size of the packaged models (SmolLM2-135M's is 576, which 128 does not; a
# layer it does not divide stays unquantized), and a step took as long as with 64.
INT4_GROUP_SIZE = 32


def quantize_weights(model: Any, setting: str) -> None:
    """CHAT_QUANTIZATION=int8 or int4: torchao's weight-only quantization, once the model
    has loaded (1.2 s for SmolLM2-135M on two cores, against 15 s through transformers'
    TorchAoConfig while loading).

    - int8, any device: each linear layer's weights in int8 with one scale per output row,
      widened inside its matrix product, half the bytes a decoding step reads. It pays
      compiled (GENERATION_COMPILE), where inductor fuses the widening into the product;
      eagerly a step is slower than in bfloat16.
    - int4, a CPU only, computing in bfloat16: weights in 4 bits with a scale and zero
      point per group of INT4_GROUP_SIZE inputs, multiplied by PyTorch's own CPU int4
      kernel (`_weight_int4pack_mm_for_cpu`) without widening, so it pays eagerly too.
      torchao 0.18 offers it as a prototype (`PrototypeInt4WeightOnlyConfig`), pinned in
      requirements.txt; its other int4 formats need CUDA kernels. The kernel takes
      bfloat16 activations: with float32 ones a product was 18x slower. Its time grows
      with the rows multiplied, so each layer keeps a dense copy too, for prompts
      (inference/int4.py).

    Speed and agreement with the unquantized model: docs/benchmarks.md."""
    if setting not in ("int8", "int4"):
        return
    if importlib.util.find_spec("torchao") is None:
        raise RuntimeError(f"CHAT_QUANTIZATION={setting} needs the torchao package (pip install torchao==0.18.0)")
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    if setting == "int8":
        quantize_(model, Int8WeightOnlyConfig())
        return
    if model.device.type != "cpu" or model.dtype != torch.bfloat16:
        raise RuntimeError(
            "CHAT_QUANTIZATION=int4 runs on a CPU in bfloat16 (torchao's CPU int4 kernel), not on "
            f"{model.device.type} in {str(model.dtype).removeprefix('torch.')}: set CHAT_DEVICE=cpu "
            "and CHAT_DTYPE=auto, or use bnb-4bit on a GPU"
        )
    from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig

    from inference.int4 import keep_dense_weights

    weights = {module: module.weight for module in model.modules() if isinstance(module, torch.nn.Linear)}
    # set_inductor_config would change torch.compile's options for the whole process.
    quantize_(model, PrototypeInt4WeightOnlyConfig(group_size=INT4_GROUP_SIZE, set_inductor_config=False))
    # A layer quantize_ left alone (its inputs not a multiple of the group) kept its weight.
    keep_dense_weights(
        model,
        {module: weight.detach() for module, weight in weights.items() if module.weight is not weight},
        dense_dtype=torch.bfloat16 if cpu_has_native_bf16() else torch.float32,
    )


def weights_dtype_for(device: torch.device, dtype: str, quantization: str) -> torch.dtype:
    """The dtype the weights load in: CHAT_DTYPE's (dtype_for), except that int4 computes in
    bfloat16 whatever the CPU, when CHAT_DTYPE leaves the choice (`auto`)."""
    if quantization == "int4" and dtype == "auto":
        return torch.bfloat16
    return dtype_for(device, dtype)


def quantization_config(setting: str, device: torch.device, dtype: torch.dtype) -> Any | None:
    """CHAT_QUANTIZATION → transformers' BitsAndBytesConfig, or None for `none`, `int8` and `int4`
    (quantized after loading: quantize_weights).

    bitsandbytes quantizes the weights as they load: 4-bit NF4 (with the quantization
    constants quantized too) computing in `dtype`, or 8-bit LLM.int8(). It needs CUDA and
    the bitsandbytes package (in requirements-cuda.lock, not in the CPU requirements)."""
    if setting in ("none", "int8", "int4"):
        return None
    if device.type != "cuda":
        raise RuntimeError(f"CHAT_QUANTIZATION={setting} needs a CUDA device (bitsandbytes); the device is {device}")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise RuntimeError(
            f"CHAT_QUANTIZATION={setting} needs the bitsandbytes package: "
            "install requirements-cuda.lock (or pip install bitsandbytes==0.50.2)"
        )
    from transformers import BitsAndBytesConfig

    if setting == "bnb-4bit":
        return BitsAndBytesConfig(  # type: ignore[no-untyped-call]
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype
        )
    if setting == "bnb-8bit":
        return BitsAndBytesConfig(load_in_8bit=True)  # type: ignore[no-untyped-call]
    raise ValueError(f"CHAT_QUANTIZATION must be none, int8, int4, bnb-4bit or bnb-8bit, not {setting!r}")


def load_pretrained(
    model_dir: str | Path, device: torch.device, dtype: str = "auto", quantization: str = "none"
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer from a directory or hub id onto `device`,
    quantized on loading when `quantization` (CHAT_QUANTIZATION) says so."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from inference.attention import use_cpu_decode_attention

    weights_dtype = weights_dtype_for(device, dtype, quantization)
    kwargs: dict[str, object] = {"dtype": weights_dtype}
    if quantized := quantization_config(quantization, device, weights_dtype):
        kwargs["quantization_config"] = quantized
    if device.type == "cuda":
        kwargs["device_map"] = "auto" if device.index is None else {"": device.index}
    with MODEL_BUILDING:
        model: Any = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
    if device.type != "cuda":
        model.to(device)
    model.eval()
    use_cpu_decode_attention(model)
    quantize_weights(model, quantization)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return model, tokenizer


def load_tokenizer_and_config(model_dir: str | Path) -> tuple[Any, Any]:
    """A model's configuration and tokenizer, without its weights."""
    from transformers import AutoConfig, AutoTokenizer

    return AutoConfig.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
