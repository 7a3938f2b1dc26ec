"""Loading vortex (PyPI ``vtx``, Evo 2's inference code) where it was not built to load.

vortex 1.1.0 assumes a CUDA machine in three places. This module works around each, for
the duration of an import or a model build only, and changes nothing else:

1. ``vortex.ops`` imports ``triton`` and the flash-attention extension ``flash_attn_2_cuda``
   at import time. Where they are not installed, :func:`vortex_import_shims` puts stand-in
   modules in ``sys.modules`` while vortex imports, and takes them out again. Their kernels
   raise ``RuntimeError`` if called. A model without attention layers and with vortex's
   fused Hyena kernels off (``use_hc*_kernel`` false, the default) never calls them.
2. ``StripedHyena.__init__`` enters ``torch.cuda.device("cpu")`` around each block, and each
   Hyena block's forward enters ``torch.cuda.device(x.device)``; both raise on a CPU
   ("Expected a cuda device"). :func:`cpu_device_calls` makes ``torch.cuda.device`` a no-op
   for non-CUDA devices during a block: :func:`build_model` builds inside it and wraps the
   model's ``forward`` in it (calls of single blocks need it too).
3. Without Transformer Engine vortex refuses FP8 configs (``use_fp8_input_projections``):
   build with it false, then swap the projections (:func:`cpemu.evo2.swap_fp8_projections`).
4. ``vortex.logging`` opens ``activations_debug.log`` in the working directory at import
   time. :func:`vortex_import_shims` makes that file handler lazy (``delay=True``): the file
   appears only if vortex logs activations (``print_activations``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import logging
import sys
import types

import torch

from .config import is_int, check_config

__all__ = ["vortex_import_shims", "cpu_device_calls", "import_vortex", "build_model", "tiny_config", "tiny_model"]

_SHIMMED = ("triton", "triton.language", "flash_attn_2_cuda")


class _Absent:
    """Whatever a stand-in module is asked for: decorators, configs, ``tl.constexpr``."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:  # used as a decorator
            return _AbsentKernel(getattr(args[0], "__name__", self._name), self._name.split(".")[0])
        return _Absent(self._name)

    def __getattr__(self, key):
        if key.startswith("__"):
            raise AttributeError(key)
        return _Absent(f"{self._name}.{key}")

    def __getitem__(self, key):
        return _Absent(self._name)


class _AbsentKernel(_Absent):
    def __init__(self, kernel: str, module: str):
        super().__init__(kernel)
        self._module = module

    def _raise(self, *args, **kwargs):
        raise RuntimeError(f"{self._name}: a {self._module} kernel, but {self._module} is not installed "
                           f"(cpemu.evo2 imported vortex with a stand-in module)")

    __call__ = _raise

    def __getitem__(self, key):
        return self._raise


def _stand_in(name: str) -> types.ModuleType:
    mod = types.ModuleType(name, f"stand-in for {name}, which is not installed (cpemu.evo2.vortex_cpu)")

    def __getattr__(key):
        if key.startswith("__"):
            raise AttributeError(key)
        return _Absent(f"{name}.{key}")

    mod.__getattr__ = __getattr__
    return mod


def _installed(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


class _LazyFileHandler(logging.FileHandler):
    """A file handler that opens its file at the first record (``delay=True``)."""

    def __init__(self, filename, mode="a", encoding=None, delay=True, errors=None):
        super().__init__(filename, mode, encoding, True, errors)


@contextlib.contextmanager
def vortex_import_shims():
    """Stand-ins for ``triton`` and ``flash_attn_2_cuda`` where they are missing, and lazy log files,
    during the block only (see the module docstring)."""
    added = [n for n in _SHIMMED if not _installed(n.split(".")[0]) and n not in sys.modules]
    for n in added:
        sys.modules[n] = _stand_in(n)
    if "triton" in added and "triton.language" in added:
        sys.modules["triton"].language = sys.modules["triton.language"]
    file_handler = logging.FileHandler
    logging.FileHandler = _LazyFileHandler
    try:
        yield tuple(added)
    finally:
        logging.FileHandler = file_handler
        for n in added:  # torch and others must not find a stand-in later
            sys.modules.pop(n, None)


@contextlib.contextmanager
def cpu_device_calls():
    """``torch.cuda.device(d)`` is a no-op for a non-CUDA ``d`` during the block (see the module docstring)."""
    original = torch.cuda.device

    class _device:
        def __init__(self, device):
            dev = device if isinstance(device, int) or device is None else torch.device(device)
            # torch.device("cpu") and a CPU tensor's index (None) select no CUDA device
            self._inner = None if dev is None or (isinstance(dev, torch.device) and dev.type != "cuda") \
                else original(device)

        def __enter__(self):
            return None if self._inner is None else self._inner.__enter__()

        def __exit__(self, *exc):
            return False if self._inner is None else self._inner.__exit__(*exc)

    torch.cuda.device = _device
    try:
        yield
    finally:
        torch.cuda.device = original


def import_vortex():
    """``vortex.model.model``, imported with :func:`vortex_import_shims`; ImportError if vtx is absent."""
    if not _installed("vortex"):
        raise ImportError("vortex (PyPI vtx) is not installed: pip install vtx==1.1.0")
    with vortex_import_shims():
        return importlib.import_module("vortex.model.model")


def build_model(config: dict, *, bfloat16: bool = True):
    """A vortex ``StripedHyena`` built from ``config`` (a dict or vortex's dotdict) on this
    machine's default device, with :func:`cpu_device_calls`; in bf16 as vortex's loaders
    leave it (``to_bfloat16_except_pr_lc``) when ``bfloat16``; in eval mode.

    ``use_fp8_input_projections`` must be false (vortex refuses FP8 without Transformer
    Engine); swap the projections afterwards. The model's ``forward`` runs inside
    :func:`cpu_device_calls` (a no-op on CUDA tensors).

    ``config`` is checked first (:func:`cpemu.evo2.config.check_config`: ValueError naming the
    field and the rule), and a model whose parameters would not fit in memory is refused before
    vortex allocates any (:class:`cpemu.OutputTooLarge`)."""
    if not isinstance(bfloat16, bool):
        raise ValueError(f"bfloat16: must be a bool (got {type(bfloat16).__name__})")
    n_params = check_config(config)
    if config.get("use_fp8_input_projections", False):
        raise ValueError("config: use_fp8_input_projections must be False here (vortex refuses FP8 without "
                         "Transformer Engine); build without it, then call cpemu.evo2.swap_fp8_projections")
    _check_memory(n_params)
    vm = import_vortex()
    from vortex.model.utils import dotdict  # noqa: PLC0415 - vortex is optional

    with cpu_device_calls():
        model = vm.StripedHyena(dotdict(dict(config)))
    if bfloat16:
        model.to_bfloat16_except_pr_lc()
    model.forward = _in_cpu_device_calls(model.forward)
    return model.eval()


def _check_memory(n_params: int) -> None:
    """Refuse a model whose float32 parameters (vortex builds them so) do not fit where vortex builds
    it: the GPUs where CUDA is available, else this machine's memory."""
    from ..memory import check_bytes

    what = f"config: a model of {n_params:,} parameters (float32, as vortex builds it)"
    if torch.cuda.is_available():
        free = sum(torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count()))
        check_bytes(what, 4 * n_params, free, "the GPUs")
    else:
        check_bytes(what, 4 * n_params)


def _in_cpu_device_calls(forward):
    @functools.wraps(forward)
    def wrapped(*args, **kwargs):
        with cpu_device_calls():
            return forward(*args, **kwargs)

    wrapped.cpemu_wrapped = "cpemu.evo2.cpu_device_calls"
    return wrapped


def tiny_config(hidden: int = 64, layers: int = 4) -> dict:
    """A small config for smoke tests and examples: vortex's evo2-1b-8k.yml with ``hidden``
    channels and ``layers`` Hyena blocks (no attention layers), FP8 off (vortex refuses FP8
    without Transformer Engine). With random weights it is no model of DNA.

    ``hidden``: an integer from 32 that ``hidden // 16`` divides (the short and medium filters'
    groups: vortex needs at least 2, each of the same width), e.g. a multiple of 16;
    ``layers``: a positive integer."""
    if not is_int(hidden) or hidden < 32 or hidden % (hidden // 16):
        raise ValueError(f"hidden: must be an integer from 32 that hidden // 16 (the filters' group count) divides, "
                         f"e.g. a multiple of 16 (got {hidden!r:.100})")
    if not is_int(layers) or layers < 1:
        raise ValueError(f"layers: must be a positive integer (got {layers!r:.100})")
    hidden, layers = int(hidden), int(layers)
    return dict(
        model_name="tiny-evo2-test", vocab_size=512, hidden_size=hidden, num_filters=hidden,
        attn_layer_idxs=[], hcs_layer_idxs=list(range(0, layers, 3)), hcm_layer_idxs=list(range(1, layers, 3)),
        hcl_layer_idxs=list(range(2, layers, 3)), hcm_filter_length=128, hcl_filter_groups=hidden,
        hcm_filter_groups=hidden // 16, hcs_filter_groups=hidden // 16, hcs_filter_length=7, num_layers=layers,
        short_filter_length=3, num_attention_heads=4, short_filter_bias=False,
        mlp_init_method="torch.nn.init.xavier_uniform_", mlp_output_init_method="torch.nn.init.xavier_uniform_",
        eps=1e-6, state_size=16, rotary_emb_base=10000, make_vocab_size_divisible_by=8, inner_size_multiple_of=16,
        inner_mlp_size=2 * hidden, log_intermediate_values=False, proj_groups=1, hyena_filter_groups=1,
        column_split_hyena=False, column_split=True, interleave=True, evo2_style_activations=True,
        model_parallel_size=1, pipe_parallel_size=1, tie_embeddings=True, mha_out_proj_bias=True,
        hyena_out_proj_bias=True, hyena_flip_x1x2=False, qkv_proj_bias=False, use_fp8_input_projections=False,
        max_seqlen=8192, max_batch_size=1, final_norm=True, use_flash_attn=False, use_flash_rmsnorm=False,
        use_flash_depthwise=False, use_flashfft=False, use_laughing_hyena=False, inference_mode=True,
        tokenizer_type="CharLevelTokenizer", prefill_style="fft", mlp_activation="gelu", print_activations=False)


def tiny_model(seed: int = 0, hidden: int = 64, layers: int = 4, **overrides):
    """A tiny random-weight StripedHyena 2 for smoke tests: :func:`build_model` of
    :func:`tiny_config` (``overrides`` replace its fields) with vortex's own initialisation
    under ``torch.manual_seed(seed)``. vortex initialises the Hyena-LI ``log_poles`` at random
    signs, which makes the long filters grow without bound; they are made negative here
    (decaying filters, as trained checkpoints hold), so the forward pass stays finite."""
    if not is_int(seed) or not -2 ** 63 <= seed < 2 ** 64:
        raise ValueError(f"seed: must be an integer from -2**63 to 2**64 - 1, as torch.manual_seed takes "
                         f"(got {seed!r:.100})")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = build_model({**tiny_config(hidden, layers), **overrides})
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("log_poles"):
                p.copy_(-p.abs() - 0.05)
    return model
